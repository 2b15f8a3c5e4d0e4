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
from collections.abc import Iterator
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
        return self._lock.acquire(blocking, timeout)

    def release(self) -> None:
        self._lock.release()

    def __enter__(self) -> ForkSafeLock:
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


def _before_fork() -> None:
    # Never wait for a lock while holding the registry lock: a thread that holds a ForkSafeLock may be
    # creating another (a buffer built inside load_state_dict or reset), and it needs the registry lock for
    # that. So take the live locks in order without it, then, under it, the ones created meanwhile — only
    # if they are free, since waiting there could invert the order; else let everything go and start over.
    # The registry lock stays held until after the fork: no lock is created (and taken) unseen.
    while True:
        with _registry_lock:
            taken = sorted(_live, key=_order)
        for lock in taken:
            lock._lock.acquire()
        _registry_lock.acquire()
        late = sorted(set(_live).difference(taken), key=_order)
        for lock in late:
            if not lock._lock.acquire(blocking=False):
                break
            taken.append(lock)
        else:
            _held[:] = taken
            return
        _registry_lock.release()
        for lock in reversed(taken):
            lock._lock.release()
        time.sleep(0.001)  # the late lock's holder is running: let it finish


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
    global _exit_holder
    _before_fork()
    _held.clear()
    _registry_lock.release()  # locks made by later exit handlers are theirs
    _exit_holder = threading.get_ident()


_exit_holder: int | None = None

if hasattr(os, "register_at_fork"):  # POSIX; Windows has no fork
    os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent, after_in_child=_after_fork_in_child)
atexit.register(_hold_at_exit)


__all__ = ["INNER", "OUTER", "PIPELINE", "ForkSafeLock", "holding", "holding_for_exit"]
