"""The relaxed pipeline's native executor, and writes that keep the batches drawn ahead.

Covered here:

* the native executor (``worker="native"``, what ``"auto"`` picks on the C++
  tree with host storage) serves the Python executors' batches bit for bit in
  a seeded run with writes, a wrapping ring (dropped late updates), a bad
  queued update, a batch-size change, a flush and ``rng``, also when the copy
  of the generator's state it rewinds from moves often;
* its thread runs jobs while the learner's thread holds the GIL;
* a batch drawn ahead holds the rows committed when the sample that released
  it returned: a write after that neither voids it nor enters it;
* the served arrays stay valid until the learner takes ``depth + 1`` more batches;
* bad input: ``worker="native"`` where it cannot run, malformed update arrays
  (refused at once, nothing queued);
* fork (the child continues like the parent) and interpreter exit.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import textwrap
import time
from typing import Any

import numpy as np
import pytest

from hetero_replay import PrioritizedReplay, pipeline
from hetero_replay.pipeline import AUTO_WINDOW, RelaxedReplay, _NativePipeline
from tests.test_engine_concurrency import _wait_or_kill
from tests.test_pipeline import (
    BETAS,
    assert_same_batches,
    make,
    rows,
    td_by_index,
    td_errors,
)

EXECUTORS = ("native", "thread", "inline")
SCHEMA_TORCH = {"obs": ((3,), "float32"), "a": ((), "int64")}


def scripted_run(worker: str, k: int = 2, prefetch: int = 2) -> dict[str, Any]:
    """A seeded learner loop with every kind of event; returns what it saw, and what each call raised."""
    buf = RelaxedReplay(make(96, "native", seed=5), staleness=k, prefetch=prefetch, worker=worker)
    rng = np.random.default_rng(9)
    seen: list[Any] = []
    try:
        buf.add(rows(80))
        added = 80
        for t in range(40):
            if t % 3 == 1:  # writes between samples (the ring wraps: late updates are dropped)
                buf.add(rows(12, added))
                added += 12
            if t == 17:
                buf.clear_priorities(np.arange(4))
            if t == 23:
                buf.flush()
            if t == 29:
                seen.append(("rng", buf.rng.bit_generator.state["state"]["state"]))
            n = 48 if 20 <= t < 22 else 16  # a batch-size change discards the batches drawn ahead
            try:
                b = buf.sample(n, BETAS[t % len(BETAS)])
            except ValueError as e:
                seen.append(("raised", t, str(e)))
                continue
            seen.append((b.indices.copy(), np.array(b.weights, copy=True), {f: a.copy() for f, a in b.data.items()}))
            td = td_errors(b, rng)
            if t == 9:
                td[:] = np.nan  # a bad update: raised by the sample that needs it
            buf.update_priorities(b.indices, td)
        buf.flush()
        return {
            "seen": seen,
            "leaves": buf.priorities.leaves(),
            "max_priority": buf.max_priority,
            "dropped": buf.dropped_updates,
            "native": isinstance(buf._core, _NativePipeline),
        }
    finally:
        buf.close()


def assert_same_seen(got: list, want: list) -> None:
    assert len(got) == len(want)
    for t, (g, w) in enumerate(zip(got, want)):
        if isinstance(w[0], str):
            assert isinstance(g[0], str) and g == w, f"event {t}"
        else:
            assert_same_batches([g], [w])


@pytest.mark.parametrize("k, prefetch", [(1, 1), (2, 2), (4, 3)])
def test_native_and_python_executors_serve_the_same_batches_bit_for_bit(k, prefetch):
    runs = {worker: scripted_run(worker, k, prefetch) for worker in (*EXECUTORS, "auto")}
    assert runs["native"]["native"] and runs["auto"]["native"] and not runs["thread"]["native"]
    want = runs["inline"]
    raised = [e for e in want["seen"] if isinstance(e[0], str) and e[0] == "raised"]
    assert any("learner step 9" in e[2] and "nan" in e[2] for e in raised)
    assert want["dropped"] > 0
    for worker in ("native", "auto", "thread"):  # auto: small jobs, run by the learner in C++
        got = runs[worker]
        assert_same_seen(got["seen"], want["seen"])
        assert np.array_equal(got["leaves"], want["leaves"])
        assert (got["max_priority"], got["dropped"]) == (want["max_priority"], want["dropped"])


@pytest.mark.parametrize("k, prefetch", [(1, 1), (4, 3)])
def test_native_batches_stay_the_same_when_the_generator_mark_moves_between_rewinds(monkeypatch, k, prefetch):
    # The native executor copies the generator's state only once per MARK_SPAN uniforms and rewinds by
    # redrawing from that copy: with a short span the copy moves many times between the run's rewinds.
    want = scripted_run("inline", k, prefetch)
    monkeypatch.setattr(pipeline, "MARK_SPAN", 40)
    copies = []
    take = pipeline._GeneratorMark.before_draw

    def counted(mark: Any, first: bool) -> int:
        before = mark.state
        at = take(mark, first)
        copies.append(mark.state is not before)
        return at

    monkeypatch.setattr(pipeline._GeneratorMark, "before_draw", counted)
    got = scripted_run("native", k, prefetch)
    assert sum(copies) >= 5 and not all(copies)
    assert got["native"]
    assert_same_seen(got["seen"], want["seen"])
    assert np.array_equal(got["leaves"], want["leaves"])


def test_auto_picks_the_native_executor_where_it_applies():
    native = RelaxedReplay(make(64, "native"), staleness=1)
    python = RelaxedReplay(make(64, "numpy"), staleness=1)
    try:
        assert isinstance(native._core, _NativePipeline)
        assert not native.on_worker_thread  # until its jobs are measured worth a hand-over
        assert not isinstance(python._core, _NativePipeline)
    finally:
        native.close()
        python.close()


@pytest.mark.parametrize("batch, woken", [(4, False), (16_384, True)])
def test_auto_wakes_the_native_thread_only_for_jobs_worth_a_handover(batch, woken):
    """Jobs of 16k wide rows are worth waking the executor's thread for; jobs of a few rows are not (the thread
    takes those only where a core is idle for it, else the learner runs them)."""
    replay = PrioritizedReplay(32_768, {"obs": ((64,), "float32")}, tree="native", seed=0)
    replay.add({"obs": np.zeros((32_768, 64), np.float32)})
    buf = RelaxedReplay(replay, staleness=1)  # worker="auto"
    try:
        for _ in range(2 * AUTO_WINDOW + 2):
            b = buf.sample(batch)
            buf.update_priorities(b.indices, np.ones(batch))
        assert buf._core.wake is woken
        if woken:
            assert buf._core.executor.thread_alive
    finally:
        buf.close()


def test_torch_batches_on_the_cpu_are_the_slots_tensors_and_the_inline_batches():
    """A buffer built with device="cpu": the native executor gathers into tensors' memory (no copy per batch),
    takes TD errors as tensors, and serves the Python executor's batches bit for bit."""
    import torch

    def run(worker: str) -> list[Any]:
        replay = PrioritizedReplay(500, SCHEMA_TORCH, tree="native", seed=0, device="cpu")
        buf = RelaxedReplay(replay, staleness=2, prefetch=2, worker=worker)
        buf.add({"obs": np.arange(1200, dtype=np.float32).reshape(400, 3), "a": np.arange(400)})
        g = torch.Generator().manual_seed(0)
        seen = []
        try:
            for t in range(30):
                b = buf.sample(32, 0.5)
                assert isinstance(b.data["obs"], torch.Tensor) and isinstance(b.weights, torch.Tensor)
                if worker == "native" and t > 0:  # (the first batch is the learner's own draw)
                    slot_memory = {s.tensors[3].data_ptr() for s in buf._core.slots if s is not None}
                    assert b.data["obs"].data_ptr() in slot_memory  # the slot itself, not a copy
                seen.append([x.numpy().copy() for x in (b.indices, b.weights, b.data["obs"], b.data["a"])])
                buf.update_priorities(b.indices, torch.rand(32, generator=g))
                if t % 7 == 3:
                    buf.add({"obs": np.zeros((5, 3), np.float32), "a": np.zeros(5, np.int64)})
            buf.flush()
            seen.append([buf.priorities.leaves()])
            return seen
        finally:
            buf.close()

    native, inline = run("native"), run("inline")
    for got, want in zip(native, inline, strict=True):
        for g, w in zip(got, want, strict=True):
            assert np.array_equal(g, w)


