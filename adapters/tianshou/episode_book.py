"""A vector buffer's ``add`` for all environments at once: sub-buffer state kept in arrays.

Tianshou's ``ReplayBufferManager.add`` walks the environments in Python: for each
one it asks its sub-buffer for the next slot and updates that sub-buffer's
episode statistics (``_update_state_pre_add``), a few µs per environment and
call, on every step of every environment. Here the state of all sub-buffers
lives in one :class:`EpisodeBook`, an array entry per environment, and
:func:`add_rows` updates every environment of a step with a handful of NumPy
operations, whatever their number.

The sub-buffers stay Tianshou ``ReplayBuffer``\\ s (:class:`SubBuffer`) whose
state attributes are views of their entry in the book, so everything of
Tianshou's that reads or writes them (``len``, ``reset``, ``sample_indices``,
pickling) sees the same numbers as the manager.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from tianshou.data import Batch, ReplayBuffer, ReplayBufferManager
from tianshou.data.batch import BatchProtocol
from tianshou.data.buffer.buffer_base import MalformedBufferError

from hetero_replay.adapters.tianshou.staging import Staged, commit

#: What ``add`` needs in a batch (``done`` is computed from the last two).
_REQUIRED = frozenset({"obs", "act", "rew", "terminated", "truncated"})


class EpisodeBook:
    """Insertion and episode state of ``n`` sub-buffers of ``size`` slots each.

    Row ``k`` of :attr:`counters` holds what Tianshou keeps in sub-buffer ``k``'s
    attributes, one column each (local slot indices): the next slot to write,
    how many slots hold data, the last slot written, the running episode's
    length and its first slot; :attr:`ep_return` holds that episode's return.
    One row per environment lets an add read and write them all in one go.
    """

    INSERTION, STORED, LAST, EP_LEN, EP_START = range(5)

    def __init__(self, n: int, size: int) -> None:
        self.size = size
        self.counters = np.zeros((n, 5), np.int64)
        self.ep_return = np.zeros(n, np.float64)  # (n, *reward shape) once a vector reward arrives


def _counter(column: int, doc: str) -> property:
    def get(self: SubBuffer) -> int:
        return int(self._book.counters[self._env, column])

    def set(self: SubBuffer, value: int) -> None:
        self._book.counters[self._env, column] = value

    return property(get, set, doc=doc)


class SubBuffer(ReplayBuffer):
    """One environment's Tianshou ``ReplayBuffer`` whose insertion and episode state is row ``env`` of ``book``."""

    _insertion_idx = _counter(EpisodeBook.INSERTION, "next slot to write")
    _size = _counter(EpisodeBook.STORED, "slots holding data")
    _ep_len = _counter(EpisodeBook.EP_LEN, "length of the running episode")
    _ep_start_idx = _counter(EpisodeBook.EP_START, "first slot of the running episode")

    def __init__(self, size: int, book: EpisodeBook, env: int, **kwargs: Any) -> None:
        self._book, self._env = book, env  # first: ReplayBuffer.__init__ writes the state
        super().__init__(size, **kwargs)

    def __getstate__(self) -> dict[str, Any]:
        """The state without the storage: a view of the manager's, which re-links it when it is loaded.

        Pickling, ``deepcopy`` and HDF5 would otherwise store every transition twice.
        """
        state = self.__dict__.copy()
        state["_meta"] = Batch()
        return state

    @property
    def _ep_return(self) -> Any:
        """Return of the running episode (an array for vector rewards)."""
        value = self._book.ep_return[self._env]
        return value.copy() if value.ndim else value

    @_ep_return.setter
    def _ep_return(self, value: Any) -> None:
        self._book.ep_return[self._env] = value

    @property
    def last_index(self) -> np.ndarray:
        """``[last slot written]``, a view: Tianshou writes ``last_index[0]`` in place."""
        return self._book.counters[self._env, EpisodeBook.LAST : EpisodeBook.LAST + 1]

    @last_index.setter
    def last_index(self, value: np.ndarray) -> None:
        self._book.counters[self._env, EpisodeBook.LAST] = np.asarray(value).reshape(())


