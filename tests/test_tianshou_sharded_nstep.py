"""n-step returns from a ShardedReplay: each row carries its window from the write, and Tianshou's own n-step
code computes on a drawn batch exactly the return it computes on a local buffer holding the same episodes."""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("tianshou")
pytest.importorskip("ray")

import gymnasium as gym  # noqa: E402
from tianshou.algorithm.algorithm_base import Algorithm  # noqa: E402
from tianshou.data import Batch, Collector, CollectStats, VectorReplayBuffer  # noqa: E402
from tianshou.env import DummyVectorEnv  # noqa: E402
from tianshou.utils.torch_utils import policy_within_training_step  # noqa: E402

from hetero_replay.adapters.tianshou import PEROffPolicyWrapper, ShardedVectorReplayBuffer, transition_schema  # noqa: E402
from hetero_replay.adapters.tianshou.workload import STANDARD_HYPERPARAMS, standard_algorithm  # noqa: E402
from hetero_replay.distributed import ShardedReplay  # noqa: E402

N, GAMMA, ENVS = 3, 0.9, 2
OBS_SPACE, ACT_SPACE = gym.spaces.Box(-1e6, 1e6, (2,), np.float32), gym.spaces.Discrete(2)

#: Per env, its steps: (reward, terminated, truncated). Env 0: an episode that terminates, one cut by a time
#: limit, one still running when collection stops; env 1: a one-step episode, then a long running one.
EPISODES = {
    0: [(1.0, False, False), (2.0, False, False), (3.0, False, False), (4.0, True, False),
        (5.0, False, False), (6.0, False, True),
        (7.0, False, False), (8.0, False, False)],
    1: [(10.0, True, False),
        (11.0, False, False), (12.0, False, False), (13.0, False, False), (14.0, False, False), (15.0, False, False)],
}  # fmt: skip


def step_of(env: int, t: int) -> Batch:
    """Step ``t`` of ``env``: its obs encodes (env, t), obs_next (env, t + 1)."""
    rew, term, trunc = EPISODES[env][t]
    return Batch(obs=np.array([[env, t]], np.float32), act=np.array([t % 2]), rew=np.array([rew]),
                 terminated=np.array([term]), truncated=np.array([trunc]),
                 obs_next=np.array([[env, t + 1]], np.float32), info=Batch())  # fmt: skip


def target_q(buffer, indices: np.ndarray) -> torch.Tensor:
    """A stand-in target Q that depends on the row read: 100 * env + the step obs_next names."""
    obs_next = np.asarray(buffer[indices].obs_next)
    return torch.as_tensor(100.0 * obs_next[:, 0] + obs_next[:, 1] + 0.5)