def test_the_native_thread_runs_while_the_learner_holds_the_gil():
    replay = PrioritizedReplay(200_000, {"obs": ((8,), "float32")}, tree="native", seed=0)
    replay.add({"obs": np.zeros((200_000, 8), np.float32)})
    buf = RelaxedReplay(replay, staleness=1, worker="native")
    switch = sys.getswitchinterval()
    try:
        buf.sample(100_000)  # releases the next draw of 100k rows
        executor = buf._core.executor
        sys.setswitchinterval(1000.0)  # this thread keeps the GIL for the whole loop below
        deadline = time.perf_counter() + 20.0
        spins = 0
        while executor.finished == 0 and time.perf_counter() < deadline:
            spins += 1  # pure Python: a thread that needs the GIL could not finish meanwhile
        sys.setswitchinterval(switch)
        assert executor.finished == 1, "the native job did not finish while this thread held the GIL"
        assert spins > 0
    finally:
        sys.setswitchinterval(switch)
        buf.close()


@pytest.mark.parametrize("worker", EXECUTORS)
def test_a_write_after_a_sample_does_not_void_or_enter_the_batch_it_released(worker):
    buf = RelaxedReplay(make(256, "native"), staleness=1, worker=worker)
    try:
        buf.add(rows(64))
        b = buf.sample(32)
        state = buf.replay.rng.bit_generator.state if worker == "native" else None
        buf.update_priorities(b.indices, td_by_index(b.indices))
        buf.add(rows(64, 1000))  # new rows get the max priority: they would fill a batch drawn now
        if state is not None:  # the released draw's uniforms were taken at the sample; nothing was rewound
            assert buf.replay.rng.bit_generator.state == state
        ahead = buf.sample(32)
        assert (ahead.data["reward"] < 500).all(), "the batch drawn ahead holds rows added after its release"
        later = buf.sample(32)
        assert (later.data["reward"] >= 500).any()  # released after the write: the new rows are in
    finally:
        buf.close()


