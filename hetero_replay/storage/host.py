"""Transitions in host memory, one record per transition.

All fields of a transition sit next to each other in one record (an
array-of-structs layout), so gathering a sampled transition touches one or two
cache lines instead of one per field. ``arrays[name]`` are ordinary (strided)
NumPy views of each field.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from hetero_replay._native import RowAccess
from hetero_replay.storage.base import check_host_batch
from hetero_replay.storage.schema import Schema


class HostStorage:
    """Fixed-capacity storage of transitions, written as a ring, read by index.

    The storage only stores: where the next write goes (the ring position) is
    decided by its owner, see :class:`~hetero_replay.replay.PrioritizedReplay`.
    """

    def __init__(self, capacity: int, schema: Schema | Mapping[str, Any], records: np.ndarray | None = None) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.capacity = int(capacity)
        self.schema = schema if isinstance(schema, Schema) else Schema(schema)
        offsets, record_bytes = record_layout(self.schema)
        # np.zeros maps untouched pages lazily: a large buffer costs RAM as it fills.
        # `records`: memory someone else mapped (a shared segment), (capacity, record_bytes) uint8.
        self._records = np.zeros((self.capacity, record_bytes), np.uint8) if records is None else records
        if self._records.shape != (self.capacity, record_bytes) or self._records.dtype != np.uint8:
            raise ValueError(f"records must be uint8 of shape {(self.capacity, record_bytes)}")
        self.arrays: dict[str, np.ndarray] = {
            name: np.ndarray(
                (self.capacity, *field.shape),
                field.dtype,
                buffer=self._records,
                offset=offsets[name],
                strides=(record_bytes, *_contiguous_strides(field.shape, field.dtype.itemsize)),
            )
            for name, field in self.schema.items()
        }
        self._names = list(self.arrays)
        self._name_set = set(self._names)
        self._fields = list(self.schema.items())
        self._rows = RowAccess(list(self.arrays.values()))

    def validate(self, batch: Mapping[str, Any]) -> tuple[int, dict[str, np.ndarray]]:
        """Check a batch holding every field; return ``(rows, arrays)`` in the fields' dtypes.

        Every field must be present, shaped ``(rows, *field.shape)`` with the same
        ``rows`` throughout, and of a dtype that casts to the field's within the
        same kind (float64 -> float32 is fine, float -> int is not) without
        changing a value (see :meth:`Field.cast`).
        """
        return check_host_batch(self.schema, self.capacity, batch)

    def validate_fields(self, fields: Mapping[str, Any]) -> tuple[int, dict[str, np.ndarray]]:
        """:meth:`validate` for some of the fields."""
        return check_host_batch(self.schema, self.capacity, fields, every_field=False)

    def write(self, start: int, arrays: Mapping[str, np.ndarray]) -> None:
        """Write validated rows at ring positions ``start, start + 1, ...`` (wrapping).

        ``arrays`` holds every field (as :meth:`validate` returns them) or a subset.
        """
        if arrays.keys() == self._name_set:  # the common case: one C++ call for all fields
            self._rows.write(start, [np.ascontiguousarray(arrays[n], dtype=f.dtype) for n, f in self._fields])
            return
        for name, arr in arrays.items():
            rows, dst = len(arr), self.arrays[name]
            head = min(rows, self.capacity - start)
            dst[start : start + head] = arr[:head]
            if head < rows:
                dst[: rows - head] = arr[head:]

    def gather(self, indices: np.ndarray, fields: Sequence[str] | None = None) -> dict[str, np.ndarray]:
        """Rows at ``indices``, one new contiguous array per field (or per name in ``fields``)."""
        if fields is None:
            return dict(zip(self._names, self._rows.gather(indices)))
        return {name: self.arrays[name].take(indices, axis=0) for name in fields}

    def export_rows(self, count: int, copy: bool = True) -> dict[str, np.ndarray]:
        """The first ``count`` rows of every field (views unless ``copy``)."""
        return {n: (a[:count].copy() if copy else a[:count]) for n, a in self.arrays.items()}

    def import_rows(self, arrays: Mapping[str, np.ndarray]) -> None:
        """Every field's rows from row 0 on (checked by the caller against the schema)."""
        for name, arr in arrays.items():
            self.arrays[name][: len(arr)] = arr

    def view(self, name: str) -> np.ndarray:
        """Field ``name`` over all rows: a live strided view into the records."""
        return self.arrays[name]

    def close(self) -> None:
        """Nothing to release: the records are ordinary memory."""


def record_layout(schema: Schema) -> tuple[dict[str, int], int]:
    """Byte offset of each field in a record, and the record size.

    Fields keep schema order, each aligned to its item size (at most 8); the
    record is padded to 8 bytes so every record starts aligned.
    """
    offsets, pos = {}, 0
    for name, field in schema.items():
        align = min(field.dtype.itemsize, 8)
        pos = -(-pos // align) * align
        offsets[name] = pos
        pos += field.item_bytes
    return offsets, max(8, -(-pos // 8) * 8)


def _contiguous_strides(shape: tuple[int, ...], itemsize: int) -> tuple[int, ...]:
    strides, step = [], itemsize
    for size in reversed(shape):
        strides.append(step)
        step *= size
    return tuple(reversed(strides))
