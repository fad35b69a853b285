"""docs/design.md, "Security", against real servers: TLS, bearer tokens and their roles, metrics on
loopback.

Two servers for the whole module, one worker each: one serving TLS with a self-signed
certificate made here by ``openssl``, one with a tokens file (admin, producer, reader). Every
rejection must arrive as the client's own class (``Unauthenticated``, ``PermissionDenied``,
``ServerUnavailable``) with a one-line reason, and from the CLI as one ``lowtide: ...`` line.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import pickle
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pyarrow as pa
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from server_harness import Server, listening_sockets, lowtide_command, running_server

from lowtide import InvalidArgument, NotFound, PermissionDenied, Punctuation, Unauthenticated
from lowtide.clients import AsyncClient, Client, ServerUnavailable
from lowtide.clients._wire import arrow_bytes, translate
from lowtide.clients.spark import LowtideSink, PartitionSender
from lowtide.proto import lowtide_pb2 as pb
from lowtide.proto import lowtide_pb2_grpc as pb_grpc
from lowtide.server import auth
from lowtide.server.config import ServerConfig

pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("security")]

SCHEMA = {"k": "string", "ts": "int64"}
WAIT = 60.0  # seconds: the longest a subscription may take to deliver its first table
CLI_TIMEOUT = 120


@dataclass(frozen=True)
class Tls:
    cert: Path
    key: Path


@dataclass(frozen=True)
class Tokens:
    admin: str
    producer: str
    reader: str


# -- servers --------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> Tls:
    """A self-signed certificate for 127.0.0.1 and localhost, valid for a day."""
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("openssl is not installed: cannot make the test's self-signed certificate")
    folder = tmp_path_factory.mktemp("tls")
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(
        [openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=localhost",
         "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost", "-days", "1",
         "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    return Tls(cert, key)


@pytest.fixture(scope="module")
def tokens(tmp_path_factory: pytest.TempPathFactory) -> tuple[Tokens, Path]:
    # Fixed, so every run is the same run (a random one began with "-" once: argparse took it
    # for an option); hex, as `openssl rand -hex` or secrets.token_hex make them.
    made = Tokens(
        *(hashlib.sha256(role.encode()).hexdigest()[:48] for role in ("admin", "producer", "reader"))
    )
    path = tmp_path_factory.mktemp("tokens") / "tokens.toml"
    path.write_text(
        f'[tokens]\n"{made.admin}" = "admin"\n"{made.producer}" = "producer"\n"{made.reader}" = "reader"\n'
    )
    return made, path


@pytest.fixture(scope="module")
def tls_server(tls: Tls) -> Iterator[Server]:
    with running_server(
        "--tls-cert", str(tls.cert), "--tls-key", str(tls.key), workers=1, warm_up=False
    ) as server:
        yield server


@pytest.fixture(scope="module")
def token_server(tokens: tuple[Tokens, Path]) -> Iterator[Server]:
    with running_server("--tokens", str(tokens[1]), workers=1, warm_up=False) as server:
        yield server


@pytest.fixture
def keys(tokens: tuple[Tokens, Path]) -> Tokens:
    return tokens[0]


# -- helpers --------------------------------------------------------------------------------------
def populate(client: Client, fresh: Callable[[str], str]) -> tuple[str, str]:
    """A stream, a tumbling count on it, and one punctuated batch: (stream, query)."""
    stream, query = fresh("Sec"), fresh("q")
    client.create_stream(stream, SCHEMA)
    client.register_query(
        f"SELECT k, count(*) AS n [RANGE 10, SLIDE 10, WA ts] FROM {stream} GROUP BY k", name=query
    )
    with client.producer(stream, linger_ms=0) as producer:
        producer.send({"k": ["a", "b", "a"], "ts": [1, 2, 3]})
        producer.punctuate(100)
    return stream, query


def first_table(client: Client, query: str) -> pa.Table:
    """The query's first result table; fails (never hangs) if none comes within WAIT seconds."""
    with client.subscribe(query) as subscription:
        watchdog = threading.Timer(WAIT, subscription.cancel)
        watchdog.start()
        try:
            for item in subscription:
                if not isinstance(item, Punctuation):
                    return item
        finally:
            watchdog.cancel()
    raise AssertionError(f"no result table from {query} within {WAIT} s")


