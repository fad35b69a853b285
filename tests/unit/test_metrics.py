"""ServerMetrics (docs/design.md, "Metrics"): every metric's name, labels and value, as Prometheus
scrapes them."""

from __future__ import annotations

import math
import urllib.error
import urllib.request
from typing import Any

import pytest
from prometheus_client import REGISTRY, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from lowtide import END_OF_STREAM, NO_PROGRESS, Engine
from lowtide.server import metrics as metrics_module
from lowtide.server.metrics import PUNCTUATION_TO_RESULT_BUCKETS, ServerMetrics, snapshot_from_engine_stats

SNAPSHOT: dict[str, Any] = {
    "streams": {
        "Main": {"low_watermark": 1_700_000_000_000, "ingested": 1234, "late": 7},
        "Idle": {"low_watermark": NO_PROGRESS, "ingested": 0, "late": 0},
        "Done": {"low_watermark": END_OF_STREAM, "ingested": 50, "late": 1},
    },
    "queries": {
        "q1": {
            "low_watermark": 1_699_999_990_000,
            "late": 3,
            "open_windows": 12,
            "state_bytes": 4096,
            "operators": [
                (0, "Input", 1234, 1234),
                (1, "Bucket", 1234, 1234),
                (2, "WID Aggregate", 1234, 40),
                (3, "Sink", 40, 0),
            ],
            "status": "running",
        },
        "q2": {
            "low_watermark": NO_PROGRESS,
            "late": 0,
            "open_windows": 0,
            "state_bytes": 0,
            "operators": [(0, "Input", 0, 0)],
            "status": "aborted",
        },
        "q3": {
            "low_watermark": END_OF_STREAM,
            "late": 0,
            "open_windows": 0,
            "state_bytes": 128,
            "operators": [],
        },
    },
    "workers": {0: "localhost", 1: "localhost"},
}

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(metrics: ServerMetrics) -> tuple[str, Samples, dict[str, str]]:
    """The exposition text, its samples by (name, sorted labels), and each family's type."""
    text = generate_latest(metrics.registry).decode()
    samples: Samples = {}
    types: dict[str, str] = {}
    for family in text_string_to_metric_families(text):
        types[family.name] = family.type
        for sample in family.samples:
            key = (sample.name, tuple(sorted(sample.labels.items())))
            assert key not in samples, f"duplicate series {key}"
            samples[key] = sample.value
    return text, samples, types


