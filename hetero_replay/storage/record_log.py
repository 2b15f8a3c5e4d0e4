"""A circular byte log of compressed records, written lock-free by many processes.

The compressed ring storages keep their compressed fields here rather than in
their fixed-size rows: records differ in size, so they go one after another
into ``log_bytes`` bytes (the byte budget) used as a ring of bytes, a region of
the shared segment (:mod:`.shared_compressed`) or a file written with
``pwrite`` and read with ``pread`` (``records.log`` of the disk storage,
:mod:`.disk`); the same native code appends, gathers and checks both:

* **The head** (a 64-bit word before the region) counts the bytes ever
  reserved; absolute position ``p`` lives at byte ``p % log_bytes``. A writer
  compresses its batch in its own process, reserves all its records' bytes
  with one atomic add on the head, and copies each record after a 16-byte
  header (its *tag*: the stamp of the row that first writes it; its length),
  wrapping at the region's end (``csrc/record_log.cpp``). The row keeps each
  record's absolute offset and length (with frames, also the tag: a row may
  reference a frame an earlier row of its writer wrote); its stamp is
  published afterwards as for any ring row.
* **FIFO**: the oldest bytes are overwritten first, like the ring's oldest
  rows. A record at offset ``o`` is gone once the head passes
  ``o + log_bytes``. With a budget of at least the capacity times the
  records' mean bytes per row (the header included), a row's records outlive
  the row; with less, the oldest rows lose their records before the ring
  overwrites them: they are *evicted*.
* **Reads** decompress a sampled row's records, then re-read the head
  (seqlock-style): a record read while a reservation passed its end may have
  been overwritten, and is not served. The header (the reference's tag and
  length) and the record's CRC-32C also catch a writer that reserved long ago
  and copied only now, over newer records.

:class:`Evictions` is the learner's bookkeeping of which rows lost their
records, so that they leave the sum tree before anyone draws them.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Sequence
from typing import Any

import numpy as np

from hetero_replay._native import log_append, log_gather

#: Bytes before the log's data: the head, alone on its cache line (writers contend for it).
LOG_HEADER_BYTES = 64
#: Bytes each record takes besides its own: the header (its tag, its length).
RECORD_HEADER_BYTES = 16


class RecordLog:
    """The log in ``region`` (uint8, :meth:`region_bytes` long): its head and its ``log_bytes`` of data.

    :meth:`in_file` makes one whose data is a file instead (its header words elsewhere, e.g. mapped).
    """

    def __init__(self, region: np.ndarray, log_bytes: int) -> None:
        self.log_bytes = int(log_bytes)
        #: The log's header words: the head, then the log's size (written by the segment's owner).
        self.words = region[:LOG_HEADER_BYTES].view(np.int64)
        self.head = self.words[:1]
        #: The data in memory (None for a log in a file).
        self.data: np.ndarray | None = region[LOG_HEADER_BYTES : LOG_HEADER_BYTES + self.log_bytes]
        #: The file descriptor of a log in a file (None in memory).
        self.fd: int | None = None
        self._source: Any = self.data

    @classmethod
    def in_file(cls, fd: int, words: np.ndarray, log_bytes: int) -> RecordLog:
        """The log whose data is the file ``fd`` (``log_bytes`` long) and whose header words are ``words``
        (int64, :data:`LOG_HEADER_BYTES` of them, shared by every process writing the file)."""
        log = cls.__new__(cls)
        log.log_bytes, log.words, log.head = int(log_bytes), words, words[:1]
        log.data, log.fd, log._source = None, fd, (fd, int(log_bytes))
        return log

    @staticmethod
    def region_bytes(log_bytes: int) -> int:
        """Bytes of a segment the log of ``log_bytes`` takes (the head's line included)."""
        return LOG_HEADER_BYTES + log_bytes

    @property
    def reserved(self) -> int:
        """Bytes ever reserved (the head): records at offsets below ``reserved - log_bytes`` are gone."""
        return int(self.head[0])

    def append(self, records: Sequence[bytes], tags: np.ndarray) -> np.ndarray:
        """Copy ``records``, each under a header naming its tag (``tags``: one a record, or one a row of
        row-major records, every row's fields under its row's stamp); their absolute offsets."""
        tags = np.asarray(tags, np.int64)
        if len(tags) and len(records) != len(tags):
            tags = np.repeat(tags, len(records) // len(tags))
        return log_append(self._source, self.head, list(records), tags)

    def gather(
        self,
        offsets: np.ndarray,
        lengths: np.ndarray,
        tags: np.ndarray,
        outs: Sequence[np.ndarray],
        threads: int = 1,
    ) -> np.ndarray:
        """Decompress the rows' records into ``outs`` (per column ``(rows, bytes)`` uint8, rows any stride
        apart); mask of sound rows.

        ``offsets``, ``lengths``: ``(rows, columns)`` as the rows hold them; ``tags``: what each record's
        header must name, ``(rows, columns)``, or the rows' stamps as the reader saw them (one a row, for
        rows whose records their own stamp tags). A row is sound if every record's header names its tag
        and length, the record checks out (CRC, size) and the head had not passed it after the read. A
        log in a file is read on ``threads`` threads (``pread``); one in memory is decoded on the batch
        threads.
        """
        tags = np.asarray(tags, np.int64)
        if tags.ndim == 1:
            tags = np.repeat(tags[:, None], len(outs), axis=1)
        return log_gather(self._source, self.head, offsets, lengths, tags, list(outs), threads).view(bool)

    def record_at(self, offset: int, length: int, tag: int) -> bytes | None:
        """The record at absolute ``offset`` if its header names ``tag`` and ``length`` (a copy), else None.

        Unchecked otherwise: the caller re-reads the head after copying, and decompresses it.
        """
        size = self.log_bytes
        if tag <= 0 or offset < 0 or not 0 < length <= size - RECORD_HEADER_BYTES:
            return None
        start, n = offset % size, RECORD_HEADER_BYTES + length
        first = min(n, size - start)
        span = self._read(start, first) + (self._read(0, n - first) if first < n else b"")
        if len(span) != n:  # a file that ends early
            return None
        header = np.frombuffer(span, np.int64, 2)
        return span[RECORD_HEADER_BYTES:] if (int(header[0]), int(header[1])) == (tag, length) else None

    def _read(self, start: int, n: int) -> bytes:
        if self.data is not None:
            return self.data[start : start + n].tobytes()
        assert self.fd is not None
        return os.pread(self.fd, n, start)


class Evictions:
    """Which committed rows of a ring lost their records to newer ones (the learner's side).

    :meth:`track` is told a row's oldest record offset (the first of its own
    records; with frames, the oldest it references) each time its records are
    written: a new row, or one rewritten in place (its stamp kept). :meth:`expired` returns the tracked rows whose
    current first record the head has passed and that still hold the stamp they
    had then; an entry a rewrite superseded is skipped. Entries are kept in
    chunks in poll order, each sorted by offset: writers reserve bytes in about
    that order, and a row a chunk boundary hides is caught by the read's own
    check instead (:meth:`RecordLog.gather`).
    """

    def __init__(self, capacity: int) -> None:
        self._chunks: deque[tuple[np.ndarray, np.ndarray, np.ndarray]] = deque()
        self._first = np.full(capacity, -1, np.int64)  # each slot's current first record offset (-1: none)
        self._counted = np.zeros(capacity, np.int64)  # the stamp at which each slot was counted evicted
        #: Rows found evicted so far (each slot counted once per row it held).
        self.rows = 0

    def track(self, slots: np.ndarray, offsets: np.ndarray, stamps: np.ndarray) -> None:
        if len(slots):
            order = np.argsort(offsets, kind="stable")
            self._chunks.append((offsets[order], slots[order], stamps[order]))
            self._first[slots] = offsets

    def expired(self, limit: int, seen: np.ndarray) -> np.ndarray:
        """Tracked slots whose current first record lies below ``limit`` and whose stamp is still ``seen``'s."""
        dead: list[np.ndarray] = []
        while self._chunks and self._chunks[0][0][0] < limit:
            offsets, slots, stamps = self._chunks.popleft()
            cut = int(np.searchsorted(offsets, limit))
            gone = slots[:cut]
            current = (stamps[:cut] == seen[gone]) & (offsets[:cut] == self._first[gone])
            dead.append(gone[current])
            self._first[gone[current]] = -1  # found once: a duplicate entry (a rewrite kept it) is stale
            if cut < len(offsets):
                self._chunks.appendleft((offsets[cut:], slots[cut:], stamps[cut:]))
        return np.unique(np.concatenate(dead)) if dead else np.zeros(0, np.int64)

    def count(self, slots: np.ndarray, stamps: np.ndarray, tickets: int) -> None:
        """Count the rows ``slots`` (holding ``stamps``) whose records are gone as evicted, each row once.

        ``tickets``: the ring's ticket counter. A row whose slot a writer already reserved for a newer row is
        being replaced, as the ring replaces its oldest, whatever the budget: it is not counted (a writer
        stalled between its reservation and its write would otherwise count each row it replaces).
        """
        lost = stamps - 1 + len(self._counted) >= tickets  # (a committed row's stamp is its ticket + 1)
        slots, stamps = slots[lost], stamps[lost]
        fresh = self._counted[slots] != stamps
        self.rows += int(np.count_nonzero(fresh))
        self._counted[slots[fresh]] = stamps[fresh]


__all__ = ["LOG_HEADER_BYTES", "RECORD_HEADER_BYTES", "Evictions", "RecordLog"]
