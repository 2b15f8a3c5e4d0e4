"""RelaxedReplay (hetero_replay.pipeline): the relaxed schedule, exactly, whatever the threads do.

Covered here:

* the schedule: a relaxed buffer's batches and final priorities equal, bit for
  bit, those of a serial reference loop written below (updates of steps
  ``<= t - k - 1`` applied before the draw of step ``t``, late updates to
  rewritten slots dropped), for several staleness / prefetch pairs, with and
  without adds, on the numpy, native and torch (CPU) trees, with the work on
  the worker thread or inline (and ``worker="auto"``), and in a small buffer
  that wraps while updates are queued;
* ``staleness=0`` is the wrapped buffer, bit for bit;
* reproducibility under perturbed thread timing;
* dropped late updates (which slots keep which priority, and the count);
* errors of queued updates: raised later, naming the step and position, and
  changing nothing; refused calls and constructions change nothing;
* exact undo of priority updates (snapshot / restore) on every tree;
* threads: none leaks (close, context manager, garbage collection,
  interpreter exit); fork gives the child a working buffer that continues
  like the parent;
* pickling, state_dict / load_state_dict, save / load; the alpha setter;
  IS weights computed with the ``beta`` of the ``sample`` call.

Three bugs these tests found are fixed (load_state_dict kept no write tracking;
which call raised a queued error depended on the thread timing; state_dict could
copy a generator the worker had advanced); their tests stay as regressions.
"""

from __future__ import annotations

import gc
import math
import os
import pickle
import random
import subprocess
import sys
import textwrap
import threading
import time
from collections import deque
from typing import Any

import numpy as np
import pytest

from hetero_replay import PEROptions, Priorities, PrioritizedReplay, _native, registry
from hetero_replay.checks import MAX_STALENESS
from hetero_replay.pipeline import RelaxedReplay
from tests.test_engine_concurrency import _wait_or_kill

SCHEMA = {"obs": ((4,), "float32"), "reward": ((), "float32")}
TREES = [t for t in ("numpy", "native", "torch") if t in registry.backends()]
WORKER = "hetero-replay-pipeline"
ALPHA, EPS = 0.6, 1e-6
#: IS exponents cycled through by the learner loops (1.0 and 0.0 included).
BETAS = (0.4, 1.0, 0.0, 0.7, 0.25)


def rows(n: int, start: int = 0) -> dict[str, np.ndarray]:
    """``n`` transitions whose values encode their insertion number ``start, start + 1, ...``."""
    k = np.arange(start, start + n, dtype=np.float64)
    return {
        "obs": np.stack([k, k + 0.25, k + 0.5, k + 0.75], axis=1).astype(np.float32),
        "reward": (k * 0.5).astype(np.float32),
    }


def make(capacity: int, tree: str = "numpy", seed: int = 0) -> PrioritizedReplay:
    return PrioritizedReplay(capacity, SCHEMA, alpha=ALPHA, beta=0.4, eps=EPS, tree=tree, seed=seed)


def td_errors(batch: Any, rng: np.random.Generator) -> np.ndarray:
    """TD errors as a deterministic function of the batch's rows and a fixed random stream."""
    return (batch.data["obs"][:, 0] % 7) * 0.3 + rng.random(len(batch.indices))


def td_by_index(indices: Any) -> np.ndarray:
    """TD errors that depend on the slot only, so duplicate indices carry equal values."""
    return 0.1 + (np.asarray(indices) % 13) * 0.25


def priority(td: Any, alpha: float = ALPHA, eps: float = EPS) -> np.ndarray:
    return ((np.abs(np.asarray(td, np.float64)) + eps) ** alpha).astype(np.float32)


def pipeline_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == WORKER and t.is_alive()]


def settle(buf: RelaxedReplay) -> Any:
    """The schedule's generator state (``buf.rng``): batches drawn ahead are given back, and the
    worker draws none until the next sample, so the state stays put while the test looks."""
    return buf.rng.bit_generator.state


def wait_until(condition: Any, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.005)
    return condition()


@pytest.fixture
def relaxed():
    """Builds RelaxedReplay objects and closes them all at teardown (no worker outlives a test).

    Their work runs on the worker thread unless a test names another ``worker`` mode: ``"auto"``
    would keep these small loops on the learner's thread, and the thread is what can race.
    """
    made: list[RelaxedReplay] = []

    def build(
        replay: PrioritizedReplay, staleness: int = 1, prefetch: int = 1, worker: str = "thread"
    ) -> RelaxedReplay:
        buf = RelaxedReplay(replay, staleness=staleness, prefetch=prefetch, worker=worker)
        made.append(buf)
        return buf

    yield build
    for buf in made:
        buf.close()


# -- the two loops: a serial reference of the schedule, and the learner's loop on a relaxed buffer --


def add_plan(steps: int, every: int, n: int) -> list[int]:
    """Rows added before the sample of each step: ``n`` at steps ``t % every == 1``, none if ``every`` is 0."""
    return [n if every and t % every == 1 else 0 for t in range(steps)]