def series(samples: Samples, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    return {labels: value for (n, labels), value in samples.items() if n == name}


@pytest.fixture
def metrics() -> Any:
    m = ServerMetrics()
    yield m
    m.close()


def test_stream_metrics_from_the_snapshot(metrics: ServerMetrics) -> None:
    metrics.set_snapshot(lambda: SNAPSHOT)
    _, samples, types = scrape(metrics)
    assert types["lowtide_ingested_tuples"] == "counter"
    assert types["lowtide_late_tuples"] == "counter"
    assert types["lowtide_low_watermark"] == "gauge"
    assert series(samples, "lowtide_ingested_tuples_total") == {
        (("stream", "Main"),): 1234,
        (("stream", "Idle"),): 0,
        (("stream", "Done"),): 50,
    }
    assert series(samples, "lowtide_late_tuples_total") == {
        (("stream", "Main"),): 7,
        (("stream", "Idle"),): 0,
        (("stream", "Done"),): 1,
    }
    # NO_PROGRESS: no series at all; END_OF_STREAM: +Inf.
    assert series(samples, "lowtide_low_watermark") == {
        (("stream", "Main"),): 1_700_000_000_000,
        (("stream", "Done"),): math.inf,
    }


def test_query_metrics_from_the_snapshot(metrics: ServerMetrics) -> None:
    metrics.set_snapshot(lambda: SNAPSHOT)
    text, samples, types = scrape(metrics)
    for family in ("lowtide_query_late_tuples", "lowtide_operator_tuples_in", "lowtide_operator_tuples_out"):
        assert types[family] == "counter"
    for family in ("lowtide_query_low_watermark", "lowtide_open_windows", "lowtide_state_bytes"):
        assert types[family] == "gauge"
    assert series(samples, "lowtide_query_late_tuples_total") == {
        (("query", "q1"),): 3,
        (("query", "q2"),): 0,
        (("query", "q3"),): 0,
    }
    assert series(samples, "lowtide_query_low_watermark") == {
        (("query", "q1"),): 1_699_999_990_000,
        (("query", "q3"),): math.inf,
    }
    assert 'lowtide_query_low_watermark{query="q3"} +Inf' in text
    assert 'lowtide_low_watermark{stream="Done"} +Inf' in text
    assert series(samples, "lowtide_open_windows") == {
        (("query", "q1"),): 12,
        (("query", "q2"),): 0,
        (("query", "q3"),): 0,
    }
    assert series(samples, "lowtide_state_bytes") == {
        (("query", "q1"),): 4096,
        (("query", "q2"),): 0,
        (("query", "q3"),): 128,
    }
    assert series(samples, "lowtide_operator_tuples_in_total") == {
        (("operator", "0:Input"), ("query", "q1")): 1234,
        (("operator", "1:Bucket"), ("query", "q1")): 1234,
        (("operator", "2:WID Aggregate"), ("query", "q1")): 1234,
        (("operator", "3:Sink"), ("query", "q1")): 40,
        (("operator", "0:Input"), ("query", "q2")): 0,
    }
    assert series(samples, "lowtide_operator_tuples_out_total") == {
        (("operator", "0:Input"), ("query", "q1")): 1234,
        (("operator", "1:Bucket"), ("query", "q1")): 1234,
        (("operator", "2:WID Aggregate"), ("query", "q1")): 40,
        (("operator", "3:Sink"), ("query", "q1")): 0,
        (("operator", "0:Input"), ("query", "q2")): 0,
    }


def test_query_status_is_one_for_the_status_and_zero_for_the_others(metrics: ServerMetrics) -> None:
    """Each status has a series, so an alert on ``status="aborted"`` sees it go 0 -> 1; a query
    without a status (the in-process engine's) has none."""
    metrics.set_snapshot(lambda: SNAPSHOT)
    _, samples, types = scrape(metrics)
    assert types["lowtide_query_status"] == "gauge"
    assert series(samples, "lowtide_query_status") == {
        (("query", "q1"), ("status", "running")): 1,
        (("query", "q1"), ("status", "recovering")): 0,
        (("query", "q1"), ("status", "aborted")): 0,
        (("query", "q2"), ("status", "running")): 0,
        (("query", "q2"), ("status", "recovering")): 0,
        (("query", "q2"), ("status", "aborted")): 1,
    }


def test_snapshot_is_read_at_each_scrape(metrics: ServerMetrics) -> None:
    calls = []

    def snapshot() -> dict[str, Any]:
        calls.append(1)
        n = len(calls)
        return {"streams": {"S": {"low_watermark": n * 10, "ingested": n * 100, "late": 0}}, "queries": {}}

    metrics.set_snapshot(snapshot)
    _, first, _ = scrape(metrics)
    _, second, _ = scrape(metrics)
    assert series(first, "lowtide_ingested_tuples_total") == {(("stream", "S"),): 100}
    assert series(second, "lowtide_ingested_tuples_total") == {(("stream", "S"),): 200}
    assert series(second, "lowtide_low_watermark") == {(("stream", "S"),): 20}
    assert len(calls) == 2


def test_worker_info_names_each_workers_node_and_only_its_current_one(metrics: ServerMetrics) -> None:
    nodes = [{0: "10.0.0.7", 1: "10.0.0.8"}, {0: "10.0.0.7", 1: "10.0.0.9"}]  # worker 1 placed again
    metrics.set_snapshot(lambda: {"streams": {}, "queries": {}, "workers": nodes.pop(0)})
    _, before, types = scrape(metrics)
    _, after, _ = scrape(metrics)
    assert types["lowtide_worker_info"] == "gauge"
    assert series(before, "lowtide_worker_info") == {
        (("node", "10.0.0.7"), ("worker", "0")): 1,
        (("node", "10.0.0.8"), ("worker", "1")): 1,
    }
    assert series(after, "lowtide_worker_info") == {
        (("node", "10.0.0.7"), ("worker", "0")): 1,
        (("node", "10.0.0.9"), ("worker", "1")): 1,
    }


def test_histograms_observe(metrics: ServerMetrics) -> None:
    metrics.ingest_batch("Main", 1000, 0.002)
    metrics.ingest_batch("Main", 10, 0.0003)
    metrics.ingest_batch("Other", 5, 1.5)
    metrics.punctuation_to_result("q1", 0.0004)
    metrics.punctuation_to_result("q1", 0.003)
    metrics.punctuation_to_result("q1", 20.0)
    _, samples, types = scrape(metrics)
    assert types["lowtide_ingest_batch_seconds"] == "histogram"
    assert types["lowtide_ingest_batch_tuples"] == "histogram"
    assert types["lowtide_punctuation_to_result_seconds"] == "histogram"

    assert series(samples, "lowtide_ingest_batch_seconds_count") == {
        (("stream", "Main"),): 2,
        (("stream", "Other"),): 1,
    }
    assert series(samples, "lowtide_ingest_batch_seconds_sum")[(("stream", "Main"),)] == pytest.approx(0.0023)
    assert series(samples, "lowtide_ingest_batch_tuples_sum") == {
        (("stream", "Main"),): 1010,
        (("stream", "Other"),): 5,
    }

    p2r = series(samples, "lowtide_punctuation_to_result_seconds_bucket")
    buckets = {dict(labels)["le"]: value for labels, value in p2r.items()}
    # Buckets from 0.5 ms to 10 s, then +Inf.
    assert [float(le) for le in buckets] == [*PUNCTUATION_TO_RESULT_BUCKETS, math.inf]
    assert PUNCTUATION_TO_RESULT_BUCKETS[0] == 0.0005 and PUNCTUATION_TO_RESULT_BUCKETS[-1] == 10.0
    assert buckets["0.0005"] == 1
    assert buckets["0.0025"] == 1
    assert buckets["0.005"] == 2
    assert buckets["10.0"] == 2
    assert buckets["+Inf"] == 3
    assert series(samples, "lowtide_punctuation_to_result_seconds_count") == {(("query", "q1"),): 3}
    p2r_sum = series(samples, "lowtide_punctuation_to_result_seconds_sum")
    assert p2r_sum == {(("query", "q1"),): pytest.approx(20.0034)}


def test_worker_restarts(metrics: ServerMetrics) -> None:
    metrics.worker_restarted(0)
    metrics.worker_restarted(1)
    metrics.worker_restarted(1)
    _, samples, types = scrape(metrics)
    assert types["lowtide_worker_restarts"] == "counter"
    assert series(samples, "lowtide_worker_restarts_total") == {
        (("worker", "0"),): 1,
        (("worker", "1"),): 2,
    }


def test_checkpoints(metrics: ServerMetrics) -> None:
    metrics.checkpoint_taken(0.8, 1_000_000, [0.002, 0.003])
    metrics.checkpoint_taken(3.0, 2_500_000, [0.004, 0.0001])
    _, samples, types = scrape(metrics)
    assert types["lowtide_checkpoint_seconds"] == "histogram"
    assert types["lowtide_checkpoint_bytes"] == "gauge"
    assert series(samples, "lowtide_checkpoint_seconds_count") == {(): 2}
    assert series(samples, "lowtide_checkpoint_seconds_sum") == {(): pytest.approx(3.8)}
    assert series(samples, "lowtide_checkpoint_pause_seconds_count") == {(): 4}
    assert series(samples, "lowtide_checkpoint_bytes") == {(): 2_500_000}


def test_forget_drops_histogram_series(metrics: ServerMetrics) -> None:
    metrics.ingest_batch("Main", 1, 0.001)
    metrics.punctuation_to_result("q1", 0.001)
    metrics.forget(stream="Main", query="q1")
    metrics.forget(stream="never-seen")
    _, samples, _ = scrape(metrics)
    assert not series(samples, "lowtide_ingest_batch_seconds_count")
    assert not series(samples, "lowtide_punctuation_to_result_seconds_count")


def test_no_snapshot_and_failing_snapshot(metrics: ServerMetrics) -> None:
    metrics.ingest_batch("Main", 1, 0.001)
    _, samples, _ = scrape(metrics)
    assert not series(samples, "lowtide_ingested_tuples_total")
    assert series(samples, "lowtide_snapshot_errors_total") == {(): 0}

    def broken() -> dict[str, Any]:
        raise RuntimeError("workers unreachable")

    metrics.set_snapshot(broken)
    _, samples, _ = scrape(metrics)
    assert series(samples, "lowtide_snapshot_errors_total") == {(): 1}
    assert not series(samples, "lowtide_ingested_tuples_total")
    assert series(samples, "lowtide_ingest_batch_seconds_count") == {(("stream", "Main"),): 1}


def test_every_name_is_prefixed_documented_and_private_to_the_instance(metrics: ServerMetrics) -> None:
    metrics.set_snapshot(lambda: SNAPSHOT)
    metrics.ingest_batch("Main", 1, 0.001)
    metrics.punctuation_to_result("q1", 0.001)
    metrics.worker_restarted(0)
    _, _, types = scrape(metrics)
    doc = metrics_module.__doc__ or ""
    for family, kind in types.items():
        assert family.startswith("lowtide_"), family
        if family.endswith("_created"):  # prometheus_client's creation-time gauge of each counter/histogram
            continue
        exposed = family + "_total" if kind == "counter" else family
        assert f"``{exposed}" in doc, f"{exposed} is not in server/metrics.py's docstring"
    # Two servers in one process do not collide, and nothing lands in the global registry.
    other = ServerMetrics()
    other.worker_restarted(3)
    assert REGISTRY.get_sample_value("lowtide_worker_restarts_total", {"worker": "0"}) is None
    assert metrics.registry.get_sample_value("lowtide_worker_restarts_total", {"worker": "3"}) is None
    assert other.registry.get_sample_value("lowtide_worker_restarts_total", {"worker": "3"}) == 1


def test_serve_on_a_free_port_and_close(metrics: ServerMetrics) -> None:
    metrics.set_snapshot(lambda: SNAPSHOT)
    port = metrics.serve("127.0.0.1", 0)
    assert port > 0 and metrics.port == port
    with pytest.raises(RuntimeError):
        metrics.serve("127.0.0.1", 0)
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/plain")
        body = response.read().decode()
    assert 'lowtide_ingested_tuples_total{stream="Main"} 1234.0' in body
    metrics.close()
    metrics.close()  # idempotent
    assert metrics.port is None
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2)


