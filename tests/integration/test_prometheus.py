"""A real Prometheus scrapes a real ServerMetrics exposition and answers queries about lowtide.

The exposition is served from this test process, its snapshot read from a real in-process
``lowtide.Engine`` that ingested data (the end-to-end server test is elsewhere). Prometheus is the
Debian package (``.ci/run`` installs it; without it these tests skip and say how to install it),
run on a temporary config and storage, listening on and scraping 127.0.0.1 only.
"""

from __future__ import annotations

import contextlib
import json
import math
import re
import shutil
import subprocess
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest
from server_harness import free_port

from lowtide import Engine
from lowtide.server.metrics import ServerMetrics, snapshot_from_engine_stats

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "dashboards" / "lowtide.json"
WAIT = 60.0  # seconds: any wait on Prometheus fails with a clear message past this
INSTALL_COMMAND = "sudo apt-get install -y --no-install-recommends prometheus"
T = TypeVar("T")


# -- Prometheus, found and run -----------------------------------------------------------------------
def _run(command: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        return subprocess.CompletedProcess(command, 124, "", f"timed out after {exc.timeout:.0f} s")


def find_prometheus() -> Path:
    """The ``prometheus`` binary on PATH (``.ci/run`` installs it); tests never install packages."""
    found = shutil.which("prometheus")
    if found is None:
        pytest.skip(f"prometheus is not installed: run `{INSTALL_COMMAND}` (as .ci/run does)")
    return Path(found)


def wait_for(what: str, probe: Callable[[], T | None], diagnostics: Callable[[], str] = lambda: "") -> T:
    """Call ``probe`` until it returns something other than None, for at most WAIT seconds."""
    deadline = time.monotonic() + WAIT
    last_error = ""
    while True:
        try:
            value = probe()
            if value is not None:
                return value
        except (OSError, ValueError, KeyError) as exc:  # not up yet, or not scraped yet
            last_error = f" (last error: {exc})"
        if time.monotonic() > deadline:
            pytest.fail(f"gave up after {WAIT:.0f} s waiting for {what}{last_error}{diagnostics()}")
        time.sleep(0.25)


@dataclass
class Prometheus:
    url: str
    process: subprocess.Popen[bytes]
    log: Path

    def tail(self) -> str:
        lines = self.log.read_text(errors="replace").splitlines() if self.log.exists() else []
        return "\nprometheus log:\n" + "\n".join(lines[-20:])

    def get(self, path: str, **params: str) -> Any:
        if self.process.poll() is not None:
            pytest.fail(f"prometheus exited with status {self.process.returncode}{self.tail()}")
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        with urllib.request.urlopen(f"{self.url}{path}{query}", timeout=10) as response:
            return json.loads(response.read())

    def query(self, promql: str) -> list[dict[str, Any]]:
        answer = self.get("/api/v1/query", query=promql)
        assert answer["status"] == "success", answer
        result: list[dict[str, Any]] = answer["data"]["result"]
        return result


@contextlib.contextmanager
def run_prometheus(binary: Path, workdir: Path, metrics_port: int) -> Iterator[Prometheus]:
    """Prometheus on 127.0.0.1 with one job, ``lowtide``, scraping 127.0.0.1:<metrics_port> every 1 s."""
    config = workdir / "prometheus.yml"
    config.write_text(
        "global:\n"
        "  scrape_interval: 1s\n"
        "  scrape_timeout: 1s\n"
        "  evaluation_interval: 1s\n"
        "scrape_configs:\n"
        "  - job_name: lowtide\n"
        "    static_configs:\n"
        f"      - targets: ['127.0.0.1:{metrics_port}']\n"
    )
    promtool = shutil.which("promtool")
    if promtool:
        check = _run([promtool, "check", "config", str(config)], WAIT)
        assert check.returncode == 0, check.stdout + check.stderr
    port = free_port()
    log = workdir / "prometheus.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [
                str(binary),
                f"--config.file={config}",
                f"--storage.tsdb.path={workdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--storage.tsdb.retention.time=1h",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=workdir,
        )
    prometheus = Prometheus(f"http://127.0.0.1:{port}", process, log)
    try:

        def ready() -> bool | None:
            if process.poll() is not None:
                pytest.fail(f"prometheus exited with status {process.returncode}{prometheus.tail()}")
            with urllib.request.urlopen(f"{prometheus.url}/-/ready", timeout=5) as response:
                return True if response.status == 200 else None

        wait_for("prometheus to be ready", ready, prometheus.tail)
        yield prometheus
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


@pytest.fixture(scope="module")
def prometheus_binary() -> Path:
    return find_prometheus()


