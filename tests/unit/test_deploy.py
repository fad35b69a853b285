"""deploy/: the example config loads, the compose stack's files parse and hang together, the systemd
unit and the image say what the README says."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tomllib
from concurrent import futures
from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest
import yaml

from lowtide.server import metrics as metrics_module
from lowtide.server.config import ServerConfig

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
DASHBOARD = DEPLOY / "grafana" / "dashboards" / "lowtide.json"

EXAMPLE_CONFIG = ServerConfig(
    host="127.0.0.1",
    port=50051,
    workers=4,
    metrics_port=9464,
    state_dir="",
    max_message_bytes=64 << 20,
    max_batch_rows=1_000_000,
    max_streams=1000,
    max_queries=1000,
    max_query_state_bytes=1 << 30,
    retained_items=1024,
    retained_bytes=256 << 20,
    max_subscriber_bytes=64 << 20,
)


# -- lowtide.toml ---------------------------------------------------------------------------------
def test_example_config_loads_with_the_documented_values() -> None:
    assert ServerConfig.load(DEPLOY / "lowtide.toml") == EXAMPLE_CONFIG
    assert ServerConfig.load(str(DEPLOY / "lowtide.toml"), host="0.0.0.0").host == "0.0.0.0"


def test_example_config_sets_and_comments_every_key() -> None:
    text = (DEPLOY / "lowtide.toml").read_text()
    keys = set(tomllib.loads(text)["server"])
    assert keys == {f.name for f in fields(ServerConfig)}
    lines = text.splitlines()
    for key in keys:
        (index,) = [i for i, line in enumerate(lines) if line.startswith(f"{key} =")]
        assert lines[index - 1].startswith("#"), f"{key} has no comment above it"
    readme = (DEPLOY / "README.md").read_text()
    for key in keys:
        assert f"`{key}`" in readme, f"deploy/README.md does not document {key}"


# -- Prometheus and Grafana -----------------------------------------------------------------------
def dashboard_exprs(dashboard: dict[str, Any]) -> list[str]:
    return [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]


def exposed_samples() -> set[str]:
    """Every sample name a server's exposition carries once each of its series has a value."""
    metrics = metrics_module.ServerMetrics()
    metrics.ingest_batch("S", 10, 0.001)
    metrics.punctuation_to_result("q", 0.001)
    metrics.worker_restarted(0)
    metrics.checkpoint_taken(0.5, 1024, [0.001])
    operators = [(0, "Input", 10, 10)]
    query = {"low_watermark": 5, "late": 0, "open_windows": 1, "state_bytes": 64, "operators": operators}
    stream = {"low_watermark": 5, "ingested": 10, "behind": 0, "late": 0}
    metrics.set_snapshot(lambda: {"streams": {"S": stream}, "queries": {"q": query}, "strings": {"front": 1}})
    return {sample.name for family in metrics.registry.collect() for sample in family.samples}


def test_grafana_dashboard_is_a_real_dashboard() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["uid"] and dashboard["title"] == "lowtide"
    panels = dashboard["panels"]
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids))
    for panel in panels:
        grid = panel["gridPos"]
        assert grid["x"] >= 0 and grid["x"] + grid["w"] <= 24, panel["title"]
        if panel["type"] != "row":
            assert panel["targets"], panel["title"]
            assert all(t["expr"].strip() for t in panel["targets"]), panel["title"]
    exprs = "\n".join(dashboard_exprs(dashboard))
    # What the dashboard must show (the brief): ingest rate, watermark lag, p50/p99 latency, state
    # and open windows per query, late tuples, worker restarts.
    assert "rate(lowtide_ingested_tuples_total" in exprs
    assert "time() - (lowtide_low_watermark" in exprs
    assert "time() - (lowtide_query_low_watermark" in exprs
    latency = "sum by (le, query) (rate(lowtide_punctuation_to_result_seconds_bucket"
    for q in ("0.5", "0.99"):
        assert f"histogram_quantile({q}, {latency}" in exprs
    for name in (
        "lowtide_state_bytes",
        "lowtide_open_windows",
        "lowtide_late_tuples_total",
        "lowtide_query_late_tuples_total",
        "lowtide_worker_restarts_total",
    ):
        assert name in exprs, name
    # Durability: the checkpoint metrics and restarts (issue 22, item 9).
    for q in ("0.5", "0.99"):
        for histogram in ("lowtide_checkpoint_seconds", "lowtide_checkpoint_pause_seconds"):
            assert f"histogram_quantile({q}, sum by (le) (rate({histogram}_bucket" in exprs
    assert "lowtide_checkpoint_bytes" in exprs
    assert "increase(lowtide_checkpoint_seconds_count" in exprs
    # Every metric it reads is one the server exposes (a typo would draw an empty panel).
    documented = metrics_module.__doc__ or ""
    exposed = exposed_samples()
    for name in set(re.findall(r"lowtide_[a-z_]+", exprs)):
        base = re.sub(r"_(bucket|sum|count)$", "", name)
        assert f"``{name}" in documented or f"``{base}" in documented, name
        assert name in exposed, f"the server exposes no sample {name}"
    variables = {v["name"] for v in dashboard["templating"]["list"]}
    used = set(re.findall(r"\$\{?([a-z_]+)", json.dumps(dashboard["panels"]))) - {
        "__rate_interval",
        "__range",
        "__interval",
    }
    assert used <= variables, used - variables


