"""A query planned, as data: what :func:`~lowtide.query.describe.describe` decides and
:func:`~lowtide.query.build.build` instantiates.

Invariant: a :class:`PlanDescription` is frozen dataclasses, tuples, strings, numbers and enums
only - no functions, no operators, no pool codes - so it pickles, compares by value, and means
the same in every process. Expressions stay query syntax (:mod:`lowtide.query.ast`) with the
:class:`~lowtide.query.scope.Scope` they resolve in; whoever builds compiles them with its own
string pool. It carries everything the door and a runner need without building anything: the
operator graph (:class:`Node` s in plan order, each naming the nodes that feed its ports), each
input's late rule (:data:`LateJudge`), the result schema, the windows' slides, the share it makes
or reads, and from these the partitioning (:mod:`lowtide.server.partitioning`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TypeAlias

from lowtide.operators.aggregates import AggFunc, AggregateCall
from lowtide.operators.join_windows import JoinSide, JoinWindow
from lowtide.operators.result_queue import SlowFlush
from lowtide.operators.windows import Session, Window, WindowLimits
from lowtide.punctuation.policies import LatePolicy
from lowtide.query.ast import Expr
from lowtide.query.early import Early
from lowtide.query.scope import Scope
from lowtide.query.sharing import ShareDescription
from lowtide.query.windowing import SlideByTuple
from lowtide.schema import ColumnType

Fields: TypeAlias = tuple[tuple[str, ColumnType], ...]  # columns and their types, in order


@dataclass(frozen=True)
class PlanOptions:
    """How a query is planned, besides its text and the catalog: the late policy and lateness
    allowed, the server's window limits and slow flush, the slices a restored query read, and
    two choices of operators that change how fast a query runs, never what it emits."""

    policy: LatePolicy = LatePolicy.DROP
    allowed_lateness: str | int | None = None
    windows: WindowLimits = field(default_factory=WindowLimits)
    flush: SlowFlush | None = None  # smooth emission of time windows; None: all at punctuation
    restored_share: str | None = None  # described again to restore: the slices_key it read
    # Sliding queries fed alike read one set of slices (lowtide.query.sharing); False: each
    # Paned-WID query keeps slices of its own.
    share_slices: bool = True
    # Plain WID updates RANGE / SLIDE cells per tuple; Paned-WID one, plus combining RANGE / pane
    # panes per group when a window closes. Panes pay off once windows overlap this much.
    paned_min_overlap: int = 4

    def __post_init__(self) -> None:
        if self.paned_min_overlap < 1:  # below 1, windows with gaps between them would be paned
            raise ValueError(f"paned_min_overlap is at least 1, not {self.paned_min_overlap}")


@dataclass(frozen=True)
class Where:
    """Conjuncts of a WHERE, over ``scope``."""

    conjuncts: tuple[Expr, ...]
    scope: Scope


@dataclass(frozen=True)
class HavingClause:
    """A HAVING over the result columns ``scope``; ``names``: the aggregates it reads, by column."""

    expr: Expr
    scope: Scope
    names: tuple[tuple[Expr, str], ...]


# -- nodes: one per operator ---------------------------------------------------------------------
@dataclass(frozen=True)
class InputNode:
    """Where ``stream`` enters the query; ``layout``: the stream's columns (its late tuples')."""

    stream: str
    layout: Fields


@dataclass(frozen=True)
class MeldNode:
    inputs: int


@dataclass(frozen=True)
class SelectNode:
    where: Where


@dataclass(frozen=True)
class JoinNode:
    left: JoinSide
    right: JoinSide
    window: JoinWindow
    layouts: tuple[Fields, Fields]  # each side's columns, as its late tuples go to <query>.late


@dataclass(frozen=True)
class BucketNode:
    window: Window
    allowed_lateness: int | None = None


@dataclass(frozen=True)
class SlicesNode:
    width: int
    groups: tuple[str, ...]
    types: tuple[ColumnType, ...]


@dataclass(frozen=True)
class AggregateDescription:
    """One aggregation: what every strategy (:mod:`lowtide.query.strategies`) reads."""

    window: Window | Session | SlideByTuple
    groups: tuple[str, ...]  # GROUP BY columns, then PA columns
    group_types: tuple[ColumnType, ...]
    calls: tuple[AggregateCall, ...]  # select-list aggregates, then those only HAVING reads
    columns: tuple[str, ...]  # the operator's output columns (window_start, ..., revision, ...)
    having: HavingClause | None
    lateness: int | None  # late = update: allowed lateness in the window's units; None: not update
    late_layout: Fields  # the columns its late tuples carry into <query>.late
    limits: WindowLimits


@dataclass(frozen=True)
class AggregateNode:
    """The aggregate ``strategy`` builds; ``where``: the WHERE a fused one runs itself; ``slices``:
    the node of the slices a Paned-WID reads; ``flush``: its slow flush."""

    strategy: str
    aggregate: AggregateDescription
    where: Where | None = None
    slices: int | None = None
    flush: SlowFlush | None = None


@dataclass(frozen=True)
class ProjectNode:
    """Output columns: an expression over ``scope``, or (a str) that input column as it is;
    ``keeps_input``: every input column too (the columns an aggregate computes before it)."""

    columns: tuple[tuple[str, Expr | str], ...]
    scope: Scope
    renames: tuple[tuple[str, str], ...]  # input column -> output name, passed as they are
    keeps_input: bool = False


@dataclass(frozen=True)
class DupElimNode:
    columns: tuple[str, ...]
    attribute: str


@dataclass(frozen=True)
class TopNNode:
    """A Window Top-N (:class:`~lowtide.operators.window_top_n.WindowTopN`): ranks each partition's
    rows by ``order`` (column, descending) once punctuation on ``attribute`` completes it, into
    column ``output``; ``limit``: keeps only ranks up to it; ``tumble``: the size of the TUMBLE
    windows it gives the rows (None: ``attribute`` is their window already); ``whole``: the
    partitions span the whole stream, complete at its end (Flink's Top-N over a stream)."""

    function: str
    partition: tuple[str, ...]
    order: tuple[tuple[str, bool], ...]
    output: str
    attribute: str
    limit: int | None = None
    tumble: int | None = None
    whole: bool = False


NodeKind: TypeAlias = (
    InputNode
    | MeldNode
    | SelectNode
    | JoinNode
    | BucketNode
    | SlicesNode
    | AggregateNode
    | ProjectNode
    | DupElimNode
    | TopNNode
)


@dataclass(frozen=True)
class Node:
    """An operator of the graph; ``sources[p]``: the node feeding its input port ``p``."""

    kind: NodeKind
    sources: tuple[int, ...] = ()


# -- late rules: which tuples behind punctuation are late for the query -----------------------------
@dataclass(frozen=True)
class WindowJudge:
    """A window operator over ``window`` counts the Inputs' tuples behind punctuation; late are
    those it can no longer count at the minimum progress of ``streams`` (what a Meld passes on),
    among those ``where`` keeps (a tuple the WHERE drops is late for no window)."""

    window: Window | Session
    streams: tuple[str, ...]
    where: Where | None


@dataclass(frozen=True)
class JoinJudge:
    """OA-Join counts side ``side``'s tuples behind punctuation (``ts`` their progressing column);
    late are those whose partners may be purged at the bounds of both sides, each the minimum over
    its ``streams``, among those the side's pushed-down ``where`` keeps."""

    window: JoinWindow
    side: int
    ts: str
    streams: tuple[tuple[str, ...], tuple[str, ...]]
    where: Where | None


LateJudge: TypeAlias = WindowJudge | JoinJudge


@dataclass(frozen=True)
class InputDescription:
    """Input ``node`` of the graph, reading ``stream``. ``judge``: who counts its tuples behind
    punctuation (None: none does, they are late at the Input). ``numbers_rows``: it feeds a tuple
    window, which numbers rows as they arrive (see :class:`~lowtide.operators.input.Input`)."""

    stream: str
    node: int
    judge: LateJudge | None = None
    numbers_rows: bool = False


@dataclass(frozen=True)
class PlanDescription:
    """A query planned (see the module). ``nodes`` are in plan order (``explain``, snapshots);
    the last is the output. With a ``share`` it joins, the nodes up to its slices are the share's
    (the live ones are read, not built)."""

    nodes: tuple[Node, ...]
    inputs: tuple[InputDescription, ...]
    schema: Fields
    progressing: tuple[str, ...]
    policy: LatePolicy
    slides: tuple[tuple[str, int], ...] = ()  # stream -> SLIDE of a time window on it
    time_unit: str = ""  # s|ms|us|ns: window bounds are epoch times in this unit; "": plain numbers
    early: Early | None = None  # EMIT EVERY
    share: ShareDescription | None = None
    aligned: tuple[tuple[str, int], ...] = ()  # result columns = progressing[0] + constant

    @property
    def flushes_slowly(self) -> bool:
        """Whether an aggregate of it smooths emission (§8.3.3): its output may leave after the
        punctuation that completed it."""
        return any(isinstance(n.kind, AggregateNode) and n.kind.flush is not None for n in self.nodes)

    @property
    def decodes_strings(self) -> bool:
        """Whether running it turns string codes back into strings (``heavy_hitters`` of a string
        column ranks its hits by their text): its runner then needs every string of the pool,
        where other queries need the codes of their literals alone."""
        return any(
            call.func is AggFunc.HEAVY_HITTERS and call.input_type is not None and call.input_type.is_string
            for node in self.nodes
            if isinstance(node.kind, AggregateNode)
            for call in node.kind.aggregate.calls
        )


__all__ = [
    "AggregateDescription",
    "AggregateNode",
    "BucketNode",
    "DupElimNode",
    "Fields",
    "HavingClause",
    "InputDescription",
    "InputNode",
    "JoinJudge",
    "JoinNode",
    "LateJudge",
    "MeldNode",
    "Node",
    "NodeKind",
    "PlanDescription",
    "PlanOptions",
    "ProjectNode",
    "SelectNode",
    "SlicesNode",
    "TopNNode",
    "Where",
    "WindowJudge",
]
