"""Familiar head types beside the regimes: TransformerLens's previous-token, duplicate-token and
induction scores of every head, on a repeated random sequence.

The scores are those of ``transformer_lens.head_detector.detect_head`` with its defaults
(``error_measure="mul"``): the share of a head's attention, summed over every query of
``BOS + R + R`` (``R`` random tokens), that falls on the entries TransformerLens's own detection
pattern marks (the previous token; earlier copies of the query's token; the token after an
earlier copy). The detection patterns come from ``transformer_lens.head_detector``; the sums
run over every head of a layer at once from one streamed forward. docs/metrics.md ("Familiar
head types") says how they relate to the regimes.

``tlg.analyze(model, ...)`` attaches them itself (``head_types=False`` skips the extra forward);
from a cache, attach them with :meth:`~tl_geometry.run.results.Analysis.with_head_types`:

    >>> res = tlg.analyze(cache, tokens).with_head_types(tlg.head_types(model))  # doctest: +SKIP
    >>> res.heads_table(all_columns=True)[["name", "regime", "dominant_offset", "induction"]]      # doctest: +SKIP

``detect_head`` takes a string and tokenises it again; random token ids decoded to text rarely
tokenise back to themselves (101 ids become 109 on SmolLM2), so compare on one text's tokens:
``tlg.head_types(model, tokens=model.to_tokens(text))`` equals ``detect_head(model, text, ...)``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, get_args

import torch
from jaxtyping import Float, Int
from torch import Tensor

from ..errors import TLGeometryError
from ..heads import head_columns
from ..io import load_tensors, save_tensors

__all__ = ["HeadType", "HEAD_TYPES", "HEAD_TYPES_FILE", "HeadTypes", "head_types", "repeated_random_tokens"]

HeadType = Literal["previous_token", "duplicate_token", "induction"]
HEAD_TYPES: tuple[HeadType, ...] = get_args(HeadType)
# A head "is" a type when its score is at least half the best a head of that type reaches.
DEFAULT_THRESHOLD = 0.5
_KIND = "tl_geometry.HeadTypes"
# Its file in a saved analysis or run folder.
HEAD_TYPES_FILE = "head_types.safetensors"


@dataclass(frozen=True)
class HeadTypes:
    """Per head ``[n_layers, n_heads]`` scores in [0, 1], one tensor per :data:`HeadType`, the
    settings of the sequence they were measured on (``length`` of ``R``, ``seed``) and its token
    ids ``tokens`` ``[1, pos]``, to run any other tool on exactly the same input."""

    previous_token: Float[Tensor, "layer head"]
    duplicate_token: Float[Tensor, "layer head"]
    induction: Float[Tensor, "layer head"]
    settings: dict[str, Any] = field(default_factory=dict)
    tokens: Int[Tensor, "1 pos"] | None = None

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.previous_token.shape)

    def __repr__(self) -> str:
        counts = ", ".join(f"{kind} {int((self.labels() == kind).sum())}" for kind in HEAD_TYPES)
        on = (f"BOS + 2 × {self.settings.get('length')} repeated random tokens" if self.settings.get("length")
              else f"{self.settings.get('n_tokens')} given tokens")
        return (f"HeadTypes({self.shape[0]}×{self.shape[1]} heads on {on}; heads at ≥ {DEFAULT_THRESHOLD} of a "
                f"type's best score: {counts})")

    def scores(self) -> Float[Tensor, "layer head 3"]:
        """The three scores stacked in :data:`HEAD_TYPES` order."""
        return torch.stack([getattr(self, kind) for kind in HEAD_TYPES], dim=-1)

    def labels(self, threshold: float = DEFAULT_THRESHOLD):
        """``[n_layers, n_heads]`` array of the type whose score, as a share of the best a head of
        that type can reach on this sequence (``settings["ceiling"]``), is highest and at least
        ``threshold``; ``"other"`` where none is."""
        import numpy as np

        ceiling = self.settings.get("ceiling", {})
        scores = self.scores() / torch.tensor([ceiling.get(kind, 1.0) for kind in HEAD_TYPES], dtype=torch.float64)
        names = np.array(HEAD_TYPES, dtype=object)[scores.argmax(-1).numpy()]
        names[(scores.max(-1).values < threshold).numpy()] = "other"
        return names

    def to_dataframe(self):
        """One row per head: layer, head, name and the three scores."""
        import pandas as pd

        table: dict[str, Any] = head_columns(*self.shape)
        for kind in HEAD_TYPES:
            table[kind] = getattr(self, kind).reshape(-1).double().numpy()
        return pd.DataFrame(table)

    def crosstab(self, taxonomy, threshold: float = DEFAULT_THRESHOLD):
        """Head counts: regimes (rows, of a :class:`~tl_geometry.label.taxonomy.HeadTaxonomy` of the
        same model) against :meth:`labels` (columns). A DataFrame with margins."""
        import pandas as pd

        from .taxonomy import REGIMES

        if tuple(taxonomy.shape) != self.shape:
            raise TLGeometryError(f"head types of {self.shape[0]}×{self.shape[1]} heads cannot be compared with a "
                                  f"taxonomy of {taxonomy.shape[0]}×{taxonomy.shape[1]}: measure both on one model.")
        regimes = pd.Categorical(taxonomy.labels.reshape(-1), categories=REGIMES)
        kinds = pd.Categorical(self.labels(threshold).reshape(-1), categories=[*HEAD_TYPES, "other"])
        return pd.crosstab(pd.Series(regimes, name="regime"), pd.Series(kinds, name="head type"), margins=True,
                           dropna=False)

    def save(self, path: str | Path) -> None:
        tensors = {kind: getattr(self, kind) for kind in HEAD_TYPES}
        if self.tokens is not None:
            tensors["tokens"] = self.tokens
        save_tensors(path, _KIND, tensors, settings=self.settings)

    @classmethod
    def load(cls, path: str | Path) -> HeadTypes:
        tensors, meta = load_tensors(path, _KIND)
        missing = [kind for kind in HEAD_TYPES if kind not in tensors]
        if missing:
            raise TLGeometryError(f"{path} lacks the scores {', '.join(missing)}: rerun tl-geometry analyze.")
        return cls(**{kind: tensors[kind] for kind in HEAD_TYPES}, settings=meta.get("settings", {}),
                   tokens=tensors.get("tokens"))


def repeated_random_tokens(model: Any, length: int = 50, seed: int = 0) -> Int[Tensor, "1 pos"]:
    """``[1, 1 + 2·length]``: BOS, then ``length`` random token ids (no special tokens) twice."""
    from ..capture.model_info import describe_model

    if isinstance(length, bool) or not isinstance(length, int) or length < 2:
        raise TLGeometryError(f"length must be an int ≥ 2 (random tokens before the repeat), got {length!r}.")
    info = describe_model(model)
    info.check_length(1 + 2 * length)
    tokenizer = getattr(model, "tokenizer", None)
    special = set(getattr(tokenizer, "all_special_ids", None) or [])
    vocab = int(model.cfg.d_vocab)
    pool = torch.tensor([i for i in range(vocab) if i not in special])
    draw = torch.randint(len(pool), (length,), generator=torch.Generator().manual_seed(seed))
    half = pool[draw]
    bos = info.bos_token_id if info.bos_token_id is not None else int(pool[0])
    return torch.cat([torch.tensor([bos]), half, half])[None]


def _detection_patterns(tokens: Int[Tensor, "1 pos"]) -> Float[Tensor, "3 pos pos"]:
    """TransformerLens's own detection patterns of :data:`HEAD_TYPES` for ``tokens``."""
    from transformer_lens import head_detector

    builders = (head_detector.get_previous_token_head_detection_pattern,
                head_detector.get_duplicate_token_head_detection_pattern,
                head_detector.get_induction_head_detection_pattern)
    return torch.stack([build(tokens.cpu()).double() for build in builders])