def reference_run(
    replay: PrioritizedReplay,
    k: int,
    initial: int,
    adds: list[int],
    batch_size: int,
    record_draws: bool = False,
    depth: int = 1,
) -> dict[str, Any]:
    """The schedule with staleness ``k``, serially, on a plain buffer (see the module docstring of pipeline).

    Serving the batch of step ``t`` releases the batches of steps up to ``t + d`` (``d = min(depth, k)``):
    each is drawn right then, after the updates of steps ``<= step - k - 1``, so rows added after that
    serve are not in it (they are in the batches released later).
    """
    d = min(depth, k)
    replay.track_writes()
    replay.add(rows(initial))
    added = initial
    rng = np.random.default_rng(123)
    queue: deque[tuple[int, np.ndarray, np.ndarray, int]] = deque()
    drawn: dict[int, tuple[Any, int, Any]] = {}  # step -> (batch, epoch, draw record)
    batches, draws, dropped = [], [], 0

    def draw(step: int) -> None:
        nonlocal dropped
        while queue and queue[0][0] <= step - k - 1:
            _, idx, td, epoch = queue.popleft()
            dropped += replay.update_priorities_since(idx, td, epoch)[0]
        record = None
        if record_draws:
            leaves = replay.priorities.leaves()
            record = (leaves, float(leaves[: len(replay)].min()))
        epoch = replay.write_epoch
        drawn[step] = (replay.sample(batch_size, 1.0), epoch, record)

    for t, n in enumerate(adds):
        if n:
            replay.add(rows(n, added))
            added += n
        if t not in drawn:
            draw(t)
        b, epoch, record = drawn.pop(t)
        if record_draws:
            draws.append(record)
        for step in range(t + 1, t + 1 + d):  # released by this serve
            if step not in drawn:
                draw(step)
        beta = BETAS[t % len(BETAS)]
        weights = _native.raised_weights(b.weights, beta)  # as every executor raises them
        batches.append((b.indices.copy(), weights, {f: a.copy() for f, a in b.data.items()}))
        queue.append((t, b.indices.copy(), td_errors(b, rng), epoch))
    while queue:
        _, idx, td, epoch = queue.popleft()
        dropped += replay.update_priorities_since(idx, td, epoch)[0]
    return {
        "batches": batches,
        "leaves": replay.priorities.leaves(),
        "max_priority": replay.max_priority,
        "dropped": dropped,
        "draws": draws,
    }


def learner_run(buf: Any, initial: int, adds: list[int], batch_size: int, pause: Any = None) -> dict[str, Any]:
    """The learner's loop (add, sample, update) on ``buf``; ``pause()`` runs between calls."""
    buf.add(rows(initial))
    added = initial
    rng = np.random.default_rng(123)
    batches = []
    for t, n in enumerate(adds):
        if n:
            buf.add(rows(n, added))
            added += n
        if pause:
            pause()
        b = buf.sample(batch_size, BETAS[t % len(BETAS)])
        batches.append((b.indices.copy(), np.array(b.weights, copy=True), {f: a.copy() for f, a in b.data.items()}))
        if pause:
            pause()
        buf.update_priorities(b.indices, td_errors(b, rng))
    if isinstance(buf, RelaxedReplay):
        buf.flush()
    return {
        "batches": batches,
        "leaves": buf.priorities.leaves(),
        "max_priority": buf.max_priority,
        "dropped": getattr(buf, "dropped_updates", 0),
    }


def assert_same_batches(got: list, want: list) -> None:
    assert len(got) == len(want)
    for t, ((gi, gw, gd), (wi, ww, wd)) in enumerate(zip(got, want)):
        assert np.array_equal(gi, wi), f"indices differ at step {t}"
        assert gw.dtype == ww.dtype and np.array_equal(gw, ww), f"weights differ at step {t}"
        for name in wd:
            assert np.array_equal(gd[name], wd[name]), f"field {name!r} differs at step {t}"


def assert_same_run(got: dict, want: dict) -> None:
    assert_same_batches(got["batches"], want["batches"])
    assert np.array_equal(got["leaves"], want["leaves"])
    assert got["max_priority"] == want["max_priority"]
    assert got["dropped"] == want["dropped"]


# -- 1. the schedule equals the serial reference ----------------------------------------------------


def executors(tree: str) -> list[str]:
    """The executors that can run a buffer on ``tree``: the native one needs the C++ tree."""
    return ["thread", "inline", *(["native"] if tree == "native" else [])]


TREE_WORKERS = [(tree, worker) for tree in TREES for worker in executors(tree)]


