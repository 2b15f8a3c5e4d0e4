"""Transitions in torch tensors: on any torch device, or in pinned host memory.

``TorchStorage(capacity, schema, device="cuda")`` keeps every field on the GPU,
so a batch gathered by indices that also live there never crosses the bus.
``TorchStorage(capacity, schema, pin_memory=True)`` keeps them in page-locked
host memory: a gathered batch is then copied to the learner's GPU with
``non_blocking=True``, overlapping the copy with whatever the host does next.

The interface is :class:`~hetero_replay.storage.HostStorage`'s (``validate``,
``write``, ``gather``, ``arrays``) with the same validation rules and messages;
inputs may be NumPy arrays or tensors on any device, and ``gather`` returns
tensors.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from hetero_replay.storage.base import check_batch
from hetero_replay.storage.schema import Field, Schema


def torch_dtype(dtype: np.dtype) -> torch.dtype:
    """The torch dtype of a NumPy dtype, or ``TypeError`` if torch has none."""
    try:
        return torch.from_numpy(np.empty(0, dtype)).dtype
    except TypeError as e:
        raise TypeError(f"dtype {dtype} has no torch equivalent") from e


def numpy_dtype(dtype: torch.dtype) -> np.dtype:
    """The NumPy dtype of a torch dtype, or ``TypeError`` if NumPy has none (bfloat16)."""
    return torch.empty(0, dtype=dtype).numpy().dtype


class TorchStorage:
    """Fixed-capacity storage of transitions in torch tensors, written as a ring.

    Args:
        capacity: rows per field.
        schema: the fields of a transition.
        device: any torch device; the default is the CPU.
        pin_memory: page-locked host memory (``device`` must be the CPU, and
            pinning needs CUDA), so copies to a GPU can run asynchronously.
    """

    def __init__(
        self,
        capacity: int,
        schema: Schema | Mapping[str, Any],
        device: str | torch.device = "cpu",
        pin_memory: bool = False,
    ) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.capacity = int(capacity)
        self.schema = schema if isinstance(schema, Schema) else Schema(schema)
        self.device = torch.device(device)
        self.pin_memory = bool(pin_memory)
        if self.pin_memory and self.device.type != "cpu":
            raise ValueError(f"pin_memory is for host storage (device 'cpu'), got device {self.device}")
        if self.pin_memory and not torch.cuda.is_available():
            raise RuntimeError("pinned host storage needs CUDA (it only speeds up copies to a GPU); none is available")
        self._dtypes = {name: torch_dtype(field.dtype) for name, field in self.schema.items()}
        self.arrays: dict[str, torch.Tensor] = {
            name: self._zeros((self.capacity, *field.shape), self._dtypes[name]) for name, field in self.schema.items()
        }

    def _zeros(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        if self.device.type == "cpu" and not self.pin_memory:
            # np.zeros maps untouched pages lazily: a large buffer costs RAM as it fills.
            return torch.from_numpy(np.zeros(shape, numpy_dtype(dtype)))
        return torch.zeros(shape, dtype=dtype, device=self.device, pin_memory=self.pin_memory)

    def validate(self, batch: Mapping[str, Any]) -> tuple[int, dict[str, torch.Tensor | np.ndarray]]:
        """Check a batch holding every field; return ``(rows, arrays)``.

        The rules of :meth:`HostStorage.validate`. Fields may be tensors on any
        device (a narrowing cast is checked there, with one read back) or
        anything ``np.asarray`` takes.
        """
        return check_batch(self.schema, self.capacity, batch, True, _as_array, _cast)

    def validate_fields(self, fields: Mapping[str, Any]) -> tuple[int, dict[str, torch.Tensor | np.ndarray]]:
        """:meth:`validate` for some of the fields."""
        return check_batch(self.schema, self.capacity, fields, False, _as_array, _cast)

    def write(self, start: int, arrays: Mapping[str, torch.Tensor | np.ndarray]) -> None:
        """Write validated rows at ring positions ``start, start + 1, ...`` (wrapping)."""
        for name, arr in arrays.items():
            dst = self.arrays[name]
            src = arr if isinstance(arr, torch.Tensor) else torch.from_numpy(np.ascontiguousarray(arr))
            src = src.to(device=dst.device, dtype=dst.dtype)
            rows = src.shape[0]
            head = min(rows, self.capacity - start)
            dst[start : start + head] = src[:head]
            if head < rows:
                dst[: rows - head] = src[head:]

    def gather(
        self, indices: Any, fields: Sequence[str] | None = None, device: str | torch.device | None = None
    ) -> dict[str, torch.Tensor]:
        """Rows at ``indices`` (int64, already validated), one new tensor per field.

        The rows are gathered where the storage is; with ``device`` they are
        then moved there (no copy if it is the storage's own device). From
        pinned storage the gather writes into pinned buffers and the move is
        non-blocking.
        """
        idx = indices if isinstance(indices, torch.Tensor) else torch.from_numpy(np.asarray(indices))
        idx = idx.to(self.device)
        target = self.device if device is None else torch.device(device)
        out = {}
        for name in self.arrays if fields is None else fields:
            arr = self.arrays[name]
            if self.pin_memory:
                rows = torch.empty((idx.shape[0], *arr.shape[1:]), dtype=arr.dtype, pin_memory=True)
                torch.index_select(arr, 0, idx, out=rows)
            else:
                rows = arr.index_select(0, idx)
            out[name] = rows.to(target, non_blocking=self.pin_memory)
        return out

    def export_rows(self, count: int, copy: bool = True) -> dict[str, np.ndarray]:
        """Host copies of the first ``count`` rows of every field (always copies: they leave the device)."""
        return {name: arr[:count].to("cpu", copy=True).numpy() for name, arr in self.arrays.items()}

    def import_rows(self, arrays: Mapping[str, np.ndarray]) -> None:
        """Every field's rows from row 0 on (checked by the caller against the schema)."""
        for name, arr in arrays.items():
            self.arrays[name][: len(arr)] = torch.from_numpy(np.ascontiguousarray(arr)).to(self.arrays[name].device)

    def view(self, name: str) -> torch.Tensor:
        """Field ``name`` over all rows: the live tensor where the storage is."""
        return self.arrays[name]

    def close(self) -> None:
        """Drops the tensors (device memory returns to torch's allocator)."""
        self.arrays = {}

    def __repr__(self) -> str:
        where = "pinned host" if self.pin_memory else str(self.device)
        return f"TorchStorage(capacity={self.capacity}, {where}, schema={self.schema!r})"


def _as_array(value: Any) -> torch.Tensor | np.ndarray:
    return value if isinstance(value, torch.Tensor) else np.asarray(value)


def _cast(name: str, field: Field, arr: torch.Tensor | np.ndarray) -> torch.Tensor | np.ndarray:
    if isinstance(arr, torch.Tensor):
        _check_tensor_cast(name, arr, field.dtype)  # written with its own dtype; the copy converts
        return arr
    return field.cast(name, arr)


def _check_tensor_cast(name: str, t: torch.Tensor, dst: np.dtype) -> None:
    """:meth:`Field.cast`'s rule for a tensor: within its kind, no value changed.

    Reads back to the host only when the cast narrows (e.g. int64 -> int32).
    """
    src = numpy_dtype(t.dtype)
    if src == dst:
        return
    if not np.can_cast(src, dst, casting="same_kind"):
        raise ValueError(f"field {name!r}: dtype {src} does not cast to {dst} (expected dtype {dst})")
    if np.can_cast(src, dst, casting="safe") or t.numel() == 0:
        return
    if dst.kind in "iu":
        info = np.iinfo(dst)
        low, high = int(t.min()), int(t.max())
        if low < info.min or high > info.max:
            raise ValueError(
                f"field {name!r}: value {low if low < info.min else high} does not fit {dst} [{info.min}, {info.max}]"
            )
    elif dst.kind == "f":
        overflow = torch.isfinite(t) & ~torch.isfinite(t.to(torch_dtype(dst)))
        if bool(overflow.any()):
            bad = t[overflow][0].item()
            raise ValueError(f"field {name!r}: value {bad!r} overflows {dst} (largest {np.finfo(dst).max})")


__all__ = ["TorchStorage", "numpy_dtype", "torch_dtype"]
