"""``lowtide demo`` (the server demo) reports the tuples it sent, all of them (issue 22, item 7).

A short, slow run of the demo's own code path: its server, its three producer processes, its
subscriptions. The count it reports must be every tuple the links generated, twice (each link
feeds its own stream and Main), whatever the server's once-a-second metrics snapshot says.
"""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from lowtide.clients.demos import server as server_demo
from lowtide.clients.demos.in_process import LINKS, link_ticks

pytestmark = pytest.mark.integration

SECONDS, RATE = 3, 2_000


def test_the_demo_reports_every_tuple_it_sent() -> None:
    expected = sum(
        2 * len(tick.batch["ts"])
        for link in LINKS
        for tick in link_ticks(link, SECONDS, RATE)
        if tick.batch is not None
    )
    output = io.StringIO()
    summary = server_demo.run(SECONDS, RATE, workers=1, console=Console(file=output, width=200))
    assert (summary["sent"], summary["tuples"]) == (expected, expected), output.getvalue()
    text = output.getvalue()
    assert f"{expected:,} tuples acknowledged by the server (of {expected:,} sent)" in text
    assert "waits behind the batches queued" in text  # what the latency figure is