@pytest.mark.parametrize("tree, worker", TREE_WORKERS)
@pytest.mark.parametrize("adds_every", [0, 3], ids=["no-adds", "adds"])
@pytest.mark.parametrize("k, prefetch", [(1, 1), (2, 1), (2, 2), (4, 4), (8, 3)])
def test_batches_and_priorities_equal_the_serial_schedule(relaxed, tree, adds_every, k, prefetch, worker):
    adds = add_plan(40, adds_every, 8)
    want = reference_run(make(256, tree), k, 48, adds, 32, depth=prefetch)
    got = learner_run(relaxed(make(256, tree), k, prefetch, worker), 48, adds, 32)
    assert_same_run(got, want)
    assert got["dropped"] == 0  # nothing wraps here
    # the reference is not strict PER in disguise: lagging updates change what is drawn
    strict = reference_run(make(256, tree), 0, 48, adds, 32)
    assert any(not np.array_equal(a[0], b[0]) for a, b in zip(want["batches"], strict["batches"]))


@pytest.mark.parametrize("tree, worker", TREE_WORKERS)
@pytest.mark.parametrize("k, prefetch", [(2, 1), (4, 4)])
def test_a_wrapping_buffer_drops_exactly_the_late_updates_the_schedule_drops(relaxed, tree, k, prefetch, worker):
    adds = [8] * 30  # 8 of 64 slots rewritten every step while k steps of updates are queued
    want = reference_run(make(64, tree), k, 64, adds, 16, depth=prefetch)
    got = learner_run(relaxed(make(64, tree), k, prefetch, worker), 64, adds, 16)
    assert_same_run(got, want)
    assert got["dropped"] > 0


def test_auto_worker_mode_serves_the_schedules_batches_before_and_after_it_picks_a_thread(relaxed):
    # 80 steps: past the measuring window, after which "auto" may move the work to the thread (timing decides)
    adds = add_plan(80, 5, 8)
    want = reference_run(make(512), 2, 48, adds, 32, depth=2)
    got = learner_run(relaxed(make(512), 2, 2, "auto"), 48, adds, 32)
    assert_same_run(got, want)


# -- 2. staleness 0 is the strict buffer ------------------------------------------------------------


@pytest.mark.parametrize("tree", TREES)
def test_staleness_zero_is_the_strict_buffer_bit_for_bit(relaxed, tree):
    before = set(pipeline_threads())
    adds = add_plan(30, 3, 8)
    want = learner_run(make(256, tree), 48, adds, 32)
    got = learner_run(relaxed(make(256, tree), staleness=0), 48, adds, 32)
    assert_same_run(got, want)
    assert set(pipeline_threads()) <= before  # no worker for strict PER


# -- 3. reproducible whatever the timing ------------------------------------------------------------


def test_same_seed_same_batches_whatever_the_thread_timing(relaxed):
    adds = add_plan(60, 4, 8)
    calm = learner_run(relaxed(make(256), 2, 2), 48, adds, 32)

    stop = threading.Event()

    def busy() -> None:  # competes with the worker for the GIL and the cores
        m = np.random.default_rng(0).random((48, 48))
        while not stop.is_set():
            m = np.tanh(m @ m)

    noise = threading.Thread(target=busy, daemon=True)
    noise.start()
    jitter = random.Random(7)
    try:
        shaken = learner_run(relaxed(make(256), 2, 2), 48, adds, 32, pause=lambda: time.sleep(jitter.uniform(0, 0.002)))
    finally:
        stop.set()
        noise.join()
    assert_same_run(shaken, calm)


# -- 4. late updates to rewritten slots are dropped -------------------------------------------------


def test_late_updates_to_rewritten_slots_are_dropped_and_counted(relaxed):
    replay = make(8, seed=3)
    replay.add(rows(8))
    replay.update_priorities(np.arange(8), 0.2 * np.arange(1, 9))  # max priority 1.6 + eps
    max_before = replay.max_priority
    new_leaf = np.float32(max_before**ALPHA)  # what an add gives a row
    buf = relaxed(replay, staleness=2)

    batch = buf.sample(16)
    idx = batch.indices.copy()
    buf.add(rows(4, 8))  # the ring is full at position 0: slots 0..3 now hold other transitions
    overwritten = idx < 4
    assert overwritten.any() and (~overwritten).any()  # the seed gives both kinds
    td = np.where(overwritten, 10.0, td_by_index(idx) / 2)  # only the dropped entries would raise the max priority
    leaves_before = buf.priorities.leaves()
    buf.update_priorities(idx, td)
    buf.flush()

    leaves = buf.priorities.leaves()
    assert buf.dropped_updates == int(overwritten.sum())  # entries, duplicates included
    np.testing.assert_array_equal(leaves[:4], np.full(4, new_leaf))
    kept = np.unique(idx[~overwritten])
    np.testing.assert_allclose(leaves[kept], priority(td_by_index(kept) / 2), rtol=1e-6)
    untouched = np.setdiff1d(np.arange(4, 8), kept)
    np.testing.assert_array_equal(leaves[untouched], leaves_before[untouched])
    assert buf.max_priority == max_before  # dropped entries count for nothing

    # bit for bit what the engine gives when only the kept entries are applied
    ref = make(8, seed=3)
    ref.add(rows(8))
    ref.update_priorities(np.arange(8), 0.2 * np.arange(1, 9))
    ref.add(rows(4, 8))
    ref.update_priorities(idx[~overwritten], td[~overwritten])
    np.testing.assert_array_equal(leaves, ref.priorities.leaves())


