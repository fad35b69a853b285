"""From a parsed window specification to a window of :mod:`lowtide.operators.windows`."""

from __future__ import annotations

from dataclasses import dataclass

from lowtide.errors import UnsupportedQuery
from lowtide.operators.windows import Landmark, Rows, Session, Sliding, Window
from lowtide.punctuation.model import MAX_EXTENT
from lowtide.query.ast import Column, Duration, Rank, RowCount, RowNum, WindowSpec
from lowtide.schema import ColumnType

_UNIT_MS = {"ms": 1.0, "s": 1000.0, "min": 60_000.0, "h": 3_600_000.0, "day": 86_400_000.0}
# Window extents, slides, gaps and lateness in the attribute's units, and row counts: up to
# MAX_EXTENT, so that window arithmetic on the attribute's domain never overflows int64.
_MAX_EXTENT_TEXT = f"2^{MAX_EXTENT.bit_length() - 1}"


def to_units(value: Duration | RowCount, kind: ColumnType, what: str) -> int:
    """A duration in the attribute's units (a bare number already is); must be a positive integer."""
    if isinstance(value, RowCount):
        raise UnsupportedQuery(f"{what} is a number of rows but the window is on {kind.name} values")
    units = value.amount if value.unit is None else value.amount * _UNIT_MS[value.unit] / kind.unit_ms
    if not 0 < units <= MAX_EXTENT:  # NaN and infinity too
        raise UnsupportedQuery(
            f"{what} must be a positive whole number of {kind.unit or 'units'} up to {_MAX_EXTENT_TEXT}, "
            f"got {units:g}"
        )
    whole = round(units)
    if abs(units - whole) > 1e-9 or whole <= 0:
        raise UnsupportedQuery(
            f"{what} must be a positive whole number of {kind.unit or 'units'}, got {units:g}"
        )
    return whole


def rows_of(value: Duration | RowCount | None, what: str) -> int:
    if not isinstance(value, RowCount) or not 0 < value.count <= MAX_EXTENT:
        raise UnsupportedQuery(
            f"{what} of a tuple window must be a positive number of rows, up to {_MAX_EXTENT_TEXT}"
        )
    return value.count


@dataclass(frozen=True)
class SlideByTuple:
    """``[RANGE r, RATTR ra, SLIDE n ROWS, SATTR row-num | rank(ra)]`` (FCA window)."""

    range: int
    rattr: str
    slide_rows: int
    by_rank: bool


def window_of(
    spec: WindowSpec, attribute: str, kind: ColumnType, partition: tuple[str, ...]
) -> Window | SlideByTuple | Session:
    """The window of an aggregation; ``attribute`` is the resolved WA/RATTR column and its type."""
    if spec.session is not None:
        others = spec.range is not None or spec.range_all or spec.slide is not None or spec.pa
        if others or spec.rattr is not None or spec.sattr is not None:
            raise UnsupportedQuery(
                "a session window takes SESSION gap and WA only, e.g. [SESSION 30 seconds, WA ts]"
            )
        if isinstance(spec.wa, RowNum):
            raise UnsupportedQuery("a session window is on a time attribute (WA ts), not on row-num")
        return Session(to_units(spec.session, kind, "SESSION gap"), attribute, spec.touching)
    if spec.rattr is not None or spec.sattr is not None:
        if spec.rattr is None or spec.sattr is None or spec.range is None:
            raise UnsupportedQuery("a slide-by-tuple window needs RANGE, RATTR, SLIDE n ROWS and SATTR")
        if isinstance(spec.sattr, Rank) and spec.sattr.attribute.name != spec.rattr.name:
            raise UnsupportedQuery("SATTR rank() must rank the RATTR attribute")
        slide = rows_of(spec.slide, "SLIDE") if spec.slide is not None else 1
        return SlideByTuple(
            to_units(spec.range, kind, "RANGE"), attribute, slide, isinstance(spec.sattr, Rank)
        )
    if isinstance(spec.wa, RowNum):
        range_rows = rows_of(spec.range, "RANGE")
        slide_rows = rows_of(spec.slide, "SLIDE") if spec.slide is not None else range_rows
        return Rows(range_rows, slide_rows, partition)
    if spec.range_all:
        if spec.slide is None:
            raise UnsupportedQuery("a landmark window (RANGE ALL) needs a SLIDE")
        return Landmark(to_units(spec.slide, kind, "SLIDE"), attribute)
    if spec.range is None:
        raise UnsupportedQuery("the window needs a RANGE")
    size = to_units(spec.range, kind, "RANGE")
    slide = to_units(spec.slide, kind, "SLIDE") if spec.slide is not None and not spec.tumbling else size
    return Sliding(size, slide, attribute)


def window_attribute(spec: WindowSpec) -> Column | RowNum | None:
    """The column a window is on: RATTR for slide-by-tuple windows, else WA."""
    return spec.rattr if spec.rattr is not None else spec.wa
