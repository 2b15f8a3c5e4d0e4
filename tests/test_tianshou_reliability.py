"""The Tianshou buffers under concurrent use, refused calls and bad input.

* Threads: adders, a sampler/updater and a pickler share one buffer. Every
  transition encodes one id ``k`` in all its fields (``obs = act = rew = k``,
  ``obs_next = k + 0.5``, ``info.k = k``, ``terminated = k % 5 == 0``), so a
  row mixing two transitions (a torn row) is visible, and the ids stored show
  whether a row was lost or a never-written slot counted as filled.
* Refused calls: everything observable (rows, priorities, position, length,
  max priority, both random generators) is snapshotted before a bad call and
  compared after it.
* Bad input: errors are ``TypeError``/``ValueError``/``IndexError`` naming the
  argument, what was expected and what was received.
"""

from __future__ import annotations

import copy
import os
import pickle
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import pytest

pytest.importorskip("tianshou")

from tianshou.data import Batch, ReplayBuffer  # noqa: E402

from hetero_replay.adapters.tianshou import (  # noqa: E402
    HeteroPrioritizedReplayBuffer,
    HeteroPrioritizedVectorReplayBuffer,
)

ENVS = 4
Buffer = HeteroPrioritizedReplayBuffer | HeteroPrioritizedVectorReplayBuffer


def rows_of(k: np.ndarray) -> Batch:
    """Transitions whose every field encodes its id ``k`` (ids start at 1: unwritten storage holds 0)."""
    k = np.asarray(k, dtype=np.int64)
    return Batch(obs=np.repeat(k[:, None], 3, axis=1).astype(np.float64), act=k, rew=k.astype(np.float64),
                 terminated=k % 5 == 0, truncated=np.zeros(len(k), bool),
                 obs_next=np.repeat(k[:, None], 3, axis=1) + 0.5, info=Batch(k=k))  # fmt: skip


def torn(batch: Batch) -> np.ndarray:
    """Rows whose fields do not all encode the same id."""
    k = batch.act
    return (
        np.any(batch.obs != k[:, None], axis=1)
        | (batch.rew != k)
        | np.any(batch.obs_next != k[:, None] + 0.5, axis=1)
        | (batch.info.k != k)
        | (batch.done != (k % 5 == 0))
    )


def make(kind: str, capacity: int, **kwargs: Any) -> Buffer:
    if kind == "single":
        return HeteroPrioritizedReplayBuffer(capacity, random_seed=0, **kwargs)
    return HeteroPrioritizedVectorReplayBuffer(capacity, ENVS, random_seed=0, **kwargs)


def add(buf: Buffer, k: np.ndarray, ids: np.ndarray) -> None:
    buf.add(rows_of(k), buffer_ids=[0] if isinstance(buf, HeteroPrioritizedReplayBuffer) else ids)


def stored_ids(buf: Buffer) -> np.ndarray:
    """Ids of every stored transition; checks the rows are whole and exactly the stored slots have priorities."""
    with buf.lock:
        indices = np.sort(buf.sample_indices(0))
        leaves = buf.priority_tree.leaves()
        assert len(indices) == len(buf)
        if not len(indices):  # copied before the first add: Tianshou has no fields to read yet
            assert not leaves.any()
            return np.empty(0, np.int64)
        batch = buf[indices]
    assert not torn(batch).any(), "a stored row mixes two transitions"
    np.testing.assert_array_equal(np.flatnonzero(leaves), indices)
    k = batch.act
    assert np.all(k > 0), "a never-written slot is counted as stored"
    assert len(np.unique(k)) == len(k), "a transition is stored twice"
    return k


