"""How the library creates and opens the files of a buffer: private, never through a planted link, owned once.

Every path a buffer creates is treated the way ``ssh`` and ``git`` treat theirs,
because a buffer's directory may sit where other local users can write
(``/tmp``, a shared scratch disk):

* **A buffer's directory is private.** It is created with mode 0700; an
  existing one must be a real directory (not a symlink), owned by this user,
  and writable by nobody else. A directory that group or others may write is
  refused even when sticky: another user could have made it, and its entries
  are the buffer's own names, known in advance. (A file *beside* which a
  random name is created, such as a ``"shared"`` segment in ``/dev/shm``, may
  go in a sticky directory: see :func:`check_directory`.)
* **No directory above them is another user's to change.** Every directory
  from the root down to the one a file or a buffer's directory is created in
  (as the path is given, and as its links resolve) must belong to root or this
  user, and be writable by nobody else unless it is sticky (``/tmp``): a user
  who can write to a directory may rename what is in it and put a directory
  or link of theirs in its place (the rule ``ssh`` applies to its files,
  loosened for sticky directories, where only an entry's owner can rename
  it). :func:`check_parents`; refused with ``ValueError`` naming the directory.
* **New files are new.** ``O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC``, mode
  0600: an existing file or a symlink under that name is an error, never
  truncated or followed. Temporary files get unpredictable names
  (:func:`tempfile.mkstemp` or a random suffix, created the same way).
* **Existing files are opened without following a symlink** and must be
  regular files.
* **One owner at a time.** :class:`OwnerLock` is an exclusive ``flock`` on
  ``<directory>/lock``, taken before anything else in the directory is read
  or written and held while the buffer is open. The kernel drops it when its
  process dies, however it dies; forked children close their copy at once, so
  a child that outlives its parent does not keep the buffer locked.
  Where it holds: every local file system; NFS across hosts (Linux >= 2.6.12
  emulates ``flock`` as a whole-file POSIX lock, so the lock file is opened for
  writing) unless mounted ``nolock`` or ``local_lock=flock|all`` (then this host
  only); SMB across hosts from Linux 5.5. A file system that refuses locks is
  refused with :class:`OSError`.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import stat
import tempfile
import weakref
from pathlib import Path

from hetero_replay.forksafe import ForkSafeLock

#: Flags of every file the library creates: new, not through a link, not inherited by exec'd programs.
NEW_FILE_FLAGS = os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
#: Flags added to every existing file the library opens.
EXISTING_FILE_FLAGS = os.O_NOFOLLOW | os.O_CLOEXEC
LOCK_FILE = "lock"


class BufferInUseError(ValueError):
    """Another learner (this process or another, on this host or one sharing the file system) owns the buffer."""


def check_parents(path: str | os.PathLike[str], name: str) -> None:
    """Refuse ``path`` if a directory above it lets another user replace it: ``ValueError`` naming both.

    Every existing directory from the root down to ``path``'s parent, along
    ``path`` as given (absolute) and along its resolved form, must belong to
    root or this user and, unless sticky, be writable by nobody else (see the
    module docstring). Symlinks on the way must belong to root or this user.
    Missing directories are not checked: whoever creates them makes them.
    """
    given = Path(os.path.abspath(path))
    seen: set[Path] = set()
    for chain in (given, Path(os.path.realpath(given))):
        for parent in reversed(chain.parents):
            if parent in seen:
                continue
            seen.add(parent)
            try:
                st = os.lstat(parent)
            except FileNotFoundError:
                break  # below it nothing exists yet
            if st.st_uid not in (0, os.geteuid()):
                raise ValueError(
                    f"{name}={str(path)!r}: the directory {str(parent)!r} above it belongs to user {st.st_uid}, "
                    "who could replace what is in it; use a path whose directories are yours or root's"
                )
            writable_by_others = st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
            if stat.S_ISDIR(st.st_mode) and writable_by_others and not st.st_mode & stat.S_ISVTX:
                raise ValueError(
                    f"{name}={str(path)!r}: the directory {str(parent)!r} above it is writable by other users "
                    f"without the sticky bit (mode {stat.filemode(st.st_mode)}): they could replace what is in "
                    "it; use a path only you can change (chmod go-w, or chmod +t)"
                )


def check_directory(path: Path, name: str, shared_sticky: bool = False) -> None:
    """Refuse a directory another user could plant files in, or replace: ``ValueError`` naming ``name``.

    It must be a real directory (not a symlink), owned by this user and not
    writable by group or others; with ``shared_sticky`` a sticky directory is
    also accepted (``/tmp``, ``/dev/shm``), for files created there under a
    random name with :data:`NEW_FILE_FLAGS`. The directories above it must
    pass :func:`check_parents`.
    """
    check_parents(path, name)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        raise ValueError(f"{name}={str(path)!r} does not exist") from None
    if stat.S_ISLNK(st.st_mode):
        raise ValueError(f"{name}={str(path)!r} is a symlink; give the directory it points to")
    if not stat.S_ISDIR(st.st_mode):
        raise ValueError(f"{name}={str(path)!r} is not a directory")
    if shared_sticky and st.st_mode & stat.S_ISVTX:
        return
    if st.st_uid != os.geteuid():
        raise ValueError(f"{name}={str(path)!r} belongs to user {st.st_uid}, not to this user ({os.geteuid()})")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise ValueError(
            f"{name}={str(path)!r} is writable by other users (mode {stat.filemode(st.st_mode)}): "
            "they could plant files in it; use a directory only you can write (chmod go-w)"
        )


def private_directory(path: Path, name: str) -> bool:
    """Create directory ``path`` (mode 0700, parents as ``mkdir -p``) or check an existing one.

    Returns whether it was created here. Raises ``ValueError`` as :func:`check_directory`,
    before creating anything when an existing directory above it fails :func:`check_parents`.
    Missing parents are made 0700 too (whatever the umask): only this user may change them.
    """
    check_parents(path, name)
    try:
        make_parents(path)
        os.mkdir(path, 0o700)
        created = True
    except FileExistsError:
        created = False
    check_directory(path, name)
    return created


def make_parents(path: str | os.PathLike[str]) -> None:
    """Create the missing directories above ``path``, each with mode 0700 (as ``mkdir -p -m 0700``)."""
    missing = []
    for parent in Path(os.path.abspath(path)).parents:
        if os.path.lexists(parent):
            break
        missing.append(parent)
    for parent in reversed(missing):
        with contextlib.suppress(FileExistsError):  # made meanwhile by another process: checked by the caller
            os.mkdir(parent, 0o700)


def replace_file(path: str | os.PathLike[str], data: bytes, name: str = "path") -> Path:
    """Write ``data`` to ``path`` atomically, never through a link planted at its name; return the absolute path.

    For files of known names in a user-given folder (reports, the advisor's
    profiles): :func:`check_parents` first (``ValueError`` naming ``name``),
    missing folders made 0700, then a new temporary of unpredictable name beside
    it (:func:`tempfile.mkstemp`: ``O_EXCL``, mode 0600) renamed over ``path``.
    A symlink at ``path`` is replaced, not followed; a directory there is an ``OSError``.
    """
    target = Path(os.path.abspath(path))
    check_parents(target, name)
    make_parents(target)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target


def read_regular_file(path: str | os.PathLike[str], limit: int, name: str = "path") -> bytes:
    """The bytes of the regular file at ``path``, at most ``limit`` of them.

    Opened without blocking (a FIFO or a device named by mistake or malice
    would otherwise hang the read or never end it), then refused unless a
    regular file of at most ``limit`` bytes: ``ValueError`` naming ``name``.
    ``FileNotFoundError`` / other ``OSError`` as ``open`` raises them.
    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise ValueError(f"{name}={os.fspath(path)!r} is not a regular file")
    with os.fdopen(fd, "rb") as f:
        if st.st_size > limit:
            raise ValueError(f"{name}={os.fspath(path)!r} holds {st.st_size} bytes, more than the {limit} it may")
        data = f.read(limit + 1)
    if len(data) > limit:  # grew while read
        raise ValueError(f"{name}={os.fspath(path)!r} holds more than the {limit} bytes it may")
    return data


