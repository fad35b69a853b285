"""The dissertation's queries (tests/data/thesis.sql), by label, and the packet schema of the
streams they read."""

from __future__ import annotations

from pathlib import Path

from lowtide.query import split_statements

THESIS_SQL = Path(__file__).resolve().parent / "data" / "thesis.sql"
# The streams' schema (thesis.sql's header); S0 and S1 add flags: string.
PACKET = {
    "srcIP": "string",
    "srcPort": "int32",
    "destIP": "string",
    "destPort": "int32",
    "len": "int32",
    "ts": "timestamp[ms]",
}


def packet_schema(stream: str) -> dict[str, str]:
    return {**PACKET, "flags": "string"} if stream in ("S0", "S1") else PACKET


def thesis_queries() -> dict[str, str]:
    """Each statement by the label of the last ``-- Qn-m:`` comment above it (``Q5-2``)."""
    labelled: dict[str, str] = {}
    for chunk in THESIS_SQL.read_text().split(";"):
        labels = [line[3:].split(":")[0] for line in chunk.splitlines() if line.startswith("-- Q")]
        statements = split_statements(chunk)
        if statements:
            labelled[labels[-1]] = statements[0]
    return labelled
