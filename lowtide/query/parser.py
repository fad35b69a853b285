"""Parse the query language (docs/design.md, "Query language") into the tree of `lowtide.query.ast`.

`parse_query` accepts one statement (a trailing ``;`` and ``--`` comments are allowed) and
either returns a `QueryTree` or raises: `QuerySyntaxError` (one line, with line and column, naming
what was found and what was expected) when the text does not parse, `UnsupportedQuery` when it
parses into something the language does not have (a FROM of three inputs). No lark exception
leaves this module. Spark's and Flink's window functions (``GROUP BY window(ts, '1 minute')``,
``TUMBLE(ts, INTERVAL '1' MINUTE)``, ``FROM TABLE(TUMBLE(...))``) come out as the bracket window
they spell (`lowtide.query.spellings`). `split_statements` cuts a script such as
``tests/data/thesis.sql`` into statements.
"""

from __future__ import annotations

import re
from dataclasses import replace
from functools import cache, lru_cache
from pathlib import Path
from typing import Any, NamedTuple

from lark import Lark, Token, Transformer, Tree, v_args
from lark.exceptions import UnexpectedCharacters, UnexpectedInput, UnexpectedToken, VisitError
from lark.lexer import PatternStr
from lark.tree import Meta

from lowtide.errors import LowtideError, QuerySyntaxError, UnsupportedQuery
from lowtide.query.ast import (
    DURATION_UNITS,
    BinaryOp,
    Case,
    Column,
    Duration,
    Expr,
    FromItem,
    FromQuery,
    FromStream,
    FromUnion,
    FuncCall,
    Interval,
    Literal,
    QueryTree,
    Rank,
    RankCall,
    RowCount,
    RowNum,
    SelectItem,
    SortKey,
    Star,
    TableArg,
    UnaryOp,
    WindowSpec,
)
from lowtide.query.spellings import WINDOW_FUNCTIONS, WindowTable, desugar, interval_of, window_table
from lowtide.query.topn import RANK_FUNCTIONS

__all__ = ["parse_query", "split_statements"]

# Reserved words are never identifiers (quote them: "from"); other keywords (RANGE, ROWS, ...) are
# keywords only where the grammar expects them, so `min`, `range` or `rows` stay usable as names.
_RESERVED_WORDS = (
    "select distinct from where group by having as and or not union true false null join on between"
)
_RESERVED = frozenset(_RESERVED_WORDS.split())
# How an expected terminal is named in a message, where its own pattern does not say it well.
_TERMINAL_TEXT = {
    "NAME": "identifier",
    "QUOTED_NAME": "identifier",
    "BACKQUOTED_NAME": "identifier",
    "NUMBER": "number",
    "STRING": "string",
    "COMPARE": "comparison operator",
    "ROW_NUM": "ROW-NUM",
    "$END": "end of query",
}
_MAX_EXPECTED = 8
_VALUES = frozenset({"NAME", "QUOTED_NAME", "BACKQUOTED_NAME", "NUMBER", "STRING"})
# Levels of the parse tree (each nested parenthesis, NOT, unary minus and chained operator is one):
# deeper queries are refused before anything recurses over them. A chain of 190 ORs still fits.
MAX_NESTING = 200
_INT64 = 2**63 - 1
# The trees `parse_query` keeps, of the last texts it parsed: a text registered again (on a fresh
# engine, a restarted query, the scope check before the door plans it) is not parsed again. Only
# texts up to REMEMBERED_CHARS: a tree takes up to about 100 bytes a character of its text, so
# the memo holds at most about 25 MB.
REMEMBERED_TEXTS = 128
REMEMBERED_CHARS = 2048
# One chunk of a script: a string, a quoted identifier, a comment, a ';', or other text.
_SCRIPT_CHUNK = re.compile(r"""'[^']*'?|"[^"]*"?|`[^`]*`?|--[^\n]*|;|[^'"`;-]+|-""")


def split_statements(text: str) -> list[str]:
    """The statements of `text`: ``--`` comments dropped, cut at each ``;`` outside quotes, stripped."""
    statements: list[str] = []
    current: list[str] = []
    for chunk in _SCRIPT_CHUNK.findall(text):
        if chunk == ";":
            statements.append("".join(current))
            current = []
        elif not chunk.startswith("--"):
            current.append(chunk)
    statements.append("".join(current))
    return [s.strip() for s in statements if s.strip()]


