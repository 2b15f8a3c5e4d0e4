"""Rows in shared memory that actor processes add to while the learner samples.

``storage="shared"``: one file holds the ring's control block
(:mod:`hetero_replay.storage.ring`) followed by the rows, in the record layout
of :class:`~hetero_replay.storage.host.HostStorage`, and every process maps it.

**Why a file-backed mapping, not** ``multiprocessing.shared_memory``: in
Python 3.11 the latter's resource tracker may unlink a segment other processes
still use (cpython gh-82300; ``track=False`` came in 3.13), and it lives in
``/dev/shm``, which containers often mount at 64 MB. A plain file that every
process ``mmap``-s has neither problem and works in any directory: by default
``/dev/shm`` when it has room (memory, no disk traffic), else the temporary
directory (page-cache backed; a warning says so); ``storage_options={"dir": ...}``
chooses; a directory of one's own, or a sticky one like ``/tmp`` (the file's name is
random and it is created exclusively, never through a link: see
:mod:`~hetero_replay.storage.files`). Its pages are reserved when it is made (``posix_fallocate``), so a segment
larger than the free space is an ``OSError`` then, not a SIGBUS at a later add.
The file is created with mode 0600 and removed when the owner closes
the buffer (or exits); writers never remove it, so an actor that crashes leaks
nothing. An owner killed with SIGKILL leaves its file behind, like any process
killed mid-write of a temporary file.
"""

from __future__ import annotations

import os
import secrets
import tempfile
import warnings
import weakref
from collections.abc import Mapping
from typing import Any

import numpy as np

from hetero_replay.storage.durable import check_path
from hetero_replay.storage.files import check_directory
from hetero_replay.storage.host import HostStorage, record_layout
from hetero_replay.storage.ring import RawRows, RingControl, RingOwner, RingReader, RingWriter, check_abandon_after
from hetero_replay.storage.schema import Schema

#: Where segments go by default, when it has room.
SHM_DIR = "/dev/shm"


class SharedRows(RawRows):
    """A writer process's view of a shared segment: the control block and the rows, mapped."""

    def __init__(self, path: str) -> None:
        self.control = RingControl.attach(path)
        try:
            self.control.check_row_bytes(record_layout(self.control.schema)[1])
            self.rows = HostStorage(self.control.capacity, self.control.schema, records=_records_of(self.control))
        except BaseException:
            self.control.close()
            raise

    def write_rows(self, first: int, arrays: Mapping[str, np.ndarray], taken: np.ndarray | None) -> None:
        _write_taken(self.rows, self.control.capacity, first, arrays, taken)

    def close(self) -> None:
        self.rows = None  # type: ignore[assignment]
        self.control.close()


class SharedStorage(RingOwner, RawRows, HostStorage):
    """Rows of a :class:`Schema` in a shared file mapping; writer processes add with :meth:`writer`.

    Args:
        capacity: rows kept; the oldest ticket's row is overwritten first.
        schema: the fields of a row.
        dir: directory of the segment file (default: ``/dev/shm`` if it has
            room for the rows plus a quarter, else the temporary directory).
        abandon_after: seconds after which a reserved row no writer has begun is
            given up (its writer died between reserving and writing; see :class:`RingReader`).

    Reads and views are those of :class:`HostStorage` over the mapping.
    """

    def __init__(
        self,
        capacity: int,
        schema: Schema | Mapping[str, Any],
        dir: str | os.PathLike[str] | None = None,
        abandon_after: float = 5.0,
    ) -> None:
        abandon_after = check_abandon_after(abandon_after)  # every argument before the file
        schema = schema if isinstance(schema, Schema) else Schema(schema)
        _, row_bytes = record_layout(schema)
        directory = _segment_dir(dir, capacity * row_bytes)
        path = os.path.join(directory, f"hetero-replay-{os.getpid()}-{secrets.token_hex(6)}.ring")
        self.control = RingControl.create(path, capacity, schema, row_bytes, payload_bytes=capacity * row_bytes)
        # Removed by close(), or when the owner's buffer is collected or the owner exits (not in forked children).
        self._remove = weakref.finalize(self, _remove_segment, path, os.getpid())
        super().__init__(capacity, schema, records=_records_of(self.control))
        self.reader = RingReader(self.control, abandon_after)
        self._tag = self.control.register(os.getpid())
        self.path = path

    def write_rows(self, first: int, arrays: Mapping[str, np.ndarray], taken: np.ndarray | None) -> None:
        _write_taken(self, self.capacity, first, arrays, taken)

    def read_intact(self, indices: np.ndarray) -> tuple[dict[str, np.ndarray], np.ndarray]:
        rows = self.gather(indices)
        return rows, self.reader.intact(indices)

    def adopt(self, position: int, size: int, arrays: Mapping[str, np.ndarray]) -> None:
        self.import_rows(arrays)
        self.reader.adopt(position, size)

    def writer(self) -> RingWriter:
        """A picklable handle actor processes add rows with (see :class:`RingWriter`)."""
        return RingWriter(SharedRows, {"path": self.path}, self.schema, self.capacity)

    def close(self) -> None:
        """Tell writers the buffer is closed, unmap and remove the segment file."""
        if self._remove.alive:
            self.control.mark_closed()
            self._rows = self._records = self.arrays = None  # type: ignore[assignment]
            self.control.close()
            self._remove()

    def __repr__(self) -> str:
        return f"SharedStorage({self.path!r}, capacity={self.capacity})"


def _records_of(control: RingControl) -> np.ndarray:
    """The rows after the control block, as HostStorage records."""
    return control.payload(control.capacity * control.row_bytes).reshape(control.capacity, control.row_bytes)


def _write_taken(
    rows: HostStorage, capacity: int, first: int, arrays: Mapping[str, np.ndarray], taken: np.ndarray | None
) -> None:
    if taken is None:  # every ticket's slot was taken: one write
        rows.write(first % capacity, arrays)
        return
    for k in np.flatnonzero(taken):  # some slots were lapped by newer tickets: write the others one by one
        rows.write((first + int(k)) % capacity, {n: a[k : k + 1] for n, a in arrays.items()})


def _segment_dir(dir: str | os.PathLike[str] | None, nbytes: int) -> str:
    if dir is not None:
        # Absolute (writers in other processes attach by this path), and no one else's to plant files in.
        directory = check_path(dir, "storage_options dir")
        check_directory(directory, "storage_options dir", shared_sticky=True)
        return str(directory)
    if os.path.isdir(SHM_DIR):
        st = os.statvfs(SHM_DIR)
        if st.f_bavail * st.f_frsize >= nbytes * 1.25 + (16 << 20):
            return SHM_DIR
        free = st.f_bavail * st.f_frsize
        warnings.warn(
            f"{SHM_DIR} has {free >> 20} MiB free, too little for a {nbytes >> 20} MiB segment; it goes to "
            f"{tempfile.gettempdir()} (a file mapping: slower under memory pressure). Choose with "
            "storage_options={'dir': ...}, or give the container a larger /dev/shm (--shm-size).",
            ResourceWarning,
            stacklevel=4,
        )
    return tempfile.gettempdir()


def _remove_segment(path: str, owner: int) -> None:
    if os.getpid() == owner:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


__all__ = ["SHM_DIR", "SharedRows", "SharedStorage"]
