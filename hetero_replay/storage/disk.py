"""Rows on local disk: a ring file read with parallel ``pread``, the newest rows in RAM, durable points.

``storage="disk"`` keeps rows in ``<path>/rows.dat``, one fixed-size record
per slot, written as a ring by any number of writer processes (the protocol of
:mod:`hetero_replay.storage.ring`, whose control block is ``<path>/ring.ctl``).
Priorities and the tree stay in the learner's RAM.

* **Reads are explicit.** A sampled batch is read with one ``pread`` per row
  on ``read_threads`` threads (GIL released), never through page faults of a
  memory map: cold random batches of 256 rows of 28 KB took 132 ms through a
  map against 12.7 ms with 8-thread ``pread`` on this project's VM. Through the
  relaxed pipeline (:class:`~hetero_replay.pipeline.RelaxedReplay`) the next
  batches are read while the learner trains.
* **The RAM tier is the page cache, bounded.** The newest rows stay cached
  (``ram_bytes`` of them): every writer's ``pwrite`` goes through it, so it is
  shared by all processes and coherent with the file by construction. At every
  durable point the rows that left that window since the last one are dropped
  from it (``posix_fadvise(DONTNEED)``), so rows written long ago do not hold RAM.
* **A record carries its ticket at both ends and a checksum**
  (``[ticket+1][row][crc][ticket+1]``): a read is served only if both ends and
  the slot's stamp are the ticket the learner polled, so neither a row being
  rewritten nor one torn by a crash is ever sampled; and only if its checksum
  holds, so a row whose bytes changed on the disk is not either (see :class:`RecordFormat`).
* **A damaged row is never returned**, on any read path. Sampling (``sample``,
  the relaxed pipeline, the shards' ``gather_at``) drops it: its priority
  becomes 0 until the ring rewrites the slot, it is counted in
  :attr:`DiskStorage.damaged_rows` and a ``RuntimeWarning`` names its slot.
  ``read_rows``, ``state_dict`` and ``save`` return exactly the rows asked for,
  so they cannot drop one: they raise ``ReplayFileError`` naming the slots (and
  count them). There is no raw ``view`` (it could not check rows). ``reopen``
  checks the structure, not every row (that would read the whole file): a row
  damaged while the buffer was closed is found when it is first read, as above.
* **Reopening trusts nothing it reads**: the control block, the row file and
  the durable point are checked against each other and the ring's bounds before
  anything changes (``ReplayFileError`` naming the damaged part).
* **Compressed fields** (``storage_options={"codec": "lz4", "byte_budget": ...}``,
  the options and rules of ``storage="shared"``; ``frames`` is refused for the
  same reason: no frame table is shared by the writer processes). The records go
  to ``<path>/records.log``, a file of ``byte_budget`` bytes used as a
  log-structured ring (:mod:`~hetero_replay.storage.disk_records`): a writer
  compresses its batch in its own process, reserves its records' bytes with one
  atomic add on a head kept in ``ring.ctl``, and ``pwrite``-s them (with a
  header: the row's stamp, the record's length) at ``offset % byte_budget``; the
  row record keeps the raw fields and each record's offset and length under its
  checksum. A gather reads the sampled rows' records with ``pread`` on the read
  threads and decodes them in C++ (GIL released), with the shared log's checks
  (header, CRC-32C, the head re-read after the copy). When the byte budget, not
  the capacity, is the limit, the oldest records are overwritten: their rows are
  *evicted* (priority 0, counted in :attr:`DiskStorage.evicted_rows`, never
  served); a record that fails the checks although the head has not passed it
  was damaged on the disk: its row is dropped as a damaged raw row is (below).
  Checkpoints keep the records as they are (the shared storage's form).
* **Durable points.** Every ``flush_every`` adds or ``flush_seconds`` seconds
  (checked at each buffer call), the learner snapshots every slot's priority
  and stamp, the max priority, the random generator and the ticket count; a
  background thread then ``fdatasync``-s the row file and writes the snapshot
  atomically to ``<path>/state.hrp``. Between points the same thread starts the
  write-back of dirty rows every ``WRITEBACK_SECONDS``, so that ``fdatasync``
  has little left to write and reads do not stall behind it. After ``kill -9`` of the learner,
  ``PrioritizedReplay.reopen(path)`` restores that point: every slot whose
  stamp still equals the snapshot's holds the same complete row; slots
  rewritten after it are empty. The loss window is the rows added after the
  last durable point (at most ``flush_every`` adds or ``flush_seconds``
  seconds, plus the time one write of the snapshot takes). With compressed
  fields the point also records the log's head (``records.log`` is synced
  first), and ``reopen`` takes the codecs from ``ring.ctl`` and checks the log:
  ``records.log`` missing, not a regular file or not ``byte_budget`` bytes long
  (truncated), damaged settings, or a head in ``ring.ctl`` behind the durable
  point's (the control block was reset) raise ``ReplayFileError`` naming the
  file, before anything changes. Then each restored row's record references are
  read: a row failing its checksum, or whose records lie outside what the log
  held at the durable point, is dropped as damaged, one whose records were
  overwritten since as evicted (priority 0 either way). A record damaged while
  the buffer was closed is found when first read, as a damaged raw row is.
* **RAM.** With compressed fields, ``ram_bytes`` covers the newest rows first
  and the newest bytes of ``records.log`` with the rest; the durable points'
  page-cache trim drops what leaves either window.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import stat
import threading
import warnings
import zlib
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from hetero_replay import _native
from hetero_replay.checks import check_bool, check_int
from hetero_replay.storage import checkpoint
from hetero_replay.storage import records as record_arrays
from hetero_replay.storage.base import check_host_batch
from hetero_replay.storage.codec import Codec, check_codec, settings_json
from hetero_replay.storage.disk_records import (
    LOG_FILE,
    REFS,
    DiskRecords,
    check_head,
    create_log,
    payload_bytes,
    row_schema,
    stored_settings,
)
from hetero_replay.storage.durable import (
    DURABLE,
    FlushSchedule,
    check_flush_every,
    check_flush_seconds,
    check_path,
    read_point,
)
from hetero_replay.storage.files import (
    BufferInUseError,
    OwnerLock,
    check_directory,
    create_file,
    open_file,
    private_directory,
)
from hetero_replay.storage.host import _contiguous_strides, record_layout
from hetero_replay.storage.record_log import RECORD_HEADER_BYTES, Evictions
from hetero_replay.storage.ring import (
    TICKET_MASK,
    RawRows,
    RingControl,
    RingOwner,
    RingReader,
    RingWriter,
    check_abandon_after,
    pid_alive,
)
from hetero_replay.storage.schema import Schema
from hetero_replay.storage.shared_compressed import (
    EncodedRows,
    adopt_rows,
    check_byte_budget,
    check_frames,
    log_options,
    oldest_first,
    records_to_adopt,
)

CONTROL_FILE, ROW_FILE, STATE_FILE = "ring.ctl", "rows.dat", "state.hrp"
#: The most threads a batch is read with (``read_threads``): each is an OS thread of the native pool.
MAX_READ_THREADS = 1024
#: Between durable points, dirty rows are sent to the disk this often (see :func:`_start_writeback`).
WRITEBACK_SECONDS = 0.5


#: Each keyword option of :class:`DiskStorage` and its check: the one rule, applied by the storage
#: and by ``ShardedReplay`` on the learner before any shard starts (:func:`check_options`).
_OPTION_CHECKS: dict[str, Callable[[Any], Any]] = {
    "path": lambda value: check_path(value, "storage_options path"),
    "ram_bytes": lambda value: check_int(value, "storage_options ram_bytes", low=0),
    "read_threads": lambda value: check_int(value, "storage_options read_threads", low=1, high=MAX_READ_THREADS),
    "flush_every": check_flush_every,
    "flush_seconds": check_flush_seconds,
    "reopen": lambda value: check_bool(value, "storage_options reopen"),
    "abandon_after": check_abandon_after,
    "codec": check_codec,
    "byte_budget": lambda value: None if value is None else check_byte_budget(value),
    "frames": lambda value: check_frames(value, "disk"),
}


def check_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """The disk storage's keyword options, each checked and made what the storage keeps, touching no file.

    ``options`` may hold any subset of :class:`DiskStorage`'s keyword arguments
    (those after ``capacity`` and ``schema``).

    Raises:
        TypeError: a name the storage does not take, or a value of the wrong type (naming it).
        ValueError: a value out of range (naming it).
    """
    unknown = sorted(str(k) for k in options if k not in _OPTION_CHECKS)
    if unknown:
        raise TypeError(
            f"storage_options got unexpected keyword argument(s) {unknown} for storage='disk'; "
            f"it takes {sorted(_OPTION_CHECKS)}"
        )
    return {name: _OPTION_CHECKS[name](value) for name, value in options.items()}


class RecordFormat:
    """A row on disk: ``[ticket + 1: int64][the HostStorage record][checksum: uint64][ticket + 1: int64]``.

    The checksum is the CRC-32 (``zlib.crc32``) of the head stamp and the row,
    computed by the process that writes the row; a row whose bytes changed on
    the disk fails it. ``zlib.crc32``, not a faster CRC-32C: it is in the standard
    library and costs 0.27 us for an 88-byte record and 7.0 us for a 28 KB one
    (4 GB/s), on add and on sample; a fraction of the ``pread`` of that row.
    """

    def __init__(self, schema: Schema) -> None:
        self.schema = schema
        self.offsets, self.row_bytes = record_layout(schema)
        self.bytes = self.row_bytes + 24
        self._sealed = 8 + self.row_bytes  # the bytes the checksum covers

    def _views(self, records: np.ndarray) -> dict[str, np.ndarray]:
        n = len(records)
        return {
            name: np.ndarray(
                (n, *f.shape),
                f.dtype,
                buffer=records,
                offset=8 + self.offsets[name],
                strides=(self.bytes, *_contiguous_strides(f.shape, f.dtype.itemsize)),
            )  # fmt: skip
            for name, f in self.schema.items()
        }

    def ends(self, records: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The ticket stamps at the head and the tail of each record."""
        head = records[:, :8].copy().view(np.int64).ravel()
        tail = records[:, -8:].copy().view(np.int64).ravel()
        return head, tail

    def _checksums(self, records: np.ndarray) -> np.ndarray:
        return np.fromiter((zlib.crc32(r) for r in records[:, : self._sealed]), np.int64, len(records))

    def seal(self, records: np.ndarray, which: np.ndarray | None = None) -> None:
        """Write the checksum of the head stamp and row of each record (those ``which``, a mask)."""
        chosen = records if which is None else records[which]
        sums = self._checksums(chosen).view(np.uint8).reshape(-1, 8)
        if which is None:
            records[:, self._sealed : self._sealed + 8] = sums
        else:
            records[which, self._sealed : self._sealed + 8] = sums

    def sound(self, records: np.ndarray) -> np.ndarray:
        """Mask of the records whose checksum matches their head stamp and row."""
        stored = records[:, self._sealed : self._sealed + 8].copy().view(np.int64).ravel()
        return stored == self._checksums(records)

    def pack(self, arrays: Mapping[str, np.ndarray], stamps: np.ndarray) -> np.ndarray:
        records = np.zeros((len(stamps), self.bytes), np.uint8)
        for name, view in self._views(records).items():
            view[...] = arrays[name]
        ends = stamps.astype(np.int64).view(np.uint8).reshape(-1, 8)
        records[:, :8] = ends
        records[:, -8:] = ends
        self.seal(records)
        return records

    def unpack(self, records: np.ndarray, fields: Sequence[str] | None = None) -> dict[str, np.ndarray]:
        views = self._views(records)
        return {name: np.ascontiguousarray(views[name]) for name in (fields or views)}


