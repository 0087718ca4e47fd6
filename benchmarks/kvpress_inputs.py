"""Inputs of ``benchmarks/bench_kvpress.py``, made in the main venv (tl_geometry, TransformerLens):
the DuoAttention patterns of a bundled model's kv heads in each measured order, a random pattern,
long token windows of the offline corpus, and the path of the model's GGUF file.

    .venv/bin/python -m benchmarks.kvpress_inputs .kvpress-bench      # then make bench-kvpress
    .venv/bin/python -m benchmarks.kvpress_inputs .kvpress-bench-gemma --model gemma-3-270m

The taxonomy comes from 16 windows × 256 tokens of python-reference (seed 0), the streaming orders
from 4 held-out windows (seed 2) with the CLI's streaming defaults (sink 4, window 64); the
benchmark's contexts are other windows (seed 7) of ``--context`` + ``--continuation`` tokens.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

import tl_geometry as tlg
from tl_geometry.capture.corpus import make_windows
from tl_geometry.capture.models import BUNDLED_MODELS
from tl_geometry.intervene.duo_attention import DuoAttentionPattern, duo_attention_pattern

ORDERS = ("taxonomy", "echo_induction", "entropy")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--context", type=int, default=1024)
    parser.add_argument("--continuation", type=int, default=128)
    parser.add_argument("--windows", type=int, default=4)
    parser.add_argument("--model", default="smollm2-135m", choices=sorted(BUNDLED_MODELS))
    args = parser.parse_args()
    torch.set_grad_enabled(False)
    model = tlg.load_model(args.model)
    analysis = tlg.analyze(model, make_windows(model, "python-reference", 256, 16, 0).tokens, progress=False)
    held = make_windows(model, "python-reference", 256, 4, 2).tokens
    curve = tlg.intervene.streaming_curve(model, held, analysis, fractions=(0.5,), window=64, sink=4, orders=ORDERS,
                                          progress=False)
    args.out.mkdir(parents=True, exist_ok=True)
    for order in ORDERS:
        duo_attention_pattern(curve, order).save(args.out / f"pattern_{order}", overwrite=True)
    n_kv = curve.settings["n_kv_total"]
    rank = torch.empty(n_kv, dtype=torch.float64)
    rank[torch.randperm(n_kv, generator=torch.Generator().manual_seed(0))] = torch.arange(n_kv, dtype=torch.float64) / (n_kv - 1)
    DuoAttentionPattern(4, 64, rank.reshape(curve.needs["taxonomy"].shape), "random").save(
        args.out / "pattern_random", overwrite=True)
    windows = make_windows(model, "python-reference", args.context + args.continuation, args.windows, 7)
    (args.out / "inputs.json").write_text(json.dumps({
        "model": args.model, "gguf": str(BUNDLED_MODELS[args.model].locate_gguf()), "corpus": windows.corpus, "context": args.context,
        "continuation": args.continuation, "tokens": windows.tokens.tolist(), "orders": list(ORDERS),
        "needle": model.tokenizer.encode(" The secret number is 7391.", add_special_tokens=False),
        "question": model.tokenizer.encode(" The secret number is", add_special_tokens=False)}))
    print(args.out)


if __name__ == "__main__":
    main()
