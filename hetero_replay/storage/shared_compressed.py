"""Shared-memory rows with compressed fields, written by actor processes: ``storage="shared"`` with a ``codec``.

``storage_options={"codec": "lz4", "byte_budget": ...}`` keeps the chosen
fields (by default the image fields, as for the host storage:
:func:`~hetero_replay.storage.codec.field_codecs`) compressed. One file
mapping, as for :class:`~hetero_replay.storage.shared.SharedStorage`, holds:

* the ring's control block (tickets, stamps, writer table; :mod:`.ring`);
* the fixed-size rows: the raw fields, as the shared storage lays them out;
* per row and compressed field, its record's *reference*: the absolute log
  offset and the length (int64 each);
* the record log (:mod:`.record_log`): ``byte_budget`` bytes used as a
  circular byte log.

A writer compresses its batch in its own process (Blosc2, GIL released),
before it takes any ticket, so a batch refused (a record larger than the
budget) changes nothing. It then takes tickets and slots as any ring writer,
appends the records with one atomic add on the log's head, writes the raw
fields and references, and publishes the rows' stamps. A writer killed at any
point loses only its own rows: its reserved log bytes are skipped like any
overwritten record.

**When the byte budget, not the capacity, is the limit**, the oldest records
are overwritten first (the log is FIFO like the ring), and rows whose records
are gone are *evicted*: never served, their priority 0 until their slot is
rewritten, counted in :attr:`CompressedSharedStorage.evicted_rows`. With a
budget of at least the capacity times the records' mean bytes per row (16 a
record for its header included), nothing is evicted; :attr:`bytes_per_row`
measures it. Unlike the host storage's budget (a hard limit that refuses
writes), writers here cannot be refused by a budget they share with other
processes without a lock: evicting the oldest keeps them lock-free.

Checkpoints keep the records as they are, in the host storage's form
(:meth:`CompressedSharedStorage.export_state`, :meth:`CompressedSharedStorage.adopt_state`): each
live row's records are copied out of the log with the gather's checks; a row the log no longer
holds is saved without records (and priority 0 by its owner), and never served after a load.

With ``frames``, each writer process stores each distinct frame of the pooled
fields once in the log and rows reference one record per frame
(:mod:`.log_frames`: no table is shared; each writer dedupes its own frames).
A row then also keeps each reference's *tag*, which the record's header must
name. Checkpoints of such a storage hold rows-mode records, each row's stack
compressed again (see :meth:`CompressedSharedStorage.export_state`).
"""

from __future__ import annotations

import os
import secrets
import weakref
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from hetero_replay._native import compress_rows
from hetero_replay.checks import is_int
from hetero_replay.storage import records as record_arrays
from hetero_replay.storage.base import check_host_batch
from hetero_replay.storage.checkpoint import ReplayFileError
from hetero_replay.storage.codec import (
    ByteBudgetError,
    Codec,
    CompressedFields,
    field_codecs,
    parse_settings,
    settings_json,
)
from hetero_replay.storage.frames import pooled_fields
from hetero_replay.storage.host import HostStorage, record_layout
from hetero_replay.storage.log_frames import FrameRows, LogFrames, records_a_row, unit_bytes
from hetero_replay.storage.record_log import RECORD_HEADER_BYTES, Evictions, RecordLog
from hetero_replay.storage.ring import RingControl, RingOwner, RingReader, RingWriter, check_abandon_after
from hetero_replay.storage.schema import Field, Schema
from hetero_replay.storage.shared import _remove_segment, _segment_dir, _write_taken

#: Default byte budget as a fraction of the compressed fields' raw bytes: image fields compress 10-100x
#: (docs/compression.md), so a quarter evicts nothing on them while taking 4x less memory than raw rows.
DEFAULT_BUDGET_FRACTION = 4
_BLOSC2_OVERHEAD = 32 + 4  # a chunk's most overhead (BLOSC2_MAX_OVERHEAD) and the record's CRC
_LINE = 64
_ADOPT_ROWS = 256  # rows a restore compresses and appends at a time, at most


@dataclass
class EncodedRows:
    """A batch with its compressed fields encoded: what a writer's :meth:`CompressedSegment.write_rows` takes."""

    rows: int
    raw: dict[str, np.ndarray]  # the fields kept raw
    names: list[str]  # the compressed fields present
    records: list[bytes]  # row-major: row r's field names[f] at r * len(names) + f