def _pwrite_runs(
    fd: int, fmt: RecordFormat, capacity: int, first: int, records: np.ndarray, taken: np.ndarray | None
) -> None:
    """Write the records of tickets ``first + k`` (those ``taken``), one ``pwrite`` per contiguous run of slots."""
    if taken is None:  # the common case: one run, split where the ring wraps
        slot, head = first % capacity, min(len(records), capacity - first % capacity)
        _pwrite_all(fd, records[:head], slot * fmt.bytes)
        _pwrite_all(fd, records[head:], 0)
        return
    take, k, n = taken, 0, len(taken)
    while k < n:
        if not take[k]:
            k += 1
            continue
        slot = (first + k) % capacity
        end = k + 1
        while end < n and take[end] and (first + end) % capacity == slot + (end - k):
            end += 1
        _pwrite_all(fd, records[k:end], slot * fmt.bytes)
        k = end


def _pwrite_all(fd: int, records: np.ndarray, offset: int) -> None:
    if records.size == 0:
        return
    data = memoryview(records).cast("B")  # type: ignore[arg-type]
    done = 0
    while done < len(data):
        done += os.pwrite(fd, data[done:], offset + done)


def _write_records(
    fd: int, fmt: RecordFormat, capacity: int, first: int, arrays: Mapping[str, np.ndarray], taken: np.ndarray | None
) -> None:
    rows = len(next(iter(arrays.values())))
    records = fmt.pack(arrays, np.arange(first + 1, first + 1 + rows, dtype=np.int64))
    _pwrite_runs(fd, fmt, capacity, first, records, taken)