def test_served_arrays_stay_valid_until_depth_plus_one_more_batches_are_taken():
    depth = 2
    buf = RelaxedReplay(make(256, "native"), staleness=depth, prefetch=depth, worker="native")
    try:
        buf.add(rows(256))
        b = buf.sample(16)
        kept = {f: a.copy() for f, a in b.data.items()}, b.indices.copy()
        for _ in range(depth):
            buf.update_priorities(b.indices, td_by_index(b.indices))
            buf.sample(16)
        assert all(np.array_equal(b.data[f], a) for f, a in kept[0].items())
        assert np.array_equal(b.indices, kept[1])
    finally:
        buf.close()


def test_worker_native_is_refused_where_it_cannot_run_naming_the_argument():
    replay = make(64, "numpy")
    with pytest.raises(ValueError, match="worker='native'"):
        RelaxedReplay(replay, staleness=1, worker="native")
    replay.add(rows(8))  # the buffer is untouched and usable
    assert len(replay.sample(4).indices) == 4


@pytest.mark.parametrize(
    "indices, td, error, match",
    [
        (np.zeros((2, 2), np.int64), np.zeros(4), ValueError, "indices must be 1-D"),
        (np.zeros(4), np.zeros(4), TypeError, "indices must be integers"),
        (np.zeros(4, np.int64), np.array(["a"] * 4), TypeError, "td_errors must be real numbers"),
        (np.zeros(4, np.int64), np.zeros(3), ValueError, "4 indices but 3 TD errors"),
    ],
)
def test_malformed_updates_are_refused_at_once_by_the_native_executor(indices, td, error, match):
    buf = RelaxedReplay(make(64, "native"), staleness=1, worker="native")
    try:
        buf.add(rows(64))
        buf.sample(8)
        engine = buf.replay
        before = (engine.priorities.leaves(), dict(engine.rng.bit_generator.state), engine.position, len(engine))
        with pytest.raises(error, match=match):
            buf.update_priorities(indices, td)
        assert len(buf._core.schedule) == 0  # nothing queued
        leaves, rng_state, position, size = before
        np.testing.assert_array_equal(engine.priorities.leaves(), leaves)
        assert engine.rng.bit_generator.state == rng_state
        assert (engine.position, len(engine)) == (position, size)
    finally:
        buf.close()


def slot_arrays(engine: Any, n: int) -> list[np.ndarray]:
    """An output slot for ``engine``'s executor: indices, weights, raised weights, one array per field, ``n`` rows
    each."""
    return [np.empty(n, np.int64), np.empty(n, np.float32), np.empty(n, np.float32)] + [
        np.empty((n, *f.shape), f.dtype) for f in engine.schema.values()
    ]


