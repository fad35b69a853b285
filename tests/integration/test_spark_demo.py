"""``lowtide demo --spark`` end to end, small: both ways through ``format("lowtide")``, exact."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from lowtide.clients.demos.spark import run

pytest.importorskip("pyspark")
pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("spark")]


@pytest.mark.parametrize("sink", ["lowtide", "foreachBatch"])
def test_the_spark_demo_is_exact(sink: str) -> None:
    out = io.StringIO()
    summary = run(files=3, rows=20_000, workers=1, sink=sink, console=Console(file=out, width=200))
    assert summary["exact"] == 1.0, out.getvalue()
    assert (summary["rows"], summary["micro_batches"]) == (60_000, 3)
    assert "the same rows" in out.getvalue()