def counts(table: pa.Table) -> dict[str, int]:
    return dict(zip(table.column("k").to_pylist(), table.column("n").to_pylist(), strict=True))


def cli(target: str, *args: str, token: str | None = None) -> subprocess.CompletedProcess[str]:
    """``lowtide --server target ARGS`` with ``$LOWTIDE_TOKEN`` set to ``token`` (or unset)."""
    env = {k: v for k, v in os.environ.items() if k != "LOWTIDE_TOKEN"}
    if token is not None:
        env["LOWTIDE_TOKEN"] = token
    return subprocess.run(
        [*lowtide_command(), "--server", target, *args],
        capture_output=True, text=True, timeout=CLI_TIMEOUT, env=env,
    )  # fmt: skip


def one_line_failure(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 1, f"exit {done.returncode}, stderr {done.stderr!r}"
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("lowtide: "), done.stderr
    return lines[0]


# -- TLS ------------------------------------------------------------------------------------------
def test_a_tls_client_trusting_the_ca_creates_sends_and_subscribes(
    tls_server: Server, tls: Tls, fresh: Callable[[str], str]
) -> None:
    with Client(tls_server.target, timeout=30, root_certificates=tls.cert) as client:
        stream, query = populate(client, fresh)
        assert counts(first_table(client, query)) == {"a": 2, "b": 1}
        assert [s["tuples_ingested"] for s in client.list_streams() if s["name"] == stream] == [3]
    with Client(tls_server.target, timeout=30, root_certificates=str(tls.cert)) as client:
        assert client.health()["status"] == "SERVING"


def test_an_async_tls_client_takes_pem_bytes(tls_server: Server, tls: Tls) -> None:
    async def scenario() -> str:
        async with AsyncClient(tls_server.target, timeout=30, root_certificates=tls.cert.read_bytes()) as c:
            return str((await c.health())["status"])

    assert asyncio.run(scenario()) == "SERVING"


def test_a_plaintext_client_against_tls_fails_at_once(tls_server: Server) -> None:
    began = time.monotonic()
    with (
        Client(tls_server.target, timeout=10) as client,
        pytest.raises(ServerUnavailable, match="pass --tls-ca"),
    ):
        client.list_streams()
    assert time.monotonic() - began < 10, "the call waited for its deadline instead of failing"


def test_a_tls_client_against_plaintext_says_the_handshake_failed(target: str, tls: Tls) -> None:
    done = cli(target, "--tls-ca", str(tls.cert), "stream", "list")
    assert "the TLS handshake failed" in one_line_failure(done)


def test_the_cli_speaks_tls_with_tls_ca(tls_server: Server, tls: Tls) -> None:
    done = cli(tls_server.target, "--tls-ca", str(tls.cert), "stream", "list", "--format", "json")
    assert done.returncode == 0, done.stderr
    assert one_line_failure(cli(tls_server.target, "stream", "list")).startswith("lowtide: no lowtide server")


def test_unreadable_root_certificates_are_one_line(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgument, match="cannot read root certificates"):
        Client("127.0.0.1:1", root_certificates=tmp_path / "missing.pem")


def test_a_private_key_as_tls_ca_is_one_line_naming_it(tls_server: Server, tls: Tls) -> None:
    """``--tls-ca key.pem``: lowtide's line alone, no gRPC log lines before it (issue 22, item 11)."""
    line = one_line_failure(cli(tls_server.target, "--tls-ca", str(tls.key), "stream", "list"))
    assert str(tls.key) in line and "hold no PEM certificate" in line, line
    with pytest.raises(InvalidArgument, match="hold no PEM certificate"):
        Client(tls_server.target, root_certificates=tls.key.read_bytes())


# A CA that passes for PEM but that gRPC's C core cannot load: it logs four lines on stderr.
_UNLOADABLE_CA = """
import sys
if sys.argv[1] == "lowtide":
    import lowtide.clients
import grpc
pem = b"-----BEGIN CERTIFICATE-----\\nAAAA\\n-----END CERTIFICATE-----\\n"
with grpc.secure_channel("127.0.0.1:1", grpc.ssl_channel_credentials(pem)) as channel:
    try:
        channel.unary_unary("/lowtide.v1.Lowtide/Health")(b"", timeout=30)
    except grpc.RpcError as exc:
        print(exc.code().name)
"""


@pytest.mark.parametrize(
    ("imports", "verbosity", "logged"),
    [("lowtide", None, False), ("lowtide", "ERROR", True), ("grpc", None, True)],
)
def test_importing_the_client_quiets_grpc_core_logs_unless_asked(
    imports: str, verbosity: str | None, logged: bool
) -> None:
    """``import lowtide.clients`` sets GRPC_VERBOSITY=NONE when the user did not set it."""
    env = {k: v for k, v in os.environ.items() if k != "GRPC_VERBOSITY"}
    if verbosity is not None:
        env["GRPC_VERBOSITY"] = verbosity
    done = subprocess.run(
        [sys.executable, "-c", _UNLOADABLE_CA, imports], capture_output=True, text=True, timeout=60, env=env
    )
    assert done.stdout.strip() == "UNAVAILABLE", done.stdout + done.stderr
    assert bool(done.stderr.strip()) is logged, done.stderr


# -- tokens ---------------------------------------------------------------------------------------
def test_no_token_is_unauthenticated_on_control_ingest_and_subscribe(
    token_server: Server, keys: Tokens, fresh: Callable[[str], str]
) -> None:
    with Client(token_server.target, timeout=30, token=keys.admin) as admin:
        stream, query = populate(admin, fresh)
    with Client(token_server.target, timeout=30) as anonymous:
        with pytest.raises(Unauthenticated, match="bearer token"):
            anonymous.list_streams()
        with pytest.raises(Unauthenticated):
            anonymous.health()
        with pytest.raises(Unauthenticated):
            anonymous.producer(stream)  # opening it reads the stream's schema
        with pytest.raises(Unauthenticated):
            first_table(anonymous, query)
    # Ingest itself refuses before reading a message: nothing of the batch is applied.
    with grpc.insecure_channel(token_server.target) as channel:
        batch = arrow_bytes([pa.table({"k": ["x"], "ts": pa.array([5], pa.int64())})])
        request = pb.IngestRequest(stream=stream, source="raw", arrow=batch, batch_id=1)
        with pytest.raises(grpc.RpcError) as raised:
            pb_grpc.LowtideStub(channel).Ingest(iter([request]), timeout=30)
        assert isinstance(translate(raised.value, token_server.target), Unauthenticated)
    with Client(token_server.target, timeout=30, token=keys.admin) as admin:
        assert [s["tuples_ingested"] for s in admin.list_streams() if s["name"] == stream] == [3]


def test_an_unknown_token_is_unauthenticated(token_server: Server) -> None:
    client = Client(token_server.target, timeout=30, token="not-a-token")
    with client, pytest.raises(Unauthenticated, match="not known"):
        client.list_queries()


def test_a_reader_reads_but_neither_creates_nor_produces(
    token_server: Server, keys: Tokens, fresh: Callable[[str], str]
) -> None:
    with Client(token_server.target, timeout=30, token=keys.admin) as admin:
        stream, query = populate(admin, fresh)
    with Client(token_server.target, timeout=30, token=keys.reader) as reader:
        with pytest.raises(PermissionDenied, match="'reader' may not call CreateStream"):
            reader.create_stream(fresh("No"), SCHEMA)
        with pytest.raises(PermissionDenied, match="'reader' may not call Ingest"):  # noqa: SIM117
            with reader.producer(stream, linger_ms=0) as producer:
                producer.send({"k": ["z"], "ts": [7]})
        assert stream in [s["name"] for s in reader.list_streams()]
        assert query in [q["name"] for q in reader.list_queries()]
        assert any(query in w["queries"] for w in reader.list_workers())
        assert "Aggregate" in reader.explain(
            f"SELECT k, count(*) AS n [RANGE 5, SLIDE 5, WA ts] FROM {stream} GROUP BY k"
        )
        assert counts(first_table(reader, query)) == {"a": 2, "b": 1}
        assert reader.health()["status"] == "SERVING"


def test_a_producer_ingests_but_neither_registers_nor_drops(
    token_server: Server, keys: Tokens, fresh: Callable[[str], str]
) -> None:
    with Client(token_server.target, timeout=30, token=keys.admin) as admin:
        stream, query = populate(admin, fresh)
    with Client(token_server.target, timeout=30, token=keys.producer) as producer_client:
        with producer_client.producer(stream, source="p", linger_ms=0) as producer:
            producer.send({"k": ["c"], "ts": [4]})
        assert producer.result is not None and producer.result.tuples == 1
        assert any(query in w["queries"] for w in producer_client.list_workers())
        with pytest.raises(PermissionDenied, match="'producer' may not call RegisterQuery"):
            producer_client.register_query(
                f"SELECT k, count(*) AS n [RANGE 5, SLIDE 5, WA ts] FROM {stream} GROUP BY k"
            )
        with pytest.raises(PermissionDenied, match="DropStream"):
            producer_client.drop_stream(stream)
        with pytest.raises(PermissionDenied, match="Subscribe"):
            first_table(producer_client, query)


def test_a_producer_stages_and_commits_but_a_reader_may_not(
    token_server: Server, keys: Tokens, fresh: Callable[[str], str]
) -> None:
    with Client(token_server.target, timeout=30, token=keys.admin) as admin:
        stream, _ = populate(admin, fresh)
    part = pa.table({"k": ["s", "t"], "ts": pa.array([200, 201], pa.int64())})
    with Client(token_server.target, timeout=30, token=keys.reader) as reader:
        with pytest.raises(PermissionDenied, match=r"^role 'reader' may not call Stage \(it may call "):
            reader.stage(stream, 1, "p0", part, source="spark")
        with pytest.raises(PermissionDenied, match=r"^role 'reader' may not call CommitStaged "):
            reader.commit_staged(stream, 1, ["p0"], source="spark", punctuation=500)
        with pytest.raises(PermissionDenied, match=r"^role 'reader' may not call AbortStaged "):
            reader.abort_staged(stream, 1, source="spark")
    with Client(token_server.target, timeout=30, token=keys.producer) as producer:
        with pytest.raises(NotFound, match="'p0'"):  # the reader's Stage staged nothing
            producer.commit_staged(stream, 1, ["p0"], source="spark")
        assert producer.stage(stream, 1, "p0", part, source="spark") == {"tuples": 2, "duplicate": False}
        assert producer.stage(stream, 2, "p0", part, source="spark")["tuples"] == 2
        assert producer.commit_staged(stream, 1, ["p0"], source="spark")["tuples"] == 2
        assert producer.abort_staged(stream, 2, source="spark") == 1
    with Client(token_server.target, timeout=30, token=keys.admin) as admin:
        (info,) = [s for s in admin.list_streams() if s["name"] == stream]
        assert info["tuples_ingested"] == 3 + 2
        assert info["source_punctuation"].get("spark", -1) < 500  # the reader's punctuation was refused


def test_an_admin_does_everything(token_server: Server, keys: Tokens, fresh: Callable[[str], str]) -> None:
    with Client(token_server.target, timeout=30, token=keys.admin) as admin:
        stream, query = populate(admin, fresh)
        assert counts(first_table(admin, query)) == {"a": 2, "b": 1}
        admin.drop_query(query)
        admin.drop_stream(stream)
        assert stream not in [s["name"] for s in admin.list_streams()]


def test_health_and_reflection_need_a_token_of_any_role(token_server: Server, keys: Tokens) -> None:
    with grpc.insecure_channel(token_server.target) as channel:
        check = health_pb2_grpc.HealthStub(channel).Check
        with pytest.raises(grpc.RpcError) as raised:
            check(health_pb2.HealthCheckRequest(), timeout=30)
        assert raised.value.code() == grpc.StatusCode.UNAUTHENTICATED
        for token in (keys.admin, keys.producer, keys.reader):
            answer = check(
                health_pb2.HealthCheckRequest(), timeout=30, metadata=[("authorization", f"Bearer {token}")]
            )
            assert answer.status == health_pb2.HealthCheckResponse.SERVING
    assert auth.allows("reader", "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo")


def test_the_spark_sink_carries_tls_and_token_to_the_executors(
    tls_server: Server,
    token_server: Server,
    tls: Tls,
    keys: Tokens,
    fresh: Callable[[str], str],
) -> None:
    """The sink travels pickled: it holds the PEM bytes (read on the driver) and the token."""
    with Client(token_server.target, timeout=30, token=keys.admin) as admin:
        stream, _ = populate(admin, fresh)
    sink = pickle.loads(pickle.dumps(LowtideSink(token_server.target, stream, token=keys.producer)))
    assert sink._prepare().stream == stream  # it read the stream with the producer's token
    with pytest.raises(Unauthenticated):
        LowtideSink(token_server.target, stream)._prepare()
    with Client(tls_server.target, timeout=30, root_certificates=tls.cert) as client:
        tls_stream, _ = populate(client, fresh)
    shipped = pickle.loads(
        pickle.dumps(LowtideSink(tls_server.target, tls_stream, root_certificates=tls.cert))
    )
    assert shipped.root_certificates == tls.cert.read_bytes()
    layout = shipped._prepare()
    sender = PartitionSender("t", "s", "src", 1, layout, None, 5.0, 10, b"pem", "secret")
    assert "secret" not in repr(sender)  # Spark prints plans and tasks: the token stays out


def test_the_cli_sends_token_and_lowtide_token(
    token_server: Server, keys: Tokens, fresh: Callable[[str], str]
) -> None:
    target, stream = token_server.target, fresh("Cli")
    created = cli(target, "--token", keys.admin, "stream", "create", stream, "--schema", "k:string,ts:int64")
    assert created.returncode == 0, created.stderr
    listed = cli(target, "stream", "list", "--format", "json", token=keys.reader)
    assert listed.returncode == 0 and stream in listed.stdout, listed.stderr
    denied = one_line_failure(cli(target, "stream", "drop", stream, token=keys.reader))
    assert "'reader' may not call DropStream" in denied
    assert "bearer token" in one_line_failure(cli(target, "stream", "list"))
    # --token wins over $LOWTIDE_TOKEN.
    dropped = cli(target, "--token", keys.admin, "stream", "drop", stream, token=keys.reader)
    assert dropped.returncode == 0, dropped.stderr


# -- metrics and start-up -------------------------------------------------------------------------
def _listening(port: int) -> set[str]:
    """The local addresses listening on ``port``."""
    return {address for address, bound in listening_sockets().values() if bound == port}


def test_metrics_listen_on_loopback_by_default(token_server: Server) -> None:
    assert ServerConfig.load(host="0.0.0.0").metrics_host == "127.0.0.1"
    assert token_server.metrics_url is not None and token_server.metrics_url.startswith("http://127.0.0.1:")
    if not Path("/proc/net/tcp").exists():
        pytest.skip("no /proc/net/tcp to see the listening socket")
    port = int(token_server.metrics_url.rsplit(":", 1)[1].split("/")[0])
    assert _listening(port) == {"127.0.0.1"}  # and nothing else


def test_a_tokens_file_with_an_unknown_role_stops_the_start(tmp_path: Path) -> None:
    path = tmp_path / "tokens.toml"
    path.write_text('[tokens]\n"secret-value" = "superuser"\n')
    with pytest.raises(InvalidArgument, match="unknown role 'superuser'") as raised:
        auth.load_tokens(str(path))
    assert "secret-value" not in str(raised.value)
    done = subprocess.run(
        [*lowtide_command(), "serve", "--port", "0", "--metrics-port", "-1", "--tokens", str(path)],
        capture_output=True, text=True, timeout=CLI_TIMEOUT,
    )  # fmt: skip
    assert "unknown role 'superuser'" in one_line_failure(done)


def test_tls_cert_and_key_go_together(tls: Tls, tmp_path: Path) -> None:
    with pytest.raises(InvalidArgument, match="go together"):
        ServerConfig.load(tls_cert=str(tls.cert))
    done = subprocess.run(
        [*lowtide_command(), "serve", "--port", "0", "--metrics-port", "-1", "--tls-key", str(tls.key)],
        capture_output=True, text=True, timeout=CLI_TIMEOUT,
    )  # fmt: skip
    assert "go together" in one_line_failure(done)
    missing = ServerConfig.load(tls_cert=str(tmp_path / "missing.pem"), tls_key=str(tls.key))
    with pytest.raises(InvalidArgument, match=r"cannot read --tls-cert .*missing\.pem"):
        auth.load(missing)
