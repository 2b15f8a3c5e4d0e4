"""A ring of rows that several processes add to: the control block, writers, and the learner's view.

Storages whose rows other processes write (``"shared"``, ``"disk"``) share one
protocol, whose atomic steps are in ``csrc/hetero_replay/ring_slots.hpp``:

* **The control block** is a file every process maps: a header (the ticket
  counter, the capacity, the row size, a closed flag), a table of writer
  processes, the schema, and one 64-bit *stamp* per slot. Rows live elsewhere
  (in the same mapping for ``"shared"``, in a ring file for ``"disk"``).
* **A writer** (:class:`RingWriter`, one per process, picklable) validates a
  batch, reserves ``n`` tickets with one atomic add, takes each slot
  (``ticket % capacity``) by compare-and-swap of its stamp to a *marker* that
  names the writer, writes the rows, and publishes them by storing ``ticket + 1``.
  No lock is held: a writer killed at any point leaves markers naming a dead
  process, and the next writer of those slots takes them over. It loses its own
  uncommitted rows and nothing else.
* **The learner** (:class:`RingReader`) polls the stamps of the tickets issued
  since its last poll: a slot whose stamp became a new ``ticket + 1`` holds a
  complete new row (it gets the max priority); a slot whose stamp became a
  marker is being rewritten (its priority is cleared first). After gathering
  rows, :meth:`RingReader.intact` re-reads their stamps: a row is served only if
  its stamp is still the one the poll saw, so a torn row is never sampled.
"""

from __future__ import annotations

import errno
import json
import mmap
import os
import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import numpy as np

from hetero_replay import _native
from hetero_replay.checks import check_real
from hetero_replay.storage import checkpoint
from hetero_replay.storage.base import check_host_batch
from hetero_replay.storage.checkpoint import MAX_HEADER_BYTES, MAX_STORAGE_BYTES, ReplayFileError
from hetero_replay.storage.files import create_file, open_file
from hetero_replay.storage.schema import Schema
from hetero_replay.trees.base import MAX_CAPACITY

MAGIC = 0x48524E47_00000002  # "HRNG", format 2 (disk records carry a checksum)
MAX_WRITERS = 4096  # writer tags are 14 bits (ring_slots.hpp); each process takes one while it lives
TICKET_BITS = 48
TICKET_MASK = (1 << TICKET_BITS) - 1
#: Seconds a ticket may stay uncommitted before the learner checks on its writer.
_LOOK_AFTER = 0.25

# Header words.
_MAGIC, _CAPACITY, _ROW_BYTES, _COUNTER, _CLOSED, _SCHEMA_BYTES, _PAYLOAD_OFFSET = range(7)
_HEADER_WORDS = 16
_SCHEMA_AT = 8 * (_HEADER_WORDS + 2 * MAX_WRITERS)  # the schema's JSON follows the header and the writer table
_PAGE = 4096


