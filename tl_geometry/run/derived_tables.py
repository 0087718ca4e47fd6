"""The tables derived from an analysis (``pruning.csv``, ``single_head_scan.csv``, ``topn.csv``,
``streaming.csv``): their columns, the values each column may hold, and the command that writes
them. A table is checked row by row where it is read, so a header-only file, a short row or a
value out of range is one line that names the file, the line and the command to rerun, never a
crash or a silently wrong plot."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..config import STREAMING_ORDERS
from ..errors import TLGeometryError
from ..heads import head_columns

if TYPE_CHECKING:
    import pandas as pd
    from torch import Tensor

__all__ = ["DerivedTable", "DERIVED_TABLES", "read_table", "scan_frame", "topn_frame"]


@dataclass(frozen=True)
class Column:
    """What one column holds: ``check`` says whether a value fits, ``means`` says it in words;
    ``text``: its values are words (else a cell pandas left as text is read as a number first)."""

    check: Callable[[Any], bool]
    means: str
    text: bool = False


def _cell(value: Any, column: Column) -> Any:
    """A cell as its column means it: one bad cell makes pandas read a whole numeric column as text,
    so its other cells are parsed back (only the bad one is then reported, on its own line)."""
    if column.text or not isinstance(value, str):
        return value
    if value in ("True", "False"):
        return value == "True"
    try:
        number = float(value)
    except ValueError:
        return value
    return int(number) if number.is_integer() and "." not in value and "e" not in value.lower() else number


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and not math.isnan(value)


def _integer_at_least(low: int) -> Column:
    return Column(lambda v: _number(v) and float(v).is_integer() and v >= low, f"an integer ≥ {low}")


TEXT = Column(lambda v: isinstance(v, str) and bool(v), "text", text=True)
REAL = Column(lambda v: _number(v) and math.isfinite(v), "a finite number")
POSITIVE = Column(lambda v: _number(v) and 0 < v < math.inf, "a positive number")
SHARE = Column(lambda v: _number(v) and 0 < v <= 1, "a share in (0, 1]")
RETENTION = Column(lambda v: _number(v) and 0 <= v <= 1, "a share in [0, 1]")
FLAG = Column(lambda v: isinstance(v, bool) or v in (0, 1), "True or False")


def _one_of(names: tuple[str, ...], what: str) -> Column:
    return Column(lambda v: v in names, f"{what} ({', '.join(names)})", text=True)


@dataclass(frozen=True)
class DerivedTable:
    """A derived table: the command that writes it, its required columns (others may follow), the
    columns that name a row (no two rows alike), and what makes it whole: every group of ``group``
    columns holds the same ``within`` values (no hole in a curve), ``constant`` columns hold one
    value on every row (one run's), and ``heads``: a row for every head of the analysis."""

    command: str
    columns: dict[str, Column]
    key: tuple[str, ...]
    group: tuple[str, ...] = ()
    within: str = ""
    constant: tuple[str, ...] = ()
    heads: bool = False


DERIVED_TABLES: dict[str, DerivedTable] = {
    "pruning.csv": DerivedTable("tl-geometry prune", {"method": TEXT, "retention": RETENTION, "delta_nll": REAL},
                                ("method", "retention"), ("method",), "retention"),
    "single_head_scan.csv": DerivedTable("tl-geometry prune", {"layer": _integer_at_least(0), "head": _integer_at_least(0),
                                                               "name": TEXT, "delta_nll": REAL}, ("layer", "head"),
                                         constant=("scan_windows", "scan_seq_len"), heads=True),
    "topn.csv": DerivedTable("tl-geometry prune", {"n": _integer_at_least(1), "delta_nll": REAL, "renormalise": FLAG},
                             ("n", "renormalise"), ("renormalise",), "n"),
    "streaming.csv": DerivedTable("tl-geometry stream", {
        "order": _one_of(STREAMING_ORDERS, "a streaming order"),
        "seed": _integer_at_least(0), "fraction": SHARE, "delta_nll": REAL,
        "window": _integer_at_least(1), "sink": _integer_at_least(0), "seq_len": _integer_at_least(2),
        "n_kv_total": _integer_at_least(1), "baseline_nll": POSITIVE}, ("order", "seed", "fraction"),
        ("order", "seed"), "fraction", ("window", "sink", "seq_len", "n_kv_total", "baseline_nll")),
}


def read_table(path: Path, heads: tuple[int, int] | None = None) -> pd.DataFrame:
    """The derived table at ``path`` (named as in :data:`DERIVED_TABLES`), checked row by row and
    whole (:class:`DerivedTable`; ``heads``: the analysis's ``(n_layers, n_heads)``): one
    :class:`TLGeometryError` names the file, the line and the command that rewrites it."""
    import pandas as pd

    table = DERIVED_TABLES[path.name]
    rerun = f"rerun {table.command}"
    try:
        frame = pd.read_csv(path, keep_default_na=False, na_values=[""])
    except (OSError, ValueError) as exc:  # pandas' EmptyDataError and ParserError are ValueErrors
        raise TLGeometryError(f"cannot read {path} ({str(exc).strip() or type(exc).__name__}): {rerun}") from None
    missing = [name for name in table.columns if name not in frame.columns]
    if missing:
        raise TLGeometryError(f"{path} lacks the columns {', '.join(missing)}: it was not written by "
                              f"{table.command}; {rerun}")
    if frame.empty:
        raise TLGeometryError(f"{path} has no rows (only its header): {rerun}")
    for name, column in table.columns.items():
        values = frame[name].tolist()
        for row, value in enumerate(values):
            value = _cell(value, column)
            if isinstance(value, float) and math.isnan(value):
                value = None  # an empty cell: a short or damaged row
            if value is None or not column.check(value):
                shown = "nothing" if value is None else repr(value)
                raise TLGeometryError(f"{path}, line {row + 2}: column {name!r} must hold {column.means}, not {shown}: "
                                      f"{rerun}")
    repeated = frame.duplicated(list(table.key))
    if bool(repeated.any()):
        row = int(repeated.to_numpy().argmax())
        raise TLGeometryError(f"{path}, line {row + 2}: a second row for the same {', '.join(table.key)}: {rerun}")
    _check_whole(path, frame, table, heads, rerun)
    return frame


def _check_whole(path: Path, frame: pd.DataFrame, table: DerivedTable, heads: tuple[int, int] | None,
                 rerun: str) -> None:
    """One run's table, with no hole: see :class:`DerivedTable`."""
    for name in table.constant:
        if name in frame.columns and frame[name].nunique(dropna=False) > 1:
            raise TLGeometryError(f"{path}: column {name!r} differs between rows ({', '.join(map(str, frame[name].unique()[:3]))}"
                                  f"): rows of several runs; {rerun}")
    if table.group:
        expected = set(frame[table.within])
        for group, rows in frame.groupby(list(table.group)):
            missing = sorted(expected - set(rows[table.within]))
            if missing:
                raise TLGeometryError(f"{path}: {', '.join(table.group)} {group} has no row for {table.within} "
                                      f"{missing[0]}: the table is incomplete; {rerun}")
    if table.heads and heads is not None:
        have = set(zip(frame["layer"].astype(int), frame["head"].astype(int), strict=True))
        missing = [(layer, head) for layer in range(heads[0]) for head in range(heads[1]) if (layer, head) not in have]
        if missing or len(have) != heads[0] * heads[1]:
            shown = f"L{missing[0][0]}H{missing[0][1]}" if missing else "heads the analysis does not have"
            raise TLGeometryError(f"{path} does not cover the analysis's {heads[0]}×{heads[1]} heads ({shown}): "
                                  f"{rerun}")


def scan_frame(scan: Tensor, shape: tuple[int, int]) -> pd.DataFrame:
    """``single_head_scan.csv``'s rows from a ``[layer, head]`` ΔNLL tensor (one row per head), with the
    scan's windows × tokens (``shape``) on every row: what the ΔNLL was measured on."""
    import pandas as pd

    return pd.DataFrame({**head_columns(*scan.shape), "delta_nll": scan.flatten().double().numpy(),
                         "scan_windows": int(shape[0]), "scan_seq_len": int(shape[1])})


def topn_frame(results: list[Any]) -> pd.DataFrame:
    """``topn.csv``'s rows from :class:`~tl_geometry.intervene.pruning.TopNDeletion` results (one row
    per N and renormalisation)."""
    import pandas as pd

    return pd.DataFrame([{"n": n, "delta_nll": float(d), "renormalise": result.renormalise}
                         for result in results for n, d in zip(result.n, result.delta_nll, strict=True)])
