"""The result of :func:`~tl_geometry.analyze`: :class:`Analysis` (geometry, taxonomy, head types),
its per-head table with your own columns beside it, regime means, merging, and the run folder it
saves to and loads from."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, NamedTuple

import torch
from torch import Tensor

from ..errors import TLGeometryError
from ..heads import head_columns, head_name, kv_to_query_heads, parse_head, parse_heads
from ..io import check_sealed
from ..label.head_types import HEAD_TYPES, HEAD_TYPES_FILE, HeadTypes
from ..label.taxonomy import REGIME_MEANING, REGIMES, HeadTaxonomy, regime_gloss
from ..measure.votes import VOTES
from .geometry import GeometryResult

__all__ = ["Analysis", "READABLE_COLUMNS", "PerHead"]

# heads_table()'s default columns, in order (those the run has), before the main F gaps: what each
# label is and means, how sure it is, the familiar type beside it, and the sink.
READABLE_COLUMNS = ("name", "regime", "meaning", "share", "share_low", "share_high", "n_votes", "label_uncertain",
                    "head_type", "dominant_offset", "sink_mass", "norm_ratio")


class PerHead(NamedTuple):
    """A caller's per-head values on the ``[n_layers, n_heads]`` grid, and whether they were given
    per kv head."""

    tensor: Tensor
    per_kv: bool


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

    def heads_at_a_glance(self, k: int = 3):
        """The surest heads of each regime (up to ``k``: :meth:`HeadTaxonomy.clearest`), one row each:
        ``regime`` and its meaning, ``head``, the ``share`` of its queries the label's source wins
        with its Wilson 95% ``interval``, its ``queries`` (votes), and its TransformerLens
        ``head type`` where head types are attached (``"—"``: none of the familiar types)."""
        import pandas as pd

        tax = self.taxonomy
        low, high = tax.share_interval
        types = self.head_types.labels() if self.head_types is not None else None
        rows = []
        for i, (regime, chosen) in enumerate(tax.clearest(k).items()):
            for layer, head in chosen:
                row = {"regime": regime_gloss(regime), "head": head_name(layer, head),
                       "share": f"{float(tax.shares[layer, head, i]):.0%}",
                       "95% interval": f"{float(low[layer, head]):.1%}–{float(high[layer, head]):.1%}",
                       "queries": f"{int(tax.n_votes[layer, head]):,}"}
                if types is not None:
                    kind = types[layer, head]
                    row["head type"] = "—" if kind == "other" else kind.replace("_", "-")
                rows.append(row)
        columns = ["regime", "head", "share", "95% interval", "queries", *(["head type"] if types is not None else [])]
        return pd.DataFrame(rows, columns=columns)

    def uncertain_heads(self) -> list[str]:
        """Names of the heads whose label could flip within the votes' sampling error."""
        return [head_name(layer, head) for layer, head in self.taxonomy.label_uncertain.nonzero().tolist()]

    def heads_table(self, heads: Any = None, extra: dict[str, Any] | None = None, *, all_columns: bool = False):
        """One row per head, readable at a glance: ``name``, ``regime`` and its ``meaning``, the
        winning vote ``share`` with its Wilson 95% interval (``share_low``, ``share_high``) and
        ``n_votes``, ``label_uncertain`` (the runner-up's interval reaches it: the label could flip
        with other text), ``head_type`` (TransformerLens's, with head types attached), the
        ``dominant_offset`` of its ``other`` winners, the sink's mean ``sink_mass`` and
        ``norm_ratio``, and the top-N minus random F gap at the two smallest N measured (in a
        Euclidean run N = 1 is not: its gap is 0 by definition).

        ``all_columns=True`` gives every column (the run folder's heads.csv): ``layer``, ``head``,
        every vote share (and ``share_sinkless`` where sliding windows hid the sink from some voting
        rows), the head-type scores, F_N top-N / random / gap per N, the sink statistics and the
        certified bounds (a Euclidean run's ``@1`` columns too, which its definition fixes: F = 1,
        the gap 0, unless two contributions coincide; docs/metrics.md). Rows are layer-major (L0H0, L0H1, …,
        TransformerLens's flat head index); ``heads`` keeps those heads only, in their order (pairs,
        ``"L3H4"`` names, flat indices, a boolean ``[n_layers, n_heads]`` mask). ``extra`` joins
        columns of your own by head, whatever ``heads`` selects: ``{"patch": tensor}`` with one
        value per head (``[n_layers, n_heads]`` or flat, layer-major) or per kv head
        (``[n_layers, n_kv_heads]`` under GQA: each query head gets its kv head's value, said in
        ``frame.attrs["per_kv_head"]``), e.g. an activation-patching result. ``frame.attrs`` says
        too what the labels rest on (``basis``), whether the windows start with BOS (``bos``,
        ``windows_without_bos``) and which layers slide (``sliding_windows``)."""
        import pandas as pd

        layers, heads_per_layer = self.taxonomy.shape
        table = self._columns(all_columns)
        per_kv = []
        for name, values in (extra or {}).items():
            if name in table:
                raise TLGeometryError(f"extra column {name!r} is one of the table's own: name it otherwise.")
            per_head = self.per_head(values, f"extra[{name!r}]")
            table[name] = per_head.tensor.reshape(-1).numpy()
            per_kv += [name] if per_head.per_kv else []
        frame = pd.DataFrame(table)
        geo = self.geometry
        frame.attrs.update(basis=self.taxonomy.basis, bos=geo.bos_line(), windows_without_bos=geo.windows_without_bos,
                           sliding_windows=dict(geo.settings.get("sliding_windows") or {}))
        if per_kv:
            frame.attrs["per_kv_head"] = (f"{', '.join(per_kv)}: one value per kv head, given to each query head "
                                          f"that reads it (query head h reads kv head h // {self._group()})")
        if heads is None:
            return frame
        return frame.iloc[[a * heads_per_layer + b for a, b in parse_heads(heads, layers, heads_per_layer)]]

    def _columns(self, all_columns: bool) -> dict[str, Any]:
        """The heads table's columns by name: every one, or the readable few (:meth:`heads_table`)."""
        import pandas as pd

        geo, tax = self.geometry, self.taxonomy
        layers, heads_per_layer = tax.shape
        table: dict[str, Any] = head_columns(layers, heads_per_layer)
        table["regime"] = tax.labels.reshape(-1)
        table["meaning"] = [REGIME_MEANING[regime] for regime in table["regime"]]
        table["share"] = tax.shares.amax(-1).reshape(-1).double().numpy()
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
                table[f"{metric}@{n}"] = values[:, index].double().numpy()
        if all_columns:
            return table
        # Euclidean N = 1 selects the aggregate itself: its gap is 0 by definition (docs/metrics.md)
        measured = [n for n in geo.n if not (n == 1 and geo.settings.get("distance") == "euclidean")]
        return {name: table[name] for name in (*READABLE_COLUMNS, *(f"gap@{n}" for n in measured[:2])) if name in table}

    def _group(self) -> int:
        """Query heads per kv head (1 without GQA; the run's settings record the kv heads)."""
        return self.taxonomy.shape[1] // int(self.geometry.settings.get("n_kv_heads") or self.taxonomy.shape[1])

    def per_head(self, values: Any, what: str = "values") -> PerHead:
        """A per-head quantity of the caller's on the ``[n_layers, n_heads]`` grid (float64), from that
        shape, the flat layer-major ``[n_layers·n_heads]``, or one value per kv head (``[n_layers,
        n_kv_heads]`` or flat) under GQA; else one line saying what fits, naming ``what``."""
        layers, heads = self.taxonomy.shape
        kv = heads // self._group()
        tensor = torch.as_tensor(values).detach().cpu()
        real = not (tensor.is_complex() or tensor.dtype == torch.bool)
        for width, per_kv in {heads: False, kv: True}.items():  # one entry without GQA
            if real and tensor.numel() == layers * width and (tensor.ndim == 1 or tuple(tensor.shape) == (layers, width)):
                tensor = tensor.double().reshape(layers, width)
                return PerHead(kv_to_query_heads(tensor, heads) if per_kv else tensor, per_kv)
        kv_too = f" or per kv head [{layers}, {kv}]" if kv != heads else ""
        raise TLGeometryError(f"{what} must be one number per head, [n_layers, n_heads] = [{layers}, {heads}] "
                              f"(or flat [{layers * heads}], layer-major){kv_too}; got shape {list(tensor.shape)}"
                              f"{'' if real else ' of booleans' if tensor.dtype == torch.bool else ' of complex numbers'}.")

    def regime_means(self, metric: str | Any):
        """A per-head quantity aggregated within each regime. ``metric`` a geometry metric's name
        (e.g. ``"align_sink"`` for C7): its mean, a DataFrame indexed by regime with one column per
        N where the metric has an N axis. Or a tensor of your own, ``[n_layers, n_heads]`` (or flat,
        layer-major), e.g. an activation-patching result: columns ``count``, ``mean`` and ``sum``
        (NaN entries skipped)."""
        import pandas as pd

        if not isinstance(metric, str):
            values = self.per_head(metric, "regime_means' tensor").tensor
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
