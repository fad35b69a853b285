"""What names a token may reach: the scope of a ``--tokens`` entry (docs/design.md, "Security").

A token's role says which methods it may call (:mod:`lowtide.server.auth`); its scope says on
which names. A token written as a table may limit them with glob patterns (``fnmatchcase``:
``*``, ``?``, ``[...]``, case-sensitive), one list per kind of name:

* ``streams``: the stream an Ingest writes; the streams ListStreams shows; with ExplainQuery,
  every name the SQL reads (FROM) - a reader limited to streams explains only SQL over them.
* ``sources``: the source an Ingest sends, punctuates or closes under (producer only): a producer
  can neither close another producer's source nor hold a stream's progress back under a new one.
* ``queries``: the query a Subscribe reads, the queries ListQueries shows (with their SQL) and
  those ListWorkers shows on each worker (with their state bytes; every worker is listed).
  ``<query>.late`` (the raw input rows a query found late) is a name of its own: the pattern
  ``q1`` does not grant ``q1.late``; ``q1*`` or ``q1.late`` does. Its rows are those of the
  streams its query reads, so it takes ``streams`` too: every name the query reads (FROM), as
  ExplainQuery's SQL, must be one of them.

A reader name a CommitOffset reports under belongs to the token that first committed it
(:mod:`lowtide.server.hub`): ``committer`` carries the calling token's identity to the servicer.

Invariant: a key left out does not limit its kind of name; ``[]`` allows none. Admin tokens are
unscoped. A call outside the scope is refused with PERMISSION_DENIED naming the scope, before it
changes or shows anything; the list calls drop what the scope hides rather than refuse, and so
does the reason of an unknown name (the streams or queries it lists).
"""

from __future__ import annotations

from collections.abc import Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from fnmatch import fnmatchcase

from lowtide.door import MAX_QUERY_BYTES
from lowtide.errors import InvalidArgument, LowtideError, PermissionDenied
from lowtide.names import shown
from lowtide.query.derived import streams_read
from lowtide.query.parser import parse_query

Patterns = tuple[str, ...] | None  # None: any name
# The scope keys each role takes: a key naming what the role never reaches is a mistake.
KEYS: dict[str, tuple[str, ...]] = {
    "admin": (),
    "producer": ("streams", "sources", "queries"),
    "reader": ("streams", "queries"),
}


# The token of the CommitOffset being served (its place in the tokens file, never the secret);
# None: an admin token or a server without tokens, bound to no reader name. Set for each call, in
# the call's own task, as lowtide.names.visible_names is.
committer: ContextVar[str | None] = ContextVar("committer", default=None)


def _matches(patterns: Patterns, name: str) -> bool:
    return patterns is None or any(fnmatchcase(name, pattern) for pattern in patterns)


def _shown(patterns: Patterns) -> str:
    return "any" if patterns is None else repr(list(patterns))


@dataclass(frozen=True)
class TokenScope:
    """A token's role and the names it may reach (see the module docstring)."""

    role: str
    streams: Patterns = None
    sources: Patterns = None
    queries: Patterns = None

    @property
    def limited(self) -> bool:
        return (self.streams, self.sources, self.queries) != (None, None, None)

    def sees_stream(self, name: str) -> bool:
        return _matches(self.streams, name)

    def sees_query(self, name: str, inputs: Sequence[str] = ()) -> bool:
        """Whether the token reaches query ``name``; ``inputs``: what a ``.late`` name's query reads."""
        return _matches(self.queries, name) and all(_matches(self.streams, s) for s in inputs)

    def sees(self, kind: str, name: str, inputs: Sequence[str] = ()) -> bool:
        """Whether a reason may name the ``kind`` ("stream", "query") ``name``
        (:data:`lowtide.names.visible_names`)."""
        return self.sees_query(name, inputs) if kind == "query" else self.sees_stream(name)

    def ingest(self, stream: str, source: str) -> PermissionDenied | None:
        """The refusal of an Ingest into ``stream`` under ``source``, or None."""
        if _matches(self.streams, stream) and _matches(self.sources, source):
            return None
        return PermissionDenied(
            f"this token may ingest only into streams {_shown(self.streams)} under sources "
            f"{_shown(self.sources)}, not into stream {shown(stream)} under source {shown(source)}"
        )

    def subscribe(self, query: str, inputs: Sequence[str] = ()) -> PermissionDenied | None:
        """The refusal of a Subscribe to ``query`` (a query or ``<query>.late``), or None;
        ``inputs``: for ``<query>.late``, the names its query reads (their raw rows are in it)."""
        if _matches(self.queries, query):
            if all(_matches(self.streams, name) for name in inputs):
                return None
            return PermissionDenied(  # not naming the stream: the token may not know it
                f"{shown(query)} holds raw rows of a stream outside this token's streams "
                f"{_shown(self.streams)}"
            )
        hint = ""
        if query.endswith(".late") and _matches(self.queries, query.removesuffix(".late")):
            hint = f" (a .late stream holds raw input: it needs a pattern of its own, such as {shown(query)})"
        return PermissionDenied(
            f"this token may subscribe only to queries {_shown(self.queries)}, not {shown(query)}{hint}"
        )

    def explain(self, sql: str) -> PermissionDenied | None:
        """The refusal of explaining ``sql`` (reading a stream outside ``streams``), or None.

        SQL that does not parse, or is over the door's size limit (not parsed here: parsing
        runs on the event loop), is let through: the call answers with the door's reason.
        """
        if self.streams is None or len(sql.encode("utf-8", "surrogatepass")) > MAX_QUERY_BYTES:
            return None
        try:
            query = parse_query(sql)
        except LowtideError:
            return None
        for name in streams_read(query):
            if not _matches(self.streams, name):
                return PermissionDenied(
                    f"this token may read only streams {_shown(self.streams)}, not {shown(name)}"
                )
        return None


def parse(entry: object, role: str, where: str) -> TokenScope:
    """The scope of a ``--tokens`` entry whose role is ``role``: the table's other keys.

    ``where`` names the entry in a reason (never the token: it is a secret, and ends up in logs).
    """
    if not isinstance(entry, dict):
        return TokenScope(role)
    lists: dict[str, tuple[str, ...]] = {}
    for key, value in entry.items():
        if key == "role":
            continue
        if role == "admin":
            raise InvalidArgument(f"{where}: an admin token takes no {key!r}: admin tokens are unscoped")
        if key not in KEYS[role]:
            takes = ", ".join(repr(k) for k in KEYS[role])
            raise InvalidArgument(f"{where}: a {role} token takes no {key!r} (its scope keys are {takes})")
        if not isinstance(value, list) or not all(isinstance(p, str) and p for p in value):
            raise InvalidArgument(f'{where}: {key!r} must be a list of glob patterns, such as ["link-*"]')
        lists[key] = tuple(value)
    return TokenScope(role, lists.get("streams"), lists.get("sources"), lists.get("queries"))


def counted(scopes: Sequence[TokenScope]) -> str:
    """``2 admin, 1 producer (1 scoped)``: the tokens by role, for the start's notice."""
    parts = []
    for role in KEYS:
        of_role = [s for s in scopes if s.role == role]
        limited = sum(1 for s in of_role if s.limited)
        if of_role:
            parts.append(f"{len(of_role)} {role}" + (f" ({limited} scoped)" if limited else ""))
    return ", ".join(parts)


__all__ = ["KEYS", "TokenScope", "counted", "parse"]
