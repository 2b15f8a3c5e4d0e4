"""ForkSafeLock: a re-entrant lock that ``fork`` can never leave held in the child.

``fork`` copies only the calling thread. A lock another thread held at that
moment stays held in the child forever (its owner does not exist there), and
the data it guarded may be half-written. So before ``fork`` every live
ForkSafeLock is acquired — operations in flight on other threads finish first,
and none starts — and after it the parent releases them and the child gets
fresh ones. Buffers (the engine's and the adapters') guard their state with
these; SubprocVecEnv, multiprocessing and Ray's workers fork.

Locks are taken in ``(order, creation)`` order. A thread that holds one lock
while taking another must take them in that order too, or a concurrent fork
can deadlock: adapters' buffers (order 0) call into the engine's (order 2),
never the reverse; a relaxed pipeline (order 1) sits between them.

At interpreter exit the exiting thread takes them all the same way and keeps
them: daemon threads are then not inside the library when the interpreter
finalizes (one that is, ended mid native call, would crash the process).
That wait is bounded (:data:`EXIT_WAIT_SECONDS`): a thread that holds a lock
for good (blocked in a user callback, a write to a full pipe) must not hang
exit. Exit then goes on without the locks still held; the exiting thread's
later calls that need one raise ``RuntimeError`` instead of waiting, and a
daemon thread still inside the library when the interpreter finalizes is the
documented risk (it may crash the process at exit, after every exit handler ran).
What the library hands out is the caller's: torch (2.13) aborts a process whose
daemon thread frees any tensor while the interpreter finalizes, library or not
(a daemon loop of ``torch.empty`` alone: 15 of 15 runs), so a program whose
daemon threads train with torch must join them, or keep their batches alive, before it exits.
A lock-holding thread may create locks (a buffer built inside another's
``load_state_dict``): the fork handler never waits for a lock while holding
the registry that creation needs.
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import os
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from typing import Any

#: ``order`` of a host-library adapter's buffer lock: taken first.
OUTER = 0
#: ``order`` of a relaxed pipeline's lock (:mod:`hetero_replay.pipeline`), between the two.
PIPELINE = 1
#: ``order`` of the engine's buffer lock, which adapters' buffers and pipelines call into.
INNER = 2

_live: weakref.WeakSet[ForkSafeLock] = weakref.WeakSet()
_registry_lock = threading.Lock()
_held: list[ForkSafeLock] = []
_created = itertools.count()
#: At interpreter exit, how long the exiting thread waits for other threads to leave the library's
#: locks before exit goes on without the locks still held (see the module docstring).
EXIT_WAIT_SECONDS = 5.0


class ForkSafeLock:
    """A ``threading.RLock`` that is held across ``fork`` and fresh in the child.

    Use it as a context manager (``with lock:``) or with ``acquire`` /
    ``release``, or under a ``threading.Condition``. It cannot be pickled: owners drop it in ``__getstate__`` and
    make a new one in ``__setstate__``.
    """

    __slots__ = ("_lock", "_key", "__weakref__")

    def __init__(self, order: int = INNER) -> None:
        self._lock = threading.RLock()
        self._key = (order, next(_created))
        with _registry_lock:
            _live.add(self)

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        if self._lock.acquire(False):
            return True
        if not blocking:
            return False
        if _exit_holder == threading.get_ident():
            _acquire_at_exit(self._lock)
            return True
        return self._lock.acquire(True, timeout)

    def release(self) -> None:
        self._lock.release()

    def __enter__(self) -> ForkSafeLock:
        if not self._lock.acquire(False):  # the common case costs one acquire, as a plain RLock's
            if _exit_holder == threading.get_ident():
                _acquire_at_exit(self._lock)
            else:
                self._lock.acquire()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._lock.release()

    # What threading.Condition needs of a re-entrant lock (RLock's own, delegated).
    def _is_owned(self) -> bool:
        return self._lock._is_owned()  # type: ignore[attr-defined]

    def _release_save(self) -> Any:
        return self._lock._release_save()  # type: ignore[attr-defined]

    def _acquire_restore(self, state: Any) -> None:
        self._lock._acquire_restore(state)  # type: ignore[attr-defined]

    def __reduce__(self) -> Any:
        raise TypeError("a ForkSafeLock cannot be pickled; drop it in __getstate__ and make a new one")


@contextlib.contextmanager
def holding(*locks: ForkSafeLock) -> Iterator[None]:
    """Hold several locks at once, taken in the order ``fork`` takes them, so a concurrent fork cannot deadlock."""
    with contextlib.ExitStack() as stack:
        for lock in sorted(set(locks), key=lambda lock: lock._key):
            stack.enter_context(lock)
        yield


def _acquire_at_exit(lock: Any) -> None:
    """The exiting thread waits for a lock only until the exit's deadline: ``RuntimeError`` after it."""
    if not lock.acquire(True, max(_exit_deadline - time.monotonic(), 0.0)):
        raise RuntimeError(
            "the interpreter is exiting and another thread has held a buffer's lock for more than "
            f"EXIT_WAIT_SECONDS ({EXIT_WAIT_SECONDS} s): not waiting for it"
        )


