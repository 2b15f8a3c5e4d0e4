"""Tianshou DQN trains from a ShardedReplay (2 Ray shards) through ShardedVectorReplayBuffer and PEROffPolicyWrapper.

The training runs are real (Collector, OffPolicyTrainer, CartPole-v1, 4 envs)
and instrumented: every row sent to the shards, every batch drawn, every batch
the DQN's gradient step saw and every priority update are recorded, so one set
of runs backs both the mechanics checks and the learning check.

Learning rule (as in test_sb3_learning.py, with margin): a uniformly random
policy scores about 22 on CartPole-v1, a constant action 8-10. Each seed trains
at most BUDGET env steps (one gradient step per two env steps, after WARMUP
random steps) and is evaluated greedily every EVAL_EVERY steps; NEEDED of
SEEDS must reach THRESHOLD at an evaluation. Measured with this setup (rl-zoo's
CartPole DQN network and learning rate, as test_sb3_learning.py), without the
early stop: all of seeds 0-15 reached 150 by 1,500 steps (at 1,000 steps they
evaluated at 124-500, median ~225), so the budget is twice what any seed needed.
Seeds run in order and stop once NEEDED have passed, and the trainer stops a
seed at its first evaluation at THRESHOLD: the file takes 30-60 s on 2 busy
cores, nearly all of it Ray round trips (each draw, add and update ~1-5 ms).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
import torch

pytest.importorskip("tianshou")
pytest.importorskip("ray")  # the ray_local fixture (conftest.py) starts a local instance per module

import gymnasium as gym  # noqa: E402
from tianshou.data import Batch, Collector, CollectStats  # noqa: E402
from tianshou.env import DummyVectorEnv  # noqa: E402
from tianshou.trainer import OffPolicyTrainerParams  # noqa: E402
from tianshou.utils.torch_utils import policy_within_training_step  # noqa: E402

from hetero_replay.adapters.tianshou import (  # noqa: E402
    LinearBetaSchedule,
    PEROffPolicyWrapper,
    ShardedVectorReplayBuffer,
    transition_schema,
)
from hetero_replay.adapters.tianshou.sharded import FIELDS, ShardedSampleBuffer  # noqa: E402
from hetero_replay.adapters.tianshou.workload import STANDARD_HYPERPARAMS, standard_algorithm  # noqa: E402
from hetero_replay.distributed import ShardedReplay  # noqa: E402

ENV = "CartPole-v1"
N_ENVS = 4
WARMUP = 1000  # random env steps before training
BUDGET = 3000  # training env steps per seed
EVAL_EVERY = 500  # env steps (one epoch)
EVAL_EPISODES = 5
UPDATES_PER_STEP = 0.5
THRESHOLD = 150.0  # mean greedy return over EVAL_EPISODES
EPS_FINAL, EPS_DECAY_STEPS = 0.04, 1600  # epsilon-greedy exploration: 1 -> EPS_FINAL over the first training steps
SEEDS = (0, 1, 2)
NEEDED = 2
#: rl-zoo's CartPole DQN network and learning rate; the target network synced every 100 env steps (50 updates).
HP = dataclasses.replace(
    STANDARD_HYPERPARAMS["dqn"], hidden_sizes=(256, 256), lr=2.3e-3, extra=dict(target_update_freq=50)
)


@dataclass
class Run:
    """What one instrumented training run recorded."""

    seed: int
    sent: list[dict[str, np.ndarray]] = field(default_factory=list)  # every replay.add
    drawn: list[Any] = field(default_factory=list)  # every replay.sample's Sample
    trained: list[dict[str, np.ndarray]] = field(default_factory=list)  # what DQN's update step saw
    updated: list[tuple[np.ndarray, np.ndarray]] = field(default_factory=list)  # update_priorities(indices, td)
    evaluations: list[float] = field(default_factory=list)  # the best mean greedy return so far, per evaluation
    num_updates: int = 0
    train_steps: int = 0
    buffer_sent: int = 0
    buffer_staged: int = 0
    filled: int = 0
    versions: int = 0
    max_priority: float = 0.0
    stats: dict[str, int] = field(default_factory=dict)
    final_weights: np.ndarray | None = None
    final_beta: float = 0.0

    @property
    def best(self) -> float:
        return max(self.evaluations)


def _record(obj: Any, name: str, log: list, what: Any) -> None:
    """Replace ``obj.name`` by a wrapper that appends ``what(args, result)`` to ``log``."""
    original = getattr(obj, name)

    def spy(*args: Any, **kwargs: Any) -> Any:
        result = original(*args, **kwargs)
        log.append(what(args, result))
        return result

    setattr(obj, name, spy)


def train(seed: int) -> Run:
    """One seed of DQN on CartPole from a 2-shard replay, with the trainer's early stop at THRESHOLD."""
    run = Run(seed)
    torch.manual_seed(seed)
    np.random.seed(seed)
    env = gym.make(ENV)
    dqn = standard_algorithm("dqn", env, HP)
    updates = int(BUDGET * UPDATES_PER_STEP)
    algorithm = PEROffPolicyWrapper(wrapped_algorithm=dqn, beta=LinearBetaSchedule(0.4, 1.0, updates))
    buf = ShardedVectorReplayBuffer(
        N_ENVS, num_shards=2, capacity_per_shard=5_000, alpha=0.6, seed=seed, episode_capacity=500,
        send_every=64, observation_space=env.observation_space, action_space=env.action_space,
    )  # fmt: skip
    replay = buf.replay
    _record(replay, "add", run.sent, lambda a, r: {k: np.array(v) for k, v in a[0].items()})
    _record(replay, "sample", run.drawn, lambda a, r: r)
    _record(replay, "update_priorities", run.updated, lambda a, r: (np.array(a[0]), np.array(a[1])))
    step = dqn._update_with_batch  # what weighted_update calls for DQN's MSE loss

    def recorded_step(batch: Batch) -> Any:
        """The gradient step, recording its batch first (the step pops the IS weights)."""
        rows = {k: np.array(batch[k]) for k in FIELDS}
        rows["weight"] = batch.weight.detach().numpy().copy()
        run.trained.append(rows)
        return step(batch)

    dqn._update_with_batch = recorded_step

    train_envs = DummyVectorEnv([lambda: gym.make(ENV) for _ in range(N_ENVS)])
    train_envs.seed(seed)
    test_envs = DummyVectorEnv([lambda: gym.make(ENV) for _ in range(EVAL_EPISODES)])
    test_envs.seed(seed + 1000)
    collector = Collector[CollectStats](algorithm, train_envs, buf, exploration_noise=True)
    collector.reset()
    collector.collect(n_step=WARMUP, random=True)
    policy = algorithm.policy

    def training_fn(epoch: int, env_step: int) -> None:
        policy.set_eps_training(max(EPS_FINAL, 1.0 - (1.0 - EPS_FINAL) * env_step / EPS_DECAY_STEPS))

    def stop_fn(mean_return: float) -> bool:
        run.evaluations.append(float(mean_return))
        return mean_return >= THRESHOLD

    params = OffPolicyTrainerParams(
        training_collector=collector, test_collector=Collector[CollectStats](algorithm, test_envs),
        max_epochs=BUDGET // EVAL_EVERY, epoch_num_steps=EVAL_EVERY, collection_step_num_env_steps=N_ENVS,
        update_step_num_gradient_steps_per_sample=UPDATES_PER_STEP, batch_size=64,
        test_step_num_episodes=EVAL_EPISODES, training_fn=training_fn, stop_fn=stop_fn,
        test_in_training=False, verbose=False, show_progress=False,
    )  # fmt: skip
    result = algorithm.run_training(params)
    run.num_updates, run.train_steps = algorithm.num_updates, result.train_step
    run.final_beta = algorithm.current_beta
    run.buffer_sent, run.buffer_staged = buf.sent, buf.staged
    run.filled, run.max_priority = replay.filled, replay.max_priority
    run.versions = sum(s.version for s in replay.summaries)
    run.stats = dict(replay.stats)
    buf.send()
    run.final_weights = ShardedReplay.sample(replay, 512, beta=1.0).weights  # the class's method: not recorded
    buf.close()
    train_envs.close()
    test_envs.close()
    return run


