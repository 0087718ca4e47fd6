"""A streaming curve's decision in DuoAttention's pattern layout, for inference libraries to apply.

DuoAttention's attention pattern is a folder of two files: ``config.json`` (``sink_size``,
``recent_size``) and ``full_attention_heads.tsv`` (one row per layer, one tab-separated column per
kv head, values in [0, 1], 1 = the head needs the whole context). kvpress's ``DuoAttentionPress``
reads it and, at ``head_compression_ratio = r``, streams the ``round(r · n)`` lowest-scored kv heads
(sink + recent window only). :func:`duo_attention_pattern` writes a measured order so that kvpress
streams exactly the heads the curve streamed at that fraction: each kv head's score is its rank in
the order scaled to [0, 1] (distinct scores, so no tie is left to kvpress's sort), with the window
and sink the curve was measured with (docs/metrics.md#streaming).

Example:
    >>> curve = tlg.intervene.streaming_curve(model, long_windows, res, window=64, sink=4)   # doctest: +SKIP
    >>> tlg.intervene.duo_attention_pattern(curve).save("runs/x/duo_attention")             # doctest: +SKIP
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from jaxtyping import Bool, Float
from torch import Tensor

from ..errors import TLGeometryError
from ..io import atomic_folder
from .streaming import StreamingCurve

__all__ = ["DuoAttentionPattern", "duo_attention_pattern", "PATTERN_FILES", "DUO_ATTENTION_FOLDER"]

PATTERN_FILES = ("config.json", "full_attention_heads.tsv")
DUO_ATTENTION_FOLDER = "duo_attention"  # its folder in a run folder (tl-geometry stream)
_WRITER = "tl_geometry"  # config.json's "written_by": a folder tl-geometry may replace


@dataclass(frozen=True)
class DuoAttentionPattern:
    """Per kv head ``[n_layers, n_kv_heads]`` scores in [0, 1] (the lowest stream first), the
    ``sink_size`` first and ``recent_size`` last positions a streamed head keeps, the ``order`` the
    scores come from and what else the pattern's config records (``settings``)."""

    sink_size: int
    recent_size: int
    scores: Float[Tensor, "layer kv"]
    order: str
    settings: dict[str, Any] = field(default_factory=dict)

    def streamed(self, ratio: float) -> Bool[Tensor, "layer kv"]:
        """The kv heads kvpress streams at ``head_compression_ratio = ratio``: the ``round(ratio · n)``
        lowest scores (Python's ``round``, as kvpress and :class:`StreamingCurve` count)."""
        flat = self.scores.flatten()
        mask = torch.zeros(flat.numel(), dtype=torch.bool)
        mask[torch.argsort(flat, stable=True)[:round(ratio * flat.numel())]] = True
        return mask.reshape(self.scores.shape)

    def save(self, folder: str | Path, *, overwrite: bool = False) -> Path:
        """Write the two files into ``folder`` (new or empty; a pattern tl-geometry wrote there is
        replaced only with ``overwrite=True``, a folder of other files never), all at once."""
        folder = Path(folder).expanduser()
        if folder.exists():
            present = sorted(p.name for p in folder.iterdir()) if folder.is_dir() else [folder.name]
            ours = folder.is_dir() and set(present) <= set(PATTERN_FILES) and _written_by_us(folder)
            if present and not ours:
                raise TLGeometryError(f"{str(folder)!r} holds files tl-geometry did not write ({', '.join(present[:3])}): "
                                      "save the pattern to a new or empty folder")
            if present and not overwrite:
                raise TLGeometryError(f"{str(folder)!r} already holds a DuoAttention pattern: pass overwrite=True to "
                                      "replace it, or choose another folder")
        config = {"sink_size": self.sink_size, "recent_size": self.recent_size, "order": self.order,
                  "scores": "the kv head's rank in the order, scaled to [0, 1]: the lowest stream first",
                  **self.settings, "written_by": _WRITER}
        rows = "".join("\t".join(repr(float(x)) for x in row) + "\n" for row in self.scores.double().tolist())
        try:
            with atomic_folder(folder) as tmp:
                (tmp / "config.json").write_text(json.dumps(config, indent=1), encoding="utf-8")
                (tmp / "full_attention_heads.tsv").write_text(rows, encoding="utf-8")
        except OSError as exc:
            raise TLGeometryError(f"cannot write {folder} ({exc.strerror or exc}): choose a writable folder") from None
        return folder

    @classmethod
    def load(cls, folder: str | Path) -> DuoAttentionPattern:
        """A pattern folder (tl-geometry's or DuoAttention's own), checked: integer sizes, one row
        of finite scores in [0, 1] per layer, as many columns in each."""
        folder = Path(folder).expanduser()
        try:
            config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
            lines = (folder / "full_attention_heads.tsv").read_text(encoding="utf-8").split("\n")
        except (OSError, ValueError) as exc:
            raise TLGeometryError(f"cannot read the DuoAttention pattern in {folder} ({exc})") from None
        sizes = [config.get(key) if isinstance(config, dict) else None for key in ("sink_size", "recent_size")]
        if not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in sizes) or sizes[1] < 1:
            raise TLGeometryError(f"{folder / 'config.json'} needs integer sink_size ≥ 0 and recent_size ≥ 1")
        try:
            rows = [[float(cell) for cell in line.split("\t")] for line in lines if line.strip()]
        except ValueError:
            rows = []
        if not rows or len({len(row) for row in rows}) != 1 or not all(
                math.isfinite(x) and 0 <= x <= 1 for row in rows for x in row):
            raise TLGeometryError(f"{folder / 'full_attention_heads.tsv'} must hold one row per layer of scores in "
                                  "[0, 1], the same number in each row")
        settings = {k: v for k, v in config.items() if k not in ("sink_size", "recent_size", "order", "scores")}
        return cls(sizes[0], sizes[1], torch.tensor(rows, dtype=torch.float64), str(config.get("order", "?")), settings)