# -- 5. errors of queued updates --------------------------------------------------------------------


def _errors_setup(relaxed: Any, worker: str = "thread") -> tuple[RelaxedReplay, np.ndarray, float]:
    buf = relaxed(make(64), 1, 1, worker)
    buf.add(rows(40))
    for _ in range(6):  # learner steps 0..5
        b = buf.sample(8)
        buf.update_priorities(b.indices, td_by_index(b.indices) * 2)
    buf.flush()
    return buf, buf.priorities.leaves(), buf.max_priority


def _bad_update(buf: RelaxedReplay, bad: str) -> None:
    b = buf.sample(8)  # learner step 6
    idx, td = b.indices.copy(), td_by_index(b.indices) * 3
    if bad == "nan":
        td[3] = np.nan
    else:
        idx[3] = 1000
    buf.update_priorities(idx, td)  # queued: returns without raising


BAD = [("nan", ValueError, r"learner step 6\b.*position 3"), ("index", IndexError, r"learner step 6\b.*position 3")]


@pytest.mark.parametrize("bad, error, match", BAD, ids=["nan-td", "index-out-of-range"])
def test_a_bad_queued_update_is_raised_by_flush_and_changes_nothing(relaxed, bad, error, match):
    buf, leaves, max_priority = _errors_setup(relaxed)
    _bad_update(buf, bad)
    with pytest.raises(error, match=match):
        buf.flush()
    np.testing.assert_array_equal(buf.priorities.leaves(), leaves)
    assert buf.max_priority == max_priority
    buf.flush()  # raised once, then gone

    b = buf.sample(8)  # the buffer keeps working
    buf.update_priorities(b.indices, td_by_index(b.indices) * 5)
    buf.flush()
    np.testing.assert_allclose(buf.priorities.leaves()[b.indices], priority(td_by_index(b.indices) * 5), rtol=1e-6)


@pytest.mark.parametrize("worker", ["thread", "inline"])
@pytest.mark.parametrize("bad, error, match", BAD, ids=["nan-td", "index-out-of-range"])
def test_a_bad_queued_update_is_raised_by_a_following_sample_and_changes_nothing(relaxed, bad, error, match, worker):
    buf, leaves, max_priority = _errors_setup(relaxed, worker)
    _bad_update(buf, bad)
    raised = None
    for call in range(1, 4):  # the sample whose batch needs the update
        try:
            buf.sample(8)
        except error as e:
            raised = call
            assert e.__cause__ is not None
            with pytest.raises(error, match=match):
                raise e
            break
    assert raised is not None
    buf.flush()
    np.testing.assert_array_equal(buf.priorities.leaves(), leaves)
    assert buf.max_priority == max_priority
    b = buf.sample(8)
    buf.update_priorities(b.indices, td_by_index(b.indices) * 5)
    buf.flush()
    np.testing.assert_allclose(buf.priorities.leaves()[b.indices], priority(td_by_index(b.indices) * 5), rtol=1e-6)


def test_which_call_raises_a_queued_error_does_not_depend_on_the_worker(relaxed):
    def first_raising_call(worker: str) -> int | None:
        buf = relaxed(make(64), 1, 1, worker)
        core = buf._core
        assert core is not None

        def let_the_worker_finish() -> None:  # a legal timing: the worker is never behind the learner
            if worker == "thread":
                idle = lambda: core.thread is None or bool(core.errors) or len(core.ready) >= core.depth  # noqa: E731
                assert wait_until(idle)

        buf.add(rows(40))
        for _ in range(4):
            let_the_worker_finish()
            b = buf.sample(8)
            buf.update_priorities(b.indices, td_by_index(b.indices))
        let_the_worker_finish()
        b = buf.sample(8)
        td = td_by_index(b.indices)
        td[3] = np.nan
        buf.update_priorities(b.indices, td)
        for call in range(1, 5):
            let_the_worker_finish()
            try:
                buf.sample(8)
            except ValueError:
                return call
        return None

    assert first_raising_call("thread") == first_raising_call("inline")  # thread: 1 or 2 (by timing), inline: 3


def test_mismatched_lengths_are_refused_at_once(relaxed):
    buf, leaves, _ = _errors_setup(relaxed)
    b = buf.sample(8)
    with pytest.raises(ValueError, match="8 indices but 7 TD errors"):
        buf.update_priorities(b.indices, np.ones(7))
    buf.update_priorities(b.indices, td_by_index(b.indices))  # the step's real update is still accepted
    buf.flush()
    np.testing.assert_allclose(buf.priorities.leaves()[b.indices], priority(td_by_index(b.indices)), rtol=1e-6)


# -- 6. refused calls change nothing ----------------------------------------------------------------


def _observable(buf: RelaxedReplay) -> dict[str, Any]:
    return {
        "rng": buf.replay.rng.bit_generator.state,
        "position": buf.position,
        "len": len(buf),
        "leaves": buf.priorities.leaves(),
        "max_priority": buf.max_priority,
        "obs": buf.read_rows("obs", np.arange(buf.capacity)).copy(),
    }