@pytest.fixture(scope="module")
def runs(ray_local) -> list[Run]:
    """SEEDS in order, until NEEDED have reached THRESHOLD (or all ran)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        done: list[Run] = []
        for seed in SEEDS:
            done.append(train(seed))
            if sum(r.best >= THRESHOLD for r in done) >= NEEDED:
                break
        return done
    finally:
        torch.set_num_threads(threads)


def _row_keys(rows: dict[str, np.ndarray]) -> set[bytes]:
    """Each row's bytes over FIELDS, in the replay's dtypes (the identity of a transition)."""
    n = len(rows["obs"])
    parts = [np.ascontiguousarray(rows[k]).reshape(n, -1).view(np.uint8) for k in FIELDS]
    return {b"".join(p[i].tobytes() for p in parts) for i in range(n)}


# -- (a) what training did to the shards -----------------------------------------------------------


def test_dqn_trains_from_the_shards_with_exact_per(runs: list[Run]) -> None:
    for run in runs:
        # One draw, one gradient step and one priority update per update, nothing else.
        assert run.num_updates == len(run.drawn) == len(run.trained) == len(run.updated) == run.stats["batches"]
        assert run.num_updates >= 100 and run.stats["inexact_batches"] == 0
        for sample, (indices, td) in zip(run.drawn, run.updated):
            assert np.array_equal(indices, sample.indices)  # TD errors went to the rows drawn
            assert np.all(np.isfinite(td)) and np.all(td >= 0)
        assert run.max_priority > 1.0  # TD errors beyond the initial priority reached the shards
        # Every add and every update changed a shard (each reaches at least one).
        assert run.versions >= len(run.sent) + run.num_updates
        # Every transition collected went to the replay (none lost, none twice), the last ones maybe still staged.
        assert run.buffer_sent == run.filled == sum(len(s["obs"]) for s in run.sent)
        assert run.buffer_sent + run.buffer_staged == WARMUP + run.train_steps
        # The IS weights the gradient step used are the replay's, normalised by the global minimum.
        weights = np.concatenate([t["weight"] for t in run.trained])
        assert np.allclose(weights, np.concatenate([s.weights for s in run.drawn]), rtol=1e-6)
        assert weights.max() <= 1.0 + 1e-6 and weights.min() < 0.9
        assert len(np.unique(run.final_weights)) > 50  # the priorities differ from row to row
        assert run.final_beta > 0.4


def test_dqn_trained_on_real_transitions(runs: list[Run]) -> None:
    for run in runs:
        sent = set()
        for rows in run.sent:
            sent |= _row_keys(rows)
        for i, (sample, trained) in enumerate(zip(run.drawn, run.trained)):
            for k in FIELDS:  # the batch the step saw is the drawn batch, row for row
                assert np.array_equal(np.asarray(trained[k]), sample.data[k]), (run.seed, i, k)
            assert _row_keys({k: sample.data[k] for k in FIELDS}) <= sent, (run.seed, i)
        # CartPole: a step moves the cart, reward 1 each step.
        rows = run.drawn[-1].data
        assert np.all(rows["rew"] == 1.0) and not np.array_equal(rows["obs"], rows["obs_next"])


# -- (b) learning --------------------------------------------------------------------------------


@pytest.mark.learning
def test_dqn_learns_cartpole_from_the_shards(runs: list[Run]) -> None:
    passed = [r.seed for r in runs if r.best >= THRESHOLD]
    curves = {r.seed: [round(e, 1) for e in r.evaluations] for r in runs}
    assert len(passed) >= NEEDED, f"seeds reaching {THRESHOLD}: {passed} (evaluations {curves})"


@pytest.mark.parametrize("algo", ["ddpg", "sac"])
def test_continuous_actions_train_from_the_shards(ray_local, algo: str) -> None:
    env = gym.make("Pendulum-v1")
    algorithm = PEROffPolicyWrapper(
        wrapped_algorithm=standard_algorithm(algo, env, STANDARD_HYPERPARAMS[algo]), beta=0.5
    )
    buf = ShardedVectorReplayBuffer(2, num_shards=2, capacity_per_shard=1000, seed=0, episode_capacity=200)
    try:
        envs = DummyVectorEnv([lambda: gym.make("Pendulum-v1") for _ in range(2)])
        collector = Collector[CollectStats](algorithm, envs, buf, exploration_noise=True)
        collector.reset()
        collector.collect(n_step=200, random=True)
        collector.collect(n_step=20)  # the policy's own actions: the same dtype as the random ones
        assert buf.replay.schema == transition_schema(env.observation_space, env.action_space)  # act: (1,) float32
        with policy_within_training_step(algorithm.policy):
            stats = [algorithm.update(buf, 32) for _ in range(10)]
        assert buf.replay.stats["batches"] == algorithm.num_updates == 10 and buf.replay.filled == 220
        assert buf.replay.max_priority > 1.0 and all(s.td_error_abs_mean > 0 for s in stats)  # Pendulum's big TD errors
    finally:
        buf.close()


def test_the_replays_own_staleness_trains_with_the_relaxed_schedule(ray_local) -> None:
    env = gym.make(ENV)
    algorithm = PEROffPolicyWrapper(wrapped_algorithm=standard_algorithm("dqn", env, HP), beta=0.4)
    buf = ShardedVectorReplayBuffer(
        2, num_shards=2, capacity_per_shard=1000, seed=0, staleness=2,
        observation_space=env.observation_space, action_space=env.action_space,
    )  # fmt: skip
    try:
        _collected(buf, algorithm, steps=100)
        with policy_within_training_step(algorithm.policy):
            stats = [algorithm.update(buf, 32) for _ in range(8)]
        replay = buf.replay
        assert replay.staleness == 2 and replay.stats["batches"] >= 8 and replay.stats["redraws"] == 0
        assert replay.max_priority != 1.0  # the carried TD errors reached the shards
        assert all(0 < s.is_weight_mean <= 1.0 for s in stats)
    finally:
        buf.close()


# -- (c) refused input -----------------------------------------------------------------------------


def _collected(buf: ShardedVectorReplayBuffer, algorithm: Any, steps: int = 40) -> Collector:
    envs = DummyVectorEnv([lambda: gym.make(ENV) for _ in range(2)])
    envs.seed(0)
    collector = Collector[CollectStats](algorithm, envs, buf, exploration_noise=True)
    collector.reset()
    collector.collect(n_step=steps, random=True)
    return collector


def _state(replay: ShardedReplay) -> tuple:
    return tuple(replay.summaries), dict(replay.stats), replay.rng.bit_generator.state["state"]["state"]


def test_n_step_and_staleness_are_refused_before_anything_changes(ray_local) -> None:
    env = gym.make(ENV)
    buf = ShardedVectorReplayBuffer(
        2, num_shards=2, capacity_per_shard=1000, send_every=1000, seed=0,
        observation_space=env.observation_space, action_space=env.action_space,
    )  # fmt: skip
    try:
        dqn = standard_algorithm("dqn", env, HP)
        dqn.n_step = 3  # as DQN(n_step_return_horizon=3) sets it
        algorithm = PEROffPolicyWrapper(wrapped_algorithm=dqn, beta=0.4)
        _collected(buf, algorithm)
        staged, before = buf.staged, _state(buf.replay)
        assert staged == 40 and buf.sent == 0
        with policy_within_training_step(algorithm.policy), pytest.raises(ValueError, match="n_step = 3.*other shards"):
            algorithm.update(buf, 16)
        assert (buf.staged, buf.sent, algorithm.num_updates) == (staged, 0, 0) and _state(buf.replay) == before

        dqn.n_step = 1
        stale = PEROffPolicyWrapper(wrapped_algorithm=dqn, beta=0.4, staleness=1)
        with (
            policy_within_training_step(stale.policy),
            pytest.raises(TypeError, match="staleness=1.*ShardedVectorReplayBuffer"),
        ):
            stale.update(buf, 16)
        assert (buf.staged, buf.sent) == (staged, 0) and _state(buf.replay) == before

        # Unwrapped, the algorithm would sample the local rings: refused.
        with policy_within_training_step(dqn.policy), pytest.raises(TypeError, match="PEROffPolicyWrapper"):
            dqn.update(buf, 16)
        with pytest.raises(ValueError, match="whole buffer"):
            buf.draw(None)

        # With one-step returns the same wrapper trains: the staged rows go out first.
        with policy_within_training_step(algorithm.policy):
            stats = algorithm.update(buf, 16)
        assert (buf.staged, buf.sent, algorithm.num_updates) == (0, 40, 1) and buf.replay.filled == 40
        assert stats.beta == 0.4 and 0 < stats.is_weight_mean <= 1.0
    finally:
        buf.close()


def test_mismatched_replay_is_refused_and_nothing_changes(ray_local) -> None:
    env = gym.make(ENV)
    spaces = dict(observation_space=env.observation_space, action_space=env.action_space)
    good = transition_schema(env.observation_space, env.action_space)
    wrong_shape = {**{k: (f.shape, f.dtype) for k, f in good.items()}, "obs": ((3,), np.float32)}
    wrong_kind = {**{k: (f.shape, f.dtype) for k, f in good.items()}, "act": ((), np.float32)}
    replays = [ShardedReplay(1, 100, schema) for schema in (wrong_shape, wrong_kind)]
    try:
        # Known spaces: refused when the buffer is built.
        with pytest.raises(ValueError, match=r"field 'obs': the replay stores shape \(3,\), the spaces give \(4,\)"):
            ShardedVectorReplayBuffer(2, replays[0], **spaces)
        with pytest.raises(ValueError, match="field 'act': the replay stores float32, the spaces give int64"):
            ShardedVectorReplayBuffer(2, replays[1], **spaces)
        # Spaces not given: refused at the first add, before the local rings or the replay change.
        dqn = PEROffPolicyWrapper(wrapped_algorithm=standard_algorithm("dqn", env, HP), beta=0.4)
        for replay in replays:
            buf = ShardedVectorReplayBuffer(2, replay)
            with pytest.raises(ValueError, match="the collected data gives"):
                _collected(buf, dqn)
            assert (len(buf), buf.staged, buf.sent, replay.filled) == (0, 0, 0, 0)
        foreign = ShardedReplay(1, 100, {"obs": ((4,), np.float32), "reward": ((), np.float32)})
        replays.append(foreign)
        with pytest.raises(ValueError, match="has the fields .* but a Tianshou transition has"):
            ShardedVectorReplayBuffer(2, foreign, **spaces)
    finally:
        for replay in replays:
            replay.close()


def test_schema_from_the_first_batch_equals_the_spaces_schema(ray_local) -> None:
    env = gym.make(ENV)
    buf = ShardedVectorReplayBuffer(2, num_shards=1, capacity_per_shard=100, send_every=8)
    try:
        assert buf.replay is None  # built at the first add, from that batch
        dqn = PEROffPolicyWrapper(wrapped_algorithm=standard_algorithm("dqn", env, HP), beta=0.4)
        _collected(buf, dqn, steps=20)
        assert buf.replay.schema == transition_schema(env.observation_space, env.action_space)
        assert buf.sent == 16 and buf.staged == 4  # sent in lots of send_every
        buf.reset()  # Collector.reset(): the staged rows go out, the local rings empty, the replay keeps its rows
        assert (buf.sent, buf.staged, len(buf)) == (20, 0, 0)
        drawn = buf.draw(8, beta=1.0)
        assert isinstance(drawn, ShardedSampleBuffer) and buf.replay.filled == 20
        batch, indices = drawn.sample(8)
        assert np.array_equal(indices, np.arange(8)) and np.array_equal(batch.weight, drawn.drawn.weights)
        with pytest.raises(ValueError, match="drawn with 8"):
            drawn.sample(4)
    finally:
        buf.close()


def test_episodes_longer_than_the_local_ring_are_refused(ray_local) -> None:
    buf = ShardedVectorReplayBuffer(1, num_shards=1, capacity_per_shard=100, episode_capacity=3, send_every=2)
    try:

        def step(t: int, done: bool = False) -> Batch:
            obs = np.full((1, 2), t, np.float32)
            return Batch(
                obs=obs, act=np.array([t]), rew=np.array([1.0]), terminated=np.array([done]),
                truncated=np.array([False]), obs_next=obs + 1, info=Batch(),
            )  # fmt: skip

        for t in range(3):
            buf.add(step(t))
        with pytest.raises(ValueError, match="reached 4 steps, more than episode_capacity=3"):
            buf.add(step(3))
        assert (len(buf), buf.sent + buf.staged) == (3, 3)
        with pytest.raises(NotImplementedError, match="on_episode_done hook"):
            buf.set_array_at_key(np.zeros(3), "extra", index=np.arange(3))
        with pytest.raises(TypeError, match="Dict or Tuple space"):
            buf.add(Batch(obs=Batch(a=np.zeros((1, 2))), act=[0], rew=[0.0], terminated=[True], truncated=[False],
                          obs_next=Batch(a=np.zeros((1, 2)))))  # fmt: skip
        assert (len(buf), buf.sent + buf.staged) == (3, 3)
    finally:
        buf.close()


def test_bad_arguments_are_refused_without_ray() -> None:
    with pytest.raises(TypeError, match="num_shards= and capacity_per_shard="):
        ShardedVectorReplayBuffer(2, capacity_per_shard=10)
    with pytest.raises(TypeError, match="unexpected keyword argument 'shards'"):
        ShardedVectorReplayBuffer(2, num_shards=1, capacity_per_shard=10, shards=3)
    with pytest.raises(TypeError, match="replay must be a ShardedReplay"):
        ShardedVectorReplayBuffer(2, replay="replay")
    with pytest.raises(ValueError, match="episode_capacity must be >= 1"):
        ShardedVectorReplayBuffer(2, num_shards=1, capacity_per_shard=10, episode_capacity=0)
    with pytest.raises(TypeError, match="both observation_space and action_space"):
        ShardedVectorReplayBuffer(
            2, num_shards=1, capacity_per_shard=10, observation_space=gym.make(ENV).observation_space
        )
    with pytest.raises(TypeError, match="no fixed shape and dtype"):
        transition_schema(gym.spaces.Dict({"a": gym.spaces.Discrete(2)}), gym.spaces.Discrete(2))