def test_snapshot_from_a_real_engine(metrics: ServerMetrics) -> None:
    engine = Engine()
    engine.create_stream("Main", {"k": "string", "ts": "timestamp[ms]"}, sources=["s1"])
    engine.register_query(
        "SELECT k, count(*) AS n [RANGE 10 s, SLIDE 10 s, WA ts] FROM Main GROUP BY k", name="q1"
    )
    metrics.set_snapshot(lambda: snapshot_from_engine_stats(engine.stats()))
    _, samples, _ = scrape(metrics)
    assert not series(samples, "lowtide_low_watermark")  # nothing promised yet
    assert not series(samples, "lowtide_query_low_watermark")

    engine.push("Main", {"k": ["a", "b", "a"], "ts": [5, 1000, 12_000]}, source="s1")
    engine.punctuate("Main", 10_000, source="s1")
    engine.push("Main", {"k": ["a"], "ts": [10]}, source="s1")  # late: dropped by q1
    _, samples, _ = scrape(metrics)
    # The query's result stream is reported as the query, not as another stream.
    assert series(samples, "lowtide_ingested_tuples_total") == {(("stream", "Main"),): 4}
    assert series(samples, "lowtide_late_tuples_total") == {(("stream", "Main"),): 1}
    assert series(samples, "lowtide_behind_punctuation_tuples_total") == {(("stream", "Main"),): 1}
    assert series(samples, "lowtide_low_watermark") == {(("stream", "Main"),): 10_000}
    assert series(samples, "lowtide_query_late_tuples_total") == {(("query", "q1"),): 1}
    assert series(samples, "lowtide_query_low_watermark") == {(("query", "q1"),): 20_000}
    assert series(samples, "lowtide_open_windows") == {(("query", "q1"),): 1}
    assert series(samples, "lowtide_state_bytes")[(("query", "q1"),)] > 0
    operators_in = series(samples, "lowtide_operator_tuples_in_total")
    assert operators_in[(("operator", "0:Input"), ("query", "q1"))] == 3
    # The behind tuple reaches the aggregate, which finds its one window emitted: late.
    assert operators_in[(("operator", "2:WID Aggregate"), ("query", "q1"))] == 4
    operators_out = series(samples, "lowtide_operator_tuples_out_total")
    assert operators_out[(("operator", "2:WID Aggregate"), ("query", "q1"))] == 2

    engine.close_source("Main", "s1")
    _, samples, _ = scrape(metrics)
    assert series(samples, "lowtide_low_watermark") == {(("stream", "Main"),): math.inf}
    assert series(samples, "lowtide_query_low_watermark") == {(("query", "q1"),): math.inf}
    assert series(samples, "lowtide_open_windows") == {(("query", "q1"),): 0}
