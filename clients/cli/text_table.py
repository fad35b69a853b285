"""Rows of text as an aligned table: the ``lowtide`` command's listings and ``tail``'s tables.

Apart from :mod:`lowtide.clients.cli.io` because that loads Arrow, which a listing
(``stream list``, ``query list``, ``workers``) does not need.
"""

from __future__ import annotations


def format_table(header: list[str], rows: list[list[str]]) -> str:
    """Columns aligned with two spaces between them, nothing cut: readable and greppable."""
    widths = [max(len(cell) for cell in column) for column in zip(header, *rows, strict=True)]
    lines = [
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in (header, *rows)
    ]
    return "\n".join(lines)