def parse_query(sql: str) -> QueryTree:
    """Parse one query; raise `QuerySyntaxError` or `UnsupportedQuery` (see the module docstring).

    A text of at most `REMEMBERED_CHARS` among the last `REMEMBERED_TEXTS` parsed gives the same
    tree object again: a tree is immutable end to end (`lowtide.query.ast`), so its readers may
    share it. A text that fails is not remembered: each call raises its error anew, with the same
    message.
    """
    return _remembered(sql) if len(sql) <= REMEMBERED_CHARS else _parsed(sql)


def _parsed(sql: str) -> QueryTree:
    if not split_statements(sql):
        raise QuerySyntaxError("empty query", 1, 1)
    try:
        tree = _lark().parse(sql)  # LALR: an explicit stack, however deep the text nests
    except UnexpectedInput as exc:
        raise _syntax_error(exc, sql) from exc
    if _too_deep(tree):  # building and planning the tree recurse: about 2 frames a level
        raise UnsupportedQuery(f"query nests too deeply: more than {MAX_NESTING} levels of expressions")
    builder = _Builder(sql)
    try:
        query: QueryTree = builder.transform(tree)
    except VisitError as exc:
        if isinstance(exc.orig_exc, LowtideError):
            raise exc.orig_exc from None
        if isinstance(exc.orig_exc, RecursionError):
            raise UnsupportedQuery("query nests too deeply") from None
        raise
    return _named_as_flink(query) if builder.flink_style else query


# lru_cache keeps no exception: a text that fails raises each call.
_remembered = lru_cache(maxsize=REMEMBERED_TEXTS)(_parsed)


def _named_as_flink(query: QueryTree) -> QueryTree:
    """``query`` (and the queries in its FROM) with each select item that is a qualified column
    and has no alias named by the column alone, as Flink and Spark name it: ``B.dateTime`` is
    ``dateTime``. (The bracket form keeps ``S0.ts``: its joins select both sides' ``ts``.)"""
    select = tuple(
        replace(item, text=item.expr.name)
        if isinstance(item.expr, Column) and item.expr.qualifier is not None and item.alias is None
        else item
        for item in query.select
    )
    from_ = tuple(
        replace(item, query=_named_as_flink(item.query)) if isinstance(item, FromQuery) else item
        for item in query.from_
    )
    return replace(query, select=select, from_=from_)


class _JoinOn(NamedTuple):
    """``a JOIN b ON condition``, before the query it belongs to takes it apart."""

    items: tuple[FromItem, FromItem]
    condition: Expr


