"""Scoped tokens (docs/design.md, "Security") against a real server, and the start's plaintext
warning.

One server for the module, one worker, with a tokens file holding an admin, a producer scoped
to stream ``Main`` and sources ``link-*``, a reader scoped to query ``q1`` and stream ``Main``,
a reader scoped to ``q1*`` (which grants ``q1.late``), a reader scoped to stream ``Main`` alone
and an unscoped reader. The admin creates streams ``Main`` and ``Other`` and queries ``q1`` and
``q2`` on ``Main``; every refusal must be ``PermissionDenied`` naming the scope, and must leave
what the server holds as it was. A reader name belongs to the token that first committed it.
"""

from __future__ import annotations

import hashlib
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pyarrow as pa
import pytest
from server_harness import Server, start_server, wait_for
from test_security import SCHEMA, counts, first_table

from lowtide import InvalidArgument, NotFound, PermissionDenied, ResourceExhausted
from lowtide.clients import Client
from lowtide.clients._wire import arrow_bytes, translate
from lowtide.door import MAX_QUERY_BYTES
from lowtide.proto import lowtide_pb2 as pb
from lowtide.proto import lowtide_pb2_grpc as pb_grpc
from lowtide.server import auth
from lowtide.server.config import ServerConfig
from lowtide.server.scopes import TokenScope

pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("security")]

COUNT = "SELECT k, count(*) AS n [RANGE 10, SLIDE 10, WA ts] FROM {} GROUP BY k"


@dataclass(frozen=True)
class Keys:
    admin: str
    producer: str  # streams ["Main"], sources ["link-*"]
    reader: str  # queries ["q1"], streams ["Main"]
    late_reader: str  # queries ["q1*"]
    stream_reader: str  # streams ["Main"]: every query, but a .late only of queries over Main
    plain_reader: str  # "reader": unscoped


def _write(path: Path, keys: Keys) -> None:
    path.write_text(
        f'[tokens]\n"{keys.admin}" = "admin"\n"{keys.plain_reader}" = "reader"\n'
        f'[tokens."{keys.producer}"]\nrole = "producer"\nstreams = ["Main"]\nsources = ["link-*"]\n'
        f'[tokens."{keys.reader}"]\nrole = "reader"\nqueries = ["q1"]\nstreams = ["Main"]\n'
        f'[tokens."{keys.late_reader}"]\nrole = "reader"\nqueries = ["q1*"]\n'
        f'[tokens."{keys.stream_reader}"]\nrole = "reader"\nstreams = ["Main"]\n'
    )


@pytest.fixture(scope="module")
def keys() -> Keys:
    # Fixed, so every run is the same run; hex, as `openssl rand -hex` makes them.
    return Keys(*(hashlib.sha256(f"scoped-{i}".encode()).hexdigest()[:48] for i in range(6)))