class RingClosedError(RuntimeError):
    """The buffer's owner closed it: its writers can add nothing more."""


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` still runs (a zombie, killed but not yet reaped, does not)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except (OSError, IndexError):
        return True  # no /proc: os.kill said it exists


def check_abandon_after(value: Any) -> float:
    """``value`` as a finite float ``> 0``: the ``abandon_after`` option of a ring storage (checked before its files)."""
    return check_real(value, "storage_options abandon_after", positive=True)


class RingControl:
    """The mapped control block of a ring (see the module docstring), optionally followed by rows.

    Use :meth:`create` (the owner) or :meth:`attach` (writers, and an owner reopening a ring).
    """

    def __init__(self, path: str, fd: int, mapping: mmap.mmap) -> None:
        """Map the control block in ``mapping`` once :func:`_check_layout` accepts it (``ReplayFileError`` if not)."""
        self.path, self._fd, self._map = path, fd, mapping
        self.capacity, self.row_bytes, self.schema, stamps_at, self.payload_offset = _check_layout(path, mapping)
        self.header = np.frombuffer(mapping, np.int64, _HEADER_WORDS)
        # Writer table: (pid, first ticket it may hold) per tag - 1.
        self.writers = np.frombuffer(mapping, np.int64, 2 * MAX_WRITERS, 8 * _HEADER_WORDS).reshape(MAX_WRITERS, 2)
        self.stamps = np.frombuffer(mapping, np.int64, self.capacity, stamps_at)

    @classmethod
    def create(cls, path: str, capacity: int, schema: Schema, row_bytes: int, payload_bytes: int = 0) -> RingControl:
        """A new control block in a new file ``path`` (mode 0600), with ``payload_bytes`` after it."""
        blob = json.dumps(schema.to_json()).encode()
        payload_offset = _align(_align(_SCHEMA_AT + len(blob), 8) + 8 * capacity, _PAGE)
        fd = create_file(path)
        try:
            # Every page of the mapping reserved now: on a full file system (a small /dev/shm) a store
            # into a page that cannot be allocated is a SIGBUS that kills the process; this is ENOSPC here.
            _reserve(fd, payload_offset + payload_bytes)
            mapping = mmap.mmap(fd, payload_offset + payload_bytes)
            head = np.frombuffer(mapping, np.int64, _HEADER_WORDS)
            head[_CAPACITY], head[_ROW_BYTES], head[_SCHEMA_BYTES] = capacity, row_bytes, len(blob)
            head[_PAYLOAD_OFFSET] = payload_offset
            mapping[_SCHEMA_AT : _SCHEMA_AT + len(blob)] = blob
            head[_MAGIC] = MAGIC  # last: a half-made file is refused
            del head
            return cls(path, fd, mapping)
        except BaseException:
            os.close(fd)
            os.unlink(path)
            raise

    @classmethod
    def attach(cls, path: str) -> RingControl:
        """Map an existing ring file (``FileNotFoundError`` once its owner removed it; never through a symlink)."""
        fd = open_file(path)
        try:
            if os.fstat(fd).st_size == 0:  # mmap refuses an empty file; _check_layout says what is wrong
                raise ReplayFileError(f"{path}: truncated ring control block (0 bytes)")
            return cls(path, fd, mmap.mmap(fd, 0))
        except BaseException:
            os.close(fd)
            raise

    def payload(self, nbytes: int) -> np.ndarray:
        """The ``nbytes`` mapped after the control block (uint8); ``ReplayFileError`` if the file ends before."""
        if nbytes > len(self._map) - self.payload_offset:
            raise ReplayFileError(
                f"{self.path}: the ring's rows take {nbytes} bytes after its control block, the file holds "
                f"{len(self._map) - self.payload_offset} (truncated, or a damaged capacity or row size)"
            )
        return np.frombuffer(self._map, np.uint8, nbytes, self.payload_offset)

    @property
    def payload_bytes(self) -> int:
        """Bytes the file holds after the control block (its storage's rows or log header, if any)."""
        return len(self._map) - self.payload_offset

    def check_row_bytes(self, expected: int) -> None:
        """Refuse a control block whose row size is not ``expected``, what a row of its schema takes here."""
        if self.row_bytes != expected:
            raise ReplayFileError(
                f"{self.path}: damaged ring control block (row size {self.row_bytes} bytes; a row of its "
                f"schema takes {expected})"
            )

    # -- the counter and the closed flag ------------------------------------------------

    @property
    def tickets(self) -> int:
        """Tickets reserved so far: every add ever made, uncommitted ones included."""
        return int(_native.stamps_at(self.header, np.array([_COUNTER]))[0])

    def set_tickets(self, value: int) -> None:
        _native.atomic_store(self.header, _COUNTER, value)

    @property
    def closed(self) -> bool:
        return bool(self.header[_CLOSED])

    def mark_closed(self) -> None:
        _native.atomic_store(self.header, _CLOSED, 1)

    def reopen(self) -> None:
        """Clear the closed flag (a closed ring reopened by a new owner)."""
        _native.atomic_store(self.header, _CLOSED, 0)

    # -- writers ------------------------------------------------------------------

    def register(self, pid: int) -> int:
        """A writer tag of its own for process ``pid`` (an entry of a dead process is reused)."""
        for i in range(MAX_WRITERS):
            owner = int(self.writers[i, 0])
            if owner == 0 or (owner > 0 and not pid_alive(owner)):
                # Claim (negative pid: registering), set the first ticket it may hold, then publish.
                flat = self.writers.reshape(-1)
                if _native.atomic_cas(flat, 2 * i, owner, -pid) != owner:
                    continue
                _native.atomic_store(flat, 2 * i + 1, self.tickets)
                _native.atomic_store(flat, 2 * i, pid)
                return i + 1
        raise RuntimeError(f"{self.path}: more than {MAX_WRITERS} live writer processes")

    def unregister(self, tag: int, pid: int) -> None:
        _native.atomic_cas(self.writers.reshape(-1), 2 * (tag - 1), pid, 0)

    def marker_is_dead(self, marker: int) -> bool:
        """Whether the writer that left ``marker`` on a slot is gone (so the slot may be taken over)."""
        tag, ticket = (-marker) >> TICKET_BITS, ((-marker) & TICKET_MASK) - 1
        pid, since = int(self.writers[tag - 1, 0]), int(self.writers[tag - 1, 1])
        if pid < 0:
            return False  # being registered this instant: ask again
        return ticket < since or not pid_alive(pid)  # older than the tag's owner: a previous owner's

    # -- the write protocol -------------------------------------------------------------

    def reserve(self, n: int) -> int:
        """The first of ``n`` new consecutive tickets."""
        return int(_native.atomic_add(self.header, _COUNTER, n))

    def acquire(self, first: int, n: int, tag: int) -> tuple[np.ndarray, int]:
        """Take the slots of tickets ``first .. first + n - 1``: ``(taken mask int8, lapped count)``.

        A lapped ticket's slot already belongs to a newer ticket: its row is dropped.
        """
        taken, blockers, lapped, blocked = _native.ring_acquire(self.stamps, first, n, tag)
        delay = 1e-6
        while blocked:
            blocked = 0
            for k in np.flatnonzero(blockers):
                marker, ticket = int(blockers[k]), first + int(k)
                if self.marker_is_dead(marker) and _native.ring_steal(self.stamps, ticket, marker, tag):
                    taken[k], blockers[k] = 1, 0
                    continue
                t, b, lap, blk = _native.ring_acquire(self.stamps, ticket, 1, tag)
                taken[k], blockers[k] = t[0], b[0]
                lapped, blocked = lapped + lap, blocked + blk
            if blocked:  # a live writer is mid-row there: it finishes in microseconds
                time.sleep(delay)
                delay = min(delay * 2, 1e-3)
        return taken, lapped

    def commit(self, first: int, take: np.ndarray, tag: int) -> int:
        return int(_native.ring_commit(self.stamps, first, take, tag))

    def release(self, first: int, take: np.ndarray, tag: int) -> None:
        """Give back taken slots whose rows were not written (an error mid-add): they read as empty."""
        for k in np.flatnonzero(take):
            ticket = first + int(k)
            _native.atomic_cas(self.stamps, ticket % self.capacity, _marker(tag, ticket), 0)

    def close(self) -> None:
        """Unmap (views made from the mapping must be gone) and close the file."""
        try:
            self.header = self.stamps = self.writers = None  # type: ignore[assignment]
            self._map.close()
        except BufferError:  # a NumPy view still exports the mapping: the OS unmaps it at exit
            pass
        os.close(self._fd)


def _check_layout(path: str, mapping: mmap.mmap) -> tuple[int, int, Schema, int, int]:
    """``(capacity, row size, schema, stamps' offset, rows' offset)`` of a control block, checked.

    A control block is written by other processes (or planted): every number in
    it is checked against the file's size and the bounds the ring relies on
    (tickets fit a marker's 48 bits, sizes fit the address space) before any of
    it is used, and anything else raises ``ReplayFileError`` naming the part.
    """
    size = len(mapping)
    if size < _SCHEMA_AT:
        raise ReplayFileError(
            f"{path}: truncated ring control block ({size} bytes; its header and writer table take {_SCHEMA_AT})"
        )
    magic, capacity, row_bytes, counter, closed, schema_len, payload_at = (
        int(w) for w in np.frombuffer(mapping, np.int64, 7)
    )

    def require(ok: bool, what: str) -> None:
        if not ok:
            raise ReplayFileError(f"{path}: damaged ring control block ({what})")

    if magic >> 32 != MAGIC >> 32:
        raise ReplayFileError(f"{path}: not a hetero-replay ring (bad magic)")
    if magic != MAGIC:
        raise ReplayFileError(
            f"{path}: a ring of format {magic & 0xFFFFFFFF}; this library reads format {MAGIC & 0xFFFFFFFF}"
        )
    require(1 <= capacity <= MAX_CAPACITY, f"capacity {capacity} not in [1, {MAX_CAPACITY}]")
    require(1 <= row_bytes and capacity * row_bytes <= MAX_STORAGE_BYTES, f"row size {row_bytes} bytes")
    require(0 <= counter <= TICKET_MASK, f"ticket counter {counter} not in [0, 2**{TICKET_BITS})")
    require(closed in (0, 1), f"closed flag {closed}")
    require(
        0 < schema_len <= min(size - _SCHEMA_AT, MAX_HEADER_BYTES),
        f"schema of {schema_len} bytes in a file of {size}",
    )
    schema = checkpoint.read_schema(bytes(mapping[_SCHEMA_AT : _SCHEMA_AT + schema_len]), path)
    stamps_at = _align(_SCHEMA_AT + schema_len, 8)
    require(
        stamps_at + 8 * capacity <= payload_at <= size and payload_at % 8 == 0,
        f"payload offset {payload_at}: the {capacity} slot stamps span [{stamps_at}, {stamps_at + 8 * capacity}) "
        f"of a file of {size} bytes",
    )
    return capacity, row_bytes, schema, stamps_at, payload_at


def _reserve(fd: int, size: int) -> None:
    """Give the file ``size`` bytes with their blocks allocated (``posix_fallocate``; ``ftruncate`` where unsupported)."""
    os.ftruncate(fd, size)
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as e:
        if e.errno not in (errno.EOPNOTSUPP, errno.EINVAL):  # a file system without it: sparse, as before
            raise


def _marker(tag: int, ticket: int) -> int:
    return -((tag << TICKET_BITS) | (ticket + 1))


def _align(n: int, a: int) -> int:
    return -(-n // a) * a


class RowSink(Protocol):
    """How one process writes rows of a ring storage (the mapping, or the ring file)."""

    control: RingControl

    def encode(self, arrays: Mapping[str, np.ndarray]) -> Any:
        """What :meth:`write_rows` takes for these validated rows (the arrays, or their compressed records).

        Runs before any ticket is taken, so a batch it refuses (``ByteBudgetError``) changes nothing.
        """

    def write_rows(self, first: int, arrays: Any, taken: np.ndarray | None) -> None:
        """Write the rows of tickets ``first + k`` (all, or those where ``taken[k]``)."""

    def close(self) -> None: ...


class RawRows:
    """A :class:`RowSink` half: rows are written as they come (nothing to encode)."""

    def encode(self, arrays: Mapping[str, np.ndarray]) -> Mapping[str, np.ndarray]:
        return arrays


def append(sink: RowSink, tag: int, rows: int, arrays: Mapping[str, np.ndarray]) -> tuple[int, np.ndarray, int]:
    """Reserve, take, write and publish ``rows`` validated rows: ``(first ticket, taken mask, rows committed)``.

    The sink encodes the rows first, so that a batch it refuses changes nothing: no ticket is taken and
    no slot's row is lost.
    """
    control = sink.control
    encoded = sink.encode(arrays)
    first = control.reserve(rows)
    taken, lapped = control.acquire(first, rows, tag)
    try:
        sink.write_rows(first, encoded, taken if lapped else None)
    except BaseException:
        control.release(first, taken, tag)
        raise
    return first, taken, control.commit(first, taken, tag)


def committed_slots(first: int, taken: np.ndarray, capacity: int) -> np.ndarray:
    """The slots :func:`append` wrote (its lapped tickets left out)."""
    return (first + np.flatnonzero(taken)) % capacity


class RingOwner:
    """What a ring storage's owner side shares: its counter, its own writer, its poll.

    The storage sets ``control``, ``reader``, ``capacity`` and ``_tag`` (its own writer tag).
    """

    control: RingControl
    reader: RingReader
    capacity: int
    _tag: int

    @property
    def tickets(self) -> int:
        return self.control.tickets

    @property
    def committed(self) -> int:
        """Slots holding a complete row, as of the last poll."""
        return self.reader.committed

    def append(self, arrays: Mapping[str, np.ndarray]) -> np.ndarray:
        first, taken, _ = append(self, self._tag, len(next(iter(arrays.values()))), arrays)  # type: ignore[arg-type]
        return committed_slots(first, taken, self.capacity)

    def poll(self) -> tuple[np.ndarray, np.ndarray]:
        return self.reader.poll()


class RingWriter:
    """Adds rows to a ring storage from any process, concurrently with other writers and the learner.

    Get one from :meth:`hetero_replay.PrioritizedReplay.writer` and pass it to
    actor processes (``multiprocessing`` with fork or spawn, ``SubprocVecEnv``
    workers, Ray tasks): it pickles as the storage's location and schema, and
    maps the storage on first use in each process. Rows become visible to the
    learner's next ``sample`` (or ``len``) with the max priority.

    A refused batch (wrong fields, shapes or dtypes, values a cast would
    change, more rows than the capacity) raises ``TypeError``/``ValueError``
    before anything is reserved: the buffer is unchanged.
    """

    def __init__(self, opener: Callable[..., RowSink], location: Mapping[str, Any], schema: Schema, capacity: int):
        self._opener, self._location = opener, dict(location)
        self.schema, self.capacity = schema, capacity
        self._sink: RowSink | None = None
        self._pid = 0
        self._tag = 0

    def add(self, batch: Mapping[str, Any]) -> int:
        """Add a batch ``{field: array of shape (n, ...)}``; returns the rows committed.

        Fewer than ``n`` only when other writers lapped the whole ring while this
        one wrote (a ring smaller than the rows in flight): the oldest rows go first.

        Raises:
            TypeError, ValueError: the batch does not match the schema (nothing is written).
            RingClosedError: the buffer's owner has closed it.
        """
        rows, arrays = check_host_batch(self.schema, self.capacity, batch)
        sink = self._open()
        if sink.control.closed:
            raise RingClosedError(f"{sink.control.path}: the buffer was closed by its owner")
        if rows == 0:
            return 0
        return append(sink, self._tag, rows, arrays)[2]

    def _open(self) -> RowSink:
        pid = os.getpid()
        if self._sink is None or self._pid != pid:  # first use, or a forked child: its own tag
            try:
                self._sink = self._opener(**self._location)
            except FileNotFoundError as e:
                raise RingClosedError(f"{self._location}: the buffer was closed by its owner") from e
            self._pid, self._tag = pid, self._sink.control.register(pid)
        return self._sink

    def close(self) -> None:
        """Unmap the storage in this process (the buffer itself stays; the owner closes it)."""
        if self._sink is not None and self._pid == os.getpid():
            self._sink.control.unregister(self._tag, self._pid)
            self._sink.close()
        self._sink = None

    def __getstate__(self) -> dict[str, Any]:
        return {
            "opener": self._opener,
            "location": self._location,
            "schema": self.schema.to_json(),
            "cap": self.capacity,
        }

    def __setstate__(self, s: dict[str, Any]) -> None:
        self.__init__(s["opener"], s["location"], Schema.from_json(s["schema"]), s["cap"])  # type: ignore[misc]

    def __enter__(self) -> RingWriter:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"RingWriter({self._location}, capacity={self.capacity})"


class RingReader:
    """The learner's side of a ring: which slots hold complete rows it has seen.

    Args:
        control: the ring's control block.
        abandon_after: seconds after which a reserved ticket whose slot no writer
            has taken is given up (its writer died between reserving and taking it).
    """

    def __init__(self, control: RingControl, abandon_after: float = 5.0) -> None:
        self.control = control
        self.abandon_after = check_abandon_after(abandon_after)
        self.seen = np.zeros(control.capacity, np.int64)  # the stamp each slot had at the last poll
        self.committed = 0  # slots whose seen stamp is a complete row
        self.scanned = 0  # tickets below this were looked at once; those still settling are in `pending`
        self._pending = np.empty(0, np.int64)  # tickets looked at whose slot may still get their row
        self._pending_since = np.empty(0)  # when each was first looked at

    def poll(self) -> tuple[np.ndarray, np.ndarray]:
        """``(new, gone)``: slots that now hold a complete row not seen before, and slots whose row is being replaced."""
        hi = self.control.tickets
        now = time.monotonic()
        new, gone, keep, waiting, delta = _native.ring_scan(
            self.control.stamps, self.seen, self._pending, self.scanned, hi
        )
        self.committed += delta
        self.scanned = hi
        tickets = np.concatenate([self._pending[keep.view(bool)], waiting])
        since = np.concatenate([self._pending_since[keep.view(bool)], np.full(len(waiting), now)])
        # Writers finish in microseconds: only tickets waiting for a while are looked into.
        aged = np.flatnonzero(now - since > _LOOK_AFTER)
        if aged.size:
            still = np.ones(len(tickets), bool)
            stamps = _native.stamps_at(self.control.stamps, tickets[aged] % self.control.capacity)
            for k, stamp in zip(aged, stamps):
                if stamp < 0 and ((-int(stamp)) & TICKET_MASK) - 1 == tickets[k]:  # its writer is mid-row
                    still[k] = not self.control.marker_is_dead(int(stamp))
                else:  # reserved and never taken: its writer died in between (or is very slow)
                    still[k] = now - since[k] < self.abandon_after
            tickets, since = tickets[still], since[still]
        self._pending, self._pending_since = tickets, since
        return new, gone

    def intact(self, slots: np.ndarray) -> np.ndarray:
        """After reading rows ``slots``: mask of those whose stamp is still the polled one (not torn)."""
        cur = _native.stamps_at(self.control.stamps, slots)
        return (cur == self.seen[slots]) & (cur > 0)

    def adopt(self, position: int, size: int) -> None:
        """Mark slots ``[0, size)`` as committed rows of a ring at ``position`` (rows imported, not added)."""
        cap = self.control.capacity
        slots = np.arange(size, dtype=np.int64)
        full = size == cap
        tickets = np.where(slots >= position, slots, slots + cap) if full else slots
        base = cap if full else 0
        self.control.stamps[:size] = tickets + 1
        self.control.stamps[size:] = 0
        self.control.set_tickets(base + position if full else size)
        self.take_stamps()

    def take_stamps(self) -> None:
        """Start from the stamps as they are (a ring adopted or reopened by this owner)."""
        self.seen[:] = self.control.stamps
        self.committed = int(np.count_nonzero(self.seen > 0))
        self.scanned = self.control.tickets
        self._pending, self._pending_since = np.empty(0, np.int64), np.empty(0)


__all__ = [
    "RingClosedError",
    "RingControl",
    "RingReader",
    "RingWriter",
    "RowSink",
    "append",
    "check_abandon_after",
    "committed_slots",
    "pid_alive",
]
