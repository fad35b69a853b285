"""The window-operator contract: what an operator over windows declares beside ``STATE`` and
:meth:`~lowtide.operators.base.Operator.placement`.

A window operator (WID, fused WID, AdaptWID, Paned-WID and the Shared Slices it reads, sessions)
counts tuples in windows and emits a window's rows once punctuation completes it. Each declares:

* :meth:`WindowOperator.late_mask`: which tuples behind punctuation
  (docs/design.md, "Punctuation and lateness") it can no longer count once its input punctuation is
  ``p``. It is its window's logic, ``late_for`` (:mod:`lowtide.operators.window_logic`), a
  function of its window and ``p`` alone - a tuple in a window ``p`` completed (emitted); for
  sessions, every one, since whether a session is gone is state - so the door answers
  ``late = error`` from a query's description without the operator, with the same logic
  (:mod:`lowtide.query.late_rules`), as the operator would. Shared Slices answer for all their
  readers (the OR of theirs).
* :meth:`WindowOperator.emit_partials`: early results (``EMIT EVERY``,
  :mod:`lowtide.query.early`): emit the current rows of every open, non-empty window with
  ``final = false`` and change nothing any later result depends on. Such rows are for windows not
  complete yet, so they never fall below the output punctuation already emitted.

The contract suite (``tests/unit/test_window_operator_contract.py``) checks both for each of them.
"""

from __future__ import annotations

from abc import abstractmethod

import numpy as np
import numpy.typing as npt

from lowtide.batch import Batch
from lowtide.operators.base import Operator
from lowtide.operators.window_logic import WindowLogic

Mask = npt.NDArray[np.bool_]


class WindowOperator(Operator):
    """An operator over windows (see the module): ``logic``, its window's."""

    logic: WindowLogic

    def late_mask(self, batch: Batch, punctuation: int) -> Mask:
        """Which tuples (behind punctuation, as they enter the query) are late for this operator
        once its input punctuation is ``punctuation``: its logic's ``late_for``."""
        return self.logic.late_for(batch, punctuation)

    @abstractmethod
    def emit_partials(self) -> None:
        """Emit the open windows' current rows with ``final = false`` (see the module)."""


__all__ = ["Mask", "WindowOperator"]