def create_file(path: str | os.PathLike[str], flags: int = os.O_RDWR, mode: int = 0o600) -> int:
    """A new file at ``path``, opened with ``flags``: ``FileExistsError`` if anything (a link too) is there."""
    return os.open(path, flags | NEW_FILE_FLAGS, mode)


def open_file(path: str | os.PathLike[str], flags: int = os.O_RDWR) -> int:
    """An existing regular file at ``path``, not through a symlink (``OSError`` otherwise)."""
    fd = os.open(path, flags | EXISTING_FILE_FLAGS)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(errno.EINVAL, "not a regular file", os.fspath(path))
    return fd


class OwnerLock:
    """The exclusive ownership of a buffer's directory (see the module docstring), released by :meth:`release`.

    Raises:
        BufferInUseError: another open file description holds the lock.
        OSError: the lock file cannot be made, or the file system refuses locks.
    """

    _fd: int
    _file_id: tuple[int, int]  # (device, inode) of the lock file

    def __init__(self, directory: Path) -> None:
        self.path = directory / LOCK_FILE
        in_use = BufferInUseError(
            f"{str(directory)!r} is owned by another learner (it holds {str(self.path)!r}); "
            "close it there, or wait for that process to end"
        )
        with _acquiring:
            # Where flock is a POSIX lock (NFS), a process's second lock of a file is granted and
            # closing any descriptor of it drops the first: so this process's own locks are looked
            # up before the file is opened at all.
            with contextlib.suppress(FileNotFoundError):
                if _identity(os.stat(self.path, follow_symlinks=False)) in {lock._file_id for lock in _held}:
                    raise in_use
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | EXISTING_FILE_FLAGS, 0o600)
            try:
                st = os.fstat(fd)
                if not stat.S_ISREG(st.st_mode):
                    raise OSError(errno.EINVAL, "not a regular file", str(self.path))
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                raise in_use from None
            except BaseException:
                os.close(fd)
                raise
            self._fd, self._file_id = fd, _identity(st)
            _held.add(self)

    def release(self) -> None:
        """Drop the lock (idempotent; a no-op in a forked child, whose copy is closed already)."""
        fd, self._fd = self._fd, -1
        _held.discard(self)
        if fd >= 0:
            os.close(fd)


_held: weakref.WeakSet[OwnerLock] = weakref.WeakSet()
#: Serialises this process's lock acquisitions (a ForkSafeLock: fresh in a forked child).
_acquiring = ForkSafeLock()


def _identity(st: os.stat_result) -> tuple[int, int]:
    return st.st_dev, st.st_ino


def _close_in_child() -> None:
    """A forked child closes its copies of the owner locks: the parent alone owns its buffers."""
    for lock in list(_held):
        if lock._fd >= 0:
            os.close(lock._fd)
            lock._fd = -1
    _held.clear()


os.register_at_fork(after_in_child=_close_in_child)


__all__ = [
    "EXISTING_FILE_FLAGS",
    "LOCK_FILE",
    "NEW_FILE_FLAGS",
    "BufferInUseError",
    "OwnerLock",
    "check_directory",
    "check_parents",
    "create_file",
    "make_parents",
    "open_file",
    "private_directory",
    "read_regular_file",
    "replace_file",
]
