"""lowtide's query language: `parse_query` turns query text into the frozen tree of `ast`."""

from lowtide.query.ast import (
    BinaryOp,
    Column,
    Duration,
    Expr,
    FromItem,
    FromStream,
    FromUnion,
    FuncCall,
    Literal,
    Query,
    Rank,
    RowNum,
    Rows,
    SelectItem,
    Star,
    UnaryOp,
    WindowSpec,
)
from lowtide.query.parser import parse_query, split_statements

__all__ = [
    "BinaryOp",
    "Column",
    "Duration",
    "Expr",
    "FromItem",
    "FromStream",
    "FromUnion",
    "FuncCall",
    "Literal",
    "Query",
    "Rank",
    "RowNum",
    "Rows",
    "SelectItem",
    "Star",
    "UnaryOp",
    "WindowSpec",
    "parse_query",
    "split_statements",
]
