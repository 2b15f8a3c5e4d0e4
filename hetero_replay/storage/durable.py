"""Durable points, once for every buffer: when one is due, what it records, where it goes.

A *durable point* is a buffer's state written atomically to one
:mod:`~hetero_replay.storage.checkpoint` file, so that ``reopen`` continues the
buffer after its process died (``kill -9`` and power loss included). The
``"disk"`` storage (:mod:`~hetero_replay.storage.disk`) and the Tianshou
buffers write them by the same rules, which live here:

* **When.** ``flush()`` writes one now; besides, one is due once ``flush_every``
  transitions were added since the last one, or ``flush_seconds`` seconds passed
  since it (on a monotonic clock, so a wall-clock jump neither forces nor delays
  a point), checked when the buffer is used: :class:`FlushSchedule`.
* **What.** The core header every replay file has (config, size, position, max
  priority, generator state, checked by
  :func:`~hetero_replay.storage.checkpoint.read`), its :data:`DURABLE` section
  (the schedule's settings and counts, :meth:`FlushSchedule.section`), and what
  the buffer adds: the disk storage its ring's tickets and stamps, a Tianshou
  buffer its ``Batch`` layout.
* **Where.** A path the buffer owns: a new buffer never replaces one
  (:func:`check_new_file` for file-backed buffers); :func:`read_point` removes
  the temporaries of a write the crash interrupted before reading.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import numpy as np

from hetero_replay.checks import check_int, check_real
from hetero_replay.storage import checkpoint
from hetero_replay.storage.files import check_parents

#: The header section of a durable point that the schedule writes (and reads back at ``reopen``).
DURABLE = checkpoint.DURABLE

#: The clock of the time threshold (monotonic: a wall-clock jump neither forces nor delays a point).
_clock = time.monotonic


def check_flush_every(value: Any) -> int:
    """``value`` as an int ``>= 1`` (transitions added between durable points)."""
    return check_int(value, "flush_every", 1)


def check_flush_seconds(value: Any) -> float:
    """``value`` as a finite float ``> 0`` (seconds between durable points)."""
    return check_real(value, "flush_seconds", positive=True)


class FlushSchedule:
    """When the next durable point is due, and the counts a durable point records.

    Args:
        flush_every: a point is due once this many transitions were added since the last one.
        flush_seconds: ... or once this many seconds passed since it.
        points: durable points written over the buffer's life (kept across ``reopen``).
        added: transitions added over the buffer's life, as of the last point.

    Raises:
        TypeError, ValueError: ``flush_every`` is not an integer ``>= 1``, or
            ``flush_seconds`` not a finite number ``> 0``, naming it.
    """

    def __init__(self, flush_every: Any, flush_seconds: Any, points: int = 0, added: int = 0) -> None:
        self.flush_every = check_flush_every(flush_every)
        self.flush_seconds = check_flush_seconds(flush_seconds)
        self.points = points
        self.added = added
        self._added_at = added  # ``added`` at the last durable point
        self._time_at = _clock()

    @classmethod
    def reopened(cls, header: dict[str, Any], flush_every: Any = None, flush_seconds: Any = None) -> FlushSchedule:
        """The schedule recorded by the durable point ``header`` (read and checked), going on from it.

        ``flush_every``/``flush_seconds`` replace the recorded settings where given.

        Raises:
            KeyError: the header has no :data:`DURABLE` section (not a durable point).
            TypeError, ValueError: a replacement setting out of range.
        """
        section = header[DURABLE]
        return cls(
            section["flush_every"] if flush_every is None else flush_every,
            section["flush_seconds"] if flush_seconds is None else flush_seconds,
            points=section["points"],
            added=section["added"],
        )

    def continue_from(self, points: int, added: int) -> None:
        """Go on from a durable point that recorded ``points`` and ``added`` (a reopened buffer)."""
        self.points, self.added, self._added_at = points, added, added

    @property
    def pending(self) -> int:
        """Transitions added since the last durable point."""
        return self.added - self._added_at

    def count(self, n: int) -> bool:
        """Record ``n`` added transitions; say whether a durable point is now due."""
        self.added += n
        return self.due()

    def due(self) -> bool:
        """Whether ``flush_every`` transitions were added or ``flush_seconds`` passed since the last point."""
        return self.pending >= self.flush_every or _clock() - self._time_at >= self.flush_seconds

    def section(self) -> dict[str, Any]:
        """The :data:`DURABLE` header section of the point being made now (counted in ``points``)."""
        return {
            "flush_every": self.flush_every,
            "flush_seconds": self.flush_seconds,
            "points": self.points + 1,
            "added": self.added,
        }

    def written(self) -> None:
        """Record that the point of :meth:`section` is made: the schedule starts again from here."""
        self.points += 1
        self._added_at, self._time_at = self.added, _clock()

    def __repr__(self) -> str:
        return (
            f"FlushSchedule(flush_every={self.flush_every}, flush_seconds={self.flush_seconds}, "
            f"points={self.points}, added={self.added}, pending={self.pending})"
        )


def write_point(
    path: str | os.PathLike[str], header: dict[str, Any], arrays: dict[str, np.ndarray], schedule: FlushSchedule
) -> None:
    """Write a durable point atomically to ``path``: ``header`` with the schedule's section, and ``arrays``.

    The schedule starts again only once the file is in place; a failed write
    (``OSError``) leaves the previous point intact and the schedule due.
    """
    checkpoint.write(path, {**header, DURABLE: schedule.section()}, arrays)
    schedule.written()


class DurableFile:
    """A durable buffer kept in one file: where its durable points go, and when.

    For buffers whose whole state is one durable point (the Tianshou
    buffers); the ``"disk"`` storage keeps rows in its own files and writes
    only its priorities and stamps, with the same :class:`FlushSchedule`.

    Args:
        path: the durable file.
        schedule: when points are due, and the counts they record.
    """

    def __init__(self, path: Path, schedule: FlushSchedule) -> None:
        self.path = path
        self.schedule = schedule

    @classmethod
    def new(cls, path: Any, flush_every: Any, flush_seconds: Any, name: str = "durable_path") -> DurableFile | None:
        """A new buffer's durable file, its arguments all checked (also without a path); ``None`` without ``path``.

        Raises:
            TypeError, ValueError: as :func:`check_new_file` and :class:`FlushSchedule`, naming the argument.
        """
        schedule = FlushSchedule(flush_every, flush_seconds)
        return None if path is None else cls(check_new_file(path, name), schedule)

    def write(self, header: dict[str, Any], arrays: dict[str, np.ndarray]) -> None:
        """Write a durable point of ``header`` and ``arrays`` (:func:`write_point`)."""
        write_point(self.path, header, arrays, self.schedule)

    def __repr__(self) -> str:
        return f"DurableFile({str(self.path)!r}, {self.schedule!r})"


def read_point(path: str | os.PathLike[str]) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """The durable point at ``path``, checked (:func:`~hetero_replay.storage.checkpoint.read`).

    Removes first the temporaries of a write the crash interrupted (their writers are dead).

    Raises:
        ReplayFileError: the file is damaged, hostile or inconsistent.
        OSError: ``path`` cannot be opened (``FileNotFoundError`` if missing).
    """
    checkpoint.remove_stale_temporaries(path)
    return checkpoint.read(path)


def check_path(value: Any, name: str) -> Path:
    """``value`` as an absolute :class:`~pathlib.Path`; ``TypeError`` unless a ``str`` or ``os.PathLike`` of one, ``ValueError`` if empty.

    Made absolute once, here at the public edge: a buffer's later durable points
    and its writers in other processes must reach the same file after an ``os.chdir``.
    """
    if not isinstance(value, (str, os.PathLike)):
        raise TypeError(f"{name} must be a str or os.PathLike, got {type(value).__name__} {value!r}")
    text = os.fspath(value)
    if not isinstance(text, str):  # a PathLike of bytes
        raise TypeError(f"{name} must name a path as text, got {type(text).__name__} {text!r}")
    if not text:
        raise ValueError(f"{name} must not be empty")
    return Path(os.path.abspath(text))


def check_new_file(value: Any, name: str) -> Path:
    """``value`` as the path of a new buffer's durable file: one that does not exist yet, in a folder that does.

    Raises:
        TypeError: not a ``str``/``os.PathLike`` of text.
        ValueError: empty, existing (the buffer of an earlier run, which
            ``reopen`` continues: a new buffer never replaces it), in a
            folder that does not exist, or below a directory another user may
            change (:func:`~hetero_replay.storage.files.check_parents`).
    """
    path = check_path(value, name)
    if os.path.lexists(path):  # lexists: a dangling link would still be replaced by the first write
        what = "is a directory" if path.is_dir() else "already exists"
        raise ValueError(
            f"{name} {str(path)!r} {what}; a new buffer never replaces it. To continue the run whose "
            f"buffer it holds, call reopen({str(path)!r}); to start a new one, choose another path"
        )
    if not path.parent.is_dir():
        raise ValueError(f"{name} {str(path)!r}: the folder {str(path.parent)!r} does not exist")
    check_parents(path, name)
    return path


__all__ = [
    "DURABLE",
    "DurableFile",
    "FlushSchedule",
    "check_flush_every",
    "check_flush_seconds",
    "check_new_file",
    "check_path",
    "read_point",
    "write_point",
]
