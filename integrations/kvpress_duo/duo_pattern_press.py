"""kvpress's DuoAttentionPress on a pattern folder of one's own, with no network: the folder
tl_geometry writes (``tlg.intervene.duo_attention_pattern(curve).save(folder)``) or any folder in
DuoAttention's layout (``config.json`` with ``sink_size``/``recent_size``, ``full_attention_heads.tsv``).

Runs in the kvpress environment (``make kvpress-test`` builds ``.venv-kvpress``: kvpress pins its
own transformers and pandas, which TransformerLens 4 cannot share), so it reads the two files
itself, as DuoAttention's ``load_attn_pattern`` does (``np.loadtxt``, clipped to [0, 1]), rather
than importing tl_geometry.

    press = PatternDuoAttentionPress(head_compression_ratio=0.5, pattern="runs/x/duo_attention")
    pipe = pipeline("kv-press-text-generation", model=model, tokenizer=tokenizer)
    answer = pipe(context, question=question, press=press)["answer"]
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from kvpress import DuoAttentionPress

__all__ = ["PatternDuoAttentionPress", "read_pattern"]


def read_pattern(folder: str | Path) -> tuple[int, int, np.ndarray]:
    """``(sink_size, recent_size, head_scores[n_layers, n_kv_heads])`` of a pattern folder."""
    folder = Path(folder)
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    scores = np.loadtxt(folder / "full_attention_heads.tsv", dtype=float, delimiter="\t", ndmin=2)
    return int(config["sink_size"]), int(config["recent_size"]), np.clip(scores, 0, 1)


@dataclass
class PatternDuoAttentionPress(DuoAttentionPress):
    """``DuoAttentionPress`` whose pattern comes from the folder ``pattern`` instead of the
    DuoAttention repository; its shape must be the model's ``[n_layers, n_kv_heads]``."""

    pattern: str | Path = ""

    def load_attention_pattern(self, model):  # kvpress calls it as self.load_attention_pattern(model)
        sink, recent, scores = read_pattern(self.pattern)
        shape = (model.config.num_hidden_layers, model.config.num_key_value_heads)
        if scores.shape != shape:
            raise ValueError(f"the pattern in {self.pattern} has {scores.shape[0]}×{scores.shape[1]} kv heads but the "
                             f"model has {shape[0]}×{shape[1]}: export the pattern of this model")
        return sink, recent, scores
