"""The result of :func:`~tl_geometry.analyze`: :class:`Analysis` (geometry, taxonomy, head types),
its per-head table with your own columns beside it, regime means, merging, and the run folder it
saves to and loads from."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from ..errors import TLGeometryError
from ..heads import head_columns, head_name, parse_head, parse_heads
from ..io import check_sealed
from ..label.head_types import HEAD_TYPES, HEAD_TYPES_FILE, HeadTypes
from ..label.taxonomy import REGIMES, HeadTaxonomy
from ..measure.votes import VOTES
from .geometry import GeometryResult

__all__ = ["Analysis", "FIXED_AT_ONE"]

# Euclidean N = 1 selects the aggregate itself: these are 1 (the gap 0) unless contributions coincide.
FIXED_AT_ONE = frozenset({"f_top", "f_random", "gap", "f_nosink", "f_sink_selected", "f_sink_unselected",
                          "precision_bound", "recall_bound"})


@dataclass
class Analysis:
    """Everything one pass measured. ``geometry`` holds separability (top-N vs random), the sink
    diagnostics and the regime certificates per sequence; ``taxonomy`` the head regimes."""

    geometry: GeometryResult
    taxonomy: HeadTaxonomy
    head_types: HeadTypes | None = None

    def __repr__(self) -> str:
        types = (repr(self.head_types) if self.head_types is not None else
                 "None  # not measured (a cache, or head_types=False): res.with_head_types(tlg.head_types(model))")
        return f"Analysis(\n  geometry={self.geometry!r},\n  taxonomy={self.taxonomy!r},\n  head_types={types})"

    def with_head_types(self, head_types: HeadTypes) -> Analysis:
        """This analysis with TransformerLens's head-type scores of the same model attached
        (``tlg.head_types(model)``): they join :meth:`heads_table`, the saved run and the report."""
        if not isinstance(head_types, HeadTypes):
            raise TLGeometryError(f"with_head_types takes tlg.head_types(model), got {type(head_types).__name__}.")
        if head_types.shape != tuple(self.taxonomy.shape):
            raise TLGeometryError(f"head types of {head_types.shape[0]}×{head_types.shape[1]} heads do not fit an "
                                  f"analysis of {self.taxonomy.shape[0]}×{self.taxonomy.shape[1]}: measure both on "
                                  "one model.")
        return replace(self, head_types=head_types)

    def head_profile(self, head: Any) -> str:
        """One line on one head (a pair, ``"L3H4"`` or a flat index): its regime and vote shares,
        the dominant offset of its winners, and with head types attached their scores."""
        layer, index = parse_head(head, *self.taxonomy.shape)
        tax = self.taxonomy
        shares = " ".join(f"{vote} {float(tax.shares[layer, index, i]):.2f}" for i, vote in enumerate(VOTES))
        line = f"{head_name(layer, index)}: {tax.labels[layer, index]} (votes: {shares})"
        if tax.offsets is not None and int(tax.dominant_offset[layer, index]) >= 0:
            offset = int(tax.dominant_offset[layer, index])
            line += f"; other winners most often {offset} token{'s' if offset != 1 else ''} back"
        if self.head_types is not None:
            scores = ", ".join(f"{kind.replace('_', '-')} {float(getattr(self.head_types, kind)[layer, index]):.2f}"
                               for kind in HEAD_TYPES)
            kind = self.head_types.labels()[layer, index]
            line += f"; TransformerLens scores: {scores} ({'no familiar type' if kind == 'other' else kind.replace('_', '-') + ' head'})"
        return line

    def heads_table(self, heads: Any = None, extra: dict[str, Any] | None = None, *, all_columns: bool = False):
        """One row per head: layer, head, name, regime, vote shares (where sliding windows hid the sink
        from some voting rows, ``share_sinkless``: their share of the votes), dominant offset (with head types
        attached: the previous-token / duplicate-token / induction scores and the type), then F_N
        top-N / random / gap per N and, when measured, the sink statistics; ``n_votes``,
        ``share_low``/``share_high`` (the Wilson 95% interval of the winning share) and
        ``label_uncertain`` (the runner-up's interval reaches it) say what each label rests on. A DataFrame whose rows
        are layer-major (L0H0, L0H1, …, the order of TransformerLens's flat head index); ``heads``
        keeps those heads only, in their order (pairs, ``"L3H4"`` names, flat indices, a boolean
        ``[n_layers, n_heads]`` mask: ``heads.parse_heads``). ``extra`` joins columns of your own by
        head, whatever ``heads`` selects: ``{"patch": tensor}`` with a ``[n_layers, n_heads]``
        tensor (or its flat ``[n_layers·n_heads]`` form), e.g. an activation-patching result.
        Columns fixed by the definition are left out unless ``all_columns=True`` (the run folder's
        heads.csv keeps them): in a Euclidean run the ``@1`` columns of F (top, random, without the
        sink, sink selected or not), the gap and the certificates, which are 1 (the gap 0) unless
        two contributions coincide (docs/metrics.md). ``frame.attrs`` says whether the windows
        start with BOS (``bos``, ``windows_without_bos``) and which layers slide
        (``sliding_windows``)."""
        import pandas as pd

        geo, tax = self.geometry, self.taxonomy
        layers, heads_per_layer = tax.shape
        table: dict[str, Any] = head_columns(layers, heads_per_layer)
        table["regime"] = tax.labels.reshape(-1)
        for i, vote in enumerate(VOTES):
            table[f"share_{vote}"] = tax.shares[..., i].reshape(-1).double().numpy()
        # the label's evidence: its votes, the Wilson 95% interval of the winning share, and whether
        # the runner-up's interval reaches it (the label could flip with other windows)
        table["n_votes"] = tax.n_votes.reshape(-1).numpy()
        low, high = tax.share_interval
        table["share_low"], table["share_high"] = low.reshape(-1).numpy(), high.reshape(-1).numpy()
        table["label_uncertain"] = tax.label_uncertain.reshape(-1).numpy()
        if tax.sinkless is not None and bool(tax.sinkless.any()):  # sliding windows: votes without the sink in view
            table["share_sinkless"] = tax.sinkless_share.reshape(-1).numpy()
        offset = tax.dominant_offset.reshape(-1).numpy()
        table["dominant_offset"] = pd.Series(offset, dtype="Int64").where(offset >= 0).array  # NA: no `other` vote
        if self.head_types is not None:
            for kind in HEAD_TYPES:
                table[kind] = getattr(self.head_types, kind).reshape(-1).double().numpy()
            table["head_type"] = self.head_types.labels().reshape(-1)
        by_n = ["f_top", "f_random", "gap"]
        if geo.has_sink:
            for metric in ("norm_ratio", "sink_cosine", "sink_mass", "c_spread", "coherence_max", "regime_holds"):
                table[metric] = geo.mean(metric).reshape(-1).double().numpy()
            by_n += ["f_nosink", "f_sink_selected", "f_sink_unselected", "align_sink", "align_current",
                     "precision_bound", "recall_bound"]
        for metric in by_n:
            values = geo.mean(metric).reshape(layers * heads_per_layer, -1)
            for index, n in enumerate(geo.n):
                if all_columns or not (n == 1 and metric in FIXED_AT_ONE and geo.settings.get("distance") == "euclidean"):
                    table[f"{metric}@{n}"] = values[:, index].double().numpy()
        for name, values in (extra or {}).items():
            if name in table:
                raise TLGeometryError(f"extra column {name!r} is one of the table's own: name it otherwise.")
            table[name] = self._per_head(values, f"extra[{name!r}]").reshape(-1).numpy()
        frame = pd.DataFrame(table)
        frame.attrs.update(bos=geo.bos_line(), windows_without_bos=geo.windows_without_bos,
                           sliding_windows=dict(geo.settings.get("sliding_windows") or {}))
        if heads is None:
            return frame
        return frame.iloc[[a * heads_per_layer + b for a, b in parse_heads(heads, layers, heads_per_layer)]]

    def _per_head(self, values: Any, what: str) -> Tensor:
        """A per-head quantity of the caller's as a float64 ``[n_layers, n_heads]`` tensor (from that
        shape or the flat, layer-major ``[n_layers·n_heads]``), or one line saying what fits."""
        layers, heads = self.taxonomy.shape
        tensor = torch.as_tensor(values).detach().cpu()
        if tensor.is_complex() or tensor.dtype == torch.bool or tensor.numel() != layers * heads or (
                tensor.ndim == 2 and tuple(tensor.shape) != (layers, heads)) or tensor.ndim not in (1, 2):
            raise TLGeometryError(f"{what} must be one number per head, [n_layers, n_heads] = [{layers}, {heads}] "
                                  f"(or flat [{layers * heads}], layer-major); got shape {list(tensor.shape)}"
                                  f"{'' if tensor.dtype != torch.bool else ' of booleans'}.")
        return tensor.double().reshape(layers, heads)

    def regime_means(self, metric: str | Any):
        """A per-head quantity aggregated within each regime. ``metric`` a geometry metric's name
        (e.g. ``"align_sink"`` for C7): its mean, a DataFrame indexed by regime with one column per
        N where the metric has an N axis. Or a tensor of your own, ``[n_layers, n_heads]`` (or flat,
        layer-major), e.g. an activation-patching result: columns ``count``, ``mean`` and ``sum``
        (NaN entries skipped)."""
        import pandas as pd

        if not isinstance(metric, str):
            values = self._per_head(metric, "regime_means' tensor")
            ids = self.taxonomy.label_ids
            rows = {}
            for i, regime in enumerate(REGIMES):
                chosen = values[(ids == i) & ~values.isnan()]
                rows[regime] = [int(chosen.numel()), float(chosen.mean()) if chosen.numel() else float("nan"),
                                float(chosen.sum())]
            return pd.DataFrame.from_dict(rows, orient="index", columns=["count", "mean", "sum"])
        values = self.geometry.mean(metric)
        ids = self.taxonomy.label_ids
        rows = {}
        for i, regime in enumerate(REGIMES):
            chosen = values[ids == i]
            rows[regime] = chosen.nanmean(0).tolist() if chosen.numel() else [float("nan")] * max(1, values[0, 0].numel())
        columns = [f"N={n}" for n in self.geometry.n] if values.ndim == 3 else [metric]
        return pd.DataFrame.from_dict(rows, orient="index", columns=columns)

    def merge(self, other: Analysis) -> Analysis:
        """Results of two disjoint sets of windows (any split, any order) as one run's."""
        return Analysis(self.geometry.merge(other.geometry), self.taxonomy.merge(other.taxonomy),
                        self.head_types if self.head_types is not None else other.head_types)

    def save(self, folder: str | Path, *, overwrite: bool = False) -> None:
        """Write a finished run folder, as ``tl-geometry analyze`` does (results, tables, settings,
        manifest), so ``tl-geometry report``, ``prune``, ``stream``, ``compare`` and
        :meth:`load` take it. ``folder`` must be new, empty or a run folder; a finished analysis
        there is replaced only with ``overwrite=True`` (with the tables derived from it), and a
        folder of other files is refused. Nothing is deleted that tl-geometry did not write."""
        from .run_folder import RunFolder

        run = RunFolder(folder, api=True)
        run.check_new_analysis(overwrite=overwrite, resume=False)
        with run.writing(elsewhere=True):
            run.check_new_analysis(overwrite=overwrite, resume=False)  # again, under the lock
            run.write_analysis(self, self.geometry.settings, {})
            run.drop_stale_checkpoint()  # an interrupted run's state: its analysis is the one replaced

    @classmethod
    def load(cls, folder: str | Path) -> Analysis:
        folder = Path(folder).expanduser()
        check_sealed(folder)  # a run folder: only a finished analysis whose files match its manifest
        geometry = GeometryResult.load(folder / "geometry.safetensors")
        taxonomy = HeadTaxonomy.load(folder / "taxonomy.safetensors")
        heads = (geometry.n_layers, geometry.n_heads) if geometry.per_sequence else None
        if heads is not None and heads != tuple(taxonomy.shape):
            raise TLGeometryError(f"{str(folder)!r} holds results of two analyses: geometry of {heads[0]}×{heads[1]} "
                                  f"heads beside a taxonomy of {taxonomy.shape[0]}×{taxonomy.shape[1]}; rerun "
                                  "tl-geometry analyze into a new folder")
        analysis = cls(geometry, taxonomy)
        if (folder / HEAD_TYPES_FILE).is_file():
            analysis = analysis.with_head_types(HeadTypes.load(folder / HEAD_TYPES_FILE))
        return analysis