def _write_rows(
    fd: int,
    fmt: RecordFormat,
    capacity: int,
    records: DiskRecords | None,
    first: int,
    encoded: Any,
    taken: np.ndarray | None,
) -> None:
    """Write the rows of tickets ``first + k`` (all, or where ``taken[k]``): compressed fields' records first."""
    if records is not None:
        picked = np.arange(encoded.rows, dtype=np.int64) if taken is None else np.flatnonzero(taken)
        encoded = records.row_arrays(encoded, first + picked + 1, picked)
    _write_records(fd, fmt, capacity, first, encoded, taken)


def _row_format(schema: Schema, codecs: Mapping[str, Codec]) -> RecordFormat:
    """The row record of a buffer compressing ``codecs``' fields (their records' references in its place)."""
    return RecordFormat(row_schema(schema, codecs) if codecs else schema)


class DiskRows(RawRows):
    """A writer process's view of a disk ring: the control block mapped, the row file (and record log) open."""

    def __init__(self, path: str) -> None:
        self.control = RingControl.attach(os.path.join(path, CONTROL_FILE))
        self.records: DiskRecords | None = None
        try:
            if stored_settings(self.control) is not None:
                self.records = DiskRecords(Path(path), self.control)
            self.format = _row_format(self.control.schema, self.records.codecs if self.records else {})
            self.control.check_row_bytes(self.format.bytes)
            self.fd = open_file(os.path.join(path, ROW_FILE))
        except BaseException:
            if self.records is not None:
                self.records.close()
            self.control.close()
            raise

    def encode(self, arrays: Mapping[str, np.ndarray]) -> Any:
        """The rows as :meth:`write_rows` takes them: compressed fields compressed (``ByteBudgetError``)."""
        return arrays if self.records is None else self.records.encode(arrays)

    def write_rows(self, first: int, arrays: Any, taken: np.ndarray | None) -> None:
        _write_rows(self.fd, self.format, self.control.capacity, self.records, first, arrays, taken)

    def close(self) -> None:
        os.close(self.fd)
        if self.records is not None:
            self.records.close()
        self.control.close()