def test_refused_sample_and_add_calls_change_nothing(relaxed):
    def driven() -> RelaxedReplay:
        buf = relaxed(make(64), 2, 2)
        buf.add(rows(30))
        for _ in range(5):
            b = buf.sample(8)
            buf.update_priorities(b.indices, td_by_index(b.indices))
        settle(buf)
        return buf

    buf, twin = driven(), driven()
    before = _observable(buf)
    bad_calls = [
        (ValueError, lambda: buf.sample(0)),
        (ValueError, lambda: buf.sample(-1)),
        (TypeError, lambda: buf.sample(2.5)),
        (ValueError, lambda: buf.sample(8, beta=2)),
        (ValueError, lambda: buf.add({"obs": np.zeros((3, 4), np.float32), "rewrd": np.zeros(3, np.float32)})),
        (ValueError, lambda: buf.add({"obs": np.zeros((3, 5), np.float32), "reward": np.zeros(3, np.float32)})),
    ]
    for error, call in bad_calls:
        with pytest.raises(error):
            call()
        after = _observable(buf)
        assert after["rng"] == before["rng"]
        assert (after["position"], after["len"], after["max_priority"]) == (
            before["position"],
            before["len"],
            before["max_priority"],
        )
        np.testing.assert_array_equal(after["leaves"], before["leaves"])
        np.testing.assert_array_equal(after["obs"], before["obs"])
    # and the learner goes on exactly as a twin that never made the bad calls
    for _ in range(5):
        a, b = buf.sample(8), twin.sample(8)
        assert np.array_equal(a.indices, b.indices) and np.array_equal(a.weights, b.weights)
        buf.update_priorities(a.indices, td_by_index(a.indices))
        twin.update_priorities(b.indices, td_by_index(b.indices))


def test_sampling_an_empty_relaxed_buffer_is_refused_and_changes_nothing(relaxed):
    buf = relaxed(make(16), 2)
    state = buf.replay.rng.bit_generator.state
    with pytest.raises(ValueError, match="empty"):
        buf.sample(4)
    assert buf.replay.rng.bit_generator.state == state
    buf.add(rows(4))
    assert buf.sample(4).indices.shape == (4,)


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (dict(staleness=-1), ValueError, "staleness"),
        (dict(staleness=1.5), TypeError, "staleness"),
        (dict(staleness=True), TypeError, "staleness"),
        (dict(staleness=2000), ValueError, "staleness"),
        (dict(staleness=MAX_STALENESS + 1), ValueError, "staleness"),
        (dict(prefetch=0), ValueError, "prefetch"),
        (dict(prefetch=-2), ValueError, "prefetch"),
        (dict(prefetch=1.0), TypeError, "prefetch"),
        (dict(worker="process"), ValueError, "worker"),
        (dict(worker=None), ValueError, "worker"),
    ],
)
def test_bad_construction_is_refused_naming_the_argument(kwargs, error, match):
    before = set(pipeline_threads())
    with pytest.raises(error, match=match):
        RelaxedReplay(make(8), **kwargs)
    assert set(pipeline_threads()) <= before


def test_only_a_prioritized_replay_can_be_wrapped():
    with pytest.raises(TypeError, match="PrioritizedReplay"):
        RelaxedReplay(object())
    with pytest.raises(TypeError, match="PrioritizedReplay"):
        RelaxedReplay(Priorities(8))


def test_the_largest_staleness_is_accepted(relaxed):
    assert relaxed(make(8), MAX_STALENESS, 3).staleness == MAX_STALENESS


# -- 7. undo is exact -------------------------------------------------------------------------------


def _tree_state(pr: Priorities) -> tuple:
    return pr.leaves(), pr.tree.total(), pr.tree.min(), pr.max_priority


def _assert_tree_state(got: tuple, want: tuple) -> None:
    np.testing.assert_array_equal(got[0], want[0])
    assert got[0].dtype == want[0].dtype
    assert got[1:] == want[1:]


UPDATES = [
    (np.array([3, 7, 7, 20, 3, 63]), np.array([0.5, 2.0, 0.25, 1e-3, 4.0, 0.75])),  # duplicates
    (np.arange(0, 64, 5), np.full(13, 7.5)),  # raises the max priority
    (np.array([0, 1, 2, 3]), np.zeros(4)),  # the smallest priority: moves the tree's min
    (np.array([7, 7, 7]), np.array([30.0, 0.1, 2.0])),  # raises it again, duplicates only
]


@pytest.mark.parametrize("tree", TREES)
def test_restoring_snapshots_in_reverse_undoes_updates_exactly(tree):
    pr = Priorities(64, PEROptions(alpha=ALPHA, eps=EPS, tree=tree))
    pr.assign_new(np.arange(64))
    pr.update(np.arange(64), np.random.default_rng(0).random(64) * 3)
    before = _tree_state(pr)
    snapshots = []
    for idx, td in UPDATES:
        snapshots.append(pr.snapshot(idx))
        pr.update(idx, td)
    assert pr.max_priority > before[3]
    assert not np.array_equal(pr.leaves(), before[0])
    for snap in reversed(snapshots):
        pr.restore(snap)
    _assert_tree_state(_tree_state(pr), before)