# -- the exposition, fed by a real engine -------------------------------------------------------------
class Fed:
    """A real Engine with one stream and one query, its ServerMetrics served on 127.0.0.1."""

    def __init__(self) -> None:
        self.lock = threading.Lock()  # the snapshot runs on the exposition's HTTP thread
        self.engine = Engine()
        self.engine.create_stream("Main", {"k": "string", "ts": "timestamp[ms]"}, sources=["link-1"])
        self.engine.register_query(
            "SELECT k, count(*) AS n [RANGE 10 s, SLIDE 10 s, WA ts] FROM Main GROUP BY k", name="q1"
        )
        self.metrics = ServerMetrics()
        self.metrics.set_snapshot(self.snapshot)

    def snapshot(self) -> dict[str, Any]:
        with self.lock:
            return snapshot_from_engine_stats(self.engine.stats())

    def push(self, keys: list[str], ts: list[int]) -> None:
        with self.lock:
            start = time.perf_counter()
            self.engine.push("Main", {"k": keys, "ts": ts}, source="link-1")
            self.metrics.ingest_batch("Main", len(keys), time.perf_counter() - start)

    def punctuate(self, value: int) -> None:
        with self.lock:
            start = time.perf_counter()
            self.engine.punctuate("Main", value, source="link-1")
            self.engine.poll("q1")
            self.metrics.punctuation_to_result("q1", time.perf_counter() - start)

    def close(self) -> None:
        with self.lock:
            self.engine.close_source("Main", "link-1")


def sample(result: list[dict[str, Any]]) -> tuple[dict[str, str], str]:
    assert len(result) == 1, result
    return result[0]["metric"], result[0]["value"][1]


def test_prometheus_scrapes_lowtide_metrics(prometheus_binary: Path, tmp_path: Path) -> None:
    fed = Fed()
    fed.push(["a", "b", "a"] * 100, [5, 1000, 2000] * 100)
    fed.push(["c"] * 50, list(range(3000, 3050)))
    fed.punctuate(10_000)
    fed.push(["a"] * 7, [10] * 7)  # late: counted on the stream and dropped by q1
    metrics_port = fed.metrics.serve("127.0.0.1", 0)
    try:
        with run_prometheus(prometheus_binary, tmp_path, metrics_port) as prometheus:
            # Prometheus targets only the exposition on 127.0.0.1, nothing else, and it is up.
            def target_up() -> list[dict[str, Any]] | None:
                targets = prometheus.get("/api/v1/targets")["data"]
                active = targets["activeTargets"]
                return active if active and all(t["health"] == "up" for t in active) else None

            active = wait_for("the lowtide target to be up", target_up, prometheus.tail)
            assert [t["scrapeUrl"] for t in active] == [f"http://127.0.0.1:{metrics_port}/metrics"]
            for target in active:
                assert urllib.parse.urlsplit(target["scrapeUrl"]).hostname == "127.0.0.1"
            assert prometheus.get("/api/v1/targets")["data"]["droppedTargets"] == []
            assert prometheus.get("/api/v1/alertmanagers")["data"]["activeAlertmanagers"] == []

            # The value the engine counted comes back through Prometheus' HTTP API.
            def ingested(expected: float) -> Callable[[], tuple[dict[str, str], str] | None]:
                def probe() -> tuple[dict[str, str], str] | None:
                    result = prometheus.query("lowtide_ingested_tuples_total")
                    if result and float(result[0]["value"][1]) == expected:
                        return sample(result)
                    return None

                return probe

            labels, value = wait_for("lowtide_ingested_tuples_total == 357", ingested(357), prometheus.tail)
            assert float(value) == 357
            assert labels == {
                "__name__": "lowtide_ingested_tuples_total",
                "job": "lowtide",
                "instance": f"127.0.0.1:{metrics_port}",
                "stream": "Main",
            }
            assert float(sample(prometheus.query("lowtide_late_tuples_total"))[1]) == 7
            assert float(sample(prometheus.query('lowtide_query_late_tuples_total{query="q1"}'))[1]) == 7
            assert float(sample(prometheus.query("lowtide_low_watermark"))[1]) == 10_000
            # q1's output punctuation: no more window_end below the next window's end.
            assert float(sample(prometheus.query("lowtide_query_low_watermark"))[1]) == 20_000
            assert float(sample(prometheus.query("lowtide_open_windows"))[1]) == 0
            assert float(sample(prometheus.query("lowtide_state_bytes"))[1]) > 0
            aggregate_in = 'lowtide_operator_tuples_in_total{query="q1", operator="2:WID Aggregate"}'
            # The 7 behind tuples reach the aggregate too, which finds their windows emitted: late.
            assert float(sample(prometheus.query(aggregate_in))[1]) == 357
            assert float(sample(prometheus.query("lowtide_behind_punctuation_tuples_total"))[1]) == 7
            count = "lowtide_punctuation_to_result_seconds_count"
            assert float(sample(prometheus.query(count))[1]) == 1
            assert float(sample(prometheus.query("sum(lowtide_ingest_batch_tuples_sum)"))[1]) == 357

            # Values are read at each scrape: more data shows up, and the end of the stream is +Inf.
            fed.push(["d"] * 43, [12_000] * 43)
            wait_for("lowtide_ingested_tuples_total == 400", ingested(400), prometheus.tail)
            fed.close()

            def ended() -> str | None:
                result = prometheus.query("lowtide_low_watermark")
                return result[0]["value"][1] if result and result[0]["value"][1] == "+Inf" else None

            assert wait_for("lowtide_low_watermark == +Inf", ended, prometheus.tail) == "+Inf"
            assert math.isinf(float(sample(prometheus.query("lowtide_query_low_watermark"))[1]))

            # Every expression of the Grafana dashboard is valid PromQL for a real Prometheus.
            dashboard = json.loads(DASHBOARD.read_text())
            substitutions = {
                "$__rate_interval": "1m",
                "$__range": "1h",
                "$__interval": "15s",
                "$ts_per_second": "1000",
                "$stream": ".*",
                "$query": ".*",
                "$job": "lowtide",
            }
            for panel in dashboard["panels"]:
                for target in panel.get("targets", []):
                    expr = target["expr"]
                    for variable in sorted(substitutions, key=len, reverse=True):
                        expr = expr.replace(variable, substitutions[variable])
                    assert not re.search(r"\$\w", expr), expr
                    try:
                        prometheus.query(expr)
                    except urllib.error.HTTPError as exc:
                        pytest.fail(f"panel {panel['title']!r}: {expr}: {exc.read().decode()}")
            state = 'sum by (query) (lowtide_state_bytes{job=~"lowtide", query=~".*"})'
            assert prometheus.query(state), "the state-bytes panel's query returns no series"
    finally:
        fed.metrics.close()


