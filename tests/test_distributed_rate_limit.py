"""ShardedReplay(rate_limiter=...): bursty writer processes and the learner keep the ratio; nobody deadlocks."""

from __future__ import annotations

import time

import numpy as np
import pytest

ray = pytest.importorskip("ray")

from hetero_replay.distributed import ShardedReplay  # noqa: E402
from hetero_replay.rate_limiter import RateLimited, RateLimiter  # noqa: E402
from tests.test_distributed import SCHEMA, rows  # noqa: E402

pytestmark = pytest.mark.usefixtures("ray_local")
CHUNK, BATCH, TARGET = 32, 64, 2.0


def bursty_writer(writer: object, seed: int, seconds: float) -> dict[str, object]:
    """Bursts of adds, then pauses, for ``seconds`` (a Ray task: its own process)."""
    rng = np.random.default_rng(seed)
    end, added = time.monotonic() + seconds, 0
    while time.monotonic() < end:
        for _ in range(int(rng.integers(1, 30))):
            try:
                added += writer.add(rows(rng.integers(0, 1000, CHUNK)))  # type: ignore[attr-defined]
            except RateLimited as e:
                return {"added": added, "stopped": str(e)}
        time.sleep(float(rng.uniform(0, 0.2)))
    return {"added": added, "stopped": None}


def test_bursty_writer_processes_and_the_learner_keep_the_samples_per_insert_ratio() -> None:
    limiter = RateLimiter(TARGET, error=4 * BATCH, min_size=256, timeout=10.0)
    replay = ShardedReplay(2, 4096, SCHEMA, seed=0, staleness=1, rate_limiter=limiter)
    try:
        task = ray.remote(num_cpus=0)(bursty_writer)
        refs = [task.remote(replay.writer(), seed, 5.0) for seed in range(2)]
        # Ray starts a task's process first: on a busy machine, later than the limiter's 10 s timeout
        # (the learner's first sample then gave up before any writer came). The learner's 5 s start with
        # its first batch, once a writer has filled min_size.
        deadline = time.monotonic() + 120
        while replay.rate_limiter["inserted"] < limiter.min_size:  # type: ignore[index]
            assert time.monotonic() < deadline, "the writer tasks never started"
            time.sleep(0.05)
        first, sampled = None, 0
        while first is None or time.monotonic() - first < 5.0:
            try:
                batch = replay.sample(BATCH)  # as fast as the limiter lets it
            except RateLimited:
                break  # the writers are done (or never came: the assertions below say so)
            first = time.monotonic() if first is None else first
            replay.update_priorities(batch.indices, np.ones(BATCH))
            sampled += BATCH
        runs = ray.get(refs, timeout=60)
        state = replay.rate_limiter
        assert state is not None
        added = sum(r["added"] for r in runs)
        assert state["inserted"] == added and state["sampled"] == sampled
        assert added > 1000
        assert abs(sampled / added - TARGET) <= 0.05 * TARGET + limiter.error / added, (sampled, added)
    finally:
        replay.close()


def test_when_writers_stop_the_learner_times_out_and_when_the_learner_stops_writers_do() -> None:
    replay = ShardedReplay(
        2, 1024, SCHEMA, seed=0, rate_limiter=RateLimiter(1.0, error=BATCH, min_size=CHUNK, timeout=0.5)
    )
    try:
        writer = replay.writer()
        writer.add(rows(np.arange(CHUNK)))
        replay.sample(BATCH)  # credit 32 - 64 = -32 >= -64
        start = time.monotonic()
        with pytest.raises(RateLimited, match="sample of 64"):
            replay.sample(BATCH)  # no writer adds: it waits 0.5 s and says why
        assert time.monotonic() - start < 5
        writer.add(rows(np.arange(4 * CHUNK)))  # credit <= 0: goes
        with pytest.raises(RateLimited, match="insert of 32"):
            writer.add(rows(np.arange(CHUNK)))  # the learner does not sample: the writer waits 0.5 s
        assert replay.rate_limiter == {
            "samples_per_insert": 1.0, "min_size": CHUNK, "error": float(BATCH), "inserted": 5 * CHUNK, "sampled": BATCH,
        }  # fmt: skip
    finally:
        replay.close()
    with pytest.raises(Exception, match="closed|gone"):
        writer.add(rows(np.arange(CHUNK)))  # the replay (and its limiter) are gone: at once, saying so