def test_the_readmes_metrics_table_is_what_the_server_exposes() -> None:
    """deploy/README.md's table names every metric family the server exposes (a counter as its
    ``_total`` sample), and no other."""
    metrics = metrics_module.ServerMetrics()
    metrics.set_snapshot(lambda: {"streams": {}, "queries": {}})  # the snapshot's families appear
    exposed = {f.name + ("_total" if f.type == "counter" else "") for f in metrics.registry.collect()}
    text = (DEPLOY / "README.md").read_text()
    table = set(re.findall(r"^\| `(lowtide_\w+)` \|", text[text.index("## Metrics") :], re.M))
    assert exposed - table == set(), "exposed, missing from deploy/README.md's metrics table"
    assert table - exposed == set(), "in deploy/README.md's metrics table, not exposed"


def test_prometheus_config_targets_the_lowtide_service() -> None:
    text = (DEPLOY / "prometheus" / "prometheus.yml").read_text()
    assert re.search(r"targets:\s*\[\"lowtide:9464\"\]", text)
    assert "job_name: lowtide" in text


def test_compose_mounts_files_that_exist() -> None:
    text = (DEPLOY / "compose.yaml").read_text()
    mounts = re.findall(r"-\s+(\./[^:\s]+):", text)
    assert mounts, "compose.yaml mounts nothing from deploy/"
    for mount in mounts:
        assert (DEPLOY / mount).exists(), mount
    assert (DEPLOY / "grafana/provisioning/datasources/prometheus.yaml").exists()
    assert (DEPLOY / "grafana/provisioning/dashboards/lowtide.yaml").exists()


def test_compose_keeps_state_on_its_volume() -> None:
    """The lowtide service's --state-dir lies on the lowtide-state volume (else a restart forgets)."""
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    service = compose["services"]["lowtide"]
    command: list[str] = service["command"]
    state_dir = Path(command[command.index("--state-dir") + 1])
    mounts = {Path(target): source for source, target in (v.split(":")[:2] for v in service["volumes"])}
    assert mounts.get(Path("/var/lib/lowtide")) == "lowtide-state"
    assert state_dir.is_relative_to("/var/lib/lowtide") and state_dir != Path("/var/lib/lowtide"), state_dir
    assert "lowtide-state" in compose["volumes"]
    # The image's own command and the systemd unit keep state in the same place.
    assert f'"--state-dir", "{state_dir}"' in dockerfile()
    (exec_start,) = unit_settings(DEPLOY / "lowtide.service")["Service.ExecStart"]
    assert exec_start.endswith(f"--state-dir {state_dir}")


def test_yaml_files_parse() -> None:
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    assert {"lowtide", "prometheus", "grafana"} <= set(compose["services"])
    assert compose["services"]["lowtide"]["build"]["dockerfile"] == "deploy/Dockerfile"
    prometheus = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    jobs = {job["job_name"]: job for job in prometheus["scrape_configs"]}
    assert jobs["lowtide"]["static_configs"][0]["targets"] == ["lowtide:9464"]
    datasources = yaml.safe_load((DEPLOY / "grafana/provisioning/datasources/prometheus.yaml").read_text())
    assert datasources["datasources"][0]["url"] == "http://prometheus:9090"
    providers = yaml.safe_load((DEPLOY / "grafana/provisioning/dashboards/lowtide.yaml").read_text())
    assert providers["providers"][0]["options"]["path"] == "/etc/grafana/dashboards"