@pytest.mark.parametrize("tree", TREES)
def test_engine_undo_of_late_updates_is_exact(tree):
    replay = make(64, tree)
    epoch0 = replay.track_writes()
    replay.add(rows(64))
    replay.update_priorities(np.arange(64), np.random.default_rng(1).random(64))
    epoch = replay.write_epoch
    replay.add(rows(4, 64))  # slots 0..3 rewritten after `epoch`: entries for them are dropped
    assert replay.write_epoch > epoch > epoch0
    before = _tree_state(replay.priorities)
    snapshots, dropped = [], 0
    for idx, td in UPDATES:
        d, snap = replay.update_priorities_since(idx, td, epoch, keep_undo=True)
        dropped += d
        snapshots.append(snap)
    assert dropped == int(sum((idx < 4).sum() for idx, _ in UPDATES))
    assert replay.max_priority > before[3]
    for snap in reversed(snapshots):
        replay.restore_priorities(snap)
    _assert_tree_state(_tree_state(replay.priorities), before)


# -- 8. no thread leaks -----------------------------------------------------------------------------


def _start_worker(buf: RelaxedReplay) -> threading.Thread:
    buf.add(rows(32))
    for _ in range(4):
        b = buf.sample(8)
        buf.update_priorities(b.indices, td_by_index(b.indices))
    assert buf._core is not None
    worker = buf._core.thread
    assert worker is not None and worker.is_alive() and worker.name == WORKER
    return worker


def test_close_stops_the_worker():
    gc.collect()
    baseline = threading.active_count()
    buf = RelaxedReplay(make(64), 2, 2, worker="thread")
    worker = _start_worker(buf)
    assert threading.active_count() == baseline + 1
    buf.close()
    assert not worker.is_alive()
    assert threading.active_count() == baseline


def test_the_context_manager_stops_the_worker():
    gc.collect()
    baseline = threading.active_count()
    with RelaxedReplay(make(64), 3, 1, worker="thread") as buf:
        worker = _start_worker(buf)
    assert not worker.is_alive()
    assert threading.active_count() == baseline


def test_garbage_collection_stops_the_worker():
    gc.collect()
    baseline = threading.active_count()
    buf = RelaxedReplay(make(64), 2, 2, worker="thread")
    worker = _start_worker(buf)
    b = buf.sample(8)
    buf.update_priorities(b.indices, td_by_index(b.indices))  # an update queued
    del buf, b
    gc.collect()
    assert wait_until(lambda: not worker.is_alive(), timeout=5)
    assert wait_until(lambda: threading.active_count() == baseline, timeout=5)


