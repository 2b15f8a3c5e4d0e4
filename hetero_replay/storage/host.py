"""Transitions in host memory, one record per transition.

All fields of a transition sit next to each other in one record (an
array-of-structs layout), so gathering a sampled transition touches one or two
cache lines instead of one per field. ``arrays[name]`` are ordinary (strided)
NumPy views of each field.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from hetero_replay._native import RowAccess
from hetero_replay.storage.schema import Schema


class HostStorage:
    """Fixed-capacity storage of transitions, written as a ring, read by index.

    The storage only stores: where the next write goes (the ring position) is
    decided by its owner, see :class:`~hetero_replay.replay.PrioritizedReplay`.
    """

    def __init__(self, capacity: int, schema: Schema | Mapping[str, Any]) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.capacity = int(capacity)
        self.schema = schema if isinstance(schema, Schema) else Schema(schema)
        offsets, record_bytes = record_layout(self.schema)
        # np.zeros maps untouched pages lazily: a large buffer costs RAM as it fills.
        self._records = np.zeros((self.capacity, record_bytes), np.uint8)
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
        """Check a batch against the schema; return ``(rows, arrays)``.

        Every field must be present, shaped ``(rows, *field.shape)`` with the same
        ``rows`` throughout, and of a dtype that casts to the field's within the
        same kind (float64 -> float32 is fine, float -> int is not) without
        changing a value (see :meth:`Field.cast`). The arrays come back in the
        fields' dtypes.
        """
        if not isinstance(batch, Mapping):
            raise TypeError(f"a batch is a mapping of field name -> array, got {type(batch).__name__}")
        if batch.keys() != self._name_set:
            missing = [n for n in self._names if n not in batch]
            unknown = [n for n in batch if n not in self._name_set]
            raise ValueError(
                f"batch fields do not match the schema: missing {missing}, unknown {unknown}; "
                f"expected {self._names}"
            )
        rows = None
        out: dict[str, np.ndarray] = {}
        for name, field in self._fields:
            arr = np.asarray(batch[name])
            if arr.shape[1:] != field.shape or arr.ndim != len(field.shape) + 1:
                raise ValueError(f"field {name!r}: expected shape {_fmt(('n', *field.shape))}, got {arr.shape}")
            arr = field.cast(name, arr)
            if rows is None:
                rows = arr.shape[0]
            elif arr.shape[0] != rows:
                raise ValueError(f"field {name!r} has {arr.shape[0]} rows but {self._names[0]!r} has {rows}")
            out[name] = arr
        assert rows is not None
        if rows > self.capacity:
            raise ValueError(f"a batch of {rows} rows does not fit a capacity of {self.capacity}")
        return rows, out

    def write(self, start: int, arrays: Mapping[str, np.ndarray]) -> None:
        """Write validated rows at ring positions ``start, start + 1, ...`` (wrapping).

        ``arrays`` holds every field (as :meth:`validate` returns them) or a subset.
        """
        if arrays.keys() == self._name_set:  # the common case: one C++ call for all fields
            self._rows.write(
                start, [np.ascontiguousarray(arrays[n], dtype=f.dtype) for n, f in self._fields]
            )
            return
        for name, arr in arrays.items():
            rows, dst = len(arr), self.arrays[name]
            head = min(rows, self.capacity - start)
            dst[start : start + head] = arr[:head]
            if head < rows:
                dst[: rows - head] = arr[head:]

    def gather(self, indices: np.ndarray) -> dict[str, np.ndarray]:
        """Rows at ``indices``, one new contiguous array per field."""
        return dict(zip(self._names, self._rows.gather(indices)))


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


def _fmt(shape: tuple[Any, ...]) -> str:
    return "(" + ", ".join(str(s) for s in shape) + ("," if len(shape) == 1 else "") + ")"
