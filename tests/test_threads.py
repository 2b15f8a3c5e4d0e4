"""The C++ thread pool: parallel batches agree with serial ones, concurrent callers
don't corrupt the tree, and a forked child (SubprocVecEnv-style) still works."""

from __future__ import annotations

import os
import threading

import numpy as np
import pytest

import hetero_replay
from hetero_replay.trees import make_tree


@pytest.fixture
def threads():
    chosen = os.environ.get("HETERO_REPLAY_NUM_THREADS")
    yield hetero_replay.set_num_threads
    hetero_replay.set_num_threads(int(chosen) if chosen else None)  # the default, unless one was chosen


def run_ops(tree, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    for _ in range(5):
        tree.update_td(rng.integers(0, tree.capacity, 5000), rng.random(5000) * 3, 0.6, 1e-6)
    idx, w = tree.sample(5000, np.random.default_rng(seed), 0.4)
    return tree.leaves(), idx, w


def test_parallel_equals_serial(threads):
    threads(1)
    serial = run_ops(make_tree("native", 300_000), 0)
    threads(4)  # more threads than cores: still the same bits
    parallel = run_ops(make_tree("native", 300_000), 0)
    for a, b in zip(serial, parallel):
        np.testing.assert_array_equal(a, b)


def test_concurrent_callers_keep_the_tree_consistent(threads):
    threads(2)
    tree = make_tree("native", 100_000)
    tree.update(np.arange(100_000), np.ones(100_000))
    errors: list[BaseException] = []

    def worker(seed: int) -> None:
        rng = np.random.default_rng(seed)
        try:
            for _ in range(30):
                idx, _ = tree.sample(2048, rng, 0.4)
                tree.update_td(idx, rng.random(2048), 0.6, 1e-6)
        except BaseException as e:  # surfaced below
            errors.append(e)

    pool = [threading.Thread(target=worker, args=(s,)) for s in range(4)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    assert not errors
    fresh = make_tree("native", 100_000)
    fresh.load_leaves(tree.leaves())
    assert tree.total() == fresh.total() and tree.min() == fresh.min()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_pool_works_in_a_forked_child(threads):
    threads(2)
    tree = make_tree("native", 50_000)
    tree.update(np.arange(50_000), np.ones(50_000))
    tree.sample(4096, np.random.default_rng(0), 0.4)  # the parent's workers exist now
    pid = os.fork()
    if pid == 0:  # child: the parent's threads are gone; batches must still finish
        try:
            idx, _ = tree.sample(4096, np.random.default_rng(1), 0.4)
            tree.update_td(idx, np.ones(4096), 0.6, 1e-6)
            os._exit(0 if idx.max() < 50_000 else 1)
        except BaseException:
            os._exit(2)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0


def test_bad_thread_count():
    with pytest.raises(ValueError, match="num_threads must be >= 1"):
        hetero_replay.set_num_threads(0)


def test_none_restores_the_default_count(threads):
    threads(3)
    assert hetero_replay.num_threads() == 3
    threads(None)  # all hardware threads, of which a call uses those other processes leave idle
    assert hetero_replay.num_threads() == os.cpu_count()
