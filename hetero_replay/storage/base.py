"""The storage protocol: where the rows of transitions live.

A storage only stores: it validates batches against its schema, writes rows at
ring positions its owner chooses, gathers rows by index, and exports and
imports rows for saved buffers. The write position, the priorities and the lock
are the owner's (:class:`~hetero_replay.replay.PrioritizedReplay`). Host,
torch-device and pinned storages implement it here; shared-memory, file-backed
and remote storages plug in through :func:`hetero_replay.registry.register_storage`.

What a storage can do beyond storing is said by the protocols it meets, which
its owner asks with ``isinstance`` (never by the storage's name):

* :class:`RingStorage`: other processes add rows (writer handles, polls, reads checked whole);
* :class:`RecordRing`: a ring storage whose compressed fields' records are saved as they are;
* :class:`DurableStorage`: durable points, and reopening at the last one after a crash;
* :class:`DeviceStorage`: rows are torch tensors on a device, so batches are too.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np

from hetero_replay.storage.schema import Field, Schema


@runtime_checkable
class Storage(Protocol):
    """Fixed-capacity rows of a :class:`Schema`, written as a ring, read by index."""

    capacity: int
    schema: Schema

    def validate(self, batch: Mapping[str, Any]) -> tuple[int, dict[str, Any]]:
        """Check a batch holding every field; return ``(rows, arrays)`` in the fields' dtypes.

        Raises ``TypeError``/``ValueError`` naming the field, the expected and
        the received shape or dtype, or the value a cast would change.
        """

    def validate_fields(self, fields: Mapping[str, Any]) -> tuple[int, dict[str, Any]]:
        """:meth:`validate` for a subset of the fields (each must be in the schema)."""

    def write(self, start: int, arrays: Mapping[str, Any]) -> None:
        """Write validated rows (all fields or some) at ring positions ``start, start + 1, ...``."""

    def gather(self, indices: Any, fields: Sequence[str] | None = None) -> dict[str, Any]:
        """Rows at ``indices`` (int64, already checked) of every field, or of ``fields``."""

    def export_rows(self, count: int, copy: bool = True) -> dict[str, Any]:
        """The first ``count`` rows of every field as host NumPy arrays (for ``state_dict`` and ``save``).

        ``copy=False`` may return views (the caller holds the owner's lock while using them).
        """

    def import_rows(self, arrays: Mapping[str, Any]) -> None:
        """Write host arrays (one per field, same row count) from row 0 on (a restored state)."""

    def view(self, name: str) -> Any:
        """A live array view of field ``name`` over all rows; ``NotImplementedError`` where there is none."""

    def close(self) -> None:
        """Release what the storage holds (files, shared memory, device memory)."""


@runtime_checkable
class RingStorage(Storage, Protocol):
    """A storage that writer processes add rows to: it decides where rows go (see :mod:`.ring`).

    Its owner (:class:`~hetero_replay.replay.PrioritizedReplay`) adds through
    :meth:`append`, learns of rows other processes added from :meth:`poll`,
    and serves only rows :meth:`read_intact` vouches for.
    """

    @property
    def tickets(self) -> int:
        """Adds reserved so far by every writer; the ring's next slot is ``tickets % capacity``."""

    @property
    def committed(self) -> int:
        """Slots holding a complete row, as of the last :meth:`poll`."""

    def append(self, arrays: Mapping[str, Any]) -> Any:
        """Add validated rows as the owner's writer; returns the slots committed."""

    def poll(self) -> tuple[Any, Any]:
        """``(new, gone)`` slots since the last poll: complete new rows, and rows being replaced."""

    def read_intact(self, indices: Any) -> tuple[dict[str, Any], Any]:
        """Rows at ``indices`` and a mask of those read whole (not being rewritten meanwhile)."""

    def adopt(self, position: int, size: int, arrays: Mapping[str, Any]) -> None:
        """Hold ``arrays`` (``size`` rows, from a restored state) as committed rows of a ring at ``position``."""

    def writer(self) -> Any:
        """A picklable handle other processes add rows with."""


@runtime_checkable
class RecordRing(RingStorage, Protocol):
    """A ring storage keeping fields compressed, whose state dicts and files hold their records as they are.

    The form is the host storage's (:meth:`~hetero_replay.storage.host.HostStorage.export_state`):
    the raw fields' rows, and per compressed field its records and their offsets with the codec settings.
    """

    def export_state(self, count: int, copy: bool = True) -> tuple[dict[str, Any], dict[str, Any] | None]:
        """The first ``count`` rows: the raw fields' rows, and the compressed fields' records as they are."""

    def adopt_state(self, position: int, size: int, rows: Mapping[str, Any], packed: Mapping[str, Any]) -> None:
        """:meth:`RingStorage.adopt` of a state in :meth:`export_state`'s form (of this storage or another)."""


@runtime_checkable
class DurableStorage(Storage, Protocol):
    """A storage that keeps its buffer across crashes: it makes durable points and reopens at the last one.

    Its owner (:class:`~hetero_replay.replay.PrioritizedReplay`) hands it a
    snapshot of what the storage does not hold (the header of
    :mod:`~hetero_replay.storage.checkpoint`, every slot's priority) whenever
    :meth:`flush_due` says so, at ``flush()`` and at ``close()``; a storage
    built with ``reopen=True`` holds the last such point in :attr:`reopened_point`.
    The rules of when and what: :mod:`hetero_replay.storage.durable`.
    """

    #: ``(header, priorities)`` of the durable point a reopened storage restored
    #: (every slot's priority, 0 where the row did not survive); ``None`` for a new one.
    reopened_point: tuple[dict[str, Any], Any] | None
    #: Rows the last durable point that reached the disk holds: what a crash now would keep
    #: (a point still being written does not count).
    durable_rows: int

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called (no durable point can be made any more)."""

    def flush_due(self) -> bool:
        """Whether the schedule wants a durable point now (``flush_every`` adds or ``flush_seconds`` passed)."""

    def flush(self, header: Mapping[str, Any], priorities: Any, wait: bool = False) -> None:
        """Make a durable point of the owner's ``header`` and ``priorities``; ``wait`` until it is on disk."""


@runtime_checkable
class DeviceStorage(Storage, Protocol):
    """A storage whose rows are torch tensors on :attr:`device` (or in pinned host memory).

    Its owner delivers batches as tensors (:class:`~hetero_replay.torch_batches.TorchBatches`);
    any other storage gathers NumPy arrays, delivered as they are unless the
    buffer was given a learner ``device=``.
    """

    #: The torch device the rows live on (the CPU for pinned memory).
    device: Any
    #: Whether the rows are in page-locked host memory (asynchronous copies to a GPU).
    pin_memory: bool


def check_batch(
    schema: Schema,
    capacity: int,
    batch: Any,
    every_field: bool,
    as_array: Callable[[Any], Any],
    cast: Callable[[str, Field, Any], Any],
) -> tuple[int, dict[str, Any]]:
    """The checks every storage makes of a batch; returns ``(rows, arrays)``.

    ``batch`` must be a mapping holding every field of ``schema`` (or, unless
    ``every_field``, some of them and nothing else), each shaped
    ``(rows, *field.shape)`` with one ``rows`` throughout, ``rows <=
    capacity``. ``as_array`` turns a value into the storage's array type;
    ``cast(name, field, array)`` casts it to the field's dtype, refusing casts
    that change values (see :meth:`Field.cast`). Runs on every ``add``: keep it lean.
    """
    if not isinstance(batch, Mapping):
        raise TypeError(f"a batch is a mapping of field name -> array, got {type(batch).__name__}")
    keys = batch.keys()
    if (keys != schema.names) if every_field else not (keys and keys <= schema.names):
        names = list(schema)
        unknown = [n for n in keys if n not in schema.names]
        missing = [n for n in names if n not in keys] if every_field else []
        raise ValueError(
            f"batch fields do not match the schema: missing {missing}, unknown {unknown}; expected "
            + (f"{names}" if every_field else f"some of {names}")
        )
    rows, first = None, ""
    out: dict[str, Any] = {}
    for name, field in schema.items():
        if name not in batch:
            continue
        arr = as_array(batch[name])
        shape = tuple(arr.shape)
        if shape[1:] != field.shape or len(shape) != len(field.shape) + 1:
            raise ValueError(f"field {name!r}: expected shape {_fmt(('n', *field.shape))}, got {shape}")
        out[name] = cast(name, field, arr)
        if rows is None:
            rows, first = shape[0], name
        elif shape[0] != rows:
            raise ValueError(f"field {name!r} has {shape[0]} rows but {first!r} has {rows}")
    assert rows is not None
    if rows > capacity:
        raise ValueError(f"a batch of {rows} rows does not fit a capacity of {capacity}")
    return rows, out


class CheckedRows(dict[str, np.ndarray]):
    """A batch an adapter built for ``schema``: every field, in its dtype, shaped ``(rows, *field.shape)``.

    The SB3 buffer stages the rows its ``add`` checked into arrays made from the
    replay's schema, and commits them as this. Host storages take it as it is,
    not checking it again: checks run once, at the public edge. (Their C++ row
    write still refuses an array of another dtype or row shape, before writing
    anything, and arrays whose row counts differ.)
    """

    def __init__(self, schema: Schema, arrays: Mapping[str, np.ndarray]) -> None:
        super().__init__(arrays)
        self.schema = schema
        self.rows = len(next(iter(arrays.values())))  # the rows the arrays hold, never a separate claim


def check_host_batch(schema: Schema, capacity: int, batch: Any, every_field: bool = True) -> tuple[int, dict[str, Any]]:
    """:func:`check_batch` into NumPy arrays of the fields' dtypes (host storages, and a sharded replay's learner).

    A :class:`CheckedRows` built for this very ``schema`` is returned as it is.
    """
    if type(batch) is CheckedRows and batch.schema is schema and every_field and batch.rows <= capacity:
        return batch.rows, batch
    return check_batch(schema, capacity, batch, every_field, np.asarray, _cast_host)


def _cast_host(name: str, field: Field, arr: np.ndarray) -> np.ndarray:
    return arr if arr.dtype == field.dtype else field.cast(name, arr)


def _fmt(shape: tuple[Any, ...]) -> str:
    return "(" + ", ".join(str(s) for s in shape) + ("," if len(shape) == 1 else "") + ")"


__all__ = [
    "CheckedRows",
    "DeviceStorage",
    "DurableStorage",
    "RecordRing",
    "RingStorage",
    "Storage",
    "check_batch",
    "check_host_batch",
]
