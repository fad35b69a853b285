"""The bracket form plans as it did before lowtide read Flink SQL: ``explain`` of every query of
the dissertation equals, byte for byte, what the planner printed then (tests/data/thesis_plans.txt,
written by lowtide at 113b7fa with this file's engine)."""

from __future__ import annotations

from pathlib import Path

from thesis import PACKET, thesis_queries

from lowtide import Engine

PLANS = Path(__file__).resolve().parent.parent / "data" / "thesis_plans.txt"
PACKET_STREAMS = ["Main", "Main1", "Main2", "Control", "M", "M1", "M2", "A", "B", "C", "D", "packets"]


def _explained() -> str:
    out = []
    for label, sql in sorted(thesis_queries().items()):
        engine = Engine()
        for name in PACKET_STREAMS:
            engine.create_stream(name, PACKET, sources=["link"])
        for name in ("S0", "S1"):
            engine.create_stream(name, {**PACKET, "flags": "string"}, sources=["link"])
        out.append(f"-- {label}\n{engine.explain(sql)}")
    return "\n".join(out) + "\n"


def test_every_thesis_query_plans_as_before() -> None:
    assert _explained() == PLANS.read_text(encoding="utf-8")
