"""SB3's PER buffer and algorithms over a ShardedReplay (``replay_buffer_kwargs=dict(distributed=...)``).

Real SB3 on real gymnasium environments, shards as actors of a local Ray instance.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

pytest.importorskip("stable_baselines3")
pytest.importorskip("ray")

from hetero_replay.adapters.sb3 import PERDQN, PERSAC, PERTD3, PrioritizedReplayBuffer  # noqa: E402
from hetero_replay.distributed import INDEX_DTYPE, ShardedReplay  # noqa: E402
from hetero_replay.placement import Placement  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread", "ray_local")

CARTPOLE = gym.make("CartPole-v1")


def buffer(**kwargs: object) -> PrioritizedReplayBuffer:
    args = dict(buffer_size=400, observation_space=CARTPOLE.observation_space, action_space=CARTPOLE.action_space,
                device="cpu", n_envs=2, seed=0, alpha=1.0, eps=0.0) | kwargs  # fmt: skip
    return PrioritizedReplayBuffer(**args)  # type: ignore[arg-type]


def add_rows(buf: PrioritizedReplayBuffer, rows: int) -> None:
    for r in range(rows):
        obs = np.full((2, 4), r, np.float32)
        buf.add(obs, obs + 1, np.array([0, 1]), np.array([1.0, 2.0]), np.array([False, r % 7 == 6]), [{}, {}])


def test_the_buffer_samples_from_the_shards_with_global_weights() -> None:
    buf = buffer(distributed=dict(num_shards=2))
    try:
        replay = buf.replay
        assert isinstance(replay, ShardedReplay) and replay.capacity_per_shard == 200  # 400 transitions over 2 shards
        add_rows(buf, 50)
        batch = buf.sample(64)
        assert batch.indices.dtype == INDEX_DTYPE and batch.observations.shape == (64, 4)
        # next_obs = obs + 1 row by row: the rows come back whole from whichever shard holds them.
        assert (batch.next_observations == batch.observations + 1).all()
        td = batch.observations[:, 0].numpy() + 1.0  # priority from the row's content
        buf.update_priorities(batch.indices, td)
        assert buf.max_priority == pytest.approx(float(td.max()))
        sizes = [s.size for s in replay.summaries]
        assert sum(sizes) == 100 and abs(sizes[0] - sizes[1]) <= 2
        weights = buf.sample(256).weights.numpy().ravel()
        assert weights.max() <= 1.0 and weights.min() < 1.0
        with pytest.raises(TypeError, match="shards"):
            _ = buf.observations
        with pytest.raises(TypeError, match="summaries"):
            buf.priorities()
    finally:
        buf.replay.close()


@pytest.mark.parametrize(
    "kwargs, error, words",
    [
        (dict(distributed="2 shards"), TypeError, "distributed"),
        (dict(distributed=dict(address=None)), ValueError, "num_shards"),
        (dict(distributed=dict(num_shards=2), optimize_memory_usage=True, handle_timeout_termination=False),
         ValueError, "optimize_memory_usage"),
        (dict(distributed=dict(num_shards=2), staleness=3), ValueError, "staleness"),
        (dict(distributed=dict(num_shards=2), storage="disk"), ValueError, "storage"),
        (dict(distributed=dict(num_shards=2), placement=Placement()), ValueError, "placement"),
        (dict(distributed=dict(num_shards=0)), ValueError, "num_shards"),
    ],
)  # fmt: skip
def test_bad_distributed_arguments_are_refused(kwargs: dict, error: type, words: str) -> None:
    with pytest.raises(error, match=words):
        buffer(**kwargs)


def test_a_ready_sharded_replay_must_have_the_buffers_schema() -> None:
    wrong = ShardedReplay(2, 100, {"obs": ((3,), "float32")})
    try:
        with pytest.raises(ValueError, match="schema"):
            buffer(distributed=wrong)
    finally:
        wrong.close()
    probe = buffer(distributed=dict(num_shards=2))
    schema = probe.replay.schema
    probe.replay.close()
    mine = ShardedReplay(3, 100, schema, seed=1)
    try:
        buf = buffer(distributed=mine)
        assert buf.replay is mine
        add_rows(buf, 10)
        assert len(buf.replay) == 20 and buf.size() == 10  # .replay hands the staged rows over first
        with pytest.raises(ValueError, match="reset"):
            buf.reset()
    finally:
        mine.close()


@pytest.mark.parametrize(
    "algo, env, staleness",
    [(PERDQN, "CartPole-v1", 0), (PERSAC, "Pendulum-v1", 0), (PERTD3, "Pendulum-v1", 0), (PERDQN, "CartPole-v1", 2)],
)
def test_per_algorithms_train_from_a_sharded_replay(algo: type, env: str, staleness: int) -> None:
    model = algo(
        "MlpPolicy", env, learning_starts=100, batch_size=32, train_freq=8, gradient_steps=4, seed=0, device="cpu",
        policy_kwargs=dict(net_arch=[32, 32]), replay_buffer_kwargs=dict(distributed=dict(num_shards=2), staleness=staleness),
    )  # fmt: skip
    try:
        model.learn(400)
        replay = model.replay_buffer.replay
        assert model._n_updates > 0 and replay.staleness == staleness
        assert replay.stats["batches"] >= model._n_updates  # every gradient step sampled the shards
        assert model.replay_buffer.max_priority > 1.0 or model.replay_buffer.max_priority < 1.0  # TD errors fed back
        assert all(s.version > 1 for s in replay.summaries)
    finally:
        model.replay_buffer.replay.close()
