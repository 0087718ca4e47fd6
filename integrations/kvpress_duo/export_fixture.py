"""The pattern the kvpress tests read, from a real streaming curve (main venv, tl_geometry):

    .venv/bin/python -m integrations.kvpress_duo.export_fixture .kvpress-fixture

A tiny random model of 3 layers × 4 heads (2 kv heads) is analysed and its kv heads streamed in
every measured order; the best order's pattern is saved with, per ratio, the kv heads the curve
streamed there (``expected.json``), which the kvpress side must stream from the pattern alone.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import tl_geometry as tlg
from tests.tiny import random_tokens, tiny_streamable

RATIOS = (0.25, 0.5, 0.75, 1.0)
SHAPE = {"n_layers": 3, "n_heads": 4, "n_kv_heads": 2}


def main(out: Path) -> None:
    model, tokens = tiny_streamable(SHAPE["n_heads"], SHAPE["n_kv_heads"], n_layers=SHAPE["n_layers"]), random_tokens(4, 32, seed=3)  # ≥ 100 votes a head
    analysis = tlg.analyze(model, tokens, (1, 2, 4), progress=False)
    curve = tlg.intervene.streaming_curve(model, tokens, analysis, fractions=RATIOS, window=4, sink=1, seeds=1,
                                          orders=("taxonomy", "entropy", "oracle"), progress=False)
    pattern = tlg.intervene.duo_attention_pattern(curve)
    if (out / "expected.json").is_file():  # an earlier fixture of this script, nothing else
        shutil.rmtree(out)
    pattern.save(out / "pattern")
    n_kv = curve.settings["n_kv_total"]
    streamed = {str(r): sorted(int(k) for k in curve.orders[pattern.order][:round(r * n_kv)]) for r in RATIOS}
    (out / "expected.json").write_text(json.dumps({"shape": SHAPE, "order": pattern.order, "sink": 1, "window": 4,
                                                   "streamed": streamed}, indent=1))
    print(out)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