def test_promtool_checks_the_prometheus_config() -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not on PATH (Debian package `prometheus` provides it)")
    result = subprocess.run(
        [promtool, "check", "config", str(DEPLOY / "prometheus" / "prometheus.yml")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr


# -- systemd ----------------------------------------------------------------------------------------
def unit_settings(path: Path) -> dict[str, list[str]]:
    settings: dict[str, list[str]] = {}
    section = ""
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            section = line.strip("[]")
            continue
        key, _, value = line.partition("=")
        settings.setdefault(f"{section}.{key}", []).append(value)
    return settings


def test_systemd_unit() -> None:
    unit = unit_settings(DEPLOY / "lowtide.service")
    assert unit["Service.Type"] == ["simple"]
    (exec_start,) = unit["Service.ExecStart"]
    assert "lowtide serve --config /etc/lowtide/lowtide.toml " in exec_start
    assert exec_start.startswith("/")
    assert unit["Service.KillSignal"] == ["SIGTERM"]
    assert unit["Service.Restart"] == ["on-failure"]
    for hardening in ("NoNewPrivileges", "ProtectSystem", "ProtectHome", "PrivateTmp", "DynamicUser"):
        assert hardening in {k.split(".", 1)[1] for k in unit}, hardening
    assert unit["Install.WantedBy"] == ["multi-user.target"]


def test_systemd_analyze_verifies_the_unit(tmp_path: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not on PATH")
    # verify also checks that ExecStart's program exists: stand in for the not-installed command.
    text = (DEPLOY / "lowtide.service").read_text().replace("/usr/local/bin/lowtide", "/bin/true")
    (tmp_path / "lowtide.service").write_text(text)
    result = subprocess.run(
        [analyze, "verify", str(tmp_path / "lowtide.service")], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0 and not result.stderr.strip(), result.stderr


# -- container image --------------------------------------------------------------------------------
def dockerfile() -> str:
    return (DEPLOY / "Dockerfile").read_text()


def test_dockerfile() -> None:
    text = dockerfile()
    stages = re.findall(r"^FROM (\S+)", text, re.M)
    assert stages and all(s == "python:3.11-slim" for s in stages), stages
    assert re.search(r"^EXPOSE 50051 9464$", text, re.M)
    users = re.findall(r"^USER (\S+)", text, re.M)
    assert users and not users[-1].startswith(("root", "0")), users
    assert 'ENTRYPOINT ["lowtide"]' in text
    serve = '"serve", "--host", "0.0.0.0", "--metrics-host", "0.0.0.0", "--config", '
    assert f'CMD [{serve}"/etc/lowtide/lowtide.toml", "--state-dir", ' in text
    assert "COPY deploy/lowtide.toml /etc/lowtide/lowtide.toml" in text
    # Every folder the distribution is built from is copied into the build stage.
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    for folder in set(pyproject["tool"]["setuptools"]["package-dir"].values()):
        assert re.search(rf"^COPY {folder} {folder}$", text, re.M), f"Dockerfile does not copy {folder}/"
    assert "COPY pyproject.toml setup.py README.md ./" in text


def healthcheck_command() -> list[str]:
    match = re.search(r"^HEALTHCHECK [^\n]*\\\n\s*CMD (\[[^\n]*\])$", dockerfile(), re.M)
    assert match, "no HEALTHCHECK ... CMD [...] in the Dockerfile"
    command: list[str] = json.loads(match.group(1))
    return command


@pytest.mark.parametrize(("answer", "healthy"), [(b"\x08\x01", True), (b"\x08\x02", False), (None, False)])
def test_healthcheck_speaks_grpc_health(answer: bytes | None, healthy: bool) -> None:
    """Run the image's health check command against a grpc.health.v1 stand-in on a free port."""
    grpc = pytest.importorskip("grpc")
    command = healthcheck_command()
    assert command[0] == "python" and "/grpc.health.v1.Health/Check" in command[2]
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    requests: list[bytes] = []

    def check(request: bytes, context: Any) -> bytes:
        requests.append(request)
        assert answer is not None
        return answer

    if answer is not None:
        handler = grpc.method_handlers_generic_handler(
            "grpc.health.v1.Health",
            {"Check": grpc.unary_unary_rpc_method_handler(check)},  # raw bytes in and out
        )
        server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        script = command[2].replace("127.0.0.1:50051", f"127.0.0.1:{port}")
        result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    finally:
        server.stop(None)
    assert (result.returncode == 0) is healthy, result.stderr
    if answer is not None:
        assert requests == [b""]  # HealthCheckRequest(service="") is the empty message


# -- Makefile ---------------------------------------------------------------------------------------
def test_every_pytest_run_of_the_makefile_reports_skip_reasons() -> None:
    """``make test`` says why a test skipped (``-rs``), not just how many did."""
    runs = [line for line in (ROOT / "Makefile").read_text().splitlines() if "$(BIN)/pytest" in line]
    assert runs, "the Makefile runs no pytest"
    for line in runs:
        assert re.search(r"\s-r[a-zA-Z]*s", line), line