def auto_length(model: Any) -> int:
    """``length="auto"``: 50 random tokens, or as many as the model's context holds twice after BOS."""
    from ..capture.model_info import describe_model

    n_ctx = describe_model(model).n_ctx
    return 50 if n_ctx is None else min(50, (n_ctx - 1) // 2)


def head_types(model: Any, *, length: int | Literal["auto"] = "auto", seed: int = 0,
               tokens: Int[Tensor, "*one pos"] | None = None, allow_hooks: bool = False) -> HeadTypes:
    """TransformerLens's previous-token, duplicate-token and induction scores of every head
    (``detect_head``'s ``"mul"`` measure: the share of a head's attention on its type's pattern),
    from one forward of :func:`repeated_random_tokens` (``length="auto"``: 50 tokens, fewer where
    the context is shorter), or of your own ``tokens`` ``[1, pos]`` (then equal to ``detect_head``
    on a text whose ``model.to_tokens`` they are). ``tlg.analyze`` attaches them; attach them to
    an analysis of a cache with :meth:`~tl_geometry.run.results.Analysis.with_head_types`.
    ``allow_hooks``: as in ``tlg.analyze``."""
    from ..capture.hooks import warn_hooks_left

    warn_hooks_left(model, allow_hooks)
    if tokens is None:
        length = auto_length(model) if length == "auto" else length
        tokens = repeated_random_tokens(model, length, seed)
        settings: dict[str, Any] = {"length": length, "seed": seed}
    else:
        tokens = _given_tokens(model, tokens)
        settings = {"n_tokens": int(tokens.shape[1])}
    scores, patterns = _scores(model, tokens)
    # The best score a head of each type can reach here: the share of rows its pattern marks
    # (the first copy of R has no earlier duplicate, so induction and duplicate-token stay below 1/2).
    ceiling = patterns.amax(-1).mean(-1)
    return HeadTypes(*scores.unbind(-1), settings={**settings, "error_measure": "mul", "exclude_bos": False,
                                                   "ceiling": dict(zip(HEAD_TYPES, ceiling.tolist(), strict=True))},
                     tokens=tokens.cpu())


def _given_tokens(model: Any, tokens: Any) -> Int[Tensor, "1 pos"]:
    """The caller's token ids as ``[1, pos]`` on the CPU, or one line saying what fits."""
    from ..capture.model_info import describe_model

    ids = torch.as_tensor(tokens).detach().cpu()
    if ids.ndim == 1:
        ids = ids[None]
    if ids.is_floating_point() or ids.dtype == torch.bool or ids.ndim != 2 or ids.shape[0] != 1 or ids.shape[1] < 2:
        raise TLGeometryError(f"head_types' tokens must be the ids of one sequence of ≥ 2 tokens, [1, pos] "
                              f"(e.g. model.to_tokens(text)); got shape {list(ids.shape)} of {ids.dtype}.")
    describe_model(model).check_length(int(ids.shape[1]))
    return ids.long()


def _scores(model: Any, tokens: Int[Tensor, "1 pos"]) -> tuple[Float[Tensor, "layer head 3"], Tensor]:
    """``detect_head``'s "mul" scores of every head on ``tokens`` (one forward), and the patterns."""
    from ..capture.adapters import stream_layers
    from ..capture.model_info import describe_model

    info = describe_model(model)
    patterns = _detection_patterns(tokens)
    scores = torch.full((info.n_layers, info.n_heads, len(HEAD_TYPES)), float("nan"), dtype=torch.float64)

    def score(layer: int, att) -> None:
        attention = att.pattern[0].double().cpu()  # [head, q, k]
        scores[layer] = torch.einsum("hqk,tqk->ht", attention, patterns) / attention.sum((-2, -1))[:, None]

    stream_layers(model, tokens, score, info=info)
    return scores, patterns
