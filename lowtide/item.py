"""What a query emits, in order: result tables, each followed by the punctuation that covers it.

Apart from :mod:`lowtide.handles` because the alias needs Arrow at run time: a query's name does
not, and the ``lowtide`` command's listings and registrations never load it.
"""

from __future__ import annotations

from typing import TypeAlias

import pyarrow as pa

from lowtide.punctuation.model import Punctuation

Item: TypeAlias = pa.Table | Punctuation

__all__ = ["Item"]
