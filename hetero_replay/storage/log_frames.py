"""Frames stored once in a record log that many processes write, without a table they share.

The host storage's :class:`~hetero_replay.storage.frames.FramePool` is one
process's table of frames. Writers of a shared record log (:mod:`.record_log`)
share no table, and need none: a frame repeats only within one environment's
stream (the stack's older frames, the ``next_obs`` of the row before), and each
stream has one writer. So each writer process keeps its own map
(:class:`LogFrames`) from a frame's digest (:func:`~hetero_replay.storage.frames._digest`'s,
as the host pool) to the *reference* of the record it last wrote for it: the
record's absolute offset, its length and its *tag*, the stamp its header names
(that of the row that first wrote it).

* **A row** of a pooled field references one record per frame (a ``(4, 84, 84)``
  stack: 4 references, typically one of them new). Other compressed fields keep
  one record per row, tagged with the row's stamp. A reference is a *column*
  of the row's ``(offset, length, tag)``.
* **Frames new in a batch** are compressed once (one call per field, GIL
  released) and written in the batch's one reservation, each tagged with the
  stamp of the first row written that holds it; later rows of the batch
  reference them.
* **Half a log**: a frame whose record lies more than half the log behind the
  head (read before the batch reserves) is written again, not referenced, and
  the map forgets it (so the map is bounded by half a log of records). Every
  row's records therefore lie within about half a log of its own write: a row
  outlives at least half the log's bytes, and a row is evicted by the oldest
  of its references.
* **Soundness** stays the log's: a gather checks each record's header against
  the reference's tag (not the row's stamp), its length, its CRC, and re-reads
  the head. A record is referenced only by rows its writer wrote after copying
  it, so a row the writer publishes never references an uncopied record; a
  writer killed loses only its own rows (its map dies with it). A record whose
  first row the ring has since overwritten still carries its tag and serves the
  rows that reference it until the head passes it.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from hetero_replay._native import compress_rows
from hetero_replay.storage.codec import ByteBudgetError, Codec
from hetero_replay.storage.frames import _digest
from hetero_replay.storage.record_log import RECORD_HEADER_BYTES, RecordLog
from hetero_replay.storage.schema import Field

_OFFSET, _LENGTH, _TAG = range(3)


@dataclass
class FrameRows:
    """A batch encoded by :meth:`LogFrames.encode`: what :meth:`LogFrames.write` appends."""

    rows: int
    raw: dict[str, np.ndarray]  # the fields kept raw
    names: list[str]  # the compressed fields present
    columns: np.ndarray  # the reference columns the batch sets (its compressed fields')
    records: list[bytes]  # the records new in this batch
    digests: list[bytes | None]  # each new record's frame digest (None: a whole row of an unpooled field)
    new: np.ndarray  # (rows, columns): the new record each reference is (index into records), or -1:
    held: np.ndarray  # (rows, columns, 3): ... the reference (offset, length, tag) of a record written before


def unit_bytes(field: Field, pooled: bool) -> int:
    """Raw bytes of one record of a compressed ``field``: a frame (its last two dimensions) if ``pooled``, else a row."""
    return field.shape[-2] * field.shape[-1] * field.dtype.itemsize if pooled else field.item_bytes


def records_a_row(field: Field, pooled: bool) -> int:
    """Records (reference columns) a row of a compressed ``field`` has: one per frame if ``pooled``, else one."""
    return field.item_bytes // unit_bytes(field, pooled)


class LogFrames:
    """One writer's frames of a record log: its columns and its map of the frames it wrote lately.

    Args:
        fields: the compressed fields (a record's raw size: a frame, the field's last two dimensions,
            for pooled fields; a row for the others).
        codecs: their codecs.
        pooled: the fields whose frames are stored once.
        log: the record log written.
    """

    def __init__(
        self, fields: Mapping[str, Field], codecs: Mapping[str, Codec], pooled: Sequence[str], log: RecordLog
    ) -> None:
        self.codecs, self.log = dict(codecs), log
        self.pooled = [n for n in codecs if n in pooled]
        #: Records per row of each field, and each record's raw bytes.
        self.per_row = {n: records_a_row(fields[n], n in pooled) for n in codecs}
        self.unit_bytes = {n: unit_bytes(fields[n], n in pooled) for n in codecs}
        #: Each field's reference columns.
        self.columns: dict[str, np.ndarray] = {}
        for name in codecs:
            start = sum(len(c) for c in self.columns.values())
            self.columns[name] = np.arange(start, start + self.per_row[name], dtype=np.int64)
        #: Reference columns of a row.
        self.width = sum(self.per_row.values())
        # digest -> reference of the record last written for it, oldest offset first (appended in log order).
        self._recent: OrderedDict[bytes, tuple[int, int, int]] = OrderedDict()

    @property
    def remembered(self) -> int:
        """Frames the map holds now (those written within the last half log)."""
        return len(self._recent)

    def encode(self, arrays: Mapping[str, np.ndarray]) -> FrameRows:
        """The compressed fields among ``arrays`` (validated rows) as references and new records; changes
        nothing but forgetting frames the half-log rule retires.

        Raises:
            ByteBudgetError: the batch's new records do not fit the log.
        """
        rows = len(next(iter(arrays.values())))
        self._forget(self.log.reserved - self.log.log_bytes // 2)
        names = [n for n in self.codecs if n in arrays]
        width = sum(self.per_row[n] for n in names)
        new = np.full((rows, width), -1, np.int64)
        held = np.zeros((rows, width, 3), np.int64)
        records: list[bytes] = []
        digests: list[bytes | None] = []
        fresh: dict[bytes, int] = {}  # digest -> index of its new record (fields share frames: obs, next_obs)
        at = 0
        for name in names:
            k, codec = self.per_row[name], self.codecs[name]
            units = np.ascontiguousarray(arrays[name]).reshape(rows * k, self.unit_bytes[name]).view(np.uint8)
            index = np.full(rows * k, -1, np.int64)
            if name in self.pooled:
                ids = [_digest(u) for u in units]
                first_units: list[int] = []  # each new record's first unit (frame) in the batch
                for i, digest in enumerate(ids):
                    ref = self._recent.get(digest)
                    if ref is not None:
                        held[i // k, at + i % k] = ref
                        continue
                    j = fresh.get(digest)
                    if j is None:
                        j = fresh[digest] = len(records) + len(first_units)
                        first_units.append(i)
                    index[i] = j
                digests += [ids[i] for i in first_units]
                if first_units:
                    records += compress_rows(units[first_units], codec.name, codec.level)
            else:
                index[:] = len(records) + np.arange(rows)
                digests += [None] * rows
                records += compress_rows(units, codec.name, codec.level)
            new[:, at : at + k] = index.reshape(rows, k)
            at += k
        total = sum(map(len, records)) + RECORD_HEADER_BYTES * len(records)
        if total > self.log.log_bytes:
            raise ByteBudgetError(
                f"byte_budget: the {rows} rows' new records take {total} bytes, more than the whole record log "
                f"of {self.log.log_bytes} bytes; nothing was written (add fewer rows a call, or raise "
                "byte_budget, see docs/compression.md)"
            )
        columns = np.concatenate([self.columns[n] for n in names]) if names else np.zeros(0, np.int64)
        raw = {n: a for n, a in arrays.items() if n not in self.codecs}
        return FrameRows(rows, raw, names, columns, records, digests, new, held)

    def write(self, encoded: FrameRows, picked: np.ndarray, stamps: np.ndarray) -> np.ndarray:
        """Append the new records the rows ``picked`` (of ``encoded``; their stamps ``stamps``) reference, and
        remember their frames; the rows' references ``(picked rows, 3, encoded columns)``: offset, length, tag.

        A record's tag is the stamp of the first picked row that references it. A reference
        tagged 0 or less (a row never published) is never served, so such frames are not remembered.
        """
        new = encoded.new[picked]
        refs = encoded.held[picked].transpose(0, 2, 1).copy()  # (rows, 3, columns)
        mine = new >= 0
        if mine.any():
            first = np.full(len(encoded.records), len(picked), np.int64)
            np.minimum.at(first, new[mine], np.nonzero(mine)[0])
            needed = np.flatnonzero(first < len(picked))
            tags = np.asarray(stamps, np.int64)[first[needed]]
            records = [encoded.records[j] for j in needed.tolist()]
            lengths = np.fromiter(map(len, records), np.int64, len(records))
            offsets = self.log.append(records, tags)
            at = np.searchsorted(needed, new[mine])
            rows, columns = np.nonzero(mine)
            refs[rows, _OFFSET, columns] = offsets[at]
            refs[rows, _LENGTH, columns] = lengths[at]
            refs[rows, _TAG, columns] = tags[at]
            for j, offset, length, tag in zip(needed.tolist(), offsets.tolist(), lengths.tolist(), tags.tolist()):
                digest = encoded.digests[j]
                if digest is not None and tag > 0:
                    self._recent[digest] = (offset, length, tag)
        return refs

    def _forget(self, limit: int) -> None:
        """Forget the frames whose records lie below ``limit`` (they will be written again)."""
        recent = self._recent
        while recent and next(iter(recent.values()))[_OFFSET] < limit:
            recent.popitem(last=False)


__all__ = ["FrameRows", "LogFrames", "records_a_row", "unit_bytes"]