def _written_by_us(folder: Path) -> bool:
    try:
        return json.loads((folder / "config.json").read_text(encoding="utf-8")).get("written_by") == _WRITER
    except (OSError, ValueError, AttributeError):
        return False


def duo_attention_pattern(curve: StreamingCurve, order: str | None = None) -> DuoAttentionPattern:
    """The pattern that streams ``curve``'s kv heads in ``order`` (default: the best order it
    measured, the smallest area above the oracle; without the oracle, ``"taxonomy"`` where measured):
    at ``head_compression_ratio = f`` kvpress streams the heads the curve streamed at fraction ``f``."""
    orders = {name: o for name, o in curve.orders.items() if name != "random"}
    if not orders:
        raise TLGeometryError("this streaming curve keeps no order of kv heads (read back from streaming.csv, or "
                              "only random orders): measure one with tlg.intervene.streaming_curve")
    if order is None:
        areas = curve.area_to_oracle()
        order = (min(orders, key=lambda name: areas[name]) if areas else
                 "taxonomy" if "taxonomy" in orders else next(iter(orders)))
    if order not in orders:
        raise TLGeometryError(f"order {order!r} was not measured in this curve; it has {', '.join(orders)}")
    layers, kv = curve.needs[order].shape
    rank = torch.empty(layers * kv, dtype=torch.float64)
    rank[orders[order].flatten()] = torch.arange(layers * kv, dtype=torch.float64) / max(layers * kv - 1, 1)
    settings = {"model": curve.settings.get("model"), "n_kv_heads": kv, "seq_len": curve.settings.get("seq_len"),
                "area_above_oracle": curve.area_to_oracle().get(order)}
    return DuoAttentionPattern(int(curve.settings["sink"]), int(curve.settings["window"]), rank.reshape(layers, kv),
                               order, settings)
