"""ShardedReplay on a local Ray instance: exact global PER across shards, writers, failures, bad input.

The law: rows ``i`` carry ids; priorities are set from the ids, so the exact global
distribution ``p_i / sum p`` is known and the empirical one is tested with chi-square
(stratified draws vary less than multinomial ones, so the test is conservative).
Shard masses differ by a factor of 64.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

ray = pytest.importorskip("ray")
scipy_stats = pytest.importorskip("scipy.stats")

from hetero_replay import PrioritizedReplay  # noqa: E402
from hetero_replay.distributed import INDEX_DTYPE, ShardedReplay  # noqa: E402

SCHEMA = {"id": ((), np.int64), "obs": ((3,), np.float32)}
SHARDS, PER_SHARD = 4, 64
SCALE = np.array([1.0, 4.0, 16.0, 64.0])  # shard k's priorities are SCALE[k] * (1 + id % 7)

pytestmark = pytest.mark.usefixtures("ray_local")


def rows(ids: np.ndarray) -> dict[str, np.ndarray]:
    return {"id": ids.astype(np.int64), "obs": np.repeat(ids[:, None], 3, axis=1).astype(np.float32)}


def td_of(ids: np.ndarray) -> np.ndarray:
    """The priority each row gets (alpha = 1, eps = 0 in these tests): by shard (id // PER_SHARD), then id."""
    return SCALE[ids // PER_SHARD] * (1 + ids % 7)


def filled_replay(seed: int = 0, stratified: bool = True, **kwargs: object) -> ShardedReplay:
    """4 shards of 64 rows, ids 64k..64k+63 on shard k, priorities td_of(id) (every row updated once)."""
    replay = ShardedReplay(SHARDS, PER_SHARD, SCHEMA, alpha=1.0, eps=0.0, seed=seed, stratified=stratified, **kwargs)
    replay.add(rows(np.arange(SHARDS * PER_SHARD)))  # one chunk per shard, in order
    batch = replay.sample(16 * SHARDS * PER_SHARD)  # equal priorities, stratified: every row is drawn
    assert set(batch.data["id"]) == set(range(SHARDS * PER_SHARD))
    replay.update_priorities(batch.indices, td_of(batch.data["id"]))
    return replay


def exact_law() -> np.ndarray:
    p = td_of(np.arange(SHARDS * PER_SHARD)).astype(np.float32).astype(np.float64)
    return p / p.sum()


@pytest.mark.parametrize("stratified", [True, False])
def test_sampling_is_exact_across_shards_of_very_different_mass(stratified: bool) -> None:
    replay = filled_replay(seed=1, stratified=stratified)
    try:
        masses = np.array([s.total for s in replay.summaries])
        want = td_of(np.arange(SHARDS * PER_SHARD)).reshape(SHARDS, PER_SHARD).sum(axis=1)
        np.testing.assert_allclose(masses, want, rtol=1e-5)
        assert masses[-1] / masses[0] > 50
        counts = np.zeros(SHARDS * PER_SHARD)
        for _ in range(60):
            batch = replay.sample(4000)
            np.add.at(counts, batch.data["id"], 1)
            assert (batch.indices["shard"] == batch.data["id"] // PER_SHARD).all()
            assert (batch.indices["slot"] == batch.data["id"] % PER_SHARD).all()
        expected = exact_law() * counts.sum()
        assert expected.min() >= 5
        p_ours = scipy_stats.chisquare(counts, expected).pvalue
        assert p_ours > 1e-4, f"chi-square p = {p_ours}: the sharded draws do not follow p_i / sum p"
        # The per-shard normalisation baseline (RLlib-style: B/S draws per shard) has another law:
        # the same counts are nowhere near it.
        per_shard = np.concatenate([exact_law()[k * PER_SHARD : (k + 1) * PER_SHARD] for k in range(SHARDS)])
        per_shard = (
            per_shard
            / np.repeat([per_shard[k * PER_SHARD : (k + 1) * PER_SHARD].sum() for k in range(SHARDS)], PER_SHARD)
            / SHARDS
        )
        assert scipy_stats.chisquare(counts, per_shard * counts.sum()).pvalue < 1e-12
        assert replay.stats["inexact_batches"] == 0
    finally:
        replay.close()


def test_is_weights_equal_the_single_buffer_formula() -> None:
    replay = filled_replay(seed=2)
    single = PrioritizedReplay(SHARDS * PER_SHARD, SCHEMA, alpha=1.0, eps=0.0, seed=0)
    try:
        single.add(rows(np.arange(SHARDS * PER_SHARD)))
        single.update_priorities(np.arange(SHARDS * PER_SHARD), td_of(np.arange(SHARDS * PER_SHARD)))
        for beta in (0.0, 0.4, 1.0):
            batch = replay.sample(512, beta=beta)
            want = single.priorities.weights(batch.data["id"], beta)
            np.testing.assert_allclose(batch.weights, want, rtol=1e-6)
        assert batch.weights.max() <= 1.0
        # Normalised by the global maximum weight (the smallest priority, on the lightest shard), not the batch's.
        assert (
            batch.weights.min() == pytest.approx((1.0 / (64.0 * 7)) ** 1.0, rel=1e-5) or batch.weights.min() > 1 / 448
        )
    finally:
        replay.close()


def test_a_seed_fixes_the_samples() -> None:
    a, b = filled_replay(seed=7), filled_replay(seed=7)
    try:
        for _ in range(3):
            x, y = a.sample(64), b.sample(64)
            np.testing.assert_array_equal(x.data["id"], y.data["id"])
            np.testing.assert_array_equal(x.weights, y.weights)
    finally:
        a.close()
        b.close()


def test_new_rows_get_the_global_max_priority_on_every_shard() -> None:
    replay = filled_replay(seed=3)
    try:
        top = replay.max_priority
        assert top == pytest.approx(64.0 * 7)
        replay.add(rows(np.arange(1000, 1000 + SHARDS)))  # one new row per shard, overwriting the oldest
        batch = replay.sample(4096)
        new = batch.data["id"] >= 1000
        assert new.any()
        leaves = batch.weights[new]  # weight (p_min / p) ** beta with p = the global max on every shard
        np.testing.assert_allclose(leaves, (1.0 / top) ** replay.beta, rtol=1e-5)
    finally:
        replay.close()


@pytest.mark.parametrize("staleness", [0, 1, 2])
def test_staleness_k_delays_updates_by_k_steps_and_keeps_the_law(staleness: int) -> None:
    # The relaxed schedule: the batch of step t sees the updates of steps <= t - k - 1.
    replay = ShardedReplay(SHARDS, PER_SHARD, SCHEMA, alpha=1.0, eps=0.0, seed=0, staleness=staleness)
    try:
        replay.add(rows(np.arange(SHARDS * PER_SHARD)))
        dominated = []
        for step in range(6):
            batch = replay.sample(512)
            dominated.append(bool(np.mean(batch.data["id"] == 5) > 0.5))
            if step == 1:  # row 5 gets a priority that dominates the rest once applied
                replay.update_priorities(batch.indices, np.where(batch.data["id"] == 5, 1e4, 1.0))
        assert dominated.index(True) == 1 + staleness + 1, dominated
        assert all(dominated[1 + staleness + 1 :])
        batch = replay.sample(8192)  # the law: row 5 holds 1e4 of 1e4 + 255 of the mass
        assert np.mean(batch.data["id"] == 5) == pytest.approx(1e4 / (1e4 + 255), abs=0.01)
        np.testing.assert_allclose(batch.weights[batch.data["id"] == 5], (1.0 / 1e4) ** replay.beta, rtol=1e-5)
        assert replay.stats["redraws"] == 0
    finally:
        replay.close()


def test_updates_to_overwritten_slots_are_dropped() -> None:
    replay = filled_replay(seed=4)
    try:
        batch = replay.sample(256)
        replay.add(rows(np.arange(2000, 2000 + SHARDS * PER_SHARD)))  # every slot rewritten
        replay.update_priorities(batch.indices, np.full(256, 1e3))
        summaries = replay.summaries
        assert replay.stats["dropped_updates"] == 256
        assert max(s.max_priority for s in summaries) == pytest.approx(64.0 * 7)  # the dropped values set nothing
    finally:
        replay.close()


def _state(replay: ShardedReplay) -> tuple:
    return tuple((s.version, s.size, s.total) for s in replay.summaries), str(replay.rng.bit_generator.state)


def test_bad_input_is_refused_and_changes_nothing() -> None:
    replay = filled_replay(seed=5)
    try:
        batch = replay.sample(8)
        before = _state(replay)
        bad_adds = [
            ({"id": np.arange(3)}, ValueError, "missing"),
            ({**rows(np.arange(3)), "extra": np.zeros(3)}, ValueError, "unknown"),
            ({"id": np.arange(3), "obs": np.zeros((3, 4), np.float32)}, ValueError, "obs"),
            ({"id": np.arange(3) + 0.5, "obs": np.zeros((3, 3), np.float32)}, ValueError, "id"),
            ({"id": np.arange(3), "obs": np.zeros((2, 3), np.float32)}, ValueError, "rows"),
            ([1, 2, 3], TypeError, "mapping"),
        ]
        for value, error, words in bad_adds:
            with pytest.raises(error, match=words):
                replay.add(value)
        td = np.ones(8)
        bad_updates = [
            (batch.indices["slot"], td, TypeError, "indices"),
            (batch.indices, np.ones(7), ValueError, "TD error"),
            (batch.indices, np.where(np.arange(8) == 3, np.nan, td), ValueError, r"td_errors\[3\]"),
            (batch.indices, np.where(np.arange(8) == 5, -1.0, td), ValueError, r"td_errors\[5\]"),
            (batch.indices, np.where(np.arange(8) == 2, 1e300, td), ValueError, r"td_errors\[2\]"),
        ]
        shard_bad = batch.indices.copy()
        shard_bad["shard"][4] = SHARDS
        slot_bad = batch.indices.copy()
        slot_bad["slot"][6] = PER_SHARD
        bad_updates += [(shard_bad, td, IndexError, r"indices\[4\]"), (slot_bad, td, IndexError, r"indices\[6\]")]
        for indices, values, error, words in bad_updates:
            with pytest.raises(error, match=words):
                replay.update_priorities(indices, values)
        for n in (0, -1, 2.5, True):
            with pytest.raises((ValueError, TypeError), match="batch_size"):
                replay.sample(n)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="beta"):
            replay.sample(4, beta=1.5)
        assert _state(replay) == before
        with pytest.raises(TypeError, match="not in one process"):
            import pickle

            pickle.dumps(replay)
    finally:
        replay.close()


@pytest.mark.parametrize(
    "kwargs, error, words",
    [
        (dict(num_shards=0), ValueError, "num_shards"),
        (dict(num_shards=2.0), TypeError, "num_shards"),
        (dict(capacity_per_shard=0), ValueError, "capacity_per_shard"),
        (dict(storage="shared"), ValueError, "storage"),
        (dict(storage="disk"), ValueError, "durable_dir"),
        (dict(detached=True), ValueError, "address"),
        (dict(flush_seconds=0), ValueError, "flush_seconds"),
        (dict(name="a/b"), ValueError, "name"),
        (dict(actor_options=[{}]), ValueError, "actor_options"),
        (dict(stage_rows=-1), ValueError, "stage_rows"),
        (dict(staleness=3), ValueError, "staleness"),
        (dict(alpha=-1.0), ValueError, "alpha"),
    ],
)
def test_bad_arguments_are_refused(kwargs: dict, error: type, words: str) -> None:
    args = dict(num_shards=2, capacity_per_shard=8, schema=SCHEMA) | kwargs
    with pytest.raises(error, match=words):
        ShardedReplay(**args)


def test_empty_replay_refuses_to_sample_without_touching_the_generator() -> None:
    replay = ShardedReplay(2, 8, SCHEMA, seed=0)
    try:
        state = replay.rng.bit_generator.state
        with pytest.raises(ValueError, match="empty"):
            replay.sample(4)
        assert replay.rng.bit_generator.state == state
    finally:
        replay.close()


# -- writers: actor processes and Ray tasks, concurrently with the learner ---------------------------


def _write_from_process(writer: object, start: int, batches: int) -> None:
    for b in range(batches):
        writer.add(rows(np.arange(start + 16 * b, start + 16 * (b + 1))))  # type: ignore[attr-defined]


@ray.remote(num_cpus=0)
def _write_from_task(writer: object, start: int, batches: int) -> int:
    _write_from_process(writer, start, batches)
    return writer.rows_added  # type: ignore[attr-defined]


def test_writer_processes_and_ray_tasks_add_while_the_learner_samples() -> None:
    replay = ShardedReplay(SHARDS, 400, SCHEMA, seed=0)
    try:
        replay.add(rows(np.arange(40)))
        ctx = mp.get_context("spawn")
        procs = [
            ctx.Process(target=_write_from_process, args=(replay.writer(), 10_000 * (p + 1), 20)) for p in range(2)
        ]
        for p in procs:
            p.start()
        tasks = [_write_from_task.remote(replay.writer(policy="round_robin"), 100_000 * (t + 1), 20) for t in range(2)]
        samples = 0
        while any(p.is_alive() for p in procs) or not all(ray.wait([t], timeout=0)[0] for t in tasks):
            batch = replay.sample(64)
            replay.update_priorities(batch.indices, np.abs(np.random.default_rng(samples).normal(size=64)))
            samples += 1
        for p in procs:
            p.join()
            assert p.exitcode == 0
        assert ray.get(tasks) == [320, 320]
        sizes = [s.size for s in replay.summaries]
        assert sum(sizes) == 40 + 4 * 320
        assert max(sizes) - min(sizes) <= 2 * 16 + 10  # least-full and round-robin keep shards balanced
        ids = replay.sample(4096).data["id"]
        assert {i // 10_000 for i in ids if i >= 10_000} >= {1, 2, 10, 20}  # every writer's rows are drawn
        assert samples > 0 and replay.stats["batches"] >= samples
    finally:
        replay.close()


# -- failures: a shard killed mid-training, a learner that restarts --------------------------------------


def _train_steps(replay: ShardedReplay, steps: int, start: int, rng: np.random.Generator) -> int:
    for step in range(steps):
        replay.add(rows(np.arange(start + 8 * step, start + 8 * (step + 1))))
        batch = replay.sample(32)
        replay.update_priorities(batch.indices, rng.random(32))
    return start + 8 * steps


@pytest.mark.parametrize("storage", ["host", "disk"])
def test_a_killed_shard_restarts_from_its_last_durable_point_and_training_continues(tmp_path, storage: str) -> None:
    every = 40
    replay = ShardedReplay(
        2, 10_000, SCHEMA, seed=0, storage=storage, durable_dir=str(tmp_path), flush_every=every,
        flush_seconds=3600,
    )  # fmt: skip
    rng = np.random.default_rng(0)
    try:
        nxt = _train_steps(replay, 30, 0, rng)
        before = replay.summaries[1]
        old_batch = replay.sample(64)
        os.kill(replay.shard_pids()[1], signal.SIGKILL)
        killed = time.monotonic()
        batch = replay.sample(32)  # waits for Ray to restart the shard, then redraws
        recovery = time.monotonic() - killed
        after = replay.summaries[1]
        assert after.incarnation != before.incarnation
        assert replay.stats["recoveries"] >= 1
        # The restart keeps the last durable point that reached the disk, or a later one: "host" saves it
        # in the shard's call (so at most `every` rows are lost); "disk" writes it on a background thread,
        # so under load the point being written when the shard died may be lost too.
        assert before.flushed_rows <= after.size == after.flushed_rows <= before.size
        assert storage == "disk" or (after.flushed_rows == before.flushed_rows >= before.size - every)
        # Indices drawn before the restart are dropped by the new incarnation, never applied to other rows.
        dropped = replay.stats["dropped_updates"]
        replay.update_priorities(old_batch.indices, rng.random(64))
        replay.update_priorities(batch.indices, rng.random(32))
        _ = replay.summaries
        assert replay.stats["dropped_updates"] - dropped == (old_batch.indices["shard"] == 1).sum() > 0
        _train_steps(replay, 10, nxt, rng)
        assert replay.summaries[1].size >= after.size + 10 * 8 // 2 - 8
        assert recovery < 60
    finally:
        replay.close()


LEARNER = textwrap.dedent(
    """
    import sys, numpy as np
    from hetero_replay.distributed import ShardedReplay
    replay = ShardedReplay.attach(sys.argv[1], address=sys.argv[2], seed=0)
    print(len(replay), flush=True)
    replay.add({"id": np.arange(100, 110), "obs": np.zeros((10, 3), np.float32)})
    batch = replay.sample(16)
    replay.update_priorities(batch.indices, np.ones(16))
    print(len(replay), flush=True)
    """
)


def test_a_restarted_learner_reattaches_to_running_named_shards(ray_local: object) -> None:
    address = ray.get_runtime_context().gcs_address
    name = f"attach-{os.getpid()}"
    replay = ShardedReplay(2, 100, SCHEMA, seed=0, name=name, detached=True, address=address)
    try:
        replay.add(rows(np.arange(20)))
        assert len(replay) == 20
        for expect_before in (20, 30):  # two learner processes in turn, each exiting without closing
            out = subprocess.run(
                [sys.executable, "-c", LEARNER, name, address], capture_output=True, text=True, timeout=120
            )
            assert out.returncode == 0, out.stderr[-2000:]
            assert out.stdout.split()[:2] == [str(expect_before), str(expect_before + 10)]
        assert len(replay) == 40
        with pytest.raises(ValueError, match="no shards"):
            ShardedReplay.attach("no-such-replay")
    finally:
        replay.close(destroy=True)


def test_writers_rows_join_at_the_learners_next_call_and_never_make_a_draw_stale() -> None:
    replay = filled_replay(seed=6)
    try:
        writer = replay.writer(policy="round_robin")
        writer.add(rows(np.arange(5000, 5010)))  # queued on shard 0 until the learner's next call to it
        first = replay.sample(4096)
        assert not (first.data["id"] >= 5000).any()  # not in the tree the learner routed by
        second = replay.sample(4096)
        assert (second.data["id"] >= 5000).any()  # taken in after serving the first draw
        assert replay.stats["redraws"] == 0 and replay.stats["inexact_batches"] == 0
    finally:
        replay.close()


def test_rows_only_writers_added_are_sampled_and_an_undrawn_shard_takes_its_queue_in() -> None:
    replay = ShardedReplay(2, 16, SCHEMA, seed=0)
    try:
        writer = replay.writer(policy="round_robin")
        writer.add(rows(np.arange(4)))  # shard 0's queue: the learner has seen no row at all
        assert set(replay.sample(64).data["id"]) == {0, 1, 2, 3}
        writer.add(rows(np.arange(10, 12)))  # shard 1 is empty to the learner: it gets no draw, only the version check
        replay.sample(8)
        assert replay._ray.get(replay._shards[1].summary.remote()).staged == 0  # taken in during that check
        assert 10 in replay.sample(256).data["id"]
        assert replay.stats["redraws"] == 0
    finally:
        replay.close()


def test_a_full_queue_joins_the_tree_at_once_and_the_learner_redraws() -> None:
    replay = filled_replay(seed=8, stage_rows=12)
    try:
        writer = replay.writer(policy="round_robin")  # shards 0, 1, 2, 3, 0, ...
        for start, n in ((5000, 10), (6000, 1), (7000, 1), (8000, 1)):
            writer.add(rows(np.arange(start, start + n)))  # all queued
        queued = [replay._ray.get(h.summary.remote()).staged for h in replay._shards]
        assert queued == [10, 1, 1, 1]
        writer.add(rows(np.arange(9000, 9005)))  # shard 0: 15 > 12 rows, taken in at once
        assert replay._ray.get(replay._shards[0].summary.remote()).staged == 0
        batch = replay.sample(4096)
        assert replay.stats["redraws"] == 1 and replay.stats["inexact_batches"] == 0
        ids = set(batch.data["id"].tolist())
        assert ids & {*range(5000, 5010), *range(9000, 9005)}  # shard 0's rows are in the tree the batch saw
        # The other shards took their queues in after serving the rejected first attempt; the redraw routed
        # by their new summaries, so their rows are in the batch's tree too.
        assert ids & {6000, 7000, 8000}
    finally:
        replay.close()


@pytest.mark.parametrize("max_redraws", [8, 0])
def test_a_shard_changed_between_refresh_and_draw_forces_a_redraw(max_redraws: int) -> None:
    # stage_rows=0: a writer's add joins the tree at once, so the learner's summary of that shard goes stale.
    replay = filled_replay(seed=6, max_redraws=max_redraws, stage_rows=0)
    try:
        writer = replay.writer(policy="round_robin")
        writer.add(rows(np.arange(5000, 5010)))
        batch = replay.sample(4096)
        if max_redraws:
            assert replay.stats["redraws"] == 1 and replay.stats["inexact_batches"] == 0
        else:  # no redraw allowed: served, rescaled inside the changed shard, and counted
            assert replay.stats["redraws"] == 0 and replay.stats["inexact_batches"] == 1
        assert (batch.data["id"] >= 5000).any()  # the shard's new rows are drawn either way
        replay.sample(16)
        assert replay.stats["redraws"] == (1 if max_redraws else 0)  # the reply refreshed the learner's summary
    finally:
        replay.close()


def test_writer_refuses_bad_batches_and_policies() -> None:
    replay = ShardedReplay(2, 16, SCHEMA, seed=0)
    try:
        with pytest.raises(ValueError, match="policy"):
            replay.writer(policy="random")
        writer = replay.writer()
        with pytest.raises(ValueError, match="obs"):
            writer.add({"id": np.arange(2), "obs": np.zeros((2, 2), np.float32)})
        with pytest.raises(ValueError, match="capacity"):
            writer.add(rows(np.arange(17)))
        assert len(replay) == 0 and writer.rows_added == 0
        assert writer.add(rows(np.arange(16))) == 16 and len(replay) == 16
    finally:
        replay.close()


def test_index_dtype_names_shard_incarnation_slot_and_epoch() -> None:
    assert INDEX_DTYPE.names == ("shard", "incarnation", "slot", "epoch")