def log_options(
    capacity: int, schema: Schema, codec: Any, byte_budget: Any, frames: Any, storage: str
) -> tuple[dict[str, Codec], int]:
    """``(codecs, byte budget)`` of a ring storage keeping fields in a record log (``storage``: its name),
    the options checked: the one rule of ``storage="shared"`` and ``storage="disk"``.

    The default budget: the capacity times, per compressed field, a quarter of its raw bytes
    (:data:`DEFAULT_BUDGET_FRACTION`) plus a record's overhead (52 bytes); a field whose frames are
    stored once (``frames``) counts one frame a row (a new row's stack typically adds one frame).

    Raises:
        ValueError: ``frames`` given to ``storage="disk"`` or naming a field without a codec (or without
            frames), ``byte_budget`` without a codec, a codec compressing no field, a byte budget that is not
            a positive integer (see also :func:`~hetero_replay.storage.codec.field_codecs`).
    """
    check_frames(frames, storage)
    if codec is None:
        raise ValueError("storage_options byte_budget and frames apply to compressed fields: they need a codec")
    codecs = field_codecs(schema, codec)
    if not codecs:
        raise ValueError(
            f"storage_options codec={codec!r} compresses no field: a codec name goes to image fields (uint8, two "
            "dimensions or more) and this schema has none; name fields with codec={field: codec}"
        )
    pooled = pooled_fields(schema, frames, list(codecs))
    if byte_budget is None:
        overhead = _BLOSC2_OVERHEAD + RECORD_HEADER_BYTES  # a record's bytes besides its data
        share = sum(unit_bytes(schema[n], n in pooled) // DEFAULT_BUDGET_FRACTION + overhead for n in codecs)
        return codecs, max(capacity * share, 2 * _worst_row(schema, codecs, pooled))
    return codecs, check_byte_budget(byte_budget)


def check_frames(frames: Any, storage: str) -> None:
    """Refuse ``frames`` (anything but None or False) for ``storage="disk"``, saying why."""
    if storage == "disk" and frames is not None and frames is not False:
        raise ValueError(
            "storage_options frames: storage='disk' does not store frames once (not built: its rows.dat holds "
            "one record reference a field, which a reopen checks row by row); use storage='host' or 'shared' "
            "for frames, or leave frames out"
        )


def check_byte_budget(byte_budget: Any) -> int:
    """``byte_budget`` as a positive int (bytes); ``ValueError`` naming it otherwise."""
    if not is_int(byte_budget) or isinstance(byte_budget, bool) or byte_budget < 1:
        raise ValueError(f"storage_options byte_budget must be a positive integer (bytes), got {byte_budget!r}")
    return int(byte_budget)


def _worst_row(schema: Mapping[str, Field], codecs: Mapping[str, Codec], pooled: Sequence[str] = ()) -> int:
    """Log bytes of a row whose fields do not compress at all (nor share frames)."""
    overhead = _BLOSC2_OVERHEAD + RECORD_HEADER_BYTES
    return sum(schema[n].item_bytes + records_a_row(schema[n], n in pooled) * overhead for n in codecs)


def adopt_rows(
    schema: Mapping[str, Field], codecs: Mapping[str, Codec], byte_budget: int, pooled: Sequence[str] = ()
) -> int:
    """Rows a restore appends at a time: few enough that they fit the log even uncompressed."""
    return max(1, min(_ADOPT_ROWS, byte_budget // _worst_row(schema, codecs, pooled)))


def oldest_first(position: int, size: int, capacity: int, chunk: int) -> Iterator[np.ndarray]:
    """The slots of a ring of ``size`` rows at ``position``, oldest ticket first, ``chunk`` at a time."""
    oldest = position if size == capacity else 0
    for lo in range(0, size, chunk):
        yield (oldest + np.arange(lo, min(lo + chunk, size))) % capacity


def records_to_adopt(
    storage: Any,
    position: int,
    size: int,
    rows: Mapping[str, np.ndarray],
    packed: Mapping[str, Any],
    frames: bool = False,
) -> list[list[bytes | None]] | None:
    """The records ``storage`` (a compressed shared or disk storage) appends as they are in ``adopt_state``.

    Records compressed alike (codec and level, no ``frames`` in the records nor in ``storage``: ``frames``
    says whether it stores frames once) are returned per field of ``storage.codecs``, each row's record or
    ``None``, after each was decompressed once to check it, and the storage's reader adopts ``position``
    and ``size``; otherwise the rows are decompressed and adopted here, and ``None`` is returned.

    Raises:
        ValueError: the records are wrong (see :meth:`~hetero_replay.storage.codec.CompressedFields.adopt`).
    """
    codecs, pooled, _ = parse_settings(storage.schema, packed.get("settings"))
    source = CompressedFields.restored(storage.schema, packed, size)  # checks every record
    if codecs != storage.codecs or pooled or frames:
        arrays: dict[str, Any] = dict(rows)
        arrays.update({name: DecodedField(source, name) for name in codecs})  # adopt reads a chunk at a time
        storage.adopt(position, size, arrays)
        return None
    storage.reader.adopt(position, size)
    return [source.records(name) for name in storage.codecs]


class DecodedField:
    """A compressed field of restored records, decompressed only where indexed (``field[slots]``).

    What a restore gives a ring storage's ``adopt``, which reads its rows a chunk at a time: a buffer of a
    million Atari rows restored into another codec never holds them all decompressed (56 GB).
    """

    def __init__(self, source: CompressedFields, name: str) -> None:
        self.source, self.name = source, name

    def __getitem__(self, slots: np.ndarray) -> np.ndarray:
        return self.source.gather(np.asarray(slots, np.int64), [self.name])[self.name]


def encode_rows(codecs: Mapping[str, Codec], arrays: Mapping[str, np.ndarray], log_bytes: int) -> EncodedRows:
    """Compress the fields ``codecs`` names among ``arrays`` (validated rows) for a log of ``log_bytes``; changes nothing.

    Raises:
        ByteBudgetError: a row's records, or the batch's, do not fit the log.
    """
    rows = len(next(iter(arrays.values())))
    names = [n for n in codecs if n in arrays]
    per_field = [
        compress_rows(np.ascontiguousarray(arrays[n]).reshape(rows, -1).view(np.uint8), codecs[n].name, codecs[n].level)
        for n in names
    ]
    records = [r for row in zip(*per_field) for r in row]
    sizes = (
        np.add.reduceat(
            np.fromiter(map(len, records), np.int64, len(records)) + RECORD_HEADER_BYTES,
            np.arange(0, len(records), max(len(names), 1)),
        )
        if records
        else np.zeros(0, np.int64)
    )
    if sizes.size and sizes.sum() > log_bytes:
        largest = int(sizes.max())
        what = (
            f"a row's records take {largest} bytes"
            if largest > log_bytes
            else f"the {rows} rows' records take {int(sizes.sum())} bytes (add fewer rows a call)"
        )
        raise ByteBudgetError(
            f"byte_budget: {what}, more than the whole record log of {log_bytes} bytes; nothing was "
            "written (raise byte_budget, see docs/compression.md)"
        )
    return EncodedRows(rows, {n: a for n, a in arrays.items() if n not in codecs}, names, records)


def copy_records(
    log: RecordLog,
    fields: Mapping[str, Field],
    names: Sequence[str],
    offsets: np.ndarray,
    lengths: np.ndarray,
    stamps: np.ndarray,
) -> dict[str, list[bytes | None]]:
    """The records of fields ``names`` of rows whose references are ``offsets``, ``lengths`` (``(rows, fields)``)
    and whose stamps were ``stamps``, copied out of ``log`` as they are.

    A row's records are there if each record's header names the row's stamp and length, the head
    had not passed any of them once all were copied (the seqlock's second read, as in the gather)
    and each decompresses (CRC-32C, chunk, size); otherwise every record of the row is ``None``
    (evicted, being rewritten, or damaged).
    """
    there = np.ones(len(stamps), bool)
    records: dict[str, list[bytes | None]] = {name: [] for name in names}
    for r, stamp in enumerate(stamps.tolist()):
        for column, name in enumerate(names):
            record = log.record_at(int(offsets[r, column]), int(lengths[r, column]), stamp)
            records[name].append(record)
            there[r] &= record is not None
    if len(stamps):
        there &= offsets.min(axis=1) >= log.reserved - log.log_bytes
    for name in names:
        there[record_arrays.damaged(records[name], np.flatnonzero(there), fields[name].item_bytes)] = False
    return {
        name: [record if ok else None for record, ok in zip(held, there.tolist())] for name, held in records.items()
    }


class CompressedSegment:
    """One process's view of a compressed shared segment: control block, rows, references and log.

    Writer processes open it by ``path`` (what :meth:`CompressedSharedStorage.writer` pickles); the
    owner passes the ``control`` block it created. ``frames``: the fields whose frames are stored once
    (:mod:`.log_frames`); a row then holds a reference (offset, length, tag) per frame of them.
    """

    def __init__(
        self,
        path: str,
        codecs: Mapping[str, Any],
        log_bytes: int,
        control: RingControl | None = None,
        frames: Sequence[str] = (),
    ) -> None:
        self.control = RingControl.attach(path) if control is None else control
        try:
            self.codecs = field_codecs(self.control.schema, dict(codecs))
            self.capacity = self.control.capacity
            fields = dict(self.control.schema.items())
            raw = {n: f for n, f in fields.items() if n not in self.codecs}
            self.control.check_row_bytes(record_layout(raw)[1])
            self.pooled = list(frames)
            width = sum(records_a_row(fields[n], n in self.pooled) for n in self.codecs)
            planes = 3 if self.pooled else 2  # offset, length (and the tag, with frames)
            rows_bytes, refs_bytes, log_at = _layout(self.capacity, self.control.row_bytes, planes * width)
            payload = self.control.payload(log_at + RecordLog.region_bytes(log_bytes))
            self.rows = HostStorage(
                self.capacity, raw, records=payload[:rows_bytes].reshape(self.capacity, self.control.row_bytes)
            )
            refs = payload[rows_bytes : rows_bytes + refs_bytes].view(np.int64).reshape(self.capacity, planes, width)
            self.offsets, self.lengths = refs[:, 0], refs[:, 1]  # (capacity, columns) each
            #: Each reference's tag with frames (None without: a row's records are tagged with its stamp).
            self.tags = refs[:, 2] if self.pooled else None
            self.log = RecordLog(payload[log_at:], log_bytes)
            if control is not None:  # the owner: the log's size, which writers check they agree with
                self.log.words[1] = log_bytes
            elif int(self.log.words[1]) != log_bytes:
                raise ReplayFileError(
                    f"{path}: a record log of {int(self.log.words[1])} bytes, the writer expects {log_bytes}"
                )
        except BaseException:
            if control is None:
                self.control.close()
            raise
        self._fields = fields
        #: This process's frames (None without ``frames``): the map of the frames it wrote lately.
        self.frames = LogFrames(fields, self.codecs, self.pooled, self.log) if self.pooled else None
        #: Each compressed field's reference columns.
        self.columns = (
            self.frames.columns
            if self.frames is not None
            else {n: np.array([i], np.int64) for i, n in enumerate(self.codecs)}
        )

    def encode(self, arrays: Mapping[str, np.ndarray]) -> EncodedRows | FrameRows:
        """Compress the compressed fields among ``arrays`` (validated rows) (:func:`encode_rows`; with frames,
        :meth:`LogFrames.encode`); changes nothing."""
        if self.frames is not None:
            return self.frames.encode(arrays)
        return encode_rows(self.codecs, arrays, self.log.log_bytes)

    def write_rows(self, first: int, encoded: Any, taken: np.ndarray | None) -> None:
        """Write the rows of tickets ``first + k`` (all, or where ``taken[k]``): records, references, raw fields.

        ``encoded``: what :meth:`encode` made of them (the ring's ``append`` encodes first).
        """
        picked = np.arange(encoded.rows, dtype=np.int64) if taken is None else np.flatnonzero(taken)
        self.put_records((first + picked) % self.capacity, first + picked + 1, encoded, picked)
        _write_taken(self.rows, self.capacity, first, encoded.raw, taken)

    def put(self, start: int, encoded: EncodedRows | FrameRows, stamps: np.ndarray) -> None:
        """Write rows at slots ``start, start + 1, ...`` whose stamps are (or will be) ``stamps`` (the owner's)."""
        picked = np.arange(len(stamps), dtype=np.int64)
        self.put_records((start + picked) % self.capacity, stamps, encoded, picked)
        if encoded.raw:
            self.rows.write(start, encoded.raw)

    def put_records(
        self, slots: np.ndarray, stamps: np.ndarray, encoded: EncodedRows | FrameRows, picked: np.ndarray
    ) -> None:
        """Append the records of rows ``picked`` of ``encoded`` (at ``slots``, stamps ``stamps``) and reference them."""
        if not encoded.names or not len(picked):
            return
        if isinstance(encoded, FrameRows):
            assert self.frames is not None and self.tags is not None
            refs = self.frames.write(encoded, picked, stamps)
            where = (slots[:, None], encoded.columns)
            self.offsets[where], self.lengths[where], self.tags[where] = refs[:, 0], refs[:, 1], refs[:, 2]
            return
        fields = len(encoded.names)
        records = (
            encoded.records
            if len(picked) * fields == len(encoded.records)
            else [encoded.records[k * fields + f] for k in picked.tolist() for f in range(fields)]
        )
        offsets = self.log.append(records, stamps).reshape(len(picked), fields)
        lengths = np.fromiter(map(len, records), np.int64, len(records)).reshape(len(picked), fields)
        columns = np.concatenate([self.columns[n] for n in encoded.names])
        self.offsets[slots[:, None], columns] = offsets
        self.lengths[slots[:, None], columns] = lengths

    def decode(
        self, slots: np.ndarray, stamps: np.ndarray, names: Sequence[str]
    ) -> tuple[dict[str, np.ndarray], np.ndarray]:
        """Compressed fields ``names`` of rows ``slots`` whose stamps were ``stamps``; mask of rows sound.

        A row whose records are gone (evicted) or damaged reads as zeros and is not sound. With frames,
        each frame is a column decoded into its place in the field's rows (each distinct record once).
        """
        n = len(slots)
        out = {name: np.empty((n, *self._fields[name].shape), self._fields[name].dtype) for name in names}
        if not names:
            return out, np.ones(n, bool)
        columns = np.concatenate([self.columns[name] for name in names])
        places = []  # per column, its (rows, bytes) view of the out arrays
        for name in names:
            k = len(self.columns[name])
            per = out[name].view(np.uint8).reshape(n, k, self._fields[name].item_bytes // k)
            places += [per[:, c] for c in range(k)]
        tags = np.ascontiguousarray(stamps, np.int64) if self.tags is None else self.tags[slots][:, columns]
        sound = self.log.gather(
            np.ascontiguousarray(self.offsets[slots][:, columns]),
            np.ascontiguousarray(self.lengths[slots][:, columns]),
            tags,
            places,
        )
        return out, sound

    def copy_records(self, slots: np.ndarray, stamps: np.ndarray) -> dict[str, list[bytes | None]]:
        """The records of rows ``slots`` (whose stamps were ``stamps``) copied out of the log (:func:`copy_records`);
        without frames only (a row's records are then its fields' rows)."""
        offsets, lengths = self.offsets[slots], self.lengths[slots]  # copies: writers may rewrite them
        return copy_records(self.log, self._fields, list(self.codecs), offsets, lengths, stamps)

    def close(self) -> None:
        self.rows = self.log = self.offsets = self.lengths = self.tags = self.frames = None  # type: ignore[assignment]
        self.control.close()


class CompressedSharedStorage(RingOwner):
    """Rows of a :class:`Schema` in a shared file mapping, some fields compressed in a record log.

    Args:
        capacity: rows kept; the oldest ticket's row is overwritten first.
        schema: the fields of a row.
        codec: the compressed fields (:func:`~hetero_replay.storage.codec.field_codecs`: ``"lz4"``,
            ``"zstd"`` or ``(name, level)`` for every image field, or ``{field: codec}``).
        byte_budget: bytes of the record log (records and their 16-byte headers); default: the capacity
            times, per compressed field, a quarter of its raw bytes (:data:`DEFAULT_BUDGET_FRACTION`) plus a
            record's overhead (52 bytes).
            Less than the capacity times the mean bytes a row takes evicts the oldest rows (see the
            module's docstring).
        frames: the compressed fields whose frames (their last two dimensions) are stored once (``True``: every
            compressed image field; see :mod:`.log_frames`), each writer process deduping its own.
        dir: directory of the segment file (as :class:`~hetero_replay.storage.shared.SharedStorage`).
        abandon_after: as :class:`~hetero_replay.storage.shared.SharedStorage`.
    """

    def __init__(
        self,
        capacity: int,
        schema: Schema | Mapping[str, Any],
        codec: Any = None,
        byte_budget: int | None = None,
        frames: Any = None,
        dir: str | os.PathLike[str] | None = None,
        abandon_after: float = 5.0,
    ) -> None:
        # Every argument is checked before the segment file is made.
        abandon_after = check_abandon_after(abandon_after)
        schema = schema if isinstance(schema, Schema) else Schema(schema)
        codecs, self.byte_budget = log_options(capacity, schema, codec, byte_budget, frames, "shared")
        #: The fields whose frames are stored once (checked by log_options).
        self.pooled = pooled_fields(schema, frames, list(codecs))
        self._adopt_rows = adopt_rows(schema, codecs, self.byte_budget, self.pooled)
        raw = {n: f for n, f in schema.items() if n not in codecs}
        row_bytes = record_layout(raw)[1]
        width = sum(records_a_row(schema[n], n in self.pooled) for n in codecs)
        _, _, log_at = _layout(capacity, row_bytes, (3 if self.pooled else 2) * width)
        payload = log_at + RecordLog.region_bytes(self.byte_budget)
        directory = _segment_dir(dir, payload)
        path = os.path.join(directory, f"hetero-replay-{os.getpid()}-{secrets.token_hex(6)}.ring")
        control = RingControl.create(path, capacity, schema, row_bytes, payload_bytes=payload)
        self._remove = weakref.finalize(self, _remove_segment, path, os.getpid())
        self._codec_spec = {n: [c.name, c.level] for n, c in codecs.items()}
        self.segment = CompressedSegment(path, self._codec_spec, self.byte_budget, control=control, frames=self.pooled)
        self.control = control
        self.capacity, self.schema, self.path = int(capacity), schema, path
        self.codecs: dict[str, Codec] = self.segment.codecs
        self.reader = RingReader(control, abandon_after)
        self.evictions = Evictions(self.capacity)
        self._tag = control.register(os.getpid())

    # -- what the owner's writer and reads need ----------------------------------------

    @property
    def evicted_rows(self) -> int:
        """Rows found to have lost their records to newer ones (the byte budget was the limit)."""
        return self.evictions.rows

    @property
    def bytes_per_row(self) -> float:
        """Mean log bytes (records and headers) of the rows held now, each record counted once (rows share
        frames): capacity times this is a budget that evicts nothing."""
        held = self.reader.seen > 0
        if not held.any():
            return 0.0
        offsets, lengths = self.segment.offsets[held].ravel(), self.segment.lengths[held].ravel()
        first = np.unique(offsets[lengths > 0], return_index=True)[1]
        return float((lengths[lengths > 0][first] + RECORD_HEADER_BYTES).sum() / held.sum())

    @property
    def nbytes(self) -> int:
        """Bytes of the segment file (what the buffer takes in RAM once written)."""
        return os.path.getsize(self.path)

    def encode(self, arrays: Mapping[str, np.ndarray]) -> EncodedRows | FrameRows:
        return self.segment.encode(arrays)

    def write_rows(self, first: int, encoded: Any, taken: np.ndarray | None) -> None:
        self.segment.write_rows(first, encoded, taken)

    def poll(self) -> tuple[np.ndarray, np.ndarray]:
        """The ring's poll, plus the rows whose records the log overwrote among the gone ones."""
        new, gone = self.reader.poll()
        seen = self.reader.seen
        if new.size:
            self.evictions.track(new, self.segment.offsets[new].min(axis=1), seen[new])
        dead = self.evictions.expired(self.segment.log.reserved - self.byte_budget, seen)
        if dead.size:
            self.evictions.count(dead, seen[dead], self.control.tickets)
            gone = np.union1d(gone, dead)
        return new, gone

    def read_intact(self, indices: np.ndarray) -> tuple[dict[str, np.ndarray], np.ndarray]:
        slots = np.asarray(indices, np.int64)
        rows = self.rows_of(slots)
        compressed, sound = self.segment.decode(slots, self.reader.seen[slots], list(self.codecs))
        rows.update(compressed)
        intact = self.reader.intact(slots)
        evicted = intact & ~sound
        if evicted.any():
            dead = np.unique(slots[evicted])
            self.evictions.count(dead, self.reader.seen[dead], self.control.tickets)
        return {name: rows[name] for name in self.schema}, intact & sound

    def rows_of(self, slots: np.ndarray, names: Sequence[str] | None = None) -> dict[str, np.ndarray]:
        raw = [n for n in (self.schema if names is None else names) if n not in self.codecs]
        return self.segment.rows.gather(slots, raw) if raw else {}

    # -- the storage protocol ------------------------------------------------------------

    def validate(self, batch: Mapping[str, Any]) -> tuple[int, dict[str, np.ndarray]]:
        return check_host_batch(self.schema, self.capacity, batch)

    def validate_fields(self, fields: Mapping[str, Any]) -> tuple[int, dict[str, np.ndarray]]:
        return check_host_batch(self.schema, self.capacity, fields, every_field=False)

    def write(self, start: int, arrays: Mapping[str, np.ndarray]) -> None:
        """Write validated rows at slots ``start, ...`` in place: their stamps stay (the owner holds its lock).

        Rows given compressed fields get new records, tracked for eviction from their new offsets.
        """
        rows = len(next(iter(arrays.values())))
        slots = (start + np.arange(rows)) % self.capacity
        stamps = self.control.stamps[slots].copy()
        encoded = self.segment.encode(arrays)
        self.segment.put(start, encoded, stamps)
        if encoded.names:
            self._track(slots[stamps > 0])

    def gather(self, indices: np.ndarray, fields: Sequence[str] | None = None) -> dict[str, np.ndarray]:
        """Rows at ``indices``; a row whose records were evicted reads as zeros in its compressed fields."""
        slots = np.asarray(indices, np.int64)
        names = list(self.schema) if fields is None else list(fields)
        out = self.rows_of(slots, names)
        out.update(self.segment.decode(slots, self.reader.seen[slots], [n for n in names if n in self.codecs])[0])
        return {name: out[name] for name in names}

    def export_rows(self, count: int, copy: bool = True) -> dict[str, np.ndarray]:
        return self.gather(np.arange(count, dtype=np.int64))

    def import_rows(self, arrays: Mapping[str, np.ndarray]) -> None:
        self.write(0, arrays)

    def adopt(self, position: int, size: int, arrays: Mapping[str, np.ndarray]) -> None:
        """Hold restored rows: appended oldest ticket first, a chunk at a time, so that a budget smaller
        than the rows keeps the newest (as writes would have) instead of refusing the restore."""
        self.reader.adopt(position, size)
        for slots in self._oldest_first(position, size):
            self.write(int(slots[0]), {name: a[slots] for name, a in arrays.items()})

    def export_state(self, count: int, copy: bool = True) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """The first ``count`` rows as the host storage's state holds them: the raw fields' rows and the
        compressed fields' records as they are (copies), with the codec settings.

        A row whose records the log no longer holds (evicted, or a writer rewriting it: see
        :meth:`CompressedSegment.copy_records`), or whose raw fields a writer began to rewrite meanwhile,
        has no records (an empty one in each field): it is not served, and its owner saves it with
        priority 0 (:func:`~hetero_replay.storage.codec.absent_rows`). Always copies (``copy`` is for
        the protocol): other processes go on writing the segment.

        With frames, each row's fields are decoded (the gather's checks) and compressed again as one
        record a row (the form without ``frames``, which every storage loads), and no ``byte_budget``
        is saved (the log's size bounds frames, not these records): the log's frame records are shared
        across rows, and a writer may have written a frame twice, so they are not the host's frames.
        """
        slots = np.arange(count, dtype=np.int64)
        stamps = self.reader.seen[:count].copy()
        rows = self.rows_of(slots)
        records = self.segment.copy_records(slots, stamps) if not self.pooled else self._recompressed(slots, stamps)
        torn = np.flatnonzero(~self.reader.intact(slots))
        arrays: dict[str, np.ndarray] = {}
        for name, held in records.items():
            for r in torn.tolist():
                held[r] = None
            arrays[f"{name}/records"], arrays[f"{name}/offsets"] = record_arrays.join(held)
        budget = None if self.pooled else self.byte_budget  # the log's size bounds frames, not these records
        return rows, {"settings": settings_json(self.codecs, [], budget), "arrays": arrays}

    def adopt_state(self, position: int, size: int, rows: Mapping[str, np.ndarray], packed: Mapping[str, Any]) -> None:
        """:meth:`adopt` of rows in :meth:`export_state`'s form. Records compressed alike (codec and level,
        no ``frames``) are appended as they are, after each was decompressed once to check it; others are
        decompressed and written as rows added. A row without records stays unserved (as if evicted).

        Raises:
            ValueError: the records are wrong (see :meth:`~hetero_replay.storage.codec.CompressedFields.adopt`).
        """
        held = records_to_adopt(self, position, size, rows, packed, frames=bool(self.pooled))
        if held is None:
            return
        names = list(self.codecs)
        for slots in self._oldest_first(position, size):
            self.segment.rows.write(int(slots[0]), {name: a[slots] for name, a in rows.items()})
            there = [k for k, slot in enumerate(slots.tolist()) if all(h[slot] is not None for h in held)]
            picked = np.asarray(there, np.int64)
            self.segment.lengths[slots] = 0  # no record: never served
            records = [h[slot] or b"" for slot in slots.tolist() for h in held]
            encoded = EncodedRows(len(slots), {}, names, records)
            self.segment.put_records(slots[picked], self.control.stamps[slots[picked]], encoded, picked)
            self._track(slots[picked])

    def _recompressed(self, slots: np.ndarray, stamps: np.ndarray) -> dict[str, list[bytes | None]]:
        """Rows ``slots`` (whose stamps were ``stamps``) of each compressed field as one record a row, compressed
        again from the rows decoded, :data:`_ADOPT_ROWS` at a time; ``None`` for a row whose records were unsound."""
        records: dict[str, list[bytes | None]] = {name: [] for name in self.codecs}
        for lo in range(0, len(slots), _ADOPT_ROWS):
            chunk = slots[lo : lo + _ADOPT_ROWS]
            out, sound = self.segment.decode(chunk, stamps[lo : lo + _ADOPT_ROWS], list(self.codecs))
            for name, codec in self.codecs.items():
                fresh = compress_rows(out[name].reshape(len(chunk), -1).view(np.uint8), codec.name, codec.level)
                records[name] += [r if ok else None for r, ok in zip(fresh, sound.tolist())]
        return records

    def _track(self, slots: np.ndarray) -> None:
        """Rows restored at ``slots``: their records' offsets, so that the poll finds them if evicted."""
        self.evictions.track(slots, self.segment.offsets[slots].min(axis=1), self.control.stamps[slots])

    def _oldest_first(self, position: int, size: int) -> Iterator[np.ndarray]:
        """The slots of a ring of ``size`` rows at ``position``, oldest ticket first, in chunks that fit the log."""
        return oldest_first(position, size, self.capacity, self._adopt_rows)

    def view(self, name: str) -> np.ndarray:
        if name in self.codecs:
            raise NotImplementedError(f"field {name!r} is compressed ({self.codecs[name]}): no live view")
        return self.segment.rows.view(name)

    def writer(self) -> RingWriter:
        """A picklable handle actor processes add rows with (see :class:`RingWriter`)."""
        location = {"path": self.path, "codecs": self._codec_spec, "log_bytes": self.byte_budget, "frames": self.pooled}
        return RingWriter(CompressedSegment, location, self.schema, self.capacity)

    def close(self) -> None:
        """Tell writers the buffer is closed, unmap and remove the segment file."""
        if self._remove.alive:
            self.control.mark_closed()
            self.segment.close()
            self._remove()

    def __repr__(self) -> str:
        return f"CompressedSharedStorage({self.path!r}, capacity={self.capacity}, byte_budget={self.byte_budget})"


def _layout(capacity: int, row_bytes: int, words: int) -> tuple[int, int, int]:
    """Bytes of the rows and of the references (``words`` int64 a row), and where the log starts (on its own
    cache line)."""
    rows_bytes, refs_bytes = capacity * row_bytes, capacity * words * 8
    return rows_bytes, refs_bytes, -(-(rows_bytes + refs_bytes) // _LINE) * _LINE


__all__ = [
    "DEFAULT_BUDGET_FRACTION",
    "CompressedSegment",
    "CompressedSharedStorage",
    "DecodedField",
    "EncodedRows",
    "adopt_rows",
    "check_byte_budget",
    "check_frames",
    "copy_records",
    "encode_rows",
    "log_options",
    "oldest_first",
]
