"""Which stored rows hold a NaN or None, checked as rows are written rather than by scanning the buffer.

Tianshou's trainer asks ``buffer.hasnull()`` after every collect step. Tianshou
answers by copying the whole buffer into a new ``Batch``; a scan of every stored
row without the copy still grows with the buffer (3 ms a call for a million
CartPole transitions, tens of ms for MuJoCo observations). :class:`NullRows`
checks only the rows written since the previous question and keeps, per row,
whether it holds a null, so a call costs what the last collect step wrote.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pandas as pd
import torch
from tianshou.data import Batch


class NullRows:
    """The rows of a buffer's storage (a Tianshou ``Batch``) that hold a NaN or None (``pandas.isnull``).

    The buffer reports the rows each write stores (:meth:`wrote`) and calls
    :meth:`forget` where its stored rows change otherwise (``reset``). A
    storage whose arrays were replaced (``set_batch``, a restore, a new key) is
    noticed and checked whole. Rows written behind the buffer's back (into its
    ``_meta``, or through one sub-buffer of a vector buffer) are not seen until
    they are written again through the buffer or it is checked whole.

    Not thread-safe by itself: the buffer calls it under its lock.

    Args:
        capacity: rows the storage holds (``maxsize``).
    """

    def __init__(self, capacity: int) -> None:
        self._null = np.zeros(capacity, bool)
        self._count = 0  # rows marked in _null
        self._pending: list[np.ndarray] | None = None  # rows written since the last check; None: check all
        self._pending_rows = 0
        self._arrays: tuple[Callable[[], Any], ...] = ()  # the storage's arrays at the last check, not kept alive

    def forget(self) -> None:
        """Check every stored row at the next :meth:`any`."""
        self._pending, self._pending_rows = None, 0

    def wrote(self, rows: np.ndarray) -> None:
        """Rows (global indices) just written through the buffer."""
        if self._pending is None:
            return
        self._pending_rows += len(rows)
        if self._pending_rows > len(self._null):  # nobody asked for a while: a whole check is cheaper
            self.forget()
        else:
            self._pending.append(rows)

    def any(self, storage: Batch, stored: list[tuple[int, int]]) -> bool:
        """Whether a stored row holds a null; ``stored``: the ``[start, stop)`` ranges of the stored rows."""
        arrays = tuple(leaf_arrays(storage))
        same = len(arrays) == len(self._arrays) and all(a is ref() for a, ref in zip(arrays, self._arrays))
        if self._pending is None or not same or self._pending_rows >= sum(b - a for a, b in stored):
            self._null[:] = False
            for a, b in stored:
                self._null[a:b] = null_rows(arrays, slice(a, b), b - a)
            self._count = int(np.count_nonzero(self._null))
        elif self._pending:
            rows = np.unique(np.concatenate(self._pending))
            null = null_rows(arrays, rows, len(rows))
            self._count += int(np.count_nonzero(null)) - int(np.count_nonzero(self._null[rows]))
            self._null[rows] = null
        self._pending, self._pending_rows, self._arrays = [], 0, tuple(map(_reference, arrays))
        return self._count > 0


def _reference(array: Any) -> Callable[[], Any]:
    """A weak reference to ``array`` (a replaced storage array is freed), or a strong one where it takes none."""
    try:
        return weakref.ref(array)
    except TypeError:
        return lambda: array


def leaf_arrays(batch: Batch) -> Iterator[Any]:
    """Every array in a (nested) ``Batch``.

    Exact type tests first: ``isinstance`` against ``Batch``, whose metaclass is
    ``typing.Protocol``'s, costs ~1 µs per key, and this runs after every collect.
    """
    for value in batch.__dict__.values():
        kind = type(value)
        if kind is np.ndarray or kind is torch.Tensor:
            yield value
        elif kind is Batch or isinstance(value, Batch):
            yield from leaf_arrays(value)
        elif value is not None:  # a key Tianshou left empty holds None: no rows
            yield value


def null_rows(arrays: tuple[Any, ...], index: slice | np.ndarray, n: int) -> np.ndarray:
    """For each of the ``n`` rows at ``index``, whether one of ``arrays`` holds a NaN or None there."""
    null = np.zeros(n, bool)
    if n == 0:
        return null
    for array in arrays:
        if isinstance(array, torch.Tensor):
            if array.is_floating_point():
                taken = array[index if isinstance(index, slice) else torch.from_numpy(index)]
                null |= torch.isnan(taken).reshape(n, -1).any(dim=1).cpu().numpy()
            continue
        values = array if type(array) is np.ndarray else np.asarray(array)
        kind = values.dtype.kind
        if kind in "biu":  # integers and booleans cannot hold NaN
            continue
        found = np.asarray(np.isnan(values[index]) if kind in "fc" else pd.isnull(values[index]))
        if found.any():  # rarely: the per-row reduction only then
            null |= found.reshape(n, -1).any(axis=1)
    return null