def _too_deep(tree: Tree[Token]) -> bool:
    """Whether ``tree`` is more than ``MAX_NESTING`` levels deep (walked without recursion)."""
    stack = [(tree, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_NESTING:
            return True
        stack.extend((child, depth + 1) for child in node.children if isinstance(child, Tree))
    return False


@cache
def _lark() -> Lark:
    grammar = (Path(__file__).parent / "grammar.lark").read_text(encoding="utf-8")
    return Lark(
        grammar,
        parser="lalr",
        propagate_positions=True,
        maybe_placeholders=True,
        lexer_callbacks={"NAME": _reserve},
    )


def _unquoted(token: Token) -> str:
    """An identifier's name: a quoted one ("a b", `a b`) without its quotes, doubled ones single."""
    text = str(token)
    if token.type == "QUOTED_NAME":
        return text[1:-1].replace('""', '"')
    if token.type == "BACKQUOTED_NAME":
        return text[1:-1].replace("``", "`")
    return text


def _reserve(token: Token) -> Token:
    """Make a reserved word a keyword token (its terminal is named after it) even where unexpected."""
    if token.lower() in _RESERVED:
        token.type = token.upper()
    return token


# ---- error messages ----------------------------------------------------------------------------


def _syntax_error(exc: UnexpectedInput, sql: str) -> QuerySyntaxError:
    if isinstance(exc, UnexpectedCharacters):
        char = sql[exc.pos_in_stream or 0]
        if char in "'\"`":
            what = "string literal" if char == "'" else "quoted identifier"
            return QuerySyntaxError(f"unterminated {what}", exc.line, exc.column)
        found = f"character {_quote(char)}"
    elif isinstance(exc, UnexpectedToken) and exc.token.type != "$END":
        found = _quote(str(exc.token))
    else:
        line, column = _end_position(exc, sql)
        return QuerySyntaxError(f"unexpected end of query; expected {_expected(exc)}", line, column)
    return QuerySyntaxError(f"unexpected {found}; expected {_expected(exc)}", exc.line, exc.column)


def _accepted(exc: UnexpectedInput) -> set[str]:
    """The terminals the parser could have taken where it failed."""
    interactive = getattr(exc, "interactive_parser", None)
    if interactive is not None:  # exact: LALR's own expected sets merge lookaheads of many states
        accepts = set(interactive.accepts())
        stack = interactive.parser_state.value_stack
        if stack and isinstance(stack[-1], Token) and stack[-1].type == "NAME":
            # A value right after a name is only ever the rest of INTERVAL '1' MINUTE or TABLE S:
            # never what the user missed.
            accepts -= _VALUES
        return accepts
    return set(getattr(exc, "expected", None) or getattr(exc, "allowed", None) or ())


def _expected(exc: UnexpectedInput) -> str:
    """What the parser could have taken, as a short sorted list of what a user would type."""
    texts = sorted({_terminal_text(name) for name in _accepted(exc)} - {""}, key=_expected_rank)
    if not texts:
        return "nothing more"
    if len(texts) > _MAX_EXPECTED:
        return ", ".join(texts[:_MAX_EXPECTED]) + ", ..."
    return texts[0] if len(texts) == 1 else ", ".join(texts[:-1]) + " or " + texts[-1]


def _expected_rank(text: str) -> tuple[int, str]:
    # Keywords first, then the punctuation that closes things, then values, then operators.
    if text.isupper():
        return 0, text
    if text in ("','", "')'", "'['", "']'", "';'", "end of query"):
        return 1, text
    return (2 if text[0].isalpha() else 3), text


def _terminal_text(name: str) -> str:
    if name in _TERMINAL_TEXT:
        return _TERMINAL_TEXT[name]
    terminal = next((t for t in _lark().terminals if t.name == name), None)
    if terminal is None or name in _lark().ignore_tokens:
        return ""
    value = str(terminal.pattern.value)
    if isinstance(terminal.pattern, PatternStr) and value.isalpha():
        return value.upper()
    return _quote(value) if isinstance(terminal.pattern, PatternStr) else name


def _quote(text: str) -> str:
    return f"'{text}'" if "'" not in text else f'"{text}"'


def _end_position(exc: UnexpectedInput, sql: str) -> tuple[int, int]:
    last = getattr(exc, "token", None)  # lark's end-of-input token borrows the last token's place
    if isinstance(last, Token) and last.end_line is not None and last.end_column is not None:
        return last.end_line, last.end_column
    end = len(sql.rstrip())
    return sql.count("\n", 0, end) + 1, end - sql.rfind("\n", 0, end)


# ---- tree to AST -------------------------------------------------------------------------------


class _Param(NamedTuple):
    """One window parameter: its keyword token and the `WindowSpec` fields it sets."""

    keyword: Token
    fields: dict[str, Any]


def _error_at(token: Token, reason: str) -> QuerySyntaxError:
    return QuerySyntaxError(reason, token.line or 1, token.column or 1)


def _shorten(text: str, most: int = 30) -> str:
    return text if len(text) <= most else text[:most] + "..."


def _integer(token: Token) -> int:
    """A whole-number token as an int64 (a longer one is refused before int() reads it)."""
    digits = token.lstrip("0") or "0"
    if len(digits) > 19 or int(digits) > _INT64:
        raise _error_at(token, f"number {_shorten(token)} is out of range (at most {_INT64})")
    return int(digits)


def _flatten(children: list[Any]) -> list[Any]:
    flat: list[Any] = []
    for child in children:
        if isinstance(child, list):
            flat.extend(child)
        elif isinstance(child, Token):  # the PA keyword: its columns follow it
            flat.append(_Param(child, {}))
        elif child is not None:
            flat.append(child)
    return flat


class _Builder(Transformer[Token, QueryTree]):  # type: ignore[misc]  # lark is untyped here
    """Builds the AST bottom-up; rule names are those of grammar.lark."""

    def __init__(self, sql: str) -> None:
        super().__init__()
        self._sql = sql
        self.window_table: WindowTable | None = None  # FROM TABLE(TUMBLE(...)), if written
        # Written as Flink (or Spark) users write it: a JOIN ... ON, a derived table, a window
        # function. Its select items are then named as they name them (`B.dateTime` is `dateTime`).
        self.flink_style = False

    def _text(self, meta: Meta, end: int | None = None) -> str:
        return self._sql[meta.start_pos : meta.end_pos if end is None else end].strip()

    @v_args(meta=True)
    def query(self, meta: Meta, c: list[Any]) -> QueryTree:
        distinct, items, window, from_, where, group_by, having = c
        if isinstance(from_, _JoinOn):  # ON and WHERE alike: an inner join keeps the pairs both hold
            where = from_.condition if where is None else BinaryOp("AND", from_.condition, where)
            from_ = from_.items
        if len(from_) > 2:
            raise UnsupportedQuery(f"FROM takes one input, or two for a join; got {len(from_)}")
        if any(isinstance(g, FuncCall) and g.name in WINDOW_FUNCTIONS for g in group_by or ()):
            self.flink_style = True
        table, self.window_table = self.window_table, None  # each (derived) query its own
        query = QueryTree(
            select=tuple(items),
            distinct=distinct is not None,
            window=window,
            from_=tuple(from_),
            where=where,
            group_by=tuple(group_by or ()),
            having=having,
            text=self._text(meta),
        )
        return desugar(query, table)  # Spark's and Flink's windows as bracket windows

    def join_on(self, c: list[Any]) -> _JoinOn:
        left, kind, _, right, _, condition = c
        if kind is not None and kind.upper() != "INNER":
            raise UnsupportedQuery(
                f"{kind.upper()} JOIN is not supported: lowtide's joins are inner joins; write JOIN "
                "(a row without a partner is never emitted)",
            )
        self.flink_style = True
        return _JoinOn((left, right), condition)

    def join_kind(self, c: list[Any]) -> Token | None:
        return next((t for t in c if t is not None), None)

    def temporal_table(self, c: list[Any]) -> FromItem:
        raise UnsupportedQuery(
            "FOR SYSTEM_TIME AS OF (Flink's lookup join, on processing time) is not supported: lowtide "
            "joins streams on event time; send the table as a stream and join it with a bound in time",
        )

    def derived(self, c: list[Any]) -> FromQuery:
        self.flink_style = True
        return FromQuery(c[0])

    @v_args(meta=True)
    def star_item(self, meta: Meta, c: list[Any]) -> SelectItem:
        return SelectItem(Star(c[0]), None, self._text(meta))

    def between(self, c: list[Any]) -> Expr:
        value, negated, _, low, _, high = c
        within = BinaryOp("AND", BinaryOp(">=", value, low), BinaryOp("<=", value, high))
        return within if negated is None else UnaryOp("NOT", within)

    @v_args(meta=True)
    def item(self, meta: Meta, c: list[Any]) -> SelectItem:
        expr, as_token, alias = c
        text = self._text(meta, None if as_token is None else as_token.start_pos)
        if isinstance(expr, Column) and "`" in text:  # a backquoted column is named as Flink names it
            text = expr.name if expr.qualifier is None else f"{expr.qualifier}.{expr.name}"
        return SelectItem(expr, alias, text)

    def items(self, c: list[Any]) -> list[Any]:
        return c

    group_by = from_list = args = items

    def paren(self, c: list[Any]) -> Expr:
        expr: Expr = c[0]
        return expr

    # ---- FROM ----

    def from_window_alias(self, c: list[Any]) -> FromItem:
        primary: FromItem = c[0]
        return replace(primary, window=c[1], alias=c[2])

    def from_alias_window(self, c: list[Any]) -> FromItem:
        primary: FromItem = c[0]
        return replace(primary, alias=c[1], window=c[2])

    def union(self, c: list[Any]) -> FromUnion:
        return FromUnion(tuple(c))

    def stream(self, c: list[Any]) -> FromStream:
        return FromStream(c[0])

    @v_args(meta=True)
    def table_function(self, meta: Meta, c: list[Any]) -> FromStream:
        """Flink's ``TABLE(TUMBLE(TABLE S, DESCRIPTOR(ts), size))``: stream S, its window kept aside."""
        name, args = c
        if name.lower() != "table" or len(args) != 1:
            raise QuerySyntaxError(
                "a function in FROM is a window table of Flink: "
                "TABLE(TUMBLE(TABLE S, DESCRIPTOR(ts), INTERVAL '1' MINUTE)), or HOP or SESSION",
                meta.line,
                meta.column,
            )
        if self.window_table is not None:
            raise UnsupportedQuery(
                "a query reads one window table; a join windows its inputs in brackets, "
                "e.g. FROM S0, S1 [RANGE TUMBLING 1 minute, WA ts]"
            )
        self.window_table = window_table(args[0])
        self.flink_style = True
        return FromStream(self.window_table.stream)

    # ---- window ----

    @v_args(meta=True)
    def window(self, meta: Meta, c: list[Any]) -> WindowSpec:
        fields: dict[str, Any] = {}
        seen: dict[str, Token] = {}
        pa: list[Column] = []
        params, emit = c  # EMIT EVERY after the bracket counts as its last parameter
        for entry in [*params, emit] if emit is not None else params:
            if isinstance(entry, Column):  # an attribute of the PA list before it
                pa.append(entry)
                continue
            keyword = entry.keyword.upper()
            key = "WA" if keyword == "WATTR" else keyword
            if key in seen:
                also = "" if seen[key].upper() == keyword else f" (as {seen[key].upper()}, its synonym)"
                raise _error_at(entry.keyword, f"window parameter {keyword} given twice{also}")
            seen[key] = entry.keyword
            fields.update(entry.fields)
        return WindowSpec(**fields, pa=tuple(pa), text=self._text(meta))

    def wparams(self, c: list[Any]) -> list[Any]:
        return _flatten(c)

    pa_rest = wparams

    def range_param(self, c: list[Any]) -> _Param:
        if len(c) == 3:
            return _Param(c[0], {"range": c[2], "tumbling": True})
        if isinstance(c[1], Token):
            return _Param(c[0], {"range_all": True})
        return _Param(c[0], {"range": c[1]})

    def slide_param(self, c: list[Any]) -> _Param:
        return _Param(c[0], {"slide": c[1]})

    def wa_param(self, c: list[Any]) -> _Param:
        return _Param(c[0], {"wa": RowNum() if isinstance(c[1], Token) else c[1]})

    def session_param(self, c: list[Any]) -> _Param:
        return _Param(c[0], {"session": c[1]})

    def emit_param(self, c: list[Any]) -> _Param:
        return _Param(c[0], {"emit_every": c[2]})

    def rattr_param(self, c: list[Any]) -> _Param:
        return _Param(c[0], {"rattr": c[1]})

    def sattr_param(self, c: list[Any]) -> _Param:
        return _Param(c[0], {"sattr": RowNum() if len(c) == 2 else Rank(c[2])})

    def duration(self, c: list[Any]) -> Duration:
        amount, unit = c
        if unit is None:  # in the attribute's units: an integer stays exact past 2^53
            return Duration(int(amount) if str(amount).isdigit() else float(amount), None)
        if unit.lower() not in DURATION_UNITS:
            raise _error_at(unit, f"unknown duration unit {_quote(unit)}; expected ms, s, min, h or day")
        return Duration(float(amount), DURATION_UNITS[unit.lower()])

    def rows(self, c: list[Any]) -> RowCount:
        if not c[0].isdigit():
            raise _error_at(c[0], f"a row count is a whole number; got {_shorten(c[0])}")
        return RowCount(_integer(c[0]))

    # ---- expressions ----

    def binop(self, c: list[Any]) -> BinaryOp:
        left, op, right = c
        return BinaryOp("!=" if op == "<>" else op.upper(), left, right)

    def unop(self, c: list[Any]) -> UnaryOp:
        return UnaryOp(c[0].upper(), c[1])

    def interval_arg(self, c: list[Any]) -> Interval:
        word, value, unit = c
        if word.lower() != "interval":
            raise _error_at(value, f"unexpected {_quote(value)}; expected ',', ')' or an operator")
        if unit is None and value.type == "NUMBER":
            raise _error_at(value, f"INTERVAL {value} needs a unit, e.g. INTERVAL {value} SECONDS")
        amount = value[1:-1].replace("''", "'") if value.type == "STRING" else str(value)
        try:
            return Interval(interval_of(amount, None if unit is None else str(unit)))
        except ValueError as exc:
            raise _error_at(value, str(exc)) from None

    def table_arg(self, c: list[Any]) -> TableArg:
        word, name = c
        if word.lower() != "table":
            raise _error_at(name, f"unexpected {_quote(name)}; expected ',', ')' or an operator")
        return TableArg(_unquoted(name))

    def func_call(self, c: list[Any]) -> FuncCall:
        return FuncCall(c[0].lower(), tuple(c[1] or ()), filter=c[2])

    def distinct_call(self, c: list[Any]) -> FuncCall:
        name, distinct, args, condition = c
        if name.lower() != "count":
            raise _error_at(
                distinct, f"DISTINCT inside a call is count(DISTINCT x) only, not {name}(DISTINCT ...)"
            )
        return FuncCall("count", tuple(args), distinct=True, filter=condition)

    def star_call(self, c: list[Any]) -> FuncCall:
        if c[0].lower() != "count":
            raise _error_at(c[1], f"'*' is an argument of count only, not of {c[0]}")
        return FuncCall("count", (Star(),), filter=c[2])

    def over_call(self, c: list[Any]) -> RankCall:
        """``ROW_NUMBER() OVER (PARTITION BY ... ORDER BY ...)``; RANK() and DENSE_RANK() alike."""
        name, args, over, partition_by, order_by, frame = c
        function = name.lower()
        if frame is not None:
            raise UnsupportedQuery(
                f"{name}(...) OVER (... {frame.children[0].upper()} BETWEEN ...), Flink's over aggregation "
                "(an aggregate for every row, over the rows before it), is not supported: aggregate over a "
                "window instead, e.g. GROUP BY k, HOP(...), or the tuple window "
                "[RANGE 10 rows, SLIDE 1 row, WA row-num, PA k]"
            )
        if function not in RANK_FUNCTIONS or args:
            raise _error_at(
                over,
                f"{name}({'...' if args else ''}) OVER (...) is not supported: OVER takes ROW_NUMBER(), "
                "RANK() or DENSE_RANK(), the rank of a Window Top-N",
            )
        self.flink_style = True
        return RankCall(function, tuple(partition_by or ()), tuple(order_by or ()))

    def keyword_alias(self, c: list[Any]) -> str:
        """``FROM s order``: a name right after a name is lexed as the ORDER BY (ASC, DESC) that
        may follow a column in OVER (...) (LALR shares that state), so the alias takes them back."""
        return str(c[0])

    def partition_by(self, c: list[Any]) -> list[Expr]:
        return c[1:]

    order_by = partition_by

    def sort_key(self, c: list[Any]) -> SortKey:
        expr, direction = c
        return SortKey(expr, direction is not None and direction.upper() == "DESC")

    def agg_filter(self, c: list[Any]) -> Expr:
        condition: Expr = c[1]
        return condition

    def case_when(self, c: list[Any]) -> tuple[Expr, Expr]:
        return c[1], c[3]

    def case_expr(self, c: list[Any]) -> Case:
        """``CASE [x] WHEN ... [ELSE e] END``; the simple form's WHEN a compares ``x = a``."""
        operand, whens, else_ = c[1], c[2:-3], c[-2]  # c: CASE, x, WHEN..., ELSE, e, END
        pairs = tuple(whens if operand is None else ((BinaryOp("=", operand, w), v) for w, v in whens))
        return Case(pairs, else_)

    def literal(self, c: list[Any]) -> Literal:
        token: Token = c[0]
        if token.type == "NUMBER":
            return Literal(_integer(token) if token.isdigit() else float(token))
        if token.type == "STRING":
            return Literal(token[1:-1].replace("''", "'"))
        return Literal({"TRUE": True, "FALSE": False, "NULL": None}[token.type])

    def column(self, c: list[Any]) -> Column:
        return Column(c[0]) if len(c) == 1 else Column(c[1], c[0])

    def ident(self, c: list[Any]) -> str:
        return _unquoted(c[0])