def add_rows(
    manager: Any, staged: Staged, buffer_ids: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``ReplayBufferManager.add(batch, buffer_ids)`` with every environment handled by array operations.

    ``manager`` is a ``ReplayBufferManager`` of :class:`SubBuffer`\\ s sharing
    ``manager._book``; ``staged`` holds the new rows, one per id, already
    checked against the storage (:func:`~hetero_replay.adapters.tianshou.staging.stage`);
    ``buffer_ids`` are distinct and in range (the caller checks). Same results
    as Tianshou's. Nothing here can fail once the first row or counter is written.

    Returns:
        ``(indices, episode_returns, episode_lengths, episode_start_indices)`` as
        Tianshou's: global indices written, and the return and length of each
        episode that this step finished (0 for running ones).
    """
    book: EpisodeBook = manager._book
    B = EpisodeBook
    row = book.counters[buffer_ids]  # a copy: written back at the end
    offset = manager._offset[buffer_ids]
    slot = row[:, B.INSERTION].copy()
    ptr = slot + offset
    row[:, B.STORED] = np.minimum(row[:, B.STORED] + 1, book.size)
    ep_start = row[:, B.EP_START] + offset
    if (row[:, B.EP_START] > row[:, B.STORED]).any():
        raise MalformedBufferError(f"episode start slots {row[:, B.EP_START]} lie beyond the stored transitions")
    commit(manager, ptr, staged)

    rew, done = staged.rows.rew, staged.rows.done  # as stored: float rewards, bool flags
    if book.ep_return.shape[1:] != np.shape(rew)[1:]:  # the first vector reward: per-component returns
        book.ep_return = np.zeros((len(book.ep_return), *np.shape(rew)[1:]))
    ep_return = book.ep_return[buffer_ids] + rew
    ep_len = row[:, B.EP_LEN] + 1
    row[:, B.LAST] = slot
    row[:, B.INSERTION] = (slot + 1) % book.size
    row[:, B.EP_LEN] = np.where(done, 0, ep_len)  # a finished episode's successor starts afresh
    row[:, B.EP_START] = np.where(done, row[:, B.INSERTION], row[:, B.EP_START])
    finished = done.reshape(done.shape + (1,) * (ep_return.ndim - 1))
    book.ep_return[buffer_ids] = np.where(finished, 0.0, ep_return)
    book.counters[buffer_ids] = row
    manager.last_index[buffer_ids] = ptr
    manager._lengths[buffer_ids] = row[:, B.STORED]
    return ptr, np.where(finished, ep_return, 0.0), np.where(done, ep_len, 0), ep_start


def storable(buffer: ReplayBuffer, batch: BatchProtocol, stacked: bool = True) -> Batch:
    """The keys of ``batch`` that ``buffer`` stores, plus ``done``, as Tianshou's ``add`` prepares them.

    A vector buffer (``ReplayBufferManager``) keeps Tianshou's reserved keys, a
    single buffer every key, as their ``add``\\ s do. ``stacked``: the values have
    a leading row dimension (a single buffer's ``add`` without ``buffer_ids``
    gets one transition without it). Changes nothing.

    Raises:
        ValueError: the batch lacks a key ``add`` requires.
        TypeError: ``terminated`` or ``truncated`` hold neither booleans nor integers.
    """
    out = Batch()
    keys = buffer._reserved_keys if isinstance(buffer, ReplayBufferManager) else batch.__dict__
    for key in keys:
        if key in batch.__dict__:
            out.__dict__[key] = batch.__dict__[key]
    missing = sorted(_REQUIRED - out.__dict__.keys())
    if missing:
        raise ValueError(f"the batch to add lacks the keys {missing}")
    for key in ("terminated", "truncated"):
        dtype = np.asarray(out.__dict__[key]).dtype
        if dtype.kind not in "biu":
            raise TypeError(f"{key} must hold booleans (or 0/1 integers), got {dtype} values")
    out.__dict__["done"] = np.logical_or(out.terminated, out.truncated)
    if buffer._save_only_last_obs:
        out.obs = out.obs[:, -1] if stacked else out.obs[-1]
    if not buffer._save_obs_next:
        out.pop("obs_next", None)
    elif buffer._save_only_last_obs:
        out.obs_next = out.obs_next[:, -1] if stacked else out.obs_next[-1]
    return out
