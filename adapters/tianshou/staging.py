"""All-or-nothing writes of new transitions into Tianshou's ``Batch`` storage.

Tianshou writes a batch into its storage key by key (``Batch.__setitem__``), after
moving the buffer's position, so a value that does not fit (a reward of the
wrong shape, text where numbers are stored) raises half-way: the slot keeps
fields of two transitions and the position has moved. Here the new rows are
first converted into exactly the layout the storage holds (:func:`stage`): its
keys, shapes and dtypes, with Tianshou's defaults for keys the batch lacks and
Tianshou's allocation for keys the storage lacks. Anything that does not fit
raises there, naming the key, before the storage or any counter changes;
writing the staged rows (:func:`commit`) cannot fail.

Two rules are stricter than Tianshou's write, where that write changes data silently:

* a value must have exactly the rows' shape: NumPy would broadcast an
  observation of shape ``(obs_dim,)`` over every environment, or one row over all;
* numbers keep their kind: floats are not truncated into integer or boolean
  storage, and text does not go into numeric storage. Integers into boolean
  columns (``terminated=0``) stay allowed, as Tianshou's own tests write them.
"""

from __future__ import annotations

from typing import Any, NamedTuple, cast

import numpy as np
import torch
from tianshou.data import Batch, ReplayBuffer, ReplayBufferManager
from tianshou.data.batch import BatchProtocol, alloc_by_keys_diff, create_value
from tianshou.data.types import RolloutBatchProtocol

#: Marks a key the new batch lacks (``None`` is a value Tianshou can store).
_MISSING = object()

#: Dtypes Tianshou gives these keys when it allocates their storage.
_ALLOCATED_AS = {
    "rew": np.dtype(np.float64),
    "done": np.dtype(bool),
    "terminated": np.dtype(bool),
    "truncated": np.dtype(bool),
}


class Staged(NamedTuple):
    """New rows in the storage's layout, ready for :func:`commit`."""

    rows: Batch
    grows: bool  # the storage lacks some of the keys: commit allocates them first


def stage(storage: BatchProtocol, batch: BatchProtocol, n: int, stacked: bool = True) -> Staged:
    """``batch`` as ``n`` rows laid out as ``storage`` holds them; changes nothing.

    Args:
        storage: the buffer's ``_meta`` (empty before the first add).
        batch: the transitions, prepared as Tianshou's ``add`` prepares them.
        n: number of rows.
        stacked: the batch's values have a leading dimension of ``n`` rows; otherwise
            it is one transition without it (a single buffer's ``add`` without
            ``buffer_ids``).

    Raises:
        ValueError: a value whose shape differs from its rows' shape.
        TypeError: a value whose type or dtype the storage cannot hold unchanged.
    """
    return _stage_batch(storage, batch, n, stacked, prefix="")


def commit(buffer: ReplayBuffer, indices: np.ndarray, staged: Staged) -> None:
    """Write staged rows into ``buffer``'s storage at ``indices``, allocating new keys as Tianshou does."""
    if staged.grows:
        if not buffer._meta.get_keys():
            # create_value of a Batch is a Batch; Tianshou types its storage as a RolloutBatchProtocol
            buffer._meta = cast(RolloutBatchProtocol, create_value(staged.rows, buffer.maxsize, stack=False))
        else:
            alloc_by_keys_diff(buffer._meta, staged.rows, buffer.maxsize, stack=False)
        if isinstance(buffer, ReplayBufferManager):
            buffer._set_batch_for_children()  # the children's storage are views of the new arrays
    _write(buffer._meta, indices, staged.rows)


def _write(storage: BatchProtocol, indices: np.ndarray, rows: Batch) -> None:
    """``storage[indices] = rows`` for staged rows: one array assignment per key, none of which can fail."""
    for key, column in storage.__dict__.items():
        if _is_batch(column):
            _write(column, indices, rows.__dict__[key])
        else:
            column[indices] = rows.__dict__[key]


def _is_batch(value: Any) -> bool:
    """``isinstance(value, Batch)``, quick for arrays: ``Batch``'s metaclass makes ``isinstance`` cost µs."""
    kind = type(value)
    return kind is Batch or (kind is not np.ndarray and kind is not torch.Tensor and isinstance(value, Batch))