def test_a_drawn_batchs_n_step_returns_equal_a_local_buffers(ray_local) -> None:
    replay = ShardedReplay(2, 64, transition_schema(OBS_SPACE, ACT_SPACE, N), seed=0, alpha=0.0, eps=1.0)
    buf = ShardedVectorReplayBuffer(ENVS, replay, n_step=N, send_every=1, observation_space=OBS_SPACE,
                                    action_space=ACT_SPACE)  # fmt: skip
    local = VectorReplayBuffer(64, ENVS)
    try:
        for t in range(max(len(e) for e in EPISODES.values())):
            for env, steps in EPISODES.items():
                if t < len(steps):
                    buf.add(step_of(env, t), buffer_ids=[env])
                    local.add(step_of(env, t), buffer_ids=[env])
        assert buf.sent + buf.staged + buf.open_windows == 14
        assert buf.open_windows == 2 + 2  # env 0: steps 6, 7; env 1: steps 4, 5 (steps 1-3 are complete)
        buf.close()  # the running episodes' windows go out, cut short: the replay (given, not owned) stays
        assert buf.open_windows == 0 and replay.filled == 14

        drawn = buf.draw(512)  # uniform (alpha 0): every transition, many times
        batch, indices = drawn.sample(512)
        ours = Algorithm.compute_nstep_return(batch, drawn, indices, target_q, GAMMA, N).returns.numpy().ravel()
        ids = np.asarray(batch.obs).astype(int)  # (env, t) of each drawn transition
        assert {tuple(i) for i in ids} == {(e, t) for e, s in EPISODES.items() for t in range(len(s))}
        where = {(int(local.obs[i][0]), int(local.obs[i][1])): i for i in range(len(local.obs)) if local.done[i] or
                 i in local.sample_indices(0)}  # fmt: skip
        local_idx = np.array([where[tuple(i)] for i in ids])
        theirs = (
            Algorithm.compute_nstep_return(local[local_idx], local, local_idx, target_q, GAMMA, N)
            .returns.numpy()
            .ravel()
        )
        np.testing.assert_allclose(ours, theirs, rtol=1e-12)
        # spot checks by hand: a full window, one cut by termination, one by the time limit
        by_id = {tuple(i): r for i, r in zip(ids.tolist(), ours)}
        assert by_id[(0, 0)] == pytest.approx(1 + 0.9 * 2 + 0.81 * 3 + 0.729 * (100 * 0 + 3 + 0.5))
        assert by_id[(0, 2)] == pytest.approx(3 + 0.9 * 4)  # terminated at step 3: no bootstrap
        assert by_id[(0, 4)] == pytest.approx(5 + 0.9 * 6 + 0.81 * (6 + 0.5))  # truncated at 5: bootstraps
        # the running episode, cut at collection's stop: bootstraps from its last step, as a local buffer does
        assert by_id[(1, 4)] == pytest.approx(14 + 0.9 * 15 + 0.81 * (100 + 6 + 0.5))
        drawn.update_weight(indices[:4], np.array([1.0, 2.0, 3.0, 4.0]))  # goes to the drawn rows' shards
        assert replay.max_priority == pytest.approx(5.0)  # |td| + eps
    finally:
        replay.close()


def test_dqn_with_a_3_step_horizon_trains_from_the_shards_and_a_mismatch_is_refused(ray_local) -> None:
    env = gym.make("CartPole-v1")
    hp = STANDARD_HYPERPARAMS["dqn"]
    buf = ShardedVectorReplayBuffer(
        2, num_shards=2, capacity_per_shard=1000, seed=0, n_step=N,
        observation_space=env.observation_space, action_space=env.action_space,
    )  # fmt: skip
    try:
        one_step = PEROffPolicyWrapper(wrapped_algorithm=standard_algorithm("dqn", env, hp), beta=0.4)
        dqn = standard_algorithm("dqn", env, hp)
        dqn.n_step = N  # as DQN(n_step_return_horizon=3) sets it
        algorithm = PEROffPolicyWrapper(wrapped_algorithm=dqn, beta=0.4)
        envs = DummyVectorEnv([lambda: gym.make("CartPole-v1") for _ in range(2)])
        envs.seed(0)
        collector = Collector[CollectStats](algorithm, envs, buf, exploration_noise=True)
        collector.reset()
        collector.collect(n_step=200, random=True)
        assert buf.sent + buf.staged + buf.open_windows == 200
        with policy_within_training_step(one_step.policy), pytest.raises(ValueError, match="n_step = 1.*n_step=3"):
            one_step.update(buf, 32)  # a one-step algorithm would read windows as one-step rows
        with policy_within_training_step(algorithm.policy):
            stats = [algorithm.update(buf, 32) for _ in range(5)]
        assert buf.replay.stats["batches"] == 5 and buf.replay.max_priority != 1.0
        assert all(np.isfinite(s.loss) and 0 < s.is_weight_mean <= 1.0 for s in stats)
    finally:
        buf.close()


def test_bad_n_step_is_refused() -> None:
    with pytest.raises(ValueError, match="n_step"):
        ShardedVectorReplayBuffer(2, n_step=0, num_shards=1, capacity_per_shard=8)
    with pytest.raises(ValueError, match="n_step"):
        ShardedVectorReplayBuffer(2, n_step=20, episode_capacity=10, num_shards=1, capacity_per_shard=8)
    with pytest.raises(TypeError, match="n_step"):
        transition_schema(OBS_SPACE, ACT_SPACE, 2.0)  # type: ignore[arg-type]
