"""ForkSafeLock: held across fork, fresh in the child, outer locks taken before inner ones."""

from __future__ import annotations

import os
import pickle
import threading
import time

import pytest

from hetero_replay.forksafe import INNER, OUTER, ForkSafeLock, holding
from tests.test_engine_concurrency import _wait_or_kill


def test_a_child_gets_a_free_lock_and_waits_for_the_holder():
    outer, inner = ForkSafeLock(OUTER), ForkSafeLock(INNER)
    entered, finished = threading.Event(), []

    def nested_work() -> None:  # an adapter's buffer calling into its engine, as SB3's add does
        with outer:
            entered.set()
            time.sleep(0.2)
            with inner:
                finished.append(time.monotonic())

    worker = threading.Thread(target=nested_work)
    worker.start()
    entered.wait()
    pid = os.fork()
    if pid == 0:
        ok = outer.acquire(timeout=5) and inner.acquire(timeout=5)
        os._exit(0 if ok else 1)
    forked_at = time.monotonic()
    worker.join()
    assert _wait_or_kill(pid, timeout=20) == 0
    assert finished and finished[0] <= forked_at  # the fork waited for the nested operation


def test_holding_takes_locks_in_fork_order_whatever_the_argument_order():
    a, b = ForkSafeLock(OUTER), ForkSafeLock(INNER)
    with holding(b, a, b):
        assert a._lock._is_owned() and b._lock._is_owned()  # type: ignore[attr-defined]
    assert not a._lock._is_owned()  # type: ignore[attr-defined]


def test_a_lock_is_not_pickled():
    with pytest.raises(TypeError, match="cannot be pickled"):
        pickle.dumps(ForkSafeLock())
