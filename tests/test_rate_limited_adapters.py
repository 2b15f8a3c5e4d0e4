"""rate_limiter= on the SB3 and Tianshou buffers: a collector thread and a learner keep the ratio; state checkpoints."""

from __future__ import annotations

import pickle
import threading
import time

import numpy as np
import pytest

pytest.importorskip("tianshou")
pytest.importorskip("stable_baselines3")

from gymnasium import spaces  # noqa: E402
from tianshou.data import Batch  # noqa: E402

from hetero_replay import RateLimited, RateLimiter  # noqa: E402
from hetero_replay.adapters.sb3 import PrioritizedReplayBuffer  # noqa: E402
from hetero_replay.adapters.tianshou import (  # noqa: E402
    HeteroPrioritizedReplayBuffer,
    HeteroPrioritizedVectorReplayBuffer,
)

ENVS, BATCH, TARGET = 4, 32, 4.0


def step_batch(step: int, envs: int = ENVS) -> Batch:
    k = 1000 * np.arange(envs) + step
    obs = np.stack([k, k + 0.5], axis=-1).astype(np.float32)
    return Batch(obs=obs, act=k % 2, rew=k.astype(np.float64), terminated=k % 7 == 6,
                 truncated=np.zeros(envs, bool), obs_next=obs + 1, info=Batch())  # fmt: skip


def tianshou_state(buf) -> tuple:
    """What a refused call must leave as it was: generators, priorities, insertion state, the counters."""
    limiter = buf.rate_limiter
    return (
        str(buf._rng.bit_generator.state), buf.priority_tree.get(np.arange(buf.maxsize)).tobytes(), len(buf),
        buf.last_index.tolist(), (limiter.inserted, limiter.sampled),
    )  # fmt: skip


def test_tianshou_collector_thread_and_learner_keep_the_ratio_within_5_percent() -> None:
    limiter = RateLimiter(TARGET, error=4 * BATCH, min_size=64, timeout=0.5)
    buf = HeteroPrioritizedVectorReplayBuffer(2000, ENVS, random_seed=0, rate_limiter=limiter)
    stop = threading.Event()

    def collector() -> None:
        rng, step = np.random.default_rng(0), 0
        while not stop.is_set():
            for _ in range(int(rng.integers(1, 30))):  # a burst of steps ...
                try:
                    buf.add(step_batch(step), buffer_ids=np.arange(ENVS))
                except RateLimited:
                    return  # the learner stopped
                step += 1
            time.sleep(float(rng.uniform(0, 0.01)))  # ... then a pause

    t = threading.Thread(target=collector, daemon=True)
    t.start()
    end = time.monotonic() + 2.0
    while time.monotonic() < end:
        batch, indices = buf.sample(BATCH)  # as fast as the limiter lets it
        buf.update_weight(indices, np.ones(BATCH))
    stop.set()
    t.join(10)
    assert not t.is_alive()
    assert limiter.inserted > 1000
    assert abs(limiter.sampled / limiter.inserted - TARGET) <= 0.05 * TARGET + limiter.error / limiter.inserted


def test_tianshou_refusals_leave_the_buffer_as_it_was_and_counters_survive_copies_and_reopen(tmp_path) -> None:
    def limiter() -> RateLimiter:
        return RateLimiter(1.0, error=BATCH, min_size=ENVS, timeout=0)

    buf = HeteroPrioritizedVectorReplayBuffer(
        64, ENVS, random_seed=0, rate_limiter=limiter(), durable_path=tmp_path / "buf.hrp"
    )
    before = tianshou_state(buf)
    with pytest.raises(RateLimited, match="inserted 0"):
        buf.sample(BATCH)  # fewer than min_size added
    assert tianshou_state(buf) == before
    for step in range(4):
        buf.add(step_batch(step), buffer_ids=np.arange(ENVS))
    buf.sample(BATCH)
    buf.sample_indices(BATCH - 16)  # credit 16 - 48 = -32 >= -32
    before = tianshou_state(buf)
    with pytest.raises(RateLimited, match="sample of 1"):
        buf.sample_indices(1)  # the learner is ahead
    assert tianshou_state(buf) == before
    assert len(buf.sample_indices(0)) == 16  # Tianshou's "every stored index": no draw, not counted
    assert (buf.rate_limiter.inserted, buf.rate_limiter.sampled) == (16, 48)

    for copied in (pickle.loads(pickle.dumps(buf)), __import__("copy").deepcopy(buf)):
        assert copied.rate_limiter is not buf.rate_limiter
        assert (copied.rate_limiter.inserted, copied.rate_limiter.sampled) == (16, 48)
    buf.flush()
    again = HeteroPrioritizedVectorReplayBuffer.reopen(tmp_path / "buf.hrp", rate_limiter=limiter())
    assert (again.rate_limiter.inserted, again.rate_limiter.sampled) == (16, 48)
    with pytest.raises(TypeError, match="rate_limiter"):
        HeteroPrioritizedReplayBuffer(8, rate_limiter=1.0)
    with pytest.raises(TypeError, match="rate_limiter"):
        HeteroPrioritizedVectorReplayBuffer.reopen(tmp_path / "buf.hrp", rate_limiter="fast")
    again.close()
    buf.close()


def test_tianshou_single_buffer_add_waits_for_the_learner() -> None:
    buf = HeteroPrioritizedReplayBuffer(64, random_seed=0, rate_limiter=RateLimiter(1.0, error=2, timeout=0))
    buf.add(step_batch(0, 1)[0])
    buf.add(step_batch(1, 1)[0])  # 2 samples' worth ahead = error
    with pytest.raises(RateLimited, match="insert of 1"):
        buf.add(step_batch(2, 1)[0])
    assert len(buf) == 2
    buf.sample(2)
    buf.add(step_batch(2, 1)[0])
    assert len(buf) == 3


def test_sb3_buffer_takes_a_rate_limiter_and_refuses_it_with_distributed() -> None:
    obs, act = spaces.Box(-1, 1, (3,), np.float32), spaces.Discrete(2)
    limiter = RateLimiter(2.0, error=BATCH, min_size=8, timeout=0)
    buf = PrioritizedReplayBuffer(100, obs, act, device="cpu", seed=0, rate_limiter=limiter)
    with pytest.raises(RateLimited, match="inserted 0"):
        buf.sample(8)
    for _ in range(8):
        buf.add(np.zeros((1, 3)), np.zeros((1, 3)), np.zeros((1, 1), np.int64), np.zeros(1), np.zeros(1), [{}])
    buf.sample(8)
    assert (limiter.inserted, limiter.sampled) == (8, 8)
    with pytest.raises(ValueError, match="rate_limiter"):
        PrioritizedReplayBuffer(100, obs, act, rate_limiter=limiter, distributed=dict(num_shards=2))
    buf.close()
