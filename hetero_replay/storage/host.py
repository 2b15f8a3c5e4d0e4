"""Transitions in host memory, one record per transition.

All fields of a transition sit next to each other in one record (an
array-of-structs layout), so gathering a sampled transition touches one or two
cache lines instead of one per field. ``arrays[name]`` are ordinary (strided)
NumPy views of each field. Fields given a ``codec`` (image fields, typically)
are kept compressed instead, one record per row (:mod:`.codec`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from hetero_replay._native import RowAccess
from hetero_replay.storage.base import check_host_batch
from hetero_replay.storage.codec import CompressedFields, field_codecs, parse_settings
from hetero_replay.storage.schema import Field, Schema

#: Bytes of rows :meth:`HostStorage.import_state` decompresses at a time to convert records.
CONVERT_BYTES = 64 << 20


class HostStorage:
    """Fixed-capacity storage of transitions, written as a ring, read by index.

    The storage only stores: where the next write goes (the ring position) is
    decided by its owner, see :class:`~hetero_replay.replay.PrioritizedReplay`.

    Args:
        records: memory someone else mapped for the rows (a shared segment), ``(capacity, record_bytes)`` uint8.
        codec: fields kept compressed (:func:`~hetero_replay.storage.codec.field_codecs`: ``None``,
            ``"lz4"``/``"zstd"`` or ``(name, level)`` for the image fields, or ``{field: codec}``).
        byte_budget: the most bytes the compressed records may take (``None``: no bound); a write
            over it raises :class:`~hetero_replay.storage.codec.ByteBudgetError` and changes nothing.
        frames: compressed fields whose distinct frames (last two dimensions) are stored once and
            shared by rows (:mod:`~hetero_replay.storage.frames`): ``True`` for every compressed image
            field, or their names; stacked ``obs`` and ``next_obs`` then cost about one frame a row.
    """

    def __init__(
        self,
        capacity: int,
        schema: Schema | Mapping[str, Any],
        records: np.ndarray | None = None,
        codec: Any = None,
        byte_budget: int | None = None,
        frames: Any = None,
    ) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.capacity = int(capacity)
        self.schema = schema if isinstance(schema, Schema) else Schema(schema)
        codecs = field_codecs(self.schema, codec)
        if codec is not None and not codecs:
            raise ValueError(
                f"codec={codec!r} compresses no field: a codec name goes to image fields (uint8, two dimensions or "
                f"more) and this schema has none; name fields with codec={{field: codec}}"
            )
        if (byte_budget is not None or frames) and not codecs:
            what = "byte_budget bounds" if byte_budget is not None else "frames= de-duplicates"
            raise ValueError(f"{what} compressed records: it needs a codec= that compresses some field")
        if codecs and records is not None:
            raise ValueError("codec=: compressed fields live in this process's memory, not in given records")
        #: The compressed fields' records (None without a codec).
        self.compressed = CompressedFields(self.capacity, self.schema, codecs, byte_budget, frames) if codecs else None
        raw = {n: f for n, f in self.schema.items() if n not in codecs}
        offsets, record_bytes = record_layout(raw)
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
            for name, field in raw.items()
        }
        self._names = list(self.schema)
        self._raw_names = list(raw)
        self._rows = RowAccess(list(self.arrays.values())) if raw else None

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
        Compressed fields are compressed first: a write over the byte budget raises
        :class:`~hetero_replay.storage.codec.ByteBudgetError` having changed nothing.
        """
        if self.compressed is not None:
            encoded, added = self.compressed.encode(start, arrays)
            self._write_raw(start, {n: a for n, a in arrays.items() if n in self.arrays})
            self.compressed.commit(start, encoded, added)
        else:
            self._write_raw(start, arrays)

    def _write_raw(self, start: int, arrays: Mapping[str, np.ndarray]) -> None:
        if self._rows is not None and arrays.keys() == self.arrays.keys():  # the common case: one C++ call
            self._rows.write(start, [arrays[n] for n in self._raw_names])
            return
        for name, arr in arrays.items():
            rows, dst = len(arr), self.arrays[name]
            head = min(rows, self.capacity - start)
            dst[start : start + head] = arr[:head]
            if head < rows:
                dst[: rows - head] = arr[head:]

    def gather(self, indices: np.ndarray, fields: Sequence[str] | None = None) -> dict[str, np.ndarray]:
        """Rows at ``indices``, one new contiguous array per field (or per name in ``fields``).

        Compressed fields are decompressed on the native thread pool, the GIL released; a
        damaged record raises :class:`~hetero_replay.storage.codec.DamagedRecordError`.
        """
        if self.compressed is None:
            if fields is None:
                return dict(zip(self._names, self._rows.gather(indices)))  # type: ignore[union-attr]
            # Indexing, not take(): a field is a strided view into the rows, and take() copies all of it first.
            return {name: self.arrays[name][indices] for name in fields}
        names = self._names if fields is None else list(fields)
        raw = [n for n in names if n in self.arrays]
        if fields is None and self._rows is not None:
            out = dict(zip(self._raw_names, self._rows.gather(indices)))
        else:
            out = {name: self.arrays[name][indices] for name in raw}
        out.update(self.compressed.gather(indices, [n for n in names if n not in self.arrays]))
        return {name: out[name] for name in names}

    def export_rows(self, count: int, copy: bool = True) -> dict[str, np.ndarray]:
        """The first ``count`` rows of every field (views unless ``copy``; compressed fields decompressed)."""
        out = {n: (a[:count].copy() if copy else a[:count]) for n, a in self.arrays.items()}
        if self.compressed is not None:
            out.update(self.compressed.gather(np.arange(count, dtype=np.int64), list(self.compressed.codecs)))
        return {name: out[name] for name in self._names}

    def import_rows(self, arrays: Mapping[str, np.ndarray]) -> None:
        """Every field's rows from row 0 on (checked by the caller against the schema)."""
        self.write(0, arrays)

    def export_state(self, count: int, copy: bool = True) -> tuple[dict[str, np.ndarray], dict[str, Any] | None]:
        """The first ``count`` rows as a state dict and a file hold them: the uncompressed fields' rows
        (views unless ``copy``), and the compressed fields' records as they are
        (:meth:`~hetero_replay.storage.codec.CompressedFields.export`, copies; ``None`` without a codec).
        """
        rows = {n: (a[:count].copy() if copy else a[:count]) for n, a in self.arrays.items()}
        return rows, None if self.compressed is None else self.compressed.export(count)

    def import_state(self, rows: Mapping[str, np.ndarray], packed: Mapping[str, Any] | None, count: int) -> None:
        """Rows ``0 .. count - 1`` of a new storage from :meth:`export_state`'s form, of this storage or another.

        ``rows``: the uncompressed fields' rows (checked by the caller against the schema); ``packed``:
        the compressed fields' records (``None``: ``rows`` holds every field). Where this storage
        compresses the same fields alike (codec, level, ``frames``), it adopts the records as they are
        (every one decompressed once to check it); otherwise they are decompressed and written like
        rows added (recompressed under this storage's codecs), :data:`CONVERT_BYTES` of rows at a time.

        Raises:
            ValueError: the records are wrong (naming the field, see
                :meth:`~hetero_replay.storage.codec.CompressedFields.adopt`), or over the byte budget.
        """
        if packed is None:
            self.write(0, rows)
            return
        codecs, pooled, _ = parse_settings(self.schema, packed.get("settings"))
        if self.compressed is not None and (codecs, pooled) == (self.compressed.codecs, self.compressed.pooled):
            self.compressed.adopt(count, packed)
            self._write_raw(0, rows)
            return
        source = CompressedFields.restored(self.schema, packed, count)
        step = max(1, CONVERT_BYTES // max(self.schema.item_bytes, 1))
        for lo in range(0, count, step):
            chunk = {n: a[lo : lo + step] for n, a in rows.items()}
            chunk.update(source.gather(np.arange(lo, min(lo + step, count), dtype=np.int64), list(source.codecs)))
            self.write(lo, chunk)

    def view(self, name: str) -> np.ndarray:
        """Field ``name`` over all rows: a live strided view into the records.

        Raises:
            NotImplementedError: the field is compressed (its rows have no array to view).
        """
        if self.compressed is not None and name in self.compressed.codecs:
            raise NotImplementedError(f"field {name!r} is compressed ({self.compressed.codecs[name]}): no live view")
        return self.arrays[name]

    def close(self) -> None:
        """Nothing to release: the records are ordinary memory."""


def record_layout(schema: Mapping[str, Field]) -> tuple[dict[str, int], int]:
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