def test_prometheus_scrapes_a_real_server(prometheus_binary: Path, tmp_path: Path) -> None:
    """``lowtide serve`` with its workers: what the workers counted reaches Prometheus."""
    from server_harness import running_server
    from wire import connect, create_stream, ingest, register, table

    with running_server(workers=2, metrics=True) as server:
        assert server.metrics_url is not None
        metrics_port = urllib.parse.urlsplit(server.metrics_url).port
        assert metrics_port is not None
        stub = connect(server.target)
        schema = {"srcIP": "string", "ts": "int64"}
        create_stream(stub, "Main", schema)
        register(stub, "SELECT srcIP, count(*) AS n [RANGE 1000, WA ts] FROM Main GROUP BY srcIP", "q1")
        rows = [{"srcIP": f"10.0.0.{i % 9}", "ts": i} for i in range(500)]
        late = table(rows[:7], schema)  # below the punctuation that precedes it
        ingest(stub, "Main", "s1", [table(rows, schema), 1_000, late])
        with run_prometheus(prometheus_binary, tmp_path, metrics_port) as prometheus:

            def scraped(promql: str, expected: float) -> Callable[[], float | None]:
                def probe() -> float | None:
                    result = prometheus.query(promql)
                    value = float(result[0]["value"][1]) if result else None
                    return value if value == expected else None

                return probe

            # The front counts ingestion; the workers' operator counts arrive through the front.
            wait_for(
                "ingested == 507",
                scraped('lowtide_ingested_tuples_total{stream="Main"}', 507),
                prometheus.tail,
            )
            wait_for("late == 7", scraped('lowtide_query_late_tuples_total{query="q1"}', 7), prometheus.tail)
            aggregate_in = 'sum(lowtide_operator_tuples_in_total{query="q1", operator="2:WID Aggregate"})'
            # The 7 behind tuples reach the workers' aggregates, which find [0, 1000) emitted: late.
            wait_for("aggregate saw 507", scraped(aggregate_in, 507), prometheus.tail)
            behind = 'lowtide_behind_punctuation_tuples_total{stream="Main"}'
            wait_for("behind == 7", scraped(behind, 7), prometheus.tail)
            latency = 'sum(lowtide_punctuation_to_result_seconds_count{query="q1"})'
            assert wait_for(
                "a latency observation", lambda: prometheus.query(latency) or None, prometheus.tail
            )
