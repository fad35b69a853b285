"""The operator graph of a query while it is described: nodes in plan order, its inputs and
who judges their tuples behind punctuation. Invariant: a node is fed only by nodes before it,
so taking the last node off (a fused aggregate running the WHERE itself) renumbers nothing."""

from __future__ import annotations

from dataclasses import dataclass, field

from lowtide.query.description import InputDescription, LateJudge, Node, NodeKind
from lowtide.query.sharing import ShareDescription


@dataclass
class Graph:
    nodes: list[Node] = field(default_factory=list)
    inputs: list[InputDescription] = field(default_factory=list)
    share: ShareDescription | None = None  # the slices its Paned-WID makes or reads

    def add(self, kind: NodeKind, *sources: int) -> int:
        """Add a node fed by ``sources`` (one per input port); returns its index."""
        assert all(s < len(self.nodes) for s in sources)
        self.nodes.append(Node(kind, sources))
        return len(self.nodes) - 1

    def pop(self) -> Node:
        """Take the last node off (nothing reads it yet)."""
        return self.nodes.pop()

    def add_input(self, stream: str, node: int) -> None:
        self.inputs.append(InputDescription(stream, node))

    def judge(self, inputs: list[InputDescription], judge: LateJudge, numbers_rows: bool = False) -> None:
        """``judge`` counts the tuples behind punctuation of ``inputs`` (see InputDescription)."""
        chosen = {i.node for i in inputs}
        self.inputs = [
            InputDescription(i.stream, i.node, judge, numbers_rows) if i.node in chosen else i
            for i in self.inputs
        ]


__all__ = ["Graph"]