def test_the_limiters_counters_survive_a_reopen_from_durable_dir(tmp_path) -> None:
    d = str(tmp_path / "replay")
    replay = ShardedReplay(2, 256, SCHEMA, seed=0, durable_dir=d, rate_limiter=RateLimiter(1.0, error=BATCH))
    replay.add(rows(np.arange(100)))
    replay.sample(BATCH)
    replay.flush()
    replay.close()
    again = ShardedReplay(
        2, 256, SCHEMA, seed=0, durable_dir=d, reopen=True, rate_limiter=RateLimiter(1.0, error=BATCH)
    )
    try:
        assert again.rate_limiter is not None
        assert (again.rate_limiter["inserted"], again.rate_limiter["sampled"]) == (100, BATCH)
        again.add(rows(np.arange(100, 120)))
        again.sample(BATCH)
    finally:
        again.close()  # its last durable point: no flush() needed
    last = ShardedReplay(2, 256, SCHEMA, seed=0, durable_dir=d, reopen=True, rate_limiter=RateLimiter(1.0, error=BATCH))
    try:
        assert last.rate_limiter is not None
        assert (last.rate_limiter["inserted"], last.rate_limiter["sampled"], len(last)) == (120, 2 * BATCH, 120)
    finally:
        last.close()


def test_a_bad_rate_limiter_is_refused_before_ray_starts_a_shard() -> None:
    with pytest.raises(TypeError, match="rate_limiter"):
        ShardedReplay(2, 8, SCHEMA, rate_limiter={"samples_per_insert": 1.0}, name="refused-limiter")  # type: ignore[arg-type]
    assert all("refused-limiter" not in str(a) for a in ray.util.list_named_actors())


def sharded_state(replay: ShardedReplay) -> tuple:
    """What a refused call must leave as it was: the learner's generator, every shard's leaves, position, size."""
    leaves = ray.get([h.__ray_call__.remote(lambda shard: shard.replay.leaves()) for h in replay._shards])
    return str(replay.rng.bit_generator.state), [a.tobytes() for a in leaves], replay.position, replay.filled


def test_the_limiters_refusals_leave_the_replay_as_it_was() -> None:
    limiter = RateLimiter(1.0, error=BATCH, min_size=CHUNK, timeout=0)
    replay = ShardedReplay(2, 1024, SCHEMA, seed=0, rate_limiter=limiter)
    try:
        before = sharded_state(replay)
        with pytest.raises(RateLimited, match="inserted 0"):
            replay.sample(BATCH)  # fewer than min_size rows in
        assert sharded_state(replay) == before
        replay.add(rows(np.arange(CHUNK)))
        batch = replay.sample(BATCH)
        replay.update_priorities(batch.indices, np.linspace(0.5, 3, BATCH))
        replay.flush()
        before = sharded_state(replay)
        with pytest.raises(RateLimited, match="sample of 64"):
            replay.sample(BATCH)  # the learner is ahead
        assert sharded_state(replay) == before
        replay.add(rows(np.arange(4 * CHUNK)))
        before = sharded_state(replay)
        with pytest.raises(RateLimited, match="insert of 32"):
            replay.add(rows(np.arange(CHUNK)))  # the writers are ahead: no shard gets the rows
        assert sharded_state(replay) == before
        assert replay.rate_limiter is not None
        assert (replay.rate_limiter["inserted"], replay.rate_limiter["sampled"]) == (5 * CHUNK, BATCH)
    finally:
        replay.close()