@pytest.fixture(scope="module")
def tokens_file(keys: Keys, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("scoped") / "tokens.toml"
    _write(path, keys)
    return path


@pytest.fixture(scope="module")
def server(tokens_file: Path, keys: Keys) -> Iterator[Server]:
    """The scoped server, populated: q1 has a result (window [0, 10)) and a late tuple."""
    running = start_server("--tokens", str(tokens_file), workers=1, warm_up=False)
    try:
        with Client(running.target, timeout=30, token=keys.admin) as admin:
            admin.create_stream("Main", SCHEMA)
            admin.create_stream("Other", SCHEMA)
            admin.register_query(COUNT.format("Main"), name="q1")
            admin.register_query(COUNT.format("Main"), name="q2")
            with admin.producer("Main", source="link-0", linger_ms=0) as producer:
                producer.send({"k": ["a", "b", "a"], "ts": [1, 2, 3]})
                producer.punctuate(100)
                producer.send({"k": ["z"], "ts": [5]})  # behind the punctuation: late, to q1.late
            with admin.producer("Main", source="sensor", linger_ms=0) as other:
                other.punctuate(100)
        yield running
    finally:
        running.stop()
    stderr = running.stderr.read_text(errors="replace")
    shutil.rmtree(running.stderr.parent)
    assert "in plaintext" not in stderr, "a server bound on 127.0.0.1 warned about plaintext tokens"


def _stream(client: Client, name: str) -> dict[str, object]:
    return next(s for s in client.list_streams() if s["name"] == name)


def _ingest(target: str, token: str, stream: str, source: str, item: pb.IngestRequest) -> grpc.RpcError:
    """One raw Ingest call of ``item`` under ``stream``/``source``; it must fail: its error."""
    item.stream, item.source = stream, source
    with grpc.insecure_channel(target) as channel, pytest.raises(grpc.RpcError) as raised:
        pb_grpc.LowtideStub(channel).Ingest(
            iter([item]), timeout=30, metadata=[("authorization", f"Bearer {token}")]
        )
    return raised.value


# -- producers ------------------------------------------------------------------------------------
def test_a_scoped_producer_ingests_into_its_stream_under_its_sources(server: Server, keys: Keys) -> None:
    with Client(server.target, timeout=30, token=keys.producer) as client:
        with client.producer("Main", source="link-7", linger_ms=0) as producer:
            producer.send({"k": ["c"], "ts": [200]})
        assert producer.result is not None and producer.result.tuples == 1
        assert [s["name"] for s in client.list_streams()] == ["Main"]  # Other is hidden
        with pytest.raises(NotFound, match="unknown stream 'Other'"):
            client.producer("Other", source="link-7")  # opening it reads the (filtered) list


def test_a_scoped_producer_cannot_ingest_into_another_stream(server: Server, keys: Keys) -> None:
    batch = arrow_bytes([pa.table({"k": ["x"], "ts": pa.array([50], pa.int64())})])
    error = _ingest(
        server.target, keys.producer, "Other", "link-1", pb.IngestRequest(arrow=batch, batch_id=1)
    )
    assert error.code() == grpc.StatusCode.PERMISSION_DENIED
    assert isinstance(translate(error, server.target), PermissionDenied)
    assert error.details() == (
        "this token may ingest only into streams ['Main'] under sources ['link-*'], "
        "not into stream 'Other' under source 'link-1'"
    )
    trailing = dict(error.trailing_metadata() or ())
    assert (trailing["lowtide-message"], trailing["lowtide-applied"]) == ("0", "0,0,0")
    with Client(server.target, timeout=30, token=keys.admin) as admin:
        assert _stream(admin, "Other")["tuples_ingested"] == 0


def test_a_scoped_producer_cannot_hold_progress_back_under_a_new_source(server: Server, keys: Keys) -> None:
    denied = pytest.raises(PermissionDenied, match=r"under sources \['link-\*'\].*source 'rogue'")
    with Client(server.target, timeout=30, token=keys.producer) as client, denied:  # noqa: SIM117
        with client.producer("Main", source="rogue", linger_ms=0) as producer:
            producer.punctuate(150)
    with Client(server.target, timeout=30, token=keys.admin) as admin:
        assert "rogue" not in _stream(admin, "Main")["source_punctuation"]  # type: ignore[operator]


def test_a_scoped_producer_cannot_close_another_producers_source(server: Server, keys: Keys) -> None:
    error = _ingest(server.target, keys.producer, "Main", "sensor", pb.IngestRequest(close=True))
    assert error.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "not into stream 'Main' under source 'sensor'" in (error.details() or "")
    with Client(server.target, timeout=30, token=keys.admin) as admin:
        assert _stream(admin, "Main")["source_punctuation"]["sensor"] == 100  # type: ignore[index]


SCOPE = r"^this token may ingest only into streams \['Main'\] under sources \['link-\*'\], "


def test_a_scoped_producer_stages_only_into_its_stream_under_its_sources(server: Server, keys: Keys) -> None:
    part = pa.table({"k": ["s", "t"], "ts": pa.array([300, 301], pa.int64())})
    with Client(server.target, timeout=30, token=keys.producer) as client:
        assert client.stage("Main", 1, "p0", part, source="link-9") == {"tuples": 2, "duplicate": False}
        assert client.commit_staged("Main", 1, ["p0"], source="link-9")["tuples"] == 2
        for stream, source in (("Other", "link-1"), ("Main", "sensor")):
            refusal = SCOPE + f"not into stream '{stream}' under source '{source}'$"
            with pytest.raises(PermissionDenied, match=refusal):
                client.stage(stream, 1, "p0", part, source=source)
            with pytest.raises(PermissionDenied, match=refusal):
                client.commit_staged(stream, 1, ["p0"], source=source, punctuation=150)
            with pytest.raises(PermissionDenied, match=refusal):
                client.abort_staged(stream, 1, source=source)
    with Client(server.target, timeout=30, token=keys.admin) as admin:
        for stream, source in (("Other", "link-1"), ("Main", "sensor")):
            with pytest.raises(NotFound, match="'p0'"):  # the refused Stage calls staged nothing
                admin.commit_staged(stream, 1, ["p0"], source=source)
        assert _stream(admin, "Other")["tuples_ingested"] == 0
        assert _stream(admin, "Main")["source_punctuation"]["sensor"] == 100  # type: ignore[index]


# -- readers --------------------------------------------------------------------------------------
def test_a_scoped_reader_subscribes_and_lists_only_its_queries(server: Server, keys: Keys) -> None:
    with Client(server.target, timeout=30, token=keys.reader) as reader:
        assert counts(first_table(reader, "q1")) == {"a": 2, "b": 1}
        assert [q["name"] for q in reader.list_queries()] == ["q1"]  # not q2, nor its SQL
        assert [s["name"] for s in reader.list_streams()] == ["Main"]
        shown = reader.list_workers()  # every worker, with only q1 on it
        with pytest.raises(PermissionDenied, match=r"only to queries \['q1'\], not 'q2'$"):
            first_table(reader, "q2")
        with pytest.raises(PermissionDenied, match=r"needs a pattern of its own, such as 'q1\.late'"):
            first_table(reader, "q1.late")
        with pytest.raises(PermissionDenied, match=r"not 'nowhere'"):  # no hint of what exists
            first_table(reader, "nowhere")
    with (
        Client(server.target, timeout=30, token=keys.admin) as admin,
        Client(server.target, timeout=30, token=keys.reader) as reader,
    ):
        every = admin.list_workers()
        assert [w["queries"] for w in shown] == [["q1"]] and [w["queries"] for w in every] == [["q1", "q2"]]

        # The state bytes are q1's alone: q2 is the same query over the same stream, holding as
        # much once the worker's statistics (sent once a second) have covered both.
        def halves() -> bool:
            return 2 * reader.list_workers()[0]["state_bytes"] == admin.list_workers()[0]["state_bytes"] > 0

        wait_for("the scoped reader's state bytes to be q1's alone", halves, 10.0)


def test_a_scoped_reader_commits_offsets_only_of_its_queries(server: Server, keys: Keys) -> None:
    with Client(server.target, timeout=30, token=keys.reader) as reader:
        reader.commit_offset("q1", "scoped-job", 1)
        with pytest.raises(PermissionDenied, match=r"only to queries \['q1'\], not 'q2'$"):
            reader.commit_offset("q2", "scoped-job", 1)
        assert reader.list_queries()[0]["readers"]["scoped-job"] == 1
    with Client(server.target, timeout=30, token=keys.admin) as admin:
        assert "scoped-job" not in next(q for q in admin.list_queries() if q["name"] == "q2")["readers"]


def test_a_reader_granted_q1_star_reads_q1_late(server: Server, keys: Keys) -> None:
    with Client(server.target, timeout=30, token=keys.late_reader) as reader:
        assert first_table(reader, "q1.late").column("k").to_pylist() == ["z"]
        assert [q["name"] for q in reader.list_queries()] == ["q1"]
        assert {s["name"] for s in reader.list_streams()} == {"Main", "Other"}  # no streams key
        # An unknown name inside the scope: the reason names only what the token sees (not q2).
        with pytest.raises(NotFound) as unknown:
            first_table(reader, "q1x")
        assert str(unknown.value) == "unknown query 'q1x' (did you mean 'q1'?); queries: q1, q1.late"


def test_a_late_stream_takes_the_scope_of_the_streams_its_query_reads(server: Server, keys: Keys) -> None:
    """q.late holds raw input rows: a reader limited to streams ["Main"] reads those of a query
    over Main, and neither reads, commits on nor hears of those of a query over Other."""
    with Client(server.target, timeout=30, token=keys.admin) as admin:
        admin.register_query(COUNT.format("Other"), name="qo")
    try:
        with Client(server.target, timeout=30, token=keys.stream_reader) as reader:
            assert first_table(reader, "q1.late").column("k").to_pylist() == ["z"]
            reader.commit_offset("q1.late", "late-job", 0)
            refusal = r"^'qo\.late' holds raw rows of a stream outside this token's streams \['Main'\]$"
            with pytest.raises(PermissionDenied, match=refusal):
                first_table(reader, "qo.late")
            with pytest.raises(PermissionDenied, match=refusal):
                reader.commit_offset("qo.late", "late-job", 0)
            assert counts(first_table(reader, "q1")) == {"a": 2, "b": 1}  # its results: not raw rows
            with pytest.raises(NotFound) as unknown:
                first_table(reader, "nowhere")
            assert "q1.late" in str(unknown.value) and "qo.late" not in str(unknown.value)
        with Client(server.target, timeout=30, token=keys.admin) as admin:
            assert "late-job" not in next(q for q in admin.list_queries() if q["name"] == "qo")["readers"]
    finally:
        with Client(server.target, timeout=30, token=keys.admin) as admin:
            admin.drop_query("qo")


def test_a_reader_name_belongs_to_the_token_that_named_it(server: Server, keys: Keys) -> None:
    with Client(server.target, timeout=30, token=keys.stream_reader) as owner:
        owner.commit_offset("q1", "owned-job", 0)
    named = r"^reader 'owned-job' was named by another token: commit under a reader name of this token's own$"
    for token in (keys.plain_reader, keys.late_reader):  # another token, unscoped or scoped
        with (
            Client(server.target, timeout=30, token=token) as other,
            pytest.raises(PermissionDenied, match=named),
        ):
            other.commit_offset("q1", "owned-job", 1)
    with Client(server.target, timeout=30, token=keys.admin) as admin:
        assert next(q for q in admin.list_queries() if q["name"] == "q1")["readers"]["owned-job"] == 0
        admin.commit_offset("q1", "owned-job", 1)  # an admin may move any reader
    with Client(server.target, timeout=30, token=keys.stream_reader) as owner:
        owner.commit_offset("q1", "owned-job", 1)  # still its own
        assert next(q for q in owner.list_queries() if q["name"] == "q1")["readers"]["owned-job"] == 1


def test_a_token_keeps_64_reader_names_of_a_query_and_leaves_the_others_theirs(
    server: Server, keys: Keys
) -> None:
    with Client(server.target, timeout=30, token=keys.stream_reader) as hog:
        for number in range(64):
            hog.commit_offset("q2", f"hog-{number}", 0)
        with pytest.raises(ResourceExhausted, match=r"at most 64 readers for each token$"):
            hog.commit_offset("q2", "hog-64", 0)
    with Client(server.target, timeout=30, token=keys.plain_reader) as spark:
        spark.commit_offset("q2", "spark", 0)  # a new reader still names itself
        readers = next(q for q in spark.list_queries() if q["name"] == "q2")["readers"]
    assert "spark" in readers and len([r for r in readers if r.startswith("hog-")]) == 64


def test_a_reader_limited_to_streams_explains_only_sql_over_them(server: Server, keys: Keys) -> None:
    with Client(server.target, timeout=30, token=keys.reader) as reader:
        assert "Aggregate" in reader.explain(COUNT.format("Main"))
        with pytest.raises(PermissionDenied, match=r"may read only streams \['Main'\], not 'Other'"):
            reader.explain(COUNT.format("Other"))
        with pytest.raises(InvalidArgument):  # SQL that does not parse: the parser's reason
            reader.explain("SELECT FROM")
        with pytest.raises(InvalidArgument, match="over the limit"):  # too long to parse: the engine's
            reader.explain(COUNT.format("Other") + " " * MAX_QUERY_BYTES)
    with Client(server.target, timeout=30, token=keys.late_reader) as unlimited:
        assert "Aggregate" in unlimited.explain(COUNT.format("Other"))


# -- the tokens file ------------------------------------------------------------------------------
def test_scoped_entries_parse_next_to_plain_ones(tokens_file: Path, keys: Keys) -> None:
    assert auth.load_tokens(str(tokens_file)) == {
        keys.admin: TokenScope("admin"),
        keys.producer: TokenScope("producer", streams=("Main",), sources=("link-*",)),
        keys.reader: TokenScope("reader", streams=("Main",), queries=("q1",)),
        keys.late_reader: TokenScope("reader", queries=("q1*",)),
        keys.stream_reader: TokenScope("reader", streams=("Main",)),
        keys.plain_reader: TokenScope("reader"),
    }
    late = TokenScope("reader", queries=("q1",))
    assert late.subscribe("q1") is None and late.subscribe("q1.late") is not None
    assert TokenScope("reader", queries=("q1*",)).subscribe("q1.late") is None
    # A .late stream also takes the streams its query reads (given as inputs).
    main = TokenScope("reader", streams=("Main",))
    assert main.subscribe("q1.late", ["Main"]) is None and main.subscribe("qo.late", ["Main", "Other"])
    assert main.sees("query", "q1.late", ["Main"]) and not main.sees("query", "qo.late", ["Other"])
    assert TokenScope("reader", queries=("q*",)).subscribe("qo.late", ["Other"]) is None  # no streams key
    assert TokenScope("reader", queries=()).subscribe("q1") is not None  # [] allows none


@pytest.mark.parametrize(
    ("entry", "reason"),
    [
        ('role = "admin"\nstreams = ["Main"]', "an admin token takes no 'streams'"),
        ('role = "reader"\nsources = ["x"]', "a reader token takes no 'sources'"),
        ('role = "producer"\nstream = ["Main"]', "a producer token takes no 'stream'"),
        ('role = "producer"\nstreams = "Main"', "'streams' must be a list of glob patterns"),
        ('role = "producer"\nsources = [1]', "'sources' must be a list of glob patterns"),
        ('streams = ["Main"]', "its table needs a role"),
        ('role = "root"', "unknown role 'root'"),
    ],
)
def test_a_bad_scoped_entry_stops_the_start_naming_it_but_not_its_token(
    tmp_path: Path, entry: str, reason: str
) -> None:
    path = tmp_path / "tokens.toml"
    path.write_text(f'[tokens]\n"first-secret" = "admin"\n[tokens."second-secret"]\n{entry}\n')
    with pytest.raises(InvalidArgument, match=f"token #2: {reason}") as raised:
        auth.load_tokens(str(path))
    assert "secret" not in str(raised.value)


# -- the plaintext warning ------------------------------------------------------------------------
@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.2", "::1", "[::1]", "localhost"])
def test_tokens_on_a_loopback_address_do_not_warn(tokens_file: Path, host: str) -> None:
    assert auth.plaintext_warning(ServerConfig.load(host=host, tokens=str(tokens_file))) is None


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.0.2.7"])
def test_tokens_over_plaintext_off_loopback_warn(tokens_file: Path, tmp_path: Path, host: str) -> None:
    warning = auth.plaintext_warning(ServerConfig.load(host=host, tokens=str(tokens_file)))
    assert warning is not None and f"in plaintext on {host}" in warning and "\n" not in warning
    assert auth.plaintext_warning(ServerConfig.load(host=host)) is None  # no tokens, nothing to leak
    tls = ServerConfig.load(host=host, tokens=str(tokens_file), tls_cert="c.pem", tls_key="k.pem")
    assert auth.plaintext_warning(tls) is None


def test_the_start_carries_the_warning_for_tokens_on_every_address(tokens_file: Path) -> None:
    """What ``lowtide serve --host 0.0.0.0 --tokens F`` prints, read from the start's own security
    set-up (the port is never bound here: the tests keep every socket on loopback)."""
    security = auth.load(ServerConfig.load(host="0.0.0.0", tokens=str(tokens_file)))
    assert security.warning == (
        "lowtide: warning: bearer tokens travel in plaintext on 0.0.0.0, not a loopback address: "
        "anyone on the network path can read and replay them; serve TLS (--tls-cert, --tls-key)"
    )
