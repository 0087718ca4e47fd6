"""kvpress presses against the plugin's DuoAttention pattern on a bundled model (SmolLM2-135M), at matched
compression ratios: the NLL of a held-out continuation, a needle copied from far back in the
context, and what the KV cache keeps. Runs in the kvpress venv on the inputs the main venv made:

    .venv/bin/python -m benchmarks.kvpress_inputs .kvpress-bench
    .venv-kvpress/bin/python -m benchmarks.bench_kvpress .kvpress-bench      # or: make bench-kvpress

The model is read from the GGUF file of its wheel by transformers (float32, sdpa attention:
DuoAttentionPress refuses eager). Each window: BOS + context, compressed by the press at
prefill, then the continuation scored with teacher forcing on the compressed cache; the needle
(" The secret number is 7391.") is put 64 tokens after BOS into the same context and asked for
(" The secret number is") after it, greedily. DuoAttention's effective ratio is its head ratio
times ``1 − (sink + recent) / context``; its head ratio is set so the effective one matches.
DuoAttentionPress masks the streamed keys rather than evicting them, so its cache keeps its
length: the table gives the share of keys each press removes from attention ("compression") and
the bytes its cache really holds.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import time
from pathlib import Path

import torch
from kvpress import KnormPress, RandomPress, SnapKVPress, StreamingLLMPress
from transformers import AutoModelForCausalLM, DynamicCache

from integrations.kvpress_duo.duo_pattern_press import PatternDuoAttentionPress, read_pattern

RATIOS = (0.25, 0.5, 0.75)
NEEDLE_AT = 64


def load_model(gguf: Path):
    """The bundled model from its GGUF file (the path the main venv found), as transformers reads it."""
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32,
                                                 attn_implementation="sdpa")
    return model.eval()


def presses(folder: Path, ratio: float, orders: list[str], context: int) -> dict:
    """Every press at the compression ``ratio`` (DuoAttention's head ratio matched to it)."""
    found = {"StreamingLLM": StreamingLLMPress(compression_ratio=ratio), "SnapKV": SnapKVPress(compression_ratio=ratio),
             "Knorm": KnormPress(compression_ratio=ratio), "Random (keys)": RandomPress(compression_ratio=ratio)}
    for order in [*orders, "random"]:
        sink, recent, _ = read_pattern(folder / f"pattern_{order}")
        head_ratio = ratio / (1 - (sink + recent) / context)
        if head_ratio <= 1:
            found[f"DuoAttention, {order} order"] = PatternDuoAttentionPress(
                head_compression_ratio=head_ratio, pattern=str(folder / f"pattern_{order}"))
    return found


def _clear(model) -> None:
    for module in model.modules():  # DuoAttention's leftover mask stays on the model until the next prefill
        if hasattr(module, "masked_key_indices"):
            module.masked_key_indices = None


def run_one(model, press, context: torch.Tensor, continuation: torch.Tensor) -> tuple[float, int]:
    """NLL (nats per token) of ``continuation`` after ``context`` compressed by ``press``, and the
    bytes the cache holds."""
    cache = DynamicCache()
    with torch.no_grad(), (press(model) if press is not None else contextlib.nullcontext()):
        first = model(context[None], past_key_values=cache).logits[0, -1]
    at = len(context) + torch.arange(len(continuation) - 1)[None]  # positions as uncompressed (kvpress's pipeline)
    with torch.no_grad():
        rest = model(continuation[None, :-1], past_key_values=cache, position_ids=at).logits[0]
    logits = torch.cat([first[None], rest])
    nll = float(torch.nn.functional.cross_entropy(logits.float(), continuation))
    held = sum(layer.keys.numel() * layer.keys.element_size() * 2 for layer in cache.layers)
    _clear(model)
    return nll, held


def needle(model, press, context: torch.Tensor, needle_ids: list[int], question: list[int]) -> bool:
    """Whether the model, on the compressed context with the needle inside, says the needle's number."""
    ids = torch.cat([context[:NEEDLE_AT], torch.tensor(needle_ids), context[NEEDLE_AT:]])
    answer = needle_ids[len(question):]
    cache = DynamicCache()
    with torch.no_grad(), (press(model) if press is not None else contextlib.nullcontext()):
        model(ids[None], past_key_values=cache)
    said = []
    step, at = torch.tensor(question)[None], len(ids) + torch.arange(len(question))[None]
    with torch.no_grad():
        for _ in answer:
            token = int(model(step, past_key_values=cache, position_ids=at).logits[0, -1].argmax())
            said.append(token)
            step, at = torch.tensor([[token]]), at[:, -1:] + 1
    _clear(model)
    return said == answer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--windows", type=int, default=None, help="the first N windows only")
    parser.add_argument("--presses", default=None, help="names to keep, separated by ';' (default: all)")
    args = parser.parse_args()
    inputs = json.loads((args.folder / "inputs.json").read_text())
    tokens = torch.tensor(inputs["tokens"])[: args.windows]
    keep = None if args.presses is None else set(args.presses.split(";"))
    context, cont = inputs["context"], inputs["continuation"]
    torch.manual_seed(0)
    model = load_model(Path(inputs["gguf"]))
    rows = []
    started = time.perf_counter()
    for ratio in (0.0, *RATIOS):
        chosen = {"no press": None} if ratio == 0 else presses(args.folder, ratio, inputs["orders"], context)
        chosen = {name: press for name, press in chosen.items() if keep is None or ratio == 0 or name in keep}
        for name, press in chosen.items():
            results = [(*run_one(model, press, window[:context], window[context:]),
                        needle(model, press, window[:context - len(inputs["needle"])], inputs["needle"], inputs["question"]))
                       for window in tokens]
            nll = sum(r[0] for r in results) / len(results)
            rows.append({"ratio": ratio, "press": name, "nll": nll, "needle": int(sum(r[2] for r in results)),
                         "windows": len(results), "cache_mb": results[0][1] / 2**20})
            print(f"{ratio:.2f}  {name:<34} NLL {nll:.4f}  needle {rows[-1]['needle']}/{len(results)}  "
                  f"cache {rows[-1]['cache_mb']:.1f} MB   ({time.perf_counter() - started:.0f}s)", flush=True)
    (args.folder / "results.json").write_text(json.dumps({"rows": rows, "context": context, "continuation": cont,
                                                         "model": inputs["model"],
                                                         "windows": len(tokens), "corpus": inputs["corpus"]}, indent=1))


if __name__ == "__main__":
    main()