class DiskStorage(RingOwner, RawRows):
    """Rows of a :class:`Schema` in a ring file under ``path``; see the module docstring.

    Args:
        capacity: rows kept; the oldest ticket's row is overwritten first.
        schema: the fields of a row.
        path: a directory for this buffer's files (created with mode 0700 if
            missing; an existing one must be this user's and writable by nobody
            else: see :mod:`~hetero_replay.storage.files`). It must not hold a
            buffer already, unless ``reopen``. Made absolute here.
        ram_bytes: RAM for the newest rows (the page-cache window, default 1 GiB); with a ``codec``, the
            newest rows first, the rest for the newest bytes of the record log.
        read_threads: threads reading a sampled batch (default 8).
        flush_every: a durable point after this many adds (default 10,000).
        flush_seconds: ... or after this many seconds (default 5); the rule of
            :class:`~hetero_replay.storage.durable.FlushSchedule`.
        reopen: continue the buffer at ``path`` from its last durable point (its
            capacity and schema must be these); no process of the previous run
            may still be attached. A buffer with compressed fields reopens with them
            (its codec settings are in its control block); ``codec`` and
            ``byte_budget``, if given, must be the buffer's.
        abandon_after: see :class:`~hetero_replay.storage.ring.RingReader`.
        codec: compress these fields into the record log ``records.log`` (as for ``storage="shared"``:
            :func:`~hetero_replay.storage.codec.field_codecs`; see the module docstring).
        byte_budget: the record log's size in bytes (the default as for ``storage="shared"``:
            :func:`~hetero_replay.storage.shared_compressed.log_options`); needs a ``codec``.
        frames: refused (``ValueError``): de-duplicated frames need a frame table every writer
            process shares, which this lock-free log does not have.

    Raises:
        TypeError, ValueError: an argument of the wrong type or out of range,
            naming it, before any file is made; ``path`` holding a buffer without
            ``reopen`` (or none with it), or a directory others could plant files in.
        BufferInUseError: another learner owns the buffer (its ``flock``, held until :meth:`close`).
        OSError: the files cannot be made (a full disk); nothing made is left.
    """

    def __init__(
        self,
        capacity: int,
        schema: Schema | Mapping[str, Any],
        path: str | os.PathLike[str],
        ram_bytes: int = 1 << 30,
        read_threads: int = 8,
        flush_every: int = 10_000,
        flush_seconds: float = 5.0,
        reopen: bool = False,
        abandon_after: float = 5.0,
        codec: Any = None,
        byte_budget: int | None = None,
        frames: Any = None,
    ) -> None:
        o = check_options({
            "path": path, "ram_bytes": ram_bytes, "read_threads": read_threads, "flush_every": flush_every,
            "flush_seconds": flush_seconds, "reopen": reopen, "abandon_after": abandon_after, "codec": codec,
            "byte_budget": byte_budget, "frames": frames,
        })  # fmt: skip
        read_threads, reopen, abandon_after = o["read_threads"], o["reopen"], o["abandon_after"]
        #: When durable points are due; it counts the tickets the learner has polled.
        self.schedule = FlushSchedule(o["flush_every"], o["flush_seconds"])
        self.schema = schema if isinstance(schema, Schema) else Schema(schema)
        self.capacity = int(capacity)
        self.path: Path = o["path"]
        # The compressed fields and the log's size asked for (None: none asked for); checked before any file.
        wanted: tuple[dict[str, Codec], int] | None = None
        if codec is not None or byte_budget is not None or frames is not None:
            wanted = log_options(self.capacity, self.schema, codec, byte_budget, frames, "disk")
            row_schema(self.schema, wanted[0])
        #: The compressed fields' codecs ({} if none); a reopened buffer's are its own.
        self.codecs: dict[str, Codec] = {} if wanted is None else wanted[0]
        self.format = _row_format(self.schema, self.codecs)
        self.read_threads = read_threads
        #: ``(header, priorities)`` of the durable point a reopened buffer restores; None otherwise.
        self.reopened_point: tuple[dict[str, Any], np.ndarray] | None = None
        #: The compressed fields' record log (None without a codec).
        self.records: DiskRecords | None = None
        # Every argument is checked: from here on, files. The owner lock comes before anything
        # in the directory is read or written, and is held until close().
        if reopen:
            self._lock, self.control = self._reopen(wanted)
        else:
            self._lock, self.control = self._create(wanted)
        try:
            self.fd = open_file(self.path / ROW_FILE)
        except BaseException:
            if self.records is not None:
                self.records.close()
            self.control.close()
            self._lock.release()
            raise
        self.cache_rows = min(self.capacity, ram_bytes // self.format.bytes)
        #: Bytes of the record log's newest part kept in RAM (what ``ram_bytes`` leaves after the rows).
        self.cache_log_bytes = max(0, ram_bytes - self.cache_rows * self.format.bytes)
        self.reader = RingReader(self.control, abandon_after)
        #: Rows whose records the log overwrote (the byte budget was the limit), found so far.
        self.evictions = Evictions(self.capacity)
        self._row_log_bytes = np.zeros(self.capacity, np.int64)  # log bytes of each slot's records, as polled
        #: Rows found damaged (failing their checksum) when read, each dropped from sampling.
        self.damaged_rows = 0
        if self.reopened_point is not None:
            self.reader.take_stamps()
            if self.records is not None:
                self._restore_references(int(self.reopened_point[0]["record_log"]["head"]))
            self.schedule.continue_from(self.reopened_point[0][DURABLE]["points"], self.control.tickets)
        self.durable_rows = int(np.count_nonzero(self.control.stamps))  # the reopened point's rows (0 when new)
        self._tag = self.control.register(os.getpid())
        self._trimmed_to = 0  # tickets below this were dropped from the page cache
        self._log_trimmed_to = 0  # record log positions below this too
        self._flusher: _Flusher | None = None
        self._adopt_rows = (
            self.capacity if self.records is None else adopt_rows(self.schema, self.codecs, self.records.log_bytes)
        )

    def _create(self, wanted: tuple[dict[str, Codec], int] | None) -> tuple[OwnerLock, RingControl]:
        """A new buffer's directory (private), its lock, control block, row file and record log; on failure none is left."""
        created_dir = private_directory(self.path, "storage_options path")
        ctl, rows = self.path / CONTROL_FILE, self.path / ROW_FILE
        made: list[Path] = []
        lock: OwnerLock | None = None
        try:
            lock = OwnerLock(self.path)
            made.append(lock.path)
            if os.path.lexists(ctl) or os.path.lexists(rows) or os.path.lexists(self.path / LOG_FILE):
                made.clear()  # the lock file is that buffer's
                raise ValueError(
                    f"storage_options path={str(self.path)!r} holds a replay buffer already: reopen it with "
                    "PrioritizedReplay.reopen(path) (or reopen=True), or choose another directory"
                )
            payload = 0 if wanted is None else payload_bytes(*wanted)
            control = RingControl.create(str(ctl), self.capacity, self.schema, self.format.bytes, payload)
            made.append(ctl)
            try:
                fd = create_file(rows)
                made.append(rows)
                try:
                    os.ftruncate(fd, self.capacity * self.format.bytes)
                finally:
                    os.close(fd)
                if wanted is not None:
                    made.append(create_log(self.path, control, *wanted))
                    self.records = DiskRecords(self.path, control)
            except BaseException:
                control.close()
                raise
            return lock, control
        except BaseException:
            for name in reversed(made):
                name.unlink(missing_ok=True)
            if lock is not None:
                lock.release()
            if created_dir:
                with contextlib.suppress(OSError):
                    self.path.rmdir()
            raise

    def _reopen(self, wanted: tuple[dict[str, Codec], int] | None) -> tuple[OwnerLock, RingControl]:
        ctl = self.path / CONTROL_FILE
        if not os.path.lexists(ctl):
            raise ValueError(f"storage_options reopen=True but {str(self.path)!r} holds no replay buffer")
        check_directory(self.path, "storage_options path")
        lock = OwnerLock(self.path)
        try:
            control = RingControl.attach(str(ctl))
        except BaseException:
            lock.release()
            raise
        try:
            if control.capacity != self.capacity or control.schema != self.schema:
                raise ValueError(
                    f"{str(self.path)!r} holds a buffer of capacity {control.capacity} and schema "
                    f"{control.schema!r}, not {self.capacity} and {self.schema!r}"
                )
            stored = stored_settings(control)
            if wanted is not None and stored != wanted:
                held = "no compressed fields" if stored is None else f"codecs {stored[0]} and byte_budget {stored[1]}"
                raise ValueError(
                    f"{str(self.path)!r} holds a buffer with {held}, not codecs {wanted[0]} and byte_budget "
                    f"{wanted[1]}: reopen it without codec and byte_budget"
                )
            self.codecs = {} if stored is None else stored[0]
            self.format = _row_format(self.schema, self.codecs)
            control.check_row_bytes(self.format.bytes)
            self._check_row_file()
            if stored is not None:
                self.records = DiskRecords(self.path, control)
            live = [int(p) for p in control.writers[:, 0] if p > 0 and pid_alive(int(p))]
            if live:
                raise ValueError(
                    f"{str(self.path)!r} is still attached to running processes {live} (this one is "
                    f"{os.getpid()}): close or stop them first"
                )
            state = self.path / STATE_FILE
            point = read_point(state) if state.exists() else None
            if point is not None:
                _check_ring_point(state, *point)
                if self.records is not None:
                    log = point[0].get("record_log")
                    check_head(state, control, log.get("head") if isinstance(log, dict) else None)
            # Everything read is checked: only now does the control block change.
            control.writers[:] = 0
            control.reopen()
            if point is not None:
                header, arrays = point
                durable = arrays["stamps"]
                valid = (durable > 0) & (control.stamps == durable)
                control.stamps[:] = np.where(valid, durable, 0)
                control.set_tickets(int(header["tickets"]))
                self.reopened_point = (header, np.where(valid, arrays["priorities"], 0))
            else:  # never flushed: nothing is durable
                control.stamps[:] = 0
                control.set_tickets(0)
        except BaseException:
            if self.records is not None:
                self.records.close()
                self.records = None
            control.close()
            lock.release()
            raise
        return lock, control

    def _restore_references(self, durable_head: int) -> None:
        """A reopened buffer's rows with compressed fields: each row's references read and checked (the row's
        checksum; its records reserved before the durable point's head and not overwritten since). A row
        failing the checksum or with impossible references is dropped as damaged (counted in
        :attr:`damaged_rows`), one whose records were overwritten as evicted (:attr:`evicted_rows`): either
        way its slot is emptied and its priority 0. The others are tracked, so that the poll finds them
        evicted once the head passes them.
        """
        assert self.records is not None and self.reopened_point is not None
        priorities = self.reopened_point[1]
        for chunk in np.array_split(np.flatnonzero(self.reader.seen > 0), max(1, self.capacity // 65536)):
            if not chunk.size:
                continue
            stamps = self.reader.seen[chunk]
            rows = self._read(chunk)
            head, tail = self.format.ends(rows)
            refs = self.format.unpack(rows, [REFS])[REFS]
            ends = refs[:, 0] + refs[:, 1] + RECORD_HEADER_BYTES
            sound = (head == stamps) & (tail == stamps) & self.format.sound(rows)
            sound &= (refs[:, 0].min(axis=1) >= 0) & (refs[:, 1].min(axis=1) > 0) & (ends.max(axis=1) <= durable_head)
            evicted = sound & self.records.evicted(refs)
            self.damaged_rows += int(np.count_nonzero(~sound))
            self.evictions.count(chunk[evicted], stamps[evicted], self.control.tickets)
            drop = chunk[~sound | evicted]
            self.control.stamps[drop] = 0
            priorities[drop] = 0
            kept = sound & ~evicted
            self._track(chunk[kept], refs[kept], stamps[kept])
        self.reader.take_stamps()

    def _check_row_file(self) -> None:
        """The row file must be a regular file of ``capacity`` records: ``ReplayFileError`` naming it otherwise."""
        rows = self.path / ROW_FILE
        try:
            st = os.lstat(rows)
        except FileNotFoundError:
            raise checkpoint.ReplayFileError(f"{rows}: the buffer's row file is missing") from None
        if not stat.S_ISREG(st.st_mode):
            raise checkpoint.ReplayFileError(f"{rows}: the buffer's row file is not a regular file")
        expected = self.capacity * self.format.bytes
        if st.st_size != expected:
            raise checkpoint.ReplayFileError(
                f"{rows}: the buffer's row file holds {st.st_size} bytes, its {self.capacity} records take "
                f"{expected} (truncated, or not this buffer's)"
            )

    # -- the Storage protocol ---------------------------------------------------------

    def validate(self, batch: Mapping[str, Any]) -> tuple[int, dict[str, np.ndarray]]:
        return check_host_batch(self.schema, self.capacity, batch)

    def validate_fields(self, fields: Mapping[str, Any]) -> tuple[int, dict[str, np.ndarray]]:
        return check_host_batch(self.schema, self.capacity, fields, every_field=False)

    def _read(self, slots: np.ndarray, threads: int | None = None) -> np.ndarray:
        records = np.empty((len(slots), self.format.bytes), np.uint8)
        offsets = slots.astype(np.int64) * self.format.bytes
        _native.read_records(self.fd, offsets, records, threads or self.read_threads)
        return records

    def _whole_rows(self, slots: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The row records at ``slots`` and their stamps, for ``read_rows``, ``state_dict`` and ``save``.

        Raises:
            ReplayFileError: a row read whole fails its checksum (naming its slots): it is counted in
                :attr:`damaged_rows` and not returned.
        """
        records = self._read(slots)
        head, tail = self.format.ends(records)
        # Checked only where the slot's stamp, read after the row, is the row's own at both ends: a
        # writer marks the stamp before it changes a byte, so such a row was read whole.
        whole = (head > 0) & (head == tail) & (_native.stamps_at(self.control.stamps, slots) == head)
        damaged = whole & ~self.format.sound(records)
        if damaged.any():
            self._refuse_damaged(slots[damaged], ROW_FILE)
        return records, head

    def _refuse_damaged(self, slots: np.ndarray, file: str) -> None:
        bad = np.unique(slots)
        self.damaged_rows += len(bad)
        raise checkpoint.ReplayFileError(
            f"{self.path / file}: rows at slots {bad[:16].tolist()} fail their checksum (changed on the "
            f"disk): not returned ({self.damaged_rows} damaged rows found so far; a slot is whole again "
            "once the ring rewrites it)"
        )

    def gather(self, indices: np.ndarray, fields: Sequence[str] | None = None) -> dict[str, np.ndarray]:
        """Rows ``indices`` as stored (``read_rows``, ``state_dict``, ``save``); a damaged one is refused.

        A row whose compressed records the log has overwritten (evicted) reads as zeros in those fields.

        Raises:
            ReplayFileError: a row read whole, or one of its records, fails its checksum (naming its slots
                and file): it is counted in :attr:`damaged_rows` and not returned. Slots without a committed
                row (never written, being rewritten, dropped at ``reopen``: priority 0, never sampled) are
                returned as stored.
        """
        slots = np.asarray(indices, dtype=np.int64)
        names = list(self.schema) if fields is None else list(fields)
        records, stamps = self._whole_rows(slots)
        packed = [n for n in names if n in self.codecs]
        rows = self.format.unpack(records, [n for n in names if n not in self.codecs] + ([REFS] if packed else []))
        if packed:
            assert self.records is not None
            refs = rows.pop(REFS)
            decoded, sound = self.records.decode(refs, stamps, packed, self.read_threads)
            damaged = (stamps > 0) & ~sound & ~self.records.evicted(refs)
            if damaged.any():
                self._refuse_damaged(slots[damaged], LOG_FILE)
            rows.update(decoded)
        return {name: rows[name] for name in names}

    def write(self, start: int, arrays: Mapping[str, np.ndarray]) -> None:
        """Overwrite fields of stored rows in place (their tickets unchanged): read, patch, write.

        Compressed fields get new records (appended to the log with the rows' stamps).
        """
        rows = len(next(iter(arrays.values())))
        slots = (start + np.arange(rows)) % self.capacity
        records = self._read(slots)
        # A damaged row stays damaged (sealing it would vouch for its bad bytes); a row never
        # written (stamp 0) gets a checksum, a later add replaces it anyway.
        sound = self.format.sound(records) | (self.format.ends(records)[0] == 0)
        views = self.format._views(records)
        if self.records is not None and any(n in self.codecs for n in arrays):
            encoded = self.records.encode(arrays)
            stamps = self.control.stamps[slots].copy()
            refs = self.records.row_arrays(encoded, stamps, np.arange(rows, dtype=np.int64))[REFS]
            columns = [list(self.codecs).index(n) for n in encoded.names]
            views[REFS][:, :, columns] = refs[:, :, columns]
            held = stamps > 0  # committed rows: watched for eviction from their new records on
            self._track(slots[held], views[REFS][held], stamps[held])
        for name, view in views.items():
            if name in arrays and name not in self.codecs:
                view[...] = arrays[name]
        self.format.seal(records, sound)
        for k, slot in enumerate(slots):
            os.pwrite(self.fd, memoryview(records[k]).cast("B"), int(slot) * self.format.bytes)

    def export_rows(self, count: int, copy: bool = True) -> dict[str, np.ndarray]:
        """The first ``count`` slots' rows: ``ReplayFileError`` if one is damaged (:meth:`gather`)."""
        return self.gather(np.arange(count, dtype=np.int64))

    def import_rows(self, arrays: Mapping[str, np.ndarray]) -> None:
        self.write(0, arrays)

    def view(self, name: str) -> Any:
        """None: a raw view of the file could not check rows, so there is none (``NotImplementedError``)."""
        raise NotImplementedError(
            "the rows of a 'disk' storage live in a file: read them with read_rows / sample, write with write_rows"
        )

    # -- the ring ------------------------------------------------------------------------

    @property
    def evicted_rows(self) -> int:
        """Rows found to have lost their records to newer ones (the byte budget was the limit)."""
        return self.evictions.rows

    @property
    def bytes_per_row(self) -> float:
        """Mean log bytes (records and headers) of the rows held now (0 without a codec): capacity times
        this is a budget that evicts nothing."""
        held = self.reader.seen > 0
        return float(self._row_log_bytes[held].mean()) if self.records is not None and held.any() else 0.0

    def encode(self, arrays: Mapping[str, np.ndarray]) -> Any:
        """The rows as :meth:`write_rows` takes them: compressed fields compressed (``ByteBudgetError``)."""
        return arrays if self.records is None else self.records.encode(arrays)

    def write_rows(self, first: int, arrays: Any, taken: np.ndarray | None) -> None:
        _write_rows(self.fd, self.format, self.capacity, self.records, first, arrays, taken)

    def poll(self) -> tuple[np.ndarray, np.ndarray]:
        """The ring's poll; with compressed fields also the rows whose records the log overwrote among the gone.

        The new rows' references are read (from the page cache: just written) to track them.
        """
        new, gone = self.reader.poll()
        if self.records is None:
            return new, gone
        seen = self.reader.seen
        if new.size:
            rows = self._read(new, threads=1)  # just written: from the page cache, no threads to start
            head, tail = self.format.ends(rows)
            mine = (head == seen[new]) & (tail == seen[new])  # else rewritten since: the gather's checks catch it
            self._track(new[mine], self.format.unpack(rows[mine], [REFS])[REFS], seen[new[mine]])
        dead = self.evictions.expired(self.records.reserved - self.records.log_bytes, seen)
        if dead.size:
            self.evictions.count(dead, seen[dead], self.control.tickets)
            gone = np.union1d(gone, dead)
        return new, gone

    def _track(self, slots: np.ndarray, refs: np.ndarray, stamps: np.ndarray) -> None:
        """Rows at ``slots`` with records ``refs``: watched by the poll for eviction, their bytes counted."""
        assert self.records is not None
        if slots.size:
            self.evictions.track(slots, refs[:, 0].min(axis=1), stamps)
            self._row_log_bytes[slots] = self.records.row_log_bytes(refs)

    def read_intact(self, indices: np.ndarray) -> tuple[dict[str, np.ndarray], np.ndarray]:
        slots = np.asarray(indices)
        seen = self.reader.seen[slots]
        records = self._read(slots)
        head, tail = self.format.ends(records)
        rows = self.format.unpack(records)
        ok = self.reader.intact(slots) & (head == seen) & (tail == seen)
        # A row read whole (its stamps unchanged around the read) that fails its checksum changed on
        # the disk: it is never served, and its priority, cleared by the caller, stays 0 until rewritten.
        damaged = ok & ~self.format.sound(records)
        if self.records is not None:
            refs = rows.pop(REFS)
            decoded, sound = self.records.decode(refs, seen, list(self.codecs), self.read_threads)
            rows.update(decoded)
            # Records the head passed were overwritten (evicted); others that fail the checks were damaged.
            lost = ok & ~damaged & ~sound
            evicted = lost & self.records.evicted(refs)
            if evicted.any():
                dead = np.unique(slots[evicted])  # a slot drawn twice is counted once
                self.evictions.count(dead, self.reader.seen[dead], self.control.tickets)
            damaged |= lost & ~evicted
            ok &= ~evicted
        if damaged.any():
            bad = np.unique(slots[damaged])
            self.damaged_rows += len(bad)
            warnings.warn(
                f"{self.path}: rows at slots {bad.tolist()} fail their checksum (changed on the disk): dropped "
                f"from sampling until rewritten ({self.damaged_rows} so far)",
                RuntimeWarning,
                stacklevel=4,
            )
            ok &= ~damaged
        return {name: rows[name] for name in self.schema}, ok

    def adopt(self, position: int, size: int, arrays: Mapping[str, np.ndarray]) -> None:
        """Hold restored rows; compressed, they are appended oldest ticket first, a chunk at a time, so that a
        budget smaller than the rows keeps the newest (as writes would have) instead of refusing the restore."""
        self.reader.adopt(position, size)
        for slots in oldest_first(position, size, self.capacity, self._adopt_rows):
            chunk = {name: a[slots] for name, a in arrays.items()}
            self._put(slots, chunk if self.records is None else self.records.encode(chunk))

    def _put(self, slots: np.ndarray, encoded: Any, picked: np.ndarray | None = None) -> None:
        """Write rows at consecutive ring ``slots`` (restored: their stamps are the control block's), with
        the records of rows ``picked`` (all by default; the others have none: never served)."""
        stamps = self.control.stamps[slots].copy()
        if self.records is not None:
            picked = np.arange(len(slots), dtype=np.int64) if picked is None else picked
            encoded = self.records.row_arrays(encoded, stamps[picked], picked)
            self._track(slots[picked], encoded[REFS][picked], stamps[picked])
        _pwrite_runs(self.fd, self.format, self.capacity, int(slots[0]), self.format.pack(encoded, stamps), None)

    def export_state(self, count: int, copy: bool = True) -> tuple[dict[str, np.ndarray], dict[str, Any] | None]:
        """The first ``count`` rows: raw fields' rows and, with a codec, the compressed fields' records as
        they are (copies), with the codec settings (the host storage's form; None without a codec).

        A row whose records the log no longer holds (evicted, or a writer rewriting it: see
        :func:`~hetero_replay.storage.shared_compressed.copy_records`) has no records: it is not
        served, and its owner saves it with priority 0.

        Raises:
            ReplayFileError: a row, or a record the log still holds, fails its checksum (see :meth:`gather`).
        """
        if self.records is None:
            return self.export_rows(count), None
        slots = np.arange(count, dtype=np.int64)
        records, stamps = self._whole_rows(slots)
        rows = self.format.unpack(records, [n for n in self.schema if n not in self.codecs] + [REFS])
        refs = rows.pop(REFS)
        held = self.records.copy(refs, stamps)
        torn = ~self.reader.intact(slots) | (stamps != self.reader.seen[:count])
        # A whole row whose records the head has not passed, yet fail the checks, was damaged on the disk.
        missing = np.logical_or.reduce([[r is None for r in field_records] for field_records in held.values()])
        damaged = missing & ~torn & ~self.records.evicted(refs)
        if damaged.any():
            self._refuse_damaged(slots[damaged], LOG_FILE)
        arrays: dict[str, np.ndarray] = {}
        for name, field_records in held.items():
            for r in np.flatnonzero(torn).tolist():
                field_records[r] = None
            arrays[f"{name}/records"], arrays[f"{name}/offsets"] = record_arrays.join(field_records)
        settings = settings_json(self.codecs, [], self.records.log_bytes)
        return rows, {"settings": settings, "arrays": arrays}

    def adopt_state(self, position: int, size: int, rows: Mapping[str, np.ndarray], packed: Mapping[str, Any]) -> None:
        """:meth:`adopt` of rows in :meth:`export_state`'s form: records compressed alike are appended to the
        log as they are, others decompressed (see :func:`~hetero_replay.storage.shared_compressed.records_to_adopt`,
        whose ``ValueError`` it raises). A row without records stays unserved (as if evicted)."""
        held = records_to_adopt(self, position, size, rows, packed)
        if held is None:
            return
        names = list(self.codecs)
        for slots in oldest_first(position, size, self.capacity, self._adopt_rows):
            picked = np.asarray(
                [k for k, slot in enumerate(slots.tolist()) if all(h[slot] is not None for h in held)], np.int64
            )
            records = [h[slot] or b"" for slot in slots[picked].tolist() for h in held]
            self._put(slots, EncodedRows(len(slots), {n: a[slots] for n, a in rows.items()}, names, records), picked)

    def writer(self) -> RingWriter:
        """A picklable handle actor processes add rows with (see :class:`RingWriter`)."""
        return RingWriter(DiskRows, {"path": str(self.path)}, self.schema, self.capacity)

    # -- durable points -------------------------------------------------------------------

    def flush_due(self) -> bool:
        """Whether ``flush_every`` tickets were polled or ``flush_seconds`` passed since the last durable point."""
        return self.schedule.count(self.reader.scanned - self.schedule.added)

    def flush(self, header: Mapping[str, Any], priorities: np.ndarray, wait: bool = False) -> None:
        """Make a durable point of this snapshot: rows (and records) synced, then ``state.hrp`` replaced atomically.

        ``header`` and ``priorities`` (every slot's) are the owner's, taken with
        the stamps under the owner's lock; the disk work runs on a background
        thread unless ``wait``. The schedule starts again from here. With compressed fields the
        point records the log's head, read after the stamps: every record of the rows it holds lies below.
        """
        self.schedule.count(self.reader.scanned - self.schedule.added)
        stamps = self.reader.seen.copy()
        # A poll may see a slot committed by a ticket issued after it read the counter: the count
        # covers it, so that a reopened ring issues no ticket older than a row it holds.
        tickets = max(self.reader.scanned, int(stamps.max(initial=0)))
        extra = {} if self.records is None else {"record_log": {"head": self.records.reserved}}
        snapshot = (
            {**header, "rows": checkpoint.RING_ROWS, "tickets": tickets, DURABLE: self.schedule.section(), **extra},
            {"priorities": priorities, "stamps": stamps},
        )
        self.schedule.written()
        if self._flusher is None:
            self._flusher = _Flusher(self)
        self._flusher.submit(snapshot, wait)

    def _write_durable(self, header: dict[str, Any], arrays: dict[str, np.ndarray]) -> None:
        if self.records is not None:
            os.fdatasync(self.records.fd)
        os.fdatasync(self.fd)
        checkpoint.write(self.path / STATE_FILE, header, arrays)
        self.durable_rows = int(np.count_nonzero(arrays["stamps"]))
        self._trim_cache(int(header["tickets"]))
        if self.records is not None:
            self._trim_log(int(header["record_log"]["head"]))

    def _trim_cache(self, tickets: int) -> None:
        """Drop the rows that left the RAM window since the last trim from the page cache (synced pages go).

        Only that slice: a ``DONTNEED`` of the whole file would walk the whole cache at every durable point.
        """
        end = tickets - self.cache_rows  # tickets below this are out of the window
        start = max(self._trimmed_to, end - self.capacity)
        if end > start:
            _drop_cached(self.fd, start * self.format.bytes, end * self.format.bytes, self.capacity * self.format.bytes)
            self._trimmed_to = end

    def _trim_log(self, head: int) -> None:
        """The same for the record log: the bytes below its newest :attr:`cache_log_bytes` (up to ``head``)."""
        assert self.records is not None
        end = head - self.cache_log_bytes
        start = max(self._log_trimmed_to, end - self.records.log_bytes)
        if end > start:
            _drop_cached(self.records.fd, start, end, self.records.log_bytes)
            self._log_trimmed_to = end

    @property
    def closed(self) -> bool:
        return self.control is None

    def close(self) -> None:
        """Finish the pending durable point, tell writers the buffer is closed, close the files (they stay)."""
        if self.control is None:
            return
        if self._flusher is not None:
            self._flusher.stop()
        self.control.mark_closed()
        self.control.unregister(self._tag, os.getpid())
        os.close(self.fd)
        if self.records is not None:
            self.records.close()
        self.control.close()
        self.control = None  # type: ignore[assignment]
        self._lock.release()

    def __repr__(self) -> str:
        codec = "" if self.records is None else f", codecs={self.codecs}, byte_budget={self.records.log_bytes}"
        return f"DiskStorage({str(self.path)!r}, capacity={self.capacity}, cache_rows={self.cache_rows}{codec})"


def _drop_cached(fd: int, start: int, end: int, size: int) -> None:
    """Drop absolute bytes ``[start, end)`` of a ring file of ``size`` bytes (position ``p`` at ``p % size``;
    at most one lap) from the page cache: ``posix_fadvise(DONTNEED)`` of the one or two slices."""
    first, count = start % size, end - start
    for lo, n in ((first, min(count, size - first)), (0, count - (size - first))):
        if n > 0:
            os.posix_fadvise(fd, lo, n, os.POSIX_FADV_DONTNEED)


class _Flusher:
    """One background thread writing the latest submitted durable point (a newer one replaces a queued one)."""

    def __init__(self, storage: DiskStorage) -> None:
        self._storage = storage
        self._cond = threading.Condition()
        self._next: Any = None
        self._busy = False
        self._stopping = False
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="hetero-replay-flush", daemon=True)
        self._thread.start()

    def submit(self, snapshot: Any, wait: bool) -> None:
        with self._cond:
            self._raise()
            self._next = snapshot
            self._cond.notify_all()
            if wait:
                self._cond.wait_for(lambda: self._next is None and not self._busy)
                self._raise()

    def _raise(self) -> None:
        if self.error is not None:
            error, self.error = self.error, None
            what = f"writing a durable point of {self._storage.path} failed"
            if isinstance(error, OSError):  # a full disk, a lost device: the type callers catch, the file named
                raise OSError(error.errno, f"{what}: {error.strerror}", str(self._storage.path / STATE_FILE)) from error
            raise RuntimeError(f"{what}: {error!r}") from error

    def _run(self) -> None:
        while True:
            with self._cond:
                if not self._cond.wait_for(lambda: self._next is not None or self._stopping, WRITEBACK_SECONDS):
                    _start_writeback(self._storage.fd)
                    if self._storage.records is not None:
                        _start_writeback(self._storage.records.fd)
                    continue
                if self._next is None:
                    return
                snapshot, self._next, self._busy = self._next, None, True
            try:
                self._storage._write_durable(*snapshot)
            except BaseException as e:  # reported by the next submit
                self.error = e
            with self._cond:
                self._busy = False
                self._cond.notify_all()

    def stop(self) -> None:
        with self._cond:
            self._cond.wait_for(lambda: self._next is None and not self._busy)
            self._stopping = True
            self._cond.notify_all()
        self._thread.join()
        self._raise()


def _libc_sync_file_range() -> Any:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.sync_file_range
    except (OSError, AttributeError):  # not Linux
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    return fn


_SYNC_FILE_RANGE = _libc_sync_file_range()


def _start_writeback(fd: int) -> None:
    """Start writing the file's dirty pages to the disk, without waiting and without a cache flush.

    So a durable point's ``fdatasync`` finds little left to write: measured on the 44 GB
    workload, the 5 s of rows it otherwise wrote at once stalled reads for ~200 ms at every
    durable point. ``sync_file_range(SYNC_FILE_RANGE_WRITE)``; nothing where it does not exist.
    """
    if _SYNC_FILE_RANGE is not None:
        _SYNC_FILE_RANGE(fd, 0, 0, 2)  # SYNC_FILE_RANGE_WRITE; errors are left to the next fdatasync


def _check_ring_point(state: Path, header: dict[str, Any], arrays: dict[str, np.ndarray]) -> None:
    """A ring's durable point against the rules the ring relies on: ``ReplayFileError`` naming what breaks one.

    :func:`~hetero_replay.storage.checkpoint.read` checked types and shapes; here
    the ring's own rules: the ticket count leaves a lap of tickets that a writer's
    marker can hold (48 bits), and a slot's stamp is ``ticket + 1`` of a ticket
    issued before the count whose slot it is (what :meth:`DiskStorage.flush`
    writes). A count near ``2**63`` would overflow at the next add and lose every row.
    """
    capacity = int(header["config"]["capacity"])
    tickets = int(header["tickets"])
    if tickets > TICKET_MASK - capacity:
        raise checkpoint.ReplayFileError(
            f"{state}: damaged durable point (tickets {tickets}; a ring of capacity {capacity} issues at most "
            f"{TICKET_MASK - capacity})"
        )
    stamps = arrays["stamps"]
    slots = np.flatnonzero(stamps > 0)  # a negative stamp (a row being written) is dropped on reopen
    issued = stamps[slots] - 1
    wrong = slots[(issued >= tickets) | (issued % capacity != slots)]
    if wrong.size:
        raise checkpoint.ReplayFileError(
            f"{state}: damaged durable point (slots {wrong[:8].tolist()} hold stamps "
            f"{stamps[wrong[:8]].tolist()}, which no ticket below {tickets} leaves in them)"
        )
    priorities = arrays["priorities"]
    bad = np.flatnonzero(~np.isfinite(priorities) | (priorities < 0))
    if bad.size:
        raise checkpoint.ReplayFileError(
            f"{state}: damaged durable point (priorities at slots {bad[:8].tolist()} are "
            f"{priorities[bad[:8]].tolist()}, not finite numbers >= 0)"
        )


def last_durable_header(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The header of the last durable point of the disk buffer in directory ``path`` (checked).

    Raises:
        ValueError: ``path`` holds no durable point of a disk buffer, or is a
            directory another user could change (:func:`~hetero_replay.storage.files.check_directory`).
        ReplayFileError: the durable point is damaged.
    """
    state = os.path.join(os.fspath(path), STATE_FILE)
    if not os.path.exists(state):
        raise ValueError(f"{os.fspath(path)!r} holds no durable point of a 'disk' replay buffer ({state} is missing)")
    check_directory(check_path(path, "path"), "path")  # before reading (or tidying) anything in it
    return read_point(state)[0]


__all__ = [
    "CONTROL_FILE",
    "LOG_FILE",
    "ROW_FILE",
    "STATE_FILE",
    "DiskRows",
    "BufferInUseError",
    "DiskStorage",
    "MAX_READ_THREADS",
    "RecordFormat",
    "check_options",
    "last_durable_header",
]
