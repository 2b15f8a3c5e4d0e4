"""The engine under several threads and across fork.

Several adder threads, a sampler and an updater hammer one buffer for a few
seconds: no row may be lost, none sampled torn (fields of two transitions) or
unwritten, and the tree must end equal to one rebuilt from its leaves. Forks
taken while another thread is inside the tree must give a child that can use
the buffer (before issue 10 the child deadlocked on the tree's lock in about
half the forks).
"""

from __future__ import annotations

import os
import signal
import threading
import time

import numpy as np
import pytest

from hetero_replay import PrioritizedReplay
from hetero_replay.trees import make_tree

pytestmark = pytest.mark.slow

ADDERS = 3
BATCHES_PER_ADDER = 600
MAX_ROWS = 24

SCHEMA = {
    "obs": ((3,), np.float64),
    "action": ((), np.int64),
    "reward": ((), np.float32),
    "next_obs": ((3,), np.float64),
}


def rows_with_ids(ids: np.ndarray) -> dict[str, np.ndarray]:
    """Every field of a row encodes the same id (ids start at 1: an all-zero row was never written)."""
    f = ids.astype(np.float64)
    return {
        "obs": np.stack([f, f + 0.5, -f], axis=1),
        "action": ids.astype(np.int64),
        "reward": (ids % 1000).astype(np.float32),
        "next_obs": np.stack([f + 1, f + 1.5, -f - 1], axis=1),
    }


def torn_rows(data: dict[str, np.ndarray]) -> np.ndarray:
    """Positions of sampled rows whose fields disagree about their id, or that were never written."""
    ids = data["action"]
    f = ids.astype(np.float64)
    ok = (ids >= 1) & np.all(data["obs"] == np.stack([f, f + 0.5, -f], axis=1), axis=1)
    ok &= data["reward"] == (ids % 1000).astype(np.float32)
    ok &= np.all(data["next_obs"] == np.stack([f + 1, f + 1.5, -f - 1], axis=1), axis=1)
    return np.flatnonzero(~ok)


@pytest.mark.parametrize("backend", ["native", "numpy"])
def test_adders_sampler_and_updater_lose_and_tear_nothing(backend):
    capacity = ADDERS * BATCHES_PER_ADDER * MAX_ROWS  # never wraps: every row added must be there
    buf = PrioritizedReplay(capacity, SCHEMA, alpha=0.6, tree=backend, seed=0)
    added: list[np.ndarray] = []
    problems: list[str] = []
    stop = threading.Event()

    def adder(rank: int) -> None:
        rng = np.random.default_rng(rank)
        next_id = rank * 10_000_000 + 1
        for _ in range(BATCHES_PER_ADDER):
            n = int(rng.integers(1, MAX_ROWS + 1))
            ids = np.arange(next_id, next_id + n)
            next_id += n
            buf.add(rows_with_ids(ids))
            added.append(ids)

    def sampler_and_updater() -> None:
        rng = np.random.default_rng(99)
        while not stop.is_set():
            if len(buf) == 0:
                continue
            s = buf.sample(64)
            bad = torn_rows(s.data)
            if bad.size:
                problems.append(f"{bad.size} torn or unwritten rows, e.g. {s.data['action'][bad[:3]]}")
            buf.update_priorities(s.indices, rng.exponential(size=64))

    threads = [threading.Thread(target=adder, args=(r,)) for r in range(ADDERS)]
    side = [threading.Thread(target=sampler_and_updater) for _ in range(2)]
    for t in threads + side:
        t.start()
    for t in threads:
        t.join()
    stop.set()
    for t in side:
        t.join()

    assert not problems, problems[:5]
    expected = np.sort(np.concatenate(added))
    assert len(buf) == expected.size, f"{expected.size - len(buf)} rows lost"
    stored = np.sort(buf.storage.arrays["action"][: len(buf)])
    np.testing.assert_array_equal(stored, expected)  # each added row exactly once
    assert torn_rows(buf.storage.gather(np.arange(len(buf)))).size == 0

    # The tree equals one rebuilt from its leaves: sums and minimum exact, same draws.
    rebuilt = make_tree(backend, capacity, buf.tree.fanout, buf.tree.dtype)
    rebuilt.load_leaves(buf.tree.leaves())
    assert (buf.tree.total(), buf.tree.min()) == (rebuilt.total(), rebuilt.min())
    a = buf.tree.sample(4096, np.random.default_rng(5), 0.4)
    b = rebuilt.sample(4096, np.random.default_rng(5), 0.4)
    np.testing.assert_array_equal(a[0], b[0])
    np.testing.assert_array_equal(a[1], b[1])


def _wait_or_kill(pid: int, timeout: float) -> int | None:
    """The child's exit status, or None if it hung (then it is killed)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.01)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    return None


def _fork_during(work, use_in_child, forks: int = 20) -> list[str]:
    """Forks ``forks`` times while another thread runs ``work`` in a loop; returns the failures."""
    stop = threading.Event()

    def loop() -> None:
        while not stop.is_set():
            work()

    worker = threading.Thread(target=loop)
    worker.start()
    failures = []
    try:
        for i in range(forks):
            time.sleep(0.005)
            pid = os.fork()
            if pid == 0:  # the child: use the buffer, then leave without running parent cleanup
                try:
                    use_in_child()
                    os._exit(0)
                except BaseException:
                    os._exit(3)
            code = _wait_or_kill(pid, timeout=20)
            if code != 0:
                failures.append(f"fork {i}: " + ("deadlocked" if code is None else f"exit code {code}"))
    finally:
        stop.set()
        worker.join()
    return failures


def test_fork_during_buffer_updates_gives_a_usable_child():
    buf = PrioritizedReplay(1 << 18, SCHEMA, seed=0)
    buf.add(rows_with_ids(np.arange(1, 1 << 18)))
    rng = np.random.default_rng(0)
    idx = rng.integers(0, len(buf), 8192)  # large enough for the parallel update path

    def work() -> None:
        s = buf.sample(4096)
        buf.update_priorities(idx, rng.exponential(size=idx.size))
        buf.update_priorities(s.indices, np.ones(4096))

    def use_in_child() -> None:
        s = buf.sample(256)
        assert torn_rows(s.data).size == 0
        buf.update_priorities(s.indices, np.ones(256))
        buf.add(rows_with_ids(np.arange(1, 9)))

    assert _fork_during(work, use_in_child) == []


def test_fork_during_direct_tree_updates_gives_a_usable_child():
    # The Tianshou adapter drives a tree directly, without a buffer's lock.
    tree = make_tree("native", 1 << 18)
    tree.update(np.arange(1 << 18), np.ones(1 << 18))
    idx = np.random.default_rng(1).integers(0, 1 << 18, 16384)

    def work() -> None:
        tree.update(idx, np.full(idx.size, 2.0))
        tree.sample(4096, np.random.default_rng(0), 0.4)

    def use_in_child() -> None:
        tree.update(idx[:100], np.full(100, 3.0))
        tree.sample(64, np.random.default_rng(0), 0.4)

    assert _fork_during(work, use_in_child) == []


def test_pickled_buffer_gets_its_own_lock():
    import pickle

    buf = PrioritizedReplay(16, SCHEMA, seed=0)
    buf.add(rows_with_ids(np.arange(1, 5)))
    copy = pickle.loads(pickle.dumps(buf))
    assert copy._lock is not buf._lock
    copy.add(rows_with_ids(np.arange(5, 7)))
    assert (len(copy), len(buf)) == (6, 4)
