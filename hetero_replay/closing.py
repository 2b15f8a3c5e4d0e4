"""``close_when_gone``: a buffer left unclosed is closed when it is collected or at interpreter exit.

A normal exit must lose nothing: the rows since a buffer's last durable point,
or those it staged for the replay below it. The callback holds the buffer's
attributes, not the buffer, so it never keeps the buffer alive, and it runs only
in the process that built the buffer (a forked child's copy must not write the
owner's files or send its rows). At exit it runs before the exit handlers
registered until then (:func:`~hetero_replay.forksafe.at_exit`): a buffer's
close reaches the replay below it, and a :class:`ShardedReplay`'s shards, before
their own exit handlers (Ray's shutdown among them) end them.
"""

from __future__ import annotations

import itertools
import os
import sys
import weakref
from collections.abc import Callable
from typing import Any

from hetero_replay.forksafe import at_exit


def close_when_gone(buffer: Any, still_open: Callable[[dict[str, Any]], bool]) -> None:
    """Call ``buffer.close()`` when ``buffer`` is collected or the interpreter exits, if ``still_open(its attributes)``.

    Call it once the replay below ``buffer`` exists: at exit, buffers close in the
    reverse order of these calls, before the exit handlers registered until the
    last one. ``still_open`` must not refer to ``buffer`` (it would never be collected).
    """
    closer = weakref.finalize(buffer, _close_unclosed, type(buffer), buffer.__dict__, os.getpid(), still_open)
    closer.atexit = False  # at exit, at_exit's order instead of weakref's (which runs after Ray's shutdown)
    for key, done in list(_closers.items()):  # (each step atomic: buffers may be built on several threads)
        if not done.alive:
            _closers.pop(key, None)
    _closers[next(_keys)] = closer
    at_exit(_close_all)  # moved after every exit handler registered so far: it runs before them


_closers: dict[int, weakref.finalize[Any, Any]] = {}  # in the order of registration
_keys = itertools.count()


def _close_all() -> None:
    for closer in reversed(list(_closers.values())):
        try:
            closer()
        except Exception:  # reported as weakref's exit handler does: one buffer's failure must not stop the others
            sys.excepthook(*sys.exc_info())


def _close_unclosed(
    buffer_class: type[Any], state: dict[str, Any], owner: int, still_open: Callable[[dict[str, Any]], bool]
) -> None:
    if os.getpid() != owner or not still_open(state):
        return
    buffer = object.__new__(buffer_class)
    object.__setattr__(buffer, "__dict__", state)  # the same attributes: close() sees and updates the buffer's state
    buffer.close()


__all__ = ["close_when_gone"]