@pytest.fixture
def fast_switching() -> Iterator[None]:
    """Switch threads every 10 µs (instead of 5 ms), so races show up within a short test."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    yield
    sys.setswitchinterval(before)


class Crew:
    """Threads that share a buffer; exceptions are collected and re-raised by :meth:`join`."""

    def __init__(self) -> None:
        self.threads: list[threading.Thread] = []
        self.errors: list[BaseException] = []
        self.stop = threading.Event()

    def start(self, target: Callable[[], None]) -> threading.Thread:
        def run() -> None:
            try:
                target()
            except BaseException as e:  # surfaced in join()
                self.errors.append(e)
                self.stop.set()

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        self.threads.append(thread)
        return thread

    def join(self, timeout: float = 60.0) -> None:
        for thread in self.threads:
            thread.join(timeout)
            assert not thread.is_alive(), "a thread hangs"
        if self.errors:
            raise self.errors[0]


class Adder:
    """Adds transitions with ids ``first_id, first_id + 1, ...``: one per call (single buffer) or one to each of 2 random envs.

    Records the ids it added and how many went to each env (``per_env``; one entry for the single buffer).
    """

    def __init__(self, buf: Buffer, crew: Crew, first_id: int, calls: int | None, seed: int) -> None:
        self.buf, self.crew, self.first_id, self.calls, self.seed = buf, crew, first_id, calls, seed
        self.single = isinstance(buf, HeteroPrioritizedReplayBuffer)
        self.ids: list[int] = []
        self.per_env = np.zeros(1 if self.single else ENVS, np.int64)

    def __call__(self) -> None:
        rng = np.random.default_rng(self.seed)
        k = self.first_id
        while not self.crew.stop.is_set() and (
            self.calls is None or len(self.ids) < self.calls * (1 if self.single else 2)
        ):
            envs = np.zeros(1, np.int64) if self.single else rng.choice(ENVS, 2, replace=False)
            add(self.buf, np.arange(k, k + len(envs)), envs)
            self.ids.extend(range(k, k + len(envs)))
            self.per_env[envs] += 1
            k += len(envs)


def sampler(buf: Buffer, crew: Crew, seed: int) -> Callable[[], None]:
    """Samples, checks the rows, feeds back random TD errors, reads weights and moves beta, until stopped."""

    def run() -> None:
        rng = np.random.default_rng(seed)
        while not crew.stop.is_set():
            if len(buf) == 0:
                continue
            batch, indices = buf.sample(32)
            assert not torn(batch).any(), f"torn rows sampled: {batch[torn(batch)]}"
            assert np.all(np.isfinite(batch.weight)) and np.all(batch.act > 0)
            buf.update_weight(indices, rng.random(32))
            again = buf[indices]
            assert not torn(again).any() and np.all(np.isfinite(buf.get_weight(indices)))
            buf.set_beta(float(rng.random()))

    return run


def pickler(buf: Buffer, crew: Crew) -> Callable[[], None]:
    """Pickles and deep-copies the buffer while it changes; every copy must be a consistent buffer."""

    def run() -> None:
        rounds = 0
        while not crew.stop.is_set() or rounds == 0:
            clone = pickle.loads(pickle.dumps(buf)) if rounds % 2 else copy.deepcopy(buf)
            stored_ids(clone)
            rounds += 1
            time.sleep(0.02)  # leave the lock to the others most of the time

    return run


@pytest.mark.parametrize("kind", ["single", "vector"])
def test_concurrent_adds_samples_updates_and_pickles_lose_and_tear_nothing(kind: str, fast_switching: None) -> None:
    buf = make(kind, 3200)  # room for every transition (the vector buffer's envs get ~600 of 800 each)
    crew = Crew()
    adders = [Adder(buf, crew, 1 + 100_000 * a, 400, a) for a in range(3)]
    threads = [crew.start(a) for a in adders]
    crew.start(sampler(buf, crew, 10))
    crew.start(pickler(buf, crew))
    for thread in threads:
        thread.join(60)
    crew.stop.set()
    crew.join()
    added = sorted(k for a in adders for k in a.ids)
    assert len(added) == 3 * 400 * (1 if kind == "single" else 2)
    np.testing.assert_array_equal(np.sort(stored_ids(buf)), added)  # every transition once, nothing else
    if kind == "vector":
        np.testing.assert_array_equal(buf._lengths, sum(a.per_env for a in adders))


@pytest.mark.parametrize("kind", ["single", "vector"])
def test_concurrent_use_of_a_wrapping_buffer(kind: str, fast_switching: None) -> None:
    """A small buffer overwritten all the time while sampled: no torn rows, exact counts, ~1.5 s."""
    buf = make(kind, 64)
    crew = Crew()
    adders = [Adder(buf, crew, 1 + 10_000_000 * a, None, a) for a in range(3)]
    for a in adders:
        crew.start(a)
    crew.start(sampler(buf, crew, 10))
    crew.start(pickler(buf, crew))
    time.sleep(1.5)
    crew.stop.set()
    crew.join()
    added = sum(a.per_env for a in adders)
    assert set(stored_ids(buf)) <= {k for a in adders for k in a.ids}
    size = buf.maxsize // len(added)
    lengths = [len(buf)] if kind == "single" else buf._lengths
    positions = [buf._insertion_idx] if kind == "single" else [child._insertion_idx for child in buf.buffers]
    np.testing.assert_array_equal(lengths, np.minimum(added, size))
    np.testing.assert_array_equal(positions, added % size)


@contextmanager
def forked_child(timeout: float = 30.0) -> Iterator[int]:
    """``os.fork()``; yields 0 in the child, the pid in the parent, which fails if the child hangs or fails."""
    pid = os.fork()
    yield pid
    if pid == 0:
        return
    deadline = time.monotonic() + timeout
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            pytest.fail("the forked child deadlocked")
        time.sleep(0.02)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, f"child failed with status {status}"


def child_uses(buf: Buffer) -> None:
    """In a forked child: the buffer must be consistent and usable; exits the child with 0 on success."""
    code = 1
    try:
        before = len(buf)
        stored_ids(buf)
        add(buf, np.array([999_999]), np.array([0]))
        _, indices = buf.sample(8)
        buf.update_weight(indices, np.ones(8))
        stored_ids(buf)
        code = 0 if len(buf) >= before else 3
    finally:
        os._exit(code)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
@pytest.mark.parametrize("kind", ["single", "vector"])
def test_fork_while_another_thread_holds_the_lock(kind: str) -> None:
    """The fork waits for the holder to finish, and the child gets a consistent buffer with a free lock."""
    buf = make(kind, 400)
    for k in range(1, 41):
        add(buf, np.array([k]), np.array([k % ENVS]))
    held = threading.Event()

    def hold() -> None:
        with buf.lock:
            held.set()
            time.sleep(0.3)

    holder = threading.Thread(target=hold)
    holder.start()
    held.wait()
    with forked_child() as pid:
        if pid == 0:
            child_uses(buf)
    holder.join()
    add(buf, np.array([41]), np.array([0]))  # the parent's lock was released after the fork
    stored_ids(buf)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
@pytest.mark.parametrize("kind", ["single", "vector"])
def test_fork_during_concurrent_adds_gives_the_child_a_consistent_buffer(kind: str, fast_switching: None) -> None:
    buf = make(kind, 400)
    crew = Crew()
    crew.start(Adder(buf, crew, 1, None, 0))
    crew.start(sampler(buf, crew, 1))
    time.sleep(0.2)
    for _ in range(3):
        with forked_child() as pid:
            if pid == 0:
                child_uses(buf)
    crew.stop.set()
    crew.join()
    stored_ids(buf)


def test_lock_is_dropped_by_pickle_deepcopy_and_hdf5(tmp_path) -> None:
    buf = make("vector", 40)
    for k in range(1, 9):
        add(buf, np.array([k]), np.array([k % ENVS]))
    path = str(tmp_path / "buf.hdf5")
    buf.save_hdf5(path)
    for clone in (
        pickle.loads(pickle.dumps(buf)),
        copy.deepcopy(buf),
        HeteroPrioritizedVectorReplayBuffer.load_hdf5(path),
    ):
        assert clone.lock is not buf.lock
        with clone.lock:  # a fresh, working lock
            np.testing.assert_array_equal(np.sort(stored_ids(clone)), np.arange(1, 9))


def test_pickle_stores_each_transition_once() -> None:
    """The sub-buffers' storage are views of the manager's: pickled once, re-linked on loading."""
    buf = make("vector", 4000)
    for k in range(1, 1001):
        add(buf, np.arange(4 * k, 4 * k + 4), np.arange(ENVS))
    assert len(pickle.dumps(buf)) < 1.5 * len(pickle.dumps(buf._meta))  # was over 2x: each child's view pickled too
    clone = pickle.loads(pickle.dumps(buf))
    assert all(np.shares_memory(child._meta.obs, clone._meta.obs) for child in clone.buffers)


# -- a refused call changes nothing ------------------------------------------------------------


def snapshot(buf: Buffer) -> dict[str, Any]:
    """Everything a refused call must leave as it was."""
    state = {
        "rows": copy.deepcopy(buf._meta),
        "priorities": buf.priority_tree.leaves(),
        "len": len(buf),
        "max_priority": buf.max_priority,
        "beta": buf.beta,
        "rng": copy.deepcopy(buf._rng.bit_generator.state),
        "legacy_rng": buf._random_state.get_state()[1].copy(),
        "last_index": buf.last_index.copy(),
    }
    if isinstance(buf, HeteroPrioritizedVectorReplayBuffer):
        state.update(
            lengths=buf._lengths.copy(), counters=buf._book.counters.copy(), ep_return=buf._book.ep_return.copy()
        )
    else:
        state.update(episode=(buf._insertion_idx, buf._size, np.copy(buf._ep_return), buf._ep_len, buf._ep_start_idx))
    return state


def assert_unchanged(before: dict[str, Any], buf: Buffer) -> None:
    after = snapshot(buf)
    assert before.keys() == after.keys()
    for key in before:
        if key == "rows":
            assert set(before[key].get_keys()) == set(after[key].get_keys()), "storage gained keys"
            assert before[key] == after[key], "stored rows changed"
        elif key == "rng":
            assert before[key] == after[key], "the sampling generator moved"
        else:
            np.testing.assert_equal(after[key], before[key], err_msg=key)


def full_vector() -> HeteroPrioritizedVectorReplayBuffer:
    buf = make("vector", 8)  # 2 slots per env
    for step in range(3):  # wraps around: slots 0, 2, 4, 6 hold the third step
        add(buf, 1 + 4 * step + np.arange(ENVS), np.arange(ENVS))
    buf.update_weight(np.arange(8), np.linspace(0.5, 4.0, 8))
    return buf


def bad_step(**changes: Any) -> Batch:
    step = rows_of(np.arange(100, 100 + ENVS))
    for key, value in changes.items():
        if value is None:
            step.pop(key)
        else:
            step[key] = value
    return step


@pytest.mark.parametrize(
    ("changes", "error", "match"),
    [
        (dict(rew=np.zeros((ENVS, 2))), ValueError, r"rew.*shape \(4,\).*\(4, 2\)"),
        (dict(rew=np.zeros(ENVS - 1)), ValueError, r"rew.*\(3,\)"),
        (dict(rew=np.array(["1"] * ENVS)), TypeError, "rew"),
        (dict(act=np.full(ENVS, 1.5)), TypeError, r"act.*int64.*float64"),
        (dict(obs=np.zeros((ENVS, 5))), ValueError, r"obs.*\(4, 3\).*\(4, 5\)"),
        (dict(obs=np.zeros(3)), ValueError, "obs"),  # NumPy would broadcast it over every env
        (dict(info=np.zeros(ENVS)), TypeError, "info"),
        (dict(terminated=np.array(["no"] * ENVS)), TypeError, "terminated"),
        (dict(truncated=None), ValueError, "truncated"),
        (dict(policy=np.float64(0.5)), ValueError, r"policy: expected 4 rows"),  # a key not stored yet
    ],
)
def test_refused_vector_add_changes_nothing(changes: dict, error: type, match: str) -> None:
    buf = full_vector()
    before = snapshot(buf)
    with pytest.raises(error, match=match):
        buf.add(bad_step(**changes))
    assert_unchanged(before, buf)
    add(buf, np.arange(100, 104), np.arange(ENVS))  # and the buffer still works
    stored_ids(buf)


def test_wrong_reward_shape_does_not_leave_a_torn_slot() -> None:
    """The case from the issue: slot 2 kept the new obs and the old reward."""
    buf = full_vector()
    old = buf[np.array([2])]
    with pytest.raises(ValueError, match="rew"):
        buf.add(bad_step(rew=np.zeros((ENVS, 2))))
    new = buf[np.array([2])]
    assert not torn(new).any() and new == old


@pytest.mark.parametrize(
    ("changes", "error", "match"),
    [
        (dict(rew=np.zeros((1, 2))), ValueError, "rew"),
        (dict(act=np.array([1.5])), TypeError, "act"),
        (dict(obs=np.zeros((1, 5))), ValueError, "obs"),
        (dict(terminated=None), ValueError, "terminated"),
    ],
)
def test_refused_single_add_changes_nothing(changes: dict, error: type, match: str) -> None:
    buf = make("single", 4)
    for k in range(1, 7):
        add(buf, np.array([k]), np.array([0]))
    before = snapshot(buf)
    step = rows_of(np.array([100]))
    for key, value in changes.items():
        if value is None:
            step.pop(key)
        else:
            step[key] = value
    with pytest.raises(error, match=match):
        buf.add(step, buffer_ids=[0])
    assert_unchanged(before, buf)
    with pytest.raises(ValueError, match="buffer_ids"):
        buf.add(rows_of(np.array([100])), buffer_ids=[1])  # Tianshou accepts any single id
    assert_unchanged(before, buf)


def test_refused_single_update_from_another_buffer_changes_nothing() -> None:
    buf = make("single", 8)
    for k in range(1, 4):
        add(buf, np.array([k]), np.array([0]))
    other = ReplayBuffer(8)
    other.add(Batch(obs=np.zeros((1, 7)), act=np.array([1]), rew=np.array([1.0]), terminated=np.array([False]),
                    truncated=np.array([False])), buffer_ids=[0])  # fmt: skip
    before = snapshot(buf)
    with pytest.raises(ValueError, match="obs"):
        buf.update(other)
    assert_unchanged(before, buf)


@pytest.mark.parametrize("kind", ["single", "vector"])
def test_refused_updates_samples_and_reads_change_nothing(kind: str) -> None:
    buf = make(kind, 40)
    for k in range(1, 11):
        add(buf, np.array([k]), np.array([k % ENVS]))
    stored = np.sort(buf.sample_indices(0))
    empty = int(np.flatnonzero(buf.priority_tree.leaves() == 0)[0])
    before = snapshot(buf)
    bad_calls: list[tuple[Callable[[], Any], type, str]] = [
        (lambda: buf.update_weight(stored[:2], np.array([True, False])), TypeError, r"TD errors.*bool"),
        (lambda: buf.update_weight(stored[:2], np.array(["1", "2"])), TypeError, "TD errors"),
        (lambda: buf.update_weight(stored[:2], np.array([object(), 1.0], dtype=object)), TypeError, "TD errors"),
        (lambda: buf.update_weight(stored[:2], np.array([1.0, np.nan])), ValueError, "position 1"),
        (lambda: buf.update_weight(np.array([stored[0], empty]), np.ones(2)), IndexError, f"{empty}.*no stored"),
        (lambda: buf.update_weight(stored[:2], np.ones(3)), ValueError, "TD errors"),
        (lambda: buf.sample(2.5), TypeError, r"batch_size.*integer.*2\.5"),
        (lambda: buf.sample(True), TypeError, "batch_size"),
        (lambda: buf.sample_indices("3"), TypeError, "batch_size"),
        (lambda: buf.get_weight(np.array([empty])), IndexError, "no stored"),
        (lambda: buf.get_weight(np.array([1.5])), TypeError, "index"),
        (lambda: buf[np.array([stored[0], empty])], IndexError, "no stored"),
        (lambda: buf[np.zeros(buf.maxsize, bool)], TypeError, "mask"),
        (lambda: buf.set_beta("0.5"), TypeError, r"beta.*str"),
        (lambda: buf.set_beta(True), TypeError, "beta"),
        (lambda: buf.set_beta(1.5), ValueError, r"beta.*\[0, 1\].*1\.5"),
        (lambda: buf.init_weight(np.array([0.5])), TypeError, "index"),
    ]
    for call, error, match in bad_calls:
        with pytest.raises(error, match=match):
            call()
        assert_unchanged(before, buf)


@pytest.mark.parametrize("kind", ["single", "vector"])
def test_sampling_an_empty_buffer_is_a_clear_error(kind: str) -> None:
    buf = make(kind, 40)
    before = snapshot(buf)
    for call in (lambda: buf.sample(4), lambda: buf.sample_indices(4)):
        with pytest.raises(ValueError, match="cannot sample 4 transitions from an empty buffer"):
            call()
    assert_unchanged(before, buf)
    assert len(buf.sample_indices(0)) == 0 and len(buf.sample_indices(-1)) == 0  # Tianshou's meanings stay


# -- bad arguments: precise errors ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        (dict(alpha="0.6"), TypeError, r"alpha must be a real number, got str '0\.6'"),
        (dict(alpha=None), TypeError, "alpha must be a real number, got NoneType"),
        (dict(alpha=True), TypeError, "alpha"),
        (dict(alpha=float("inf")), ValueError, "alpha"),
        (dict(beta="0.4"), TypeError, "beta must be a real number, got str"),
        (dict(beta=None), TypeError, "beta"),
        (dict(eps="1e-6"), TypeError, "eps"),
        (dict(eps=-1.0), ValueError, r"eps.*-1\.0"),
        (dict(total_size=True), TypeError, "total_size must be an integer, got bool"),
        (dict(total_size=100.0), TypeError, "total_size"),
        (dict(buffer_num="4"), TypeError, "buffer_num"),
        (dict(stratified="no"), TypeError, "stratified must be True or False, got str"),
        (dict(weight_norm="yes"), TypeError, "weight_norm must be True or False"),
        (dict(random_seed=1.5), TypeError, "random_seed must be an integer or None, got float"),
        (dict(fanout="16"), TypeError, "fanout"),
        (dict(stack_num=0), ValueError, "stack_num"),
        (dict(stack_num=1.5), TypeError, "stack_num"),
        (dict(ignore_obs_next="no"), TypeError, "ignore_obs_next"),
        (dict(save_only_last_obs=1), TypeError, "save_only_last_obs"),
    ],
)
def test_constructor_errors_name_the_argument(kwargs: dict, error: type, match: str) -> None:
    args = dict(total_size=100, buffer_num=4) | kwargs
    with pytest.raises(error, match=match):
        HeteroPrioritizedVectorReplayBuffer(**args)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        (dict(size=True), TypeError, "size must be an integer, got bool"),
        (dict(size="10"), TypeError, "size"),
        (dict(size=0), ValueError, "size must be >= 1, got 0"),
        (dict(beta=float("nan")), ValueError, "beta"),
    ],
)
def test_single_buffer_constructor_errors(kwargs: dict, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        HeteroPrioritizedReplayBuffer(**(dict(size=10) | kwargs))
