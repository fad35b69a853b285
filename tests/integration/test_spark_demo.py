"""``lowtide demo --spark`` end to end, small: both ways through ``format("lowtide")``, exact."""

from __future__ import annotations

import io
from typing import Any

import pytest
from rich.console import Console
from spark_checks import Sessions

from lowtide.clients.demos.spark import run

pytest.importorskip("pyspark")
pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("spark")]


@pytest.fixture(scope="module")
def spark(spark_sessions: Sessions) -> Any:
    return spark_sessions.get()


@pytest.mark.parametrize("sink", ["lowtide", "foreachBatch"])
def test_the_spark_demo_is_exact(sink: str, spark: Any) -> None:
    out = io.StringIO()
    console = Console(file=out, width=200)
    summary = run(files=3, rows=20_000, workers=1, sink=sink, console=console, spark=spark)
    assert summary["exact"] == 1.0, out.getvalue()
    assert (summary["rows"], summary["micro_batches"]) == (60_000, 3)
    assert "the same rows" in out.getvalue()