def _before_fork() -> None:
    _take_all(None)


def _take_all(deadline: float | None) -> None:
    """Take every live lock in order into ``_held`` and keep the registry lock (see ``_before_fork``).

    With a ``deadline`` (``time.monotonic``), a lock not taken by then is left out.
    """
    # Never wait for a lock while holding the registry lock: a thread that holds a ForkSafeLock may be
    # creating another (a buffer built inside load_state_dict or reset), and it needs the registry lock for
    # that. So take the live locks in order without it, then, under it, the ones created meanwhile — only
    # if they are free, since waiting there could invert the order; else let everything go and start over.
    # The registry lock stays held until after the fork: no lock is created (and taken) unseen.
    while True:
        with _registry_lock:
            live = sorted(_live, key=_order)
        taken = [lock for lock in live if _acquire_by(lock, deadline)]
        _registry_lock.acquire()
        late = sorted(set(_live).difference(live), key=_order)
        for lock in late:
            if lock._lock.acquire(blocking=False):
                taken.append(lock)
            elif deadline is None or time.monotonic() < deadline:
                break
        else:
            _held[:] = taken
            return
        _registry_lock.release()
        for lock in reversed(taken):
            lock._lock.release()
        time.sleep(0.001)  # the late lock's holder is running: let it finish


def _acquire_by(lock: ForkSafeLock, deadline: float | None) -> bool:
    if deadline is None:
        return lock._lock.acquire()
    return lock._lock.acquire(True, max(deadline - time.monotonic(), 0.0))


def _order(lock: ForkSafeLock) -> tuple[int, int]:
    return lock._key


def _after_fork_in_parent() -> None:
    for lock in reversed(_held):
        lock._lock.release()
    _held.clear()
    _registry_lock.release()


def _after_fork_in_child() -> None:
    global _registry_lock
    for lock in _held:
        lock._lock = threading.RLock()
    _held.clear()
    _registry_lock = threading.Lock()


def holding_for_exit() -> bool:
    """Whether the interpreter is exiting and this thread took every lock for it (see ``_hold_at_exit``)."""
    return _exit_holder == threading.get_ident()


def _hold_at_exit() -> None:
    # Daemon threads run on until the interpreter finalizes; then one inside a native call is ended where
    # it next takes the GIL back, and its C++ frames are unwound without the GIL (a crash) — or, before
    # ReleasedGil, std::terminate. So at exit, as before a fork, wait for the calls in flight and let none
    # start: this thread keeps every lock (re-entrant, so later exit handlers here still use the buffers).
    # A lock still held after EXIT_WAIT_SECONDS is left to its holder: exit must not hang on it.
    global _exit_holder, _exit_deadline
    _exit_deadline = time.monotonic() + EXIT_WAIT_SECONDS
    _take_all(_exit_deadline)
    _held.clear()
    _registry_lock.release()  # locks made by later exit handlers are theirs
    _exit_holder = threading.get_ident()


def at_exit(fn: Callable[[], Any]) -> None:
    """Call ``fn`` at interpreter exit, before the exit handlers registered so far, after the wait for locks.

    For closes that need a service whose own exit handler would otherwise have
    run first (a ``ShardedReplay``'s shards, gone with Ray's shutdown); the
    exiting thread holds the library's locks by then, as for any exit handler
    here. Handlers registered later run earlier (``atexit``'s order): registering
    ``fn`` again moves it before those registered since. ``atexit.unregister(fn)`` undoes it.
    """
    atexit.unregister(fn)
    atexit.register(fn)
    atexit.unregister(_hold_at_exit)  # still the first to run
    atexit.register(_hold_at_exit)


_exit_holder: int | None = None
_exit_deadline = 0.0  # time.monotonic() when the exiting thread stops waiting for locks

if hasattr(os, "register_at_fork"):  # POSIX; Windows has no fork
    os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent, after_in_child=_after_fork_in_child)
atexit.register(_hold_at_exit)


__all__ = ["EXIT_WAIT_SECONDS", "INNER", "OUTER", "PIPELINE", "ForkSafeLock", "at_exit", "holding", "holding_for_exit"]