def _stage_batch(storage: BatchProtocol, batch: BatchProtocol, n: int, stacked: bool, prefix: str) -> Staged:
    out, grows = Batch(), False
    rows = out.__dict__
    for key in {**storage.__dict__, **batch.__dict__}:  # the storage's keys first, in its order
        value = batch.__dict__.get(key, _MISSING)
        column = storage.__dict__.get(key, _MISSING)
        if (
            stacked
            and type(value) is np.ndarray
            and type(column) is np.ndarray
            and value.dtype == column.dtype
            and value.shape[:1] == (n,)
            and value.shape[1:] == column.shape[1:]
        ):  # the usual case, spelled out for speed: the value fits as it is
            rows[key] = value
            continue
        path = prefix + key
        if column is _MISSING or (_is_batch(column) and not column.__dict__ and _is_batch(value) and value.__dict__):
            # a key the storage lacks (or an empty Batch it will fill): laid out as Tianshou allocates it
            column, grows = _new_column(value, n, stacked, path, top_level=not prefix), True
        if _is_batch(column):
            if value is _MISSING:
                value = Batch()  # Tianshou fills every key of a missing Batch with its default
            if not _is_batch(value):
                raise TypeError(f"{path}: the buffer stores a Batch here, got {type(value).__name__}")
            rows[key], sub_grows = _stage_batch(column, value, n, stacked, path + ".")
            grows = grows or sub_grows
        else:
            rows[key] = _stage_array(column, value, n, stacked, path)
    return Staged(out, grows)


def _new_column(value: Any, n: int, stacked: bool, path: str, top_level: bool) -> Any:
    """``n`` rows laid out as Tianshou allocates storage for a key it has not stored yet."""
    if stacked and not _is_batch(value) and np.shape(value)[:1] != (n,):
        raise ValueError(f"{path}: expected {n} rows (shape ({n}, ...)), got shape {np.shape(value)}")
    column = create_value(value, n, stack=not stacked)
    if top_level and path in _ALLOCATED_AS and isinstance(column, np.ndarray):
        column = column.astype(_ALLOCATED_AS[path])  # Tianshou stores rewards as float, flags as bool
    return column


def _stage_array(column: Any, value: Any, n: int, stacked: bool, path: str) -> Any:
    """``value`` as ``n`` rows that ``column`` can hold unchanged.

    ``value`` itself where it fits as it is (no copy), else a converted copy;
    for a key the batch lacks, rows of Tianshou's defaults (0, or ``None`` in object storage).
    """
    if _is_batch(value):
        raise TypeError(f"{path}: the buffer stores an array here, got a Batch")
    if not isinstance(column, (np.ndarray, torch.Tensor)):
        raise TypeError(f"{path}: cannot write into storage of type {type(column).__name__}")
    trailing = tuple(column.shape[1:])
    if value is _MISSING:  # Tianshou's default for a key the batch lacks
        if isinstance(column, torch.Tensor):
            return column.new_zeros((n, *trailing))
        return np.full((n, *trailing), None if column.dtype == object else 0, column.dtype)
    expected = (n, *trailing) if stacked else trailing
    if isinstance(column, torch.Tensor):
        try:
            tensor = torch.as_tensor(value)
        except (TypeError, ValueError, RuntimeError) as e:
            raise TypeError(f"{path}: the buffer stores {column.dtype}, got values it cannot hold ({e})") from e
        if tuple(tensor.shape) != expected:
            raise ValueError(f"{path}: expected shape {expected}, got {tuple(tensor.shape)}")
        if not torch.can_cast(tensor.dtype, column.dtype):
            raise TypeError(f"{path}: the buffer stores {column.dtype}, got {tensor.dtype} values")
        tensor = tensor.to(device=column.device, dtype=column.dtype)
        return tensor if stacked else tensor.unsqueeze(0)
    source = value.numpy(force=True) if isinstance(value, torch.Tensor) else np.asarray(value)
    if source.shape != expected:
        raise ValueError(f"{path}: expected shape {expected}, got {source.shape}")
    if source.dtype != column.dtype and column.dtype != object:
        if source.dtype == object:  # Batch keeps text and mixed lists as objects: type them by their elements
            try:
                source = np.array(source.tolist())
            except ValueError as e:  # ragged sequences
                raise TypeError(f"{path}: the buffer stores {column.dtype}, got objects it cannot hold ({e})") from e
        if not _keeps_kind(source.dtype, column.dtype):
            raise TypeError(f"{path}: the buffer stores {column.dtype}, got {source.dtype} values")
        source = source.astype(column.dtype)
    return source if stacked else source[None]


def _keeps_kind(source: np.dtype, target: np.dtype) -> bool:
    """Whether values of dtype ``source`` go into numeric ``target`` storage without changing kind."""
    return bool(np.can_cast(source, target, "same_kind")) or (target.kind == "b" and source.kind in "iu")
