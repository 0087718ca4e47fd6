"""Outputs of this tree against an earlier commit, bit for bit, on the bundled models: the
all-query analysis (geometry per sequence with its certificates, taxonomy votes and offsets, head
types), a streaming curve and the prune jobs (pruning curves, single-head scan, top-N deletion) on
small settings. For changes that must not move a number (a refactor); exit 1 on any difference.

    python -m benchmarks.same_outputs 252fc1a
"""

from __future__ import annotations

import argparse
import importlib
import sys
import tempfile
from pathlib import Path

from .bench_ab import export_package, jobs_of


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("rev")
    parser.add_argument("--models", default="smollm2-135m,gemma-3-270m")
    parser.add_argument("--length", type=int, default=96)
    args = parser.parse_args()

    import torch
    from safetensors.torch import load_file

    torch.set_grad_enabled(False)
    differences = 0
    with tempfile.TemporaryDirectory() as tmp:
        sys.path.insert(0, tmp)
        sides = {"old": importlib.import_module(export_package(args.rev, Path(tmp))),
                 "new": importlib.import_module("tl_geometry")}
        from tl_geometry.capture.corpus import make_windows

        for name in args.models.split(","):
            model = sides["new"].load_model(name)
            tokens = make_windows(model, "python-reference", args.length, 2, 0).tokens
            held = make_windows(model, "python-reference", args.length, 2, 1).tokens
            outputs = {}
            for side, tlg in sides.items():
                folder = Path(tmp) / f"{side}-{name}"
                folder.mkdir()
                analysis = tlg.analyze(model, tokens, queries="all", progress=False)
                analysis.geometry.save(folder / "geometry.safetensors")
                analysis.taxonomy.save(folder / "taxonomy.safetensors")
                analysis.head_types.save(folder / "head_types.safetensors")
                tensors = {f"{file.stem}/{key}": value for file in sorted(folder.glob("*.safetensors"))
                           for key, value in load_file(file).items()}
                importances = {m: jobs_of(tlg).head_importance(model, held, m, taxonomy=analysis.taxonomy)
                               for m in ("magnitude", "taxonomy")}
                tables = {
                    "streaming curve": jobs_of(tlg).streaming_curve(model, held[:1], analysis.taxonomy, fractions=(0.25, 0.5),
                                                           window=16, orders=("taxonomy", "random", "oracle"),
                                                           seeds=1, types=analysis.head_types,
                                                           progress=False).to_dataframe(),
                    "pruning curves": jobs_of(tlg).pruning_curve(model, held, importances, retention=(0.9, 0.5), progress=False),
                }
                tensors["single_head_scan"] = jobs_of(tlg).single_head_scan(model, held[:1, :32], progress=False)
                tensors["topn_deletion"] = jobs_of(tlg).topn_deletion(model, held[:1, :32], (1, 4), progress=False).delta_nll
                outputs[side] = tensors, tables
            (old_tensors, old_tables), (new_tensors, new_tables) = outputs["old"], outputs["new"]
            for key in sorted(set(old_tensors) | set(new_tensors)):
                same = key in old_tensors and key in new_tensors and old_tensors[key].dtype == new_tensors[key].dtype \
                    and torch.equal(old_tensors[key].nan_to_num(7.5), new_tensors[key].nan_to_num(7.5)) \
                    and torch.equal(old_tensors[key].isnan(), new_tensors[key].isnan())
                differences += not same
                if not same:
                    print(f"{name} {key}: differs", flush=True)
            for key in old_tables:
                same = old_tables[key].equals(new_tables[key])
                differences += not same
                if not same:
                    print(f"{name} {key}: differs", flush=True)
            print(f"{name}: {len(old_tensors)} tensors and {len(old_tables)} tables compared with {args.rev}", flush=True)
    print("bit for bit equal" if differences == 0 else f"{differences} outputs differ")
    sys.exit(1 if differences else 0)


if __name__ == "__main__":
    main()
