"""Transitions in host memory: one preallocated NumPy array per schema field."""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

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
        # np.zeros maps untouched pages lazily: a large buffer costs RAM as it fills.
        self.arrays = {n: np.zeros((self.capacity, *f.shape), f.dtype) for n, f in self.schema.items()}

    def validate(self, batch: Mapping[str, Any]) -> tuple[int, dict[str, np.ndarray]]:
        """Check a batch against the schema; return ``(rows, arrays)``.

        Every field must be present, shaped ``(rows, *field.shape)`` with the same
        ``rows`` throughout, and of a dtype that casts to the field's within the
        same kind (float64 -> float32 is fine, float -> int is not).
        """
        if not isinstance(batch, Mapping):
            raise TypeError(f"a batch is a mapping of field name -> array, got {type(batch).__name__}")
        missing = [n for n in self.schema if n not in batch]
        unknown = [n for n in batch if n not in self.schema]
        if missing or unknown:
            raise ValueError(
                f"batch fields do not match the schema: missing {missing}, unknown {unknown}; "
                f"expected {list(self.schema)}"
            )
        rows = None
        out: dict[str, np.ndarray] = {}
        for name, field in self.schema.items():
            arr = np.asarray(batch[name])
            expected = ("n", *field.shape)
            if arr.ndim != len(expected) or arr.shape[1:] != field.shape:
                raise ValueError(f"field {name!r}: expected shape {_fmt(expected)}, got {arr.shape}")
            if not np.can_cast(arr.dtype, field.dtype, casting="same_kind"):
                raise ValueError(
                    f"field {name!r}: dtype {arr.dtype} does not cast to {field.dtype} "
                    f"(expected shape {_fmt(expected)}, dtype {field.dtype})"
                )
            if rows is None:
                rows = arr.shape[0]
            elif arr.shape[0] != rows:
                first = next(iter(self.schema))
                raise ValueError(f"field {name!r} has {arr.shape[0]} rows but {first!r} has {rows}")
            out[name] = arr
        assert rows is not None
        if rows > self.capacity:
            raise ValueError(f"a batch of {rows} rows does not fit a capacity of {self.capacity}")
        return rows, out

    def write(self, start: int, arrays: Mapping[str, np.ndarray]) -> None:
        """Write validated rows at ring positions ``start, start + 1, ...`` (wrapping)."""
        for name, arr in arrays.items():
            rows, dst = len(arr), self.arrays[name]
            head = min(rows, self.capacity - start)
            dst[start : start + head] = arr[:head]
            if head < rows:
                dst[: rows - head] = arr[head:]

    def gather(self, indices: np.ndarray) -> dict[str, np.ndarray]:
        """Rows at ``indices`` (int64, already validated), one new array per field."""
        return {name: arr.take(indices, axis=0) for name, arr in self.arrays.items()}


def _fmt(shape: tuple[Any, ...]) -> str:
    return "(" + ", ".join(str(s) for s in shape) + ("," if len(shape) == 1 else "") + ")"
