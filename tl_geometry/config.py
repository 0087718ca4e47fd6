"""The run configuration: one frozen, typed value that steers an analysis.

It is what ``tlg.analyze`` builds from its arguments, what ``tl-geometry analyze`` builds from
its flags, what a run saves (``settings.json`` and the results' metadata), the key a checkpoint
must match, and what the report prints. Facts about the model and the windows (name, versions,
corpus) travel beside it as provenance, not as configuration.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, fields
from typing import Any, Literal, get_args

from .errors import TLGeometryError

__all__ = ["RunConfig", "Queries", "Distance", "Ranking", "AblationMode", "ImportanceMethod", "StreamingOrder",
           "STREAMING_ORDERS", "RANDOM_DRAWS"]

# The modes of every public signature, defined once (docs/metrics.md says what each means).
Queries = Literal["last", "all"]
Distance = Literal["euclidean", "cosine"]
Ranking = Literal["attention", "contribution"]
AblationMode = Literal["zero", "mean", "sink", "window"]
ImportanceMethod = Literal["magnitude", "entropy", "gradient", "random", "taxonomy"]
StreamingOrder = Literal["taxonomy", "echo_induction", "entropy", "random", "oracle"]
STREAMING_ORDERS: tuple[str, ...] = get_args(StreamingOrder)
# "auto" random rankings: at least this many draws per (window, head) in total.
RANDOM_DRAWS = 16


def _choice(name: str, value: Any, kind: Any) -> None:
    allowed = get_args(kind)
    if value not in allowed:
        raise TLGeometryError(f"{name} must be one of {', '.join(map(repr, allowed))}; got {value!r}.")


@dataclass(frozen=True)
class RunConfig:
    """How an analysis is run (see ``docs/metrics.md`` for each choice).

    Attributes:
        n: N values (each ≥ 1), the last axis of every per-N result.
        queries: ``"last"`` (the final real query of each window) or ``"all"``.
        taxonomy_queries: queries that vote for the head taxonomy (default every query).
        distance, ranking, exclude_sink: as in :func:`tl_geometry.separability`.
        repeats: random rankings per query, or ``"auto"``: 16 per query with ``queries="last"``,
            otherwise as many per query as give at least 16 draws per (window, head) in total
            (one per query for 256-token windows); 0 skips the random baseline.
        seed: random rankings are seeded per (seed, window, layer).
        bootstrap: replicates of the bootstrap intervals over windows.
        sink: also measure the sink diagnostics, regime fit and certificates.
    """

    n: tuple[int, ...] = (1, 2, 4, 8, 16, 32)
    queries: Queries = "last"
    taxonomy_queries: Queries = "all"
    distance: Distance = "euclidean"
    ranking: Ranking = "attention"
    exclude_sink: bool = False
    repeats: int | Literal["auto"] = "auto"
    seed: int = 0
    bootstrap: int = 2000
    sink: bool = True

    def __post_init__(self) -> None:
        n = (self.n,) if isinstance(self.n, int | float | str) or not isinstance(self.n, Iterable) else tuple(self.n)
        if not n or any(isinstance(x, bool) or not isinstance(x, int) or x < 1 for x in n):
            raise TLGeometryError(f"n must be integers ≥ 1 (N counts the selected sources); got {self.n!r}.")
        object.__setattr__(self, "n", n)
        _choice("queries", self.queries, Queries)
        _choice("taxonomy_queries", self.taxonomy_queries, Queries)
        _choice("distance", self.distance, Distance)
        _choice("ranking", self.ranking, Ranking)
        if self.repeats != "auto" and (isinstance(self.repeats, bool) or not isinstance(self.repeats, int)
                                       or self.repeats < 0):
            raise TLGeometryError(f"repeats must be 'auto' or an int ≥ 0 (0 skips the random baseline); got {self.repeats!r}.")
        for name in ("seed", "bootstrap"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < (1 if name == "bootstrap" else 0):
                raise TLGeometryError(f"{name} must be an int ≥ {1 if name == 'bootstrap' else 0}; got {value!r}.")

    def random_repeats(self, seq_len: int) -> int:
        """Random rankings per query for windows of ``seq_len`` tokens (resolves ``"auto"``)."""
        if self.repeats != "auto":
            return self.repeats
        if self.queries == "last":
            return RANDOM_DRAWS
        return math.ceil(RANDOM_DRAWS / max(1, seq_len - 1))  # queries 1..L-1 have ≥ 2 sources

    def unmeasurable_n(self, seq_len: int) -> tuple[int, ...]:
        """The N values no query of a ``seq_len``-token window can measure: a query needs more
        candidate sources than N (its ``t + 1`` sources, less the sink with ``exclude_sink``)."""
        return tuple(n for n in self.n if n >= seq_len - int(self.exclude_sink))

    def not_measurable(self, seq_len: int) -> list[str]:
        """Why some results of windows of ``seq_len`` tokens will be NaN, one sentence each."""
        reasons = []
        unmeasurable = self.unmeasurable_n(seq_len)
        if unmeasurable:
            reasons.append(f"N = {', '.join(map(str, unmeasurable))}: not measurable, windows of {seq_len} tokens "
                           f"give at most {seq_len - int(self.exclude_sink)} candidate sources (N must be fewer)")
        if self.random_repeats(seq_len) == 0:
            reasons.append("f_random and gap: not measured, the random baseline was skipped (repeats = 0)")
        return reasons

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready values (``n`` as a list)."""
        out = asdict(self)
        out["n"] = list(self.n)
        return out

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> RunConfig:
        """The configuration saved in ``values`` (other keys are ignored; missing ones default)."""
        names = {f.name for f in fields(cls)}
        kwargs = {k: v for k, v in values.items() if k in names}
        if isinstance(kwargs.get("n"), Sequence):
            kwargs["n"] = tuple(kwargs["n"])
        return cls(**kwargs)
