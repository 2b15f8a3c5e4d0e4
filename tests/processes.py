"""Actor processes for the tests of storages that writer processes share: start them, join them."""

from __future__ import annotations

import multiprocessing as mp
import signal
import time
from collections.abc import Callable, Iterable
from typing import Any

#: Seconds a join waits: only against hangs.
JOIN_S = 60


def start(target: Callable[..., Any], *args: Any, method: str = "fork") -> Any:
    """A daemon process running ``target(*args)``, started with ``method``."""
    p = mp.get_context(method).Process(target=target, args=args, daemon=True)
    p.start()
    return p


def join_all(procs: Iterable[Any], codes: tuple[int, ...] = (0,)) -> None:
    """Join ``procs``: each must end within :data:`JOIN_S` with an exit code among ``codes``."""
    for p in procs:
        p.join(JOIN_S)
        assert not p.is_alive(), f"{p.name} hung"
        assert p.exitcode in codes, f"{p.name} exit code {p.exitcode}"


def value_then_killed(target: Callable[..., Any], *args: Any) -> Any:
    """Run ``target(*args, conn)`` in a process that sends one value on ``conn`` and then SIGKILLs itself;
    return that value once the process is dead."""
    recv, send = mp.Pipe(duplex=False)
    dying = start(target, *args, send)
    deadline = time.monotonic() + JOIN_S
    while not recv.poll(0.05):
        assert dying.is_alive() and time.monotonic() < deadline, "the process failed before its kill"
    value = recv.recv()
    join_all([dying], codes=(-signal.SIGKILL,))
    return value