@pytest.mark.parametrize(
    "batch_size, slot_rows, match",
    [(-1, 8, "batch_size must be >= 0"), (8, None, "slot 0 is not registered"), (8, 4, "holds 4 rows, not 8")],
)
def test_a_refused_submit_leaves_the_generator_where_it_was(batch_size, slot_rows, match):
    # The executor draws a job's uniforms last, after every check of the job.
    engine = make(64, "native")
    engine.add(rows(64))
    tree, fields, written_at = engine.native_parts()
    executor = pipeline._native.Executor(tree, fields, written_at)
    if slot_rows is not None:
        executor.set_slot(0, slot_arrays(engine, slot_rows), slot_rows)
    before = dict(engine.rng.bit_generator.state)
    with pytest.raises(ValueError, match=match):
        executor.submit([], engine.rng, batch_size, 0, None, True, 0.6, 1e-6, 64)
    assert engine.rng.bit_generator.state == before and executor.pending == 0
    executor.stop()


@pytest.mark.parametrize(
    "index, outputs, rows_, match",
    [
        (0, [np.empty(8, np.int64)], 8, "outputs are indices, weights, raised weights and one array per field"),
        (0, None, 16, "expected a C-contiguous int64 array of at least 16 entries"),
        (0, None, -1, "index and rows must be >= 0"),
        (-1, None, 8, "index and rows must be >= 0"),
    ],
)
def test_a_slot_is_checked_when_registered(index, outputs, rows_, match):
    engine = make(64, "native")
    tree, fields, written_at = engine.native_parts()
    executor = pipeline._native.Executor(tree, fields, written_at)
    with pytest.raises(ValueError, match=match):
        executor.set_slot(index, slot_arrays(engine, 8) if outputs is None else outputs, rows_)
    with pytest.raises(ValueError, match="slot 0 is not registered"):  # nothing registered
        executor.submit([], engine.rng, 8, 0, None, True, 0.6, 1e-6, 64)
    executor.stop()


def _continue(buf: RelaxedReplay, steps: int) -> dict[str, Any]:
    batches = []
    for t in range(steps):
        b = buf.sample(16, BETAS[t % len(BETAS)])
        batches.append((b.indices.copy(), np.array(b.weights, copy=True), {f: a.copy() for f, a in b.data.items()}))
        buf.update_priorities(b.indices, td_by_index(b.indices) * (t + 1))
        buf.add(rows(3, 500 + t))
    buf.flush()
    return {"batches": batches, "leaves": buf.priorities.leaves(), "max_priority": buf.max_priority}


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork (POSIX)")
def test_a_forked_child_of_a_native_pipeline_continues_exactly_like_the_parent(tmp_path):
    buf = RelaxedReplay(make(128, "native"), staleness=2, prefetch=2, worker="native")
    try:
        buf.add(rows(100))
        for t in range(6):
            b = buf.sample(16)
            buf.update_priorities(b.indices, td_by_index(b.indices) + t)  # jobs in flight at the fork
        out = tmp_path / "child.pkl"
        pid = os.fork()
        if pid == 0:  # the child: never return into pytest
            code = 1
            try:
                thread_after_fork = buf._core.executor.thread_alive  # the parent's thread is not copied
                result = _continue(buf, 5)
                result["thread_after_fork"] = thread_after_fork
                out.write_bytes(pickle.dumps(result))
                code = 0
            finally:
                os._exit(code)
        parent = _continue(buf, 5)
        assert _wait_or_kill(pid, timeout=30) == 0
        child = pickle.loads(out.read_bytes())
        assert not child["thread_after_fork"]
        assert_same_batches(child["batches"], parent["batches"])
        np.testing.assert_array_equal(child["leaves"], parent["leaves"])
        assert child["max_priority"] == parent["max_priority"]
    finally:
        buf.close()


def test_interpreter_exit_with_native_jobs_in_flight_is_clean():
    code = textwrap.dedent(
        """
        import numpy as np
        from hetero_replay import PrioritizedReplay, RelaxedReplay
        bufs = []
        for i in range(3):
            r = PrioritizedReplay(100_000, {"obs": ((16,), "float32")}, tree="native", seed=i)
            r.add({"obs": np.zeros((100_000, 16), np.float32)})
            b = RelaxedReplay(r, staleness=2, prefetch=2, worker="native")
            s = b.sample(50_000)  # jobs of 50k rows are running as the interpreter exits
            b.update_priorities(s.indices, np.ones(50_000))
            bufs.append(b)
        leaked = RelaxedReplay(PrioritizedReplay(10, {"x": ((), "float32")}, tree="native"), 1, worker="native")
        print("exiting")
        """
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "exiting" in done.stdout
