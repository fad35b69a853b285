"""The in-order (IOP) baseline of experiments (d) and (e): what lowtide's OOP operators replace.

:class:`OrderedMerge` is an order-preserving union: it holds each input's tuples until every
input's progress has passed them, then releases them sorted by time. :class:`InOrderCount` is
the in-order tumbling-window count that follows it: it keeps one open window and emits it when
time moves past its end. Both are columnar (numpy), so the comparison is of architectures, not
of a Python loop against kernels.
"""

from __future__ import annotations

from collections import deque

import numpy as np
import numpy.typing as npt

I64 = npt.NDArray[np.int64]


class OrderedMerge:
    """Union of ``inputs`` streams, each in time order, emitted in time order (a k-way merge of
    the released runs: concatenated and sorted, which numpy does as fast as a heap in Python)."""

    def __init__(self, inputs: int) -> None:
        self.buffers: list[deque[tuple[I64, I64]]] = [
            deque() for _ in range(inputs)
        ]  # (ts, key), oldest first
        self.progress = [np.iinfo(np.int64).min] * inputs

    def push(self, port: int, ts: I64, key: I64, punctuation: int) -> tuple[I64, I64]:
        """Take a batch and the input's new progress; returns what may now leave, sorted."""
        if ts.shape[0]:
            self.buffers[port].append((ts, key))
        self.progress[port] = punctuation
        release = min(self.progress)
        out_ts, out_key = [], []
        for port_buffers in self.buffers:
            # Inputs are in time order: only the oldest batches can be ready.
            while port_buffers:
                b_ts, b_key = port_buffers[0]
                ready = int(np.searchsorted(b_ts, release))
                if ready == 0:
                    break
                out_ts.append(b_ts[:ready])
                out_key.append(b_key[:ready])
                if ready < b_ts.shape[0]:
                    port_buffers[0] = (b_ts[ready:], b_key[ready:])
                    break
                port_buffers.popleft()
        if not out_ts:
            return np.empty(0, np.int64), np.empty(0, np.int64)
        ts, key = np.concatenate(out_ts), np.concatenate(out_key)
        order = np.argsort(ts, kind="stable")  # the sort OOP never does
        return ts[order], key[order]

    def nbytes(self) -> int:
        return sum(t.nbytes + k.nbytes for port in self.buffers for t, k in port)


class InOrderCount:
    """Tumbling count per key over time-ordered input: one open window, dense counts."""

    def __init__(self, width: int, keys: int) -> None:
        self.width = width
        self.counts = np.zeros(keys, np.int64)
        self.window: int | None = None
        self.emitted = 0  # windows emitted

    def push(self, ts: I64, key: I64) -> None:
        if ts.shape[0] == 0:
            return
        windows = ts // self.width
        # Sorted input: each window's tuples are one run.
        cuts = np.flatnonzero(np.diff(windows)) + 1
        for start, end in zip(np.r_[0, cuts], np.r_[cuts, ts.shape[0]], strict=True):
            w = int(windows[start])
            if self.window is not None and w != self.window:
                self._emit()
            self.window = w
            self.counts += np.bincount(key[start:end], minlength=self.counts.shape[0])

    def punctuate(self, value: int) -> None:
        """Time has passed ``value``: the open window is done if it ends there."""
        if self.window is not None and (self.window + 1) * self.width <= value:
            self._emit()
            self.window = None

    def _emit(self) -> None:
        self.emitted += 1
        self.counts[:] = 0

    def nbytes(self) -> int:
        return int(self.counts.nbytes)
