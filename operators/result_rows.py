"""Result rows of the window aggregates: window bounds, group keys, aggregates, revision, HAVING.

Every window aggregate (WID, Paned-WID, Fused WID, AdaptWID) emits the same row layout,
``window_start, window_end, <group columns>, <aggregates>, revision`` in the order of the query's
internal ``columns``, after HAVING has dropped the rows it rejects. A query with early results
(``EMIT EVERY``) has one more column, :data:`FINAL` (bool): false on the rows of a window still
open, true on the row punctuation releases and on its revisions. :class:`ResultRows` holds that
configuration (no state) and turns cells or finalized values into one :class:`Batch`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from lowtide.batch import Batch
from lowtide.operators.aggregates import AggregateCall, CellState
from lowtide.operators.group_table import GroupTable
from lowtide.operators.windows import Landmark, Window
from lowtide.schema import ColumnType

I64 = npt.NDArray[np.int64]
FINAL = "final"  # the column of early results: false on a partial row (EMIT EVERY)
RETRACTED = "retracted"  # the column of sessions under late = update: true on a withdrawn session
Having = Callable[[dict[str, Any]], npt.NDArray[np.bool_]]


def key_columns(keys: I64, names: tuple[str, ...], types: tuple[ColumnType, ...]) -> dict[str, Any]:
    """Result columns of group keys ``[n, k]``, back in their types (floats from bit patterns)."""
    return {
        name: keys[:, j].astype(kind.dtype, copy=False)
        if kind.name != "float64"
        else keys[:, j].view(np.float64)
        for j, (name, kind) in enumerate(zip(names, types, strict=True))
    }


def apply_having(
    having: Having | None, columns: dict[str, Any]
) -> tuple[dict[str, Any], npt.NDArray[np.bool_] | None]:
    """The result rows HAVING keeps, and which they were (None: all)."""
    if having is None:
        return columns, None
    keep = np.asarray(having(columns), dtype=np.bool_)
    kept = {name: v.filter(keep) if hasattr(v, "filter") else v[keep] for name, v in columns.items()}
    return kept, keep


@dataclass(frozen=True)
class ResultRows:
    """How an aggregate's results become rows. ``window`` is the window reported (its bounds);
    ``columns`` the output columns in order; ``decode`` turns string codes back (holistic
    aggregates of strings)."""

    window: Window
    group_columns: tuple[str, ...]
    group_types: tuple[ColumnType, ...]
    calls: tuple[AggregateCall, ...]
    columns: tuple[str, ...]
    having: Having | None = None
    decode: Callable[[I64], Any] | None = None

    def describe(self) -> str:
        """The aggregates and grouping, for ``explain``: ``"n, s by k"``."""
        by = f" by {', '.join(self.group_columns)}" if self.group_columns else ""
        return f"{', '.join(call.describe() for call in self.calls)}{by}"

    def batch(
        self, wids: I64, keys: I64, values: dict[str, Any], revision: I64 | None = None, final: bool = True
    ) -> tuple[Batch, npt.NDArray[np.bool_] | None]:
        """The rows of windows ``wids`` with group keys ``keys`` ``[n, k]`` and aggregate
        ``values`` (revision 0 unless given), and which of them HAVING kept (None: all).
        ``final``: false for the partial rows of open windows."""
        assert not isinstance(self.window, Landmark), "landmark rows come from of_cells"
        return self._batch(self.window.bounds(wids), keys, values, revision, final)

    def of_cells(
        self,
        groups: GroupTable,
        cells: CellState,
        rows: I64,
        gids: I64,
        wids: I64,
        landmark_start: int = 0,
        final: bool = True,
    ) -> Batch:
        """The rows of the cells ``(rows[j], gids[j])`` of windows ``wids``. Revisions, when the
        cells track them (``rev``: the revision last emitted), count up and are updated to the
        rows HAVING lets out - not by partial rows (``final`` false), which leave every cell as
        it was. A landmark window starts at the slide ``landmark_start``."""
        rev = cells.arrays.get("rev")
        revision = rev[rows, gids] + 1 if rev is not None else None
        window = self.window
        if isinstance(window, Landmark):
            start = np.full(wids.shape[0], landmark_start * window.slide, np.int64)
            bounds = (start, (wids + 1) * window.slide)
        else:
            bounds = window.bounds(wids)
        values = cells.finalize(rows, gids, self.decode, self.calls)
        batch, keep = self._batch(bounds, groups.keys[gids], values, revision, final)
        if rev is not None and revision is not None and final:  # a revision counts emitted rows only:
            shown = slice(None) if keep is None else keep  # HAVING may hold one back
            rev[rows[shown], gids[shown]] = revision[shown]
        return batch

    def _batch(
        self,
        bounds: tuple[I64, I64],
        keys: I64,
        values: dict[str, Any],
        revision: I64 | None,
        final: bool = True,
    ) -> tuple[Batch, npt.NDArray[np.bool_] | None]:
        columns: dict[str, Any] = {"window_start": bounds[0], "window_end": bounds[1]}
        columns.update(key_columns(keys, self.group_columns, self.group_types))
        columns.update(values)
        columns["revision"] = revision if revision is not None else np.zeros(keys.shape[0], np.int64)
        if FINAL in self.columns and FINAL not in columns:  # else a column of the query's named so
            columns[FINAL] = np.full(keys.shape[0], final, np.bool_)
        columns, keep = apply_having(self.having, columns)
        size = len(columns["revision"])
        return Batch({name: columns[name] for name in self.columns}, size), keep


__all__ = ["FINAL", "RETRACTED", "Having", "ResultRows", "apply_having", "key_columns"]