def test_interpreter_exit_with_a_running_worker_does_not_hang():
    code = textwrap.dedent(
        """
        import threading
        import numpy as np
        from hetero_replay import PrioritizedReplay
        from hetero_replay.pipeline import RelaxedReplay

        schema = {"obs": ((4,), "float32"), "reward": ((), "float32")}
        buf = RelaxedReplay(PrioritizedReplay(256, schema, seed=0), staleness=4, prefetch=4, worker="thread")
        buf.add({"obs": np.ones((200, 4), np.float32), "reward": np.ones(200, np.float32)})
        for t in range(20):
            b = buf.sample(32)
            buf.update_priorities(b.indices, np.full(32, t + 1.0))
        assert any(t.name == "hetero-replay-pipeline" for t in threading.enumerate())
        print("sampled")
        """
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "sampled" in done.stdout


# -- 9. fork ----------------------------------------------------------------------------------------


def _continue(buf: RelaxedReplay, steps: int) -> dict[str, Any]:
    batches = []
    for t in range(steps):
        b = buf.sample(16, BETAS[t % len(BETAS)])
        batches.append((b.indices.copy(), np.array(b.weights, copy=True), {f: a.copy() for f, a in b.data.items()}))
        buf.update_priorities(b.indices, td_by_index(b.indices) * (t + 1))
    buf.flush()
    return {"batches": batches, "leaves": buf.priorities.leaves(), "max_priority": buf.max_priority}


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork (POSIX)")
def test_a_forked_child_continues_exactly_like_the_parent(relaxed, tmp_path):
    buf = relaxed(make(128), 2, 2)
    buf.add(rows(100))
    for t in range(6):
        b = buf.sample(16)
        buf.update_priorities(b.indices, td_by_index(b.indices) + t)  # the last two steps' updates stay queued
    out = tmp_path / "child.pkl"
    pid = os.fork()
    if pid == 0:  # the child: never return into pytest
        code = 1
        try:
            result = _continue(buf, 5)
            result["own_worker"] = any(t.name == WORKER for t in threading.enumerate())
            out.write_bytes(pickle.dumps(result))
            code = 0
        finally:
            os._exit(code)
    parent = _continue(buf, 5)
    assert _wait_or_kill(pid, timeout=30) == 0
    child = pickle.loads(out.read_bytes())
    assert child["own_worker"]  # the child started a worker of its own
    assert_same_batches(child["batches"], parent["batches"])
    np.testing.assert_array_equal(child["leaves"], parent["leaves"])
    assert child["max_priority"] == parent["max_priority"]


# -- 10. pickle, state_dict, save / load ------------------------------------------------------------


def _driven(relaxed: Any, tree: str = "numpy") -> tuple[RelaxedReplay, np.ndarray]:
    """A k=2 buffer after some steps, with the last step's update queued; returns it and that batch's indices."""
    buf = relaxed(make(128, tree), 2, 2)
    buf.add(rows(100))
    for t in range(6):
        b = buf.sample(16)
        buf.update_priorities(b.indices, td_by_index(b.indices) * (1 + t % 3))
    b = buf.sample(16)
    settle(buf)
    buf.update_priorities(b.indices, td_by_index(b.indices) * 40)  # raises the max priority
    return buf, b.indices.copy()


def _assert_same_replay_state(a: RelaxedReplay, b: RelaxedReplay) -> None:
    np.testing.assert_array_equal(a.priorities.leaves(), b.priorities.leaves())
    assert (a.position, len(a), a.max_priority) == (b.position, len(b), b.max_priority)
    assert a.replay.rng.bit_generator.state == b.replay.rng.bit_generator.state
    np.testing.assert_array_equal(a.read_rows("obs", np.arange(a.capacity)), b.read_rows("obs", np.arange(b.capacity)))


def _assert_continue_alike(a: RelaxedReplay, b: RelaxedReplay, steps: int = 5) -> None:
    assert_same_batches(_continue(a, steps)["batches"], _continue(b, steps)["batches"])


def test_pickling_flushes_and_keeps_the_staleness(relaxed):
    buf, last = _driven(relaxed)
    copy = pickle.loads(pickle.dumps(buf))
    try:
        assert isinstance(copy, RelaxedReplay)
        assert (copy.staleness, copy.prefetch) == (2, 2)
        buf.flush()
        settle(buf)
        _assert_same_replay_state(copy, buf)
        np.testing.assert_allclose(copy.priorities.leaves()[last], priority(td_by_index(last) * 40), rtol=1e-6)
        _assert_continue_alike(copy, buf)
    finally:
        copy.close()


def test_state_dict_flushes_first(relaxed):
    buf, last = _driven(relaxed)
    state = buf.state_dict()
    np.testing.assert_allclose(state["priorities"][last], priority(td_by_index(last) * 40), rtol=1e-6)
    assert state["max_priority"] == pytest.approx(float(td_by_index(last).max() * 40) + EPS)
    np.testing.assert_array_equal(state["priorities"], buf.priorities.leaves()[:100])
    assert state["rng_state"] == settle(buf)


def test_load_state_dict_discards_queued_updates(relaxed):
    buf, _ = _driven(relaxed)
    state = buf.state_dict()
    other, _ = _driven(relaxed)  # same history; its last update is still queued
    other_b = other.sample(16)
    other.update_priorities(other_b.indices, np.full(16, 1e3))  # queued, then discarded by the load
    other.load_state_dict(state)
    np.testing.assert_array_equal(other.priorities.leaves()[:100], state["priorities"])
    other.flush()
    np.testing.assert_array_equal(other.priorities.leaves()[:100], state["priorities"])
    assert other.max_priority == state["max_priority"]
    assert other.dropped_updates == 0
    assert settle(other) == state["rng_state"]
    assert other.sample(16).indices.shape == (16,)


def test_a_relaxed_buffer_goes_on_after_load_state_dict(relaxed):
    buf, _ = _driven(relaxed)
    state = buf.state_dict()
    other, _ = _driven(relaxed)
    other.load_state_dict(state)
    _assert_continue_alike(other, buf)  # sample, update, flush: the same batches as the buffer saved


def test_an_update_of_a_batch_drawn_before_load_state_dict_is_dropped(relaxed):
    buf, _ = _driven(relaxed)
    state = buf.state_dict()
    other, _ = _driven(relaxed)
    old = other.sample(16)  # drawn before the load: every slot holds another transition after it
    other.load_state_dict(state)
    other.update_priorities(old.indices, np.full(16, 1e3))
    other.flush()
    assert other.dropped_updates == 16
    np.testing.assert_array_equal(other.priorities.leaves()[:100], state["priorities"])


def test_save_and_load_round_trip(relaxed, tmp_path):
    buf, last = _driven(relaxed)
    path = tmp_path / "relaxed.hrp"
    buf.save(path)
    loaded = RelaxedReplay.load(path, staleness=2, prefetch=2)
    try:
        assert (loaded.staleness, loaded.prefetch) == (2, 2)
        settle(buf)
        _assert_same_replay_state(loaded, buf)
        np.testing.assert_allclose(loaded.priorities.leaves()[last], priority(td_by_index(last) * 40), rtol=1e-6)
        _assert_continue_alike(loaded, buf)
    finally:
        loaded.close()


def test_state_dict_holds_the_schedules_generator_state_whatever_the_timing(relaxed):
    buf = relaxed(make(128), 2, 2)
    buf.add(rows(100))
    for t in range(6):
        b = buf.sample(16)
        buf.update_priorities(b.indices, td_by_index(b.indices) * (1 + t))
    core, copy_state = buf._core, buf.replay.state_dict
    assert core is not None

    # One legal interleaving, made deterministic: the worker, woken by the learner's sample, gets the
    # pipeline lock only after the flush in state_dict; the learner's thread is descheduled right there.
    core.lock.acquire()  # the learner's thread holds the pipeline lock (re-entrant) until the flush is done

    def descheduled_learner() -> dict:
        core.lock.release()  # the flush is over: the worker can take the lock now
        time.sleep(0.2)  # time enough for the worker to draw ahead, were it allowed to
        assert not core.ready  # it is not: the flush holds it until the next sample
        return copy_state()

    try:
        buf.sample(16)  # wakes the worker, which must wait for the lock
        buf.replay.state_dict = descheduled_learner
        state = buf.state_dict()
    finally:
        del buf.replay.state_dict
        if core.lock._is_owned():
            core.lock.release()
    assert state["rng_state"] == settle(buf)


# -- 11. alpha setter -------------------------------------------------------------------------------


def test_setting_alpha_first_applies_queued_updates_with_the_old_alpha(relaxed):
    buf = relaxed(make(64), 2, 2)
    buf.add(rows(64))
    b = buf.sample(16)
    idx = b.indices.copy()
    buf.update_priorities(idx, td_by_index(idx))
    buf.alpha = 1.0
    leaves = buf.priorities.leaves()
    np.testing.assert_allclose(leaves[idx], priority(td_by_index(idx), ALPHA), rtol=1e-6)
    assert not np.allclose(leaves[idx], priority(td_by_index(idx), 1.0), rtol=1e-3)
    # updates given from now on use the new alpha
    b = buf.sample(16)
    buf.update_priorities(b.indices, td_by_index(b.indices) * 2)
    buf.flush()
    np.testing.assert_allclose(buf.priorities.leaves()[b.indices], priority(td_by_index(b.indices) * 2, 1.0), rtol=1e-6)


def test_setting_eps_first_applies_queued_updates_with_the_old_eps(relaxed):
    buf = relaxed(make(64), 3, 1)
    buf.add(rows(64))
    b = buf.sample(16)
    buf.update_priorities(b.indices, np.zeros(16))  # priority eps ** alpha
    buf.eps = 0.5
    np.testing.assert_allclose(buf.priorities.leaves()[b.indices], priority(np.zeros(16), ALPHA, EPS), rtol=1e-6)


# -- 12. IS weights use the beta of the sample call ---------------------------------------------------


@pytest.mark.parametrize("k, prefetch", [(1, 1), (3, 2)])
def test_weights_use_the_draw_time_priorities_and_the_sample_calls_beta(relaxed, k, prefetch):
    adds = add_plan(30, 4, 8)
    want = reference_run(make(256), k, 48, adds, 32, record_draws=True, depth=prefetch)
    got = learner_run(relaxed(make(256), k, prefetch), 48, adds, 32)
    for t, ((idx, weights, _), (leaves, p_min)) in enumerate(zip(got["batches"], want["draws"])):
        beta = BETAS[t % len(BETAS)]
        expected = (p_min / leaves[idx].astype(np.float64)) ** beta
        np.testing.assert_allclose(weights, expected, rtol=1e-6, err_msg=f"step {t}")


def test_beta_set_after_batches_were_drawn_ahead_applies_to_them(relaxed):
    buf = relaxed(make(64), 2, 2)
    buf.add(rows(64))
    buf.update_priorities(np.arange(64), td_by_index(np.arange(64)))  # strict here: no sample yet
    buf.flush()
    leaves = buf.priorities.leaves()
    p_min = float(leaves.min())
    first = buf.sample(16)  # starts the worker, which draws the next two batches ahead (no update queued)
    assert wait_until(lambda: len(buf._core.ready) == 2)
    buf.beta = 0.9
    for b in (first, buf.sample(16), buf.sample(16)):
        beta = 0.4 if b is first else 0.9
        np.testing.assert_allclose(b.weights, (p_min / leaves[b.indices].astype(np.float64)) ** beta, rtol=1e-6)
    assert math.isclose(buf.beta, 0.9)


@pytest.mark.parametrize("worker", ["inline", "thread"])
def test_only_auto_mode_keeps_step_timings(worker):
    """The timings that decide ``worker="auto"`` are not kept by the other modes (they would grow without end)."""
    buf = RelaxedReplay(make(128), staleness=1, worker=worker)
    buf.add(rows(100))
    for _ in range(3 * 32 + 5):
        b = buf.sample(8)
        buf.update_priorities(b.indices, td_by_index(b.indices))
    assert buf._core is not None and buf._core.intervals == [] and buf._core.works == []
    buf.close()
