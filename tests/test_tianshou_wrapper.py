"""PEROffPolicyWrapper: IS weights in every loss, beta reaching sampling, TD feedback, logging, state.

Loss checks replay the exact update: a deep copy of the buffer draws the same
batch (same generator state) and a deep copy of the algorithm computes the same
targets, from which the expected loss is computed by hand and compared with the
loss the wrapped update reports.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("tianshou")

import gymnasium as gym  # noqa: E402
from tianshou.algorithm import DDPG, DQN  # noqa: E402
from tianshou.algorithm.modelfree.ddpg import ContinuousDeterministicPolicy  # noqa: E402
from tianshou.algorithm.modelfree.dqn import DiscreteQLearningPolicy  # noqa: E402
from tianshou.algorithm.modelfree.sac import SAC, SACPolicy  # noqa: E402
from tianshou.algorithm.modelfree.td3 import TD3  # noqa: E402
from tianshou.algorithm.optim import AdamOptimizerFactory, LRSchedulerFactoryLinear  # noqa: E402
from tianshou.data import Collector, PrioritizedVectorReplayBuffer, VectorReplayBuffer  # noqa: E402
from tianshou.env import DummyVectorEnv  # noqa: E402
from tianshou.utils.net.common import Net  # noqa: E402
from tianshou.utils.net.continuous import (  # noqa: E402
    ContinuousActorDeterministic,
    ContinuousActorProbabilistic,
    ContinuousCritic,
)
from tianshou.utils.torch_utils import policy_within_training_step  # noqa: E402

from hetero_replay import DEFAULT_EPS  # noqa: E402
from hetero_replay.adapters.tianshou import (  # noqa: E402
    HeteroPrioritizedVectorReplayBuffer,
    LinearBetaSchedule,
    PEROffPolicyWrapper,
    PERTrainingStats,
)

BATCH = 32


def dqn(huber_loss_delta: float | None = None, optim: AdamOptimizerFactory | None = None, cls: type = DQN) -> DQN:
    torch.manual_seed(0)
    env = gym.make("CartPole-v1")
    policy = DiscreteQLearningPolicy(model=Net(state_shape=(4,), action_shape=2, hidden_sizes=[16]),
                                     action_space=env.action_space, eps_training=0.5)  # fmt: skip
    return cls(policy=policy, optim=optim or AdamOptimizerFactory(lr=1e-3), target_update_freq=10,
               huber_loss_delta=huber_loss_delta)  # fmt: skip


def actor_critic(name: str) -> DDPG | TD3 | SAC:
    torch.manual_seed(0)
    env = gym.make("Pendulum-v1")
    obs, act = env.observation_space.shape, env.action_space.shape

    def critic() -> ContinuousCritic:
        return ContinuousCritic(preprocess_net=Net(state_shape=obs, action_shape=act, hidden_sizes=[16], concat=True))

    common = dict(
        policy_optim=AdamOptimizerFactory(lr=1e-3), critic=critic(), critic_optim=AdamOptimizerFactory(lr=1e-3)
    )
    if name == "sac":
        actor = ContinuousActorProbabilistic(preprocess_net=Net(state_shape=obs, hidden_sizes=[16]), action_shape=act,
                                             unbounded=True, conditioned_sigma=True)  # fmt: skip
        return SAC(policy=SACPolicy(actor=actor, action_space=env.action_space), critic2=critic(), **common)
    actor = ContinuousActorDeterministic(preprocess_net=Net(state_shape=obs, hidden_sizes=[16]), action_shape=act)
    policy = ContinuousDeterministicPolicy(actor=actor, action_space=env.action_space)
    return TD3(policy=policy, critic2=critic(), **common) if name == "td3" else DDPG(policy=policy, **common)


def filled(algorithm, env_id: str = "CartPole-v1", buffer=None, steps: int = 200):
    """``buffer`` (default: ours, 2 envs) filled with random transitions, priorities (if any) spread out."""
    buf = buffer if buffer is not None else HeteroPrioritizedVectorReplayBuffer(1000, 2, random_seed=0)
    envs = DummyVectorEnv([lambda: gym.make(env_id) for _ in range(2)])
    envs.seed(0)
    collector = Collector(algorithm, envs, buf)
    collector.reset()
    collector.collect(n_step=steps, random=True)
    if hasattr(buf, "update_weight"):
        stored = np.sort(buf.sample_indices(0))
        buf.update_weight(stored, np.random.default_rng(0).exponential(1.0, len(stored)))
    return buf


def replay(algorithm, buf, beta: float, torch_seed: int = 7):
    """The batch the next update of ``algorithm`` on ``buf`` will use, pre-processed by a copy."""
    twin_buf, twin = copy.deepcopy(buf), copy.deepcopy(algorithm)
    twin_buf.set_beta(beta)
    batch, indices = twin_buf.sample(BATCH)
    torch.manual_seed(torch_seed)  # TD3/SAC draw target actions from torch's generator
    with policy_within_training_step(twin.policy):  # SAC samples (not the mode) only then
        batch = twin._preprocess_batch(batch, twin_buf, indices)
    return twin, batch, indices


def update(algorithm, buf, torch_seed: int = 7):
    torch.manual_seed(torch_seed)
    with policy_within_training_step(algorithm.policy):
        return algorithm.update(buffer=buf, sample_size=BATCH)


# -- IS weights reach every loss ---------------------------------------------------------------


@pytest.mark.parametrize("huber", [None, 1.0], ids=["mse", "huber"])
def test_dqn_loss_is_weighted_and_td_errors_become_priorities(huber: float | None) -> None:
    algorithm = PEROffPolicyWrapper(wrapped_algorithm=dqn(huber), beta=1.0)
    buf = filled(algorithm)
    twin, batch, indices = replay(algorithm.wrapped_algorithm, buf, beta=1.0)
    with torch.no_grad():
        q = twin.policy(batch).logits[np.arange(BATCH), batch.act]
        returns = batch.returns.flatten()
        per_sample = (returns - q) ** 2 if huber is None else F.huber_loss(q, returns, delta=huber, reduction="none")
    w = batch.weight
    assert w.min() < 0.5  # the weights differ enough to matter

    stats = update(algorithm, buf)
    assert isinstance(stats, PERTrainingStats)
    assert stats.loss == pytest.approx(float((w * per_sample).mean()), rel=1e-5)
    assert stats.loss != pytest.approx(float(per_sample.mean()), rel=1e-2)
    # |TD errors| fed back: p = (|td| + eps) ** alpha at the sampled (unique) indices
    td = (returns - q).abs().numpy()
    last = {int(i): t for i, t in zip(indices, td)}  # repeated index: the last write wins
    idx = np.fromiter(last, dtype=np.int64)
    np.testing.assert_allclose(
        buf.priority_tree.get(idx), (np.array(list(last.values())) + DEFAULT_EPS) ** 0.6, rtol=1e-4
    )
    assert stats.td_error_abs_mean == pytest.approx(float(td.mean()), rel=1e-5)
    assert stats.is_weight_mean == pytest.approx(float(w.mean()), rel=1e-6)


def test_stock_dqn_drops_the_weights_in_its_huber_path() -> None:
    """Why the wrapper exists: without it, Tianshou's Huber loss ignores the IS weights."""
    algorithm = dqn(huber_loss_delta=1.0)
    buf = filled(algorithm)
    twin, batch, _ = replay(algorithm, buf, beta=0.4)
    with torch.no_grad():
        q = twin.policy(batch).logits[np.arange(BATCH), batch.act]
        unweighted = F.huber_loss(q, batch.returns.flatten(), delta=1.0)
    assert update(algorithm, buf).loss == pytest.approx(float(unweighted), rel=1e-5)


@pytest.mark.parametrize("name", ["ddpg", "td3", "sac"])
def test_actor_critic_critic_losses_are_weighted(name: str) -> None:
    algorithm = PEROffPolicyWrapper(wrapped_algorithm=actor_critic(name), beta=1.0)
    buf = filled(algorithm, "Pendulum-v1")
    twin, batch, _ = replay(algorithm.wrapped_algorithm, buf, beta=1.0)
    with torch.no_grad():
        td = twin.critic(batch.obs, batch.act).flatten() - batch.returns.flatten()
    expected = float((batch.weight * td**2).mean())
    stats = update(algorithm, buf)
    assert (stats.critic_loss if name == "ddpg" else stats.critic1_loss) == pytest.approx(expected, rel=1e-5)
    assert stats.beta == 1.0 and stats.is_weight_mean < 1.0
    assert stats.is_weight_mean == pytest.approx(float(batch.weight.mean()), rel=1e-6)


# -- beta ----------------------------------------------------------------------------------------


def test_beta_schedule_reaches_sampling() -> None:
    algorithm = PEROffPolicyWrapper(wrapped_algorithm=dqn(), beta=LinearBetaSchedule(0.0, 1.0, num_updates=4))
    buf = filled(algorithm)
    seen = [update(algorithm, buf) for _ in range(5)]
    assert [s.beta for s in seen] == [0.0, 0.25, 0.5, 0.75, 1.0]
    assert seen[0].is_weight_mean == 1.0  # beta 0: no correction
    assert seen[-1].is_weight_mean < 0.8 and buf.beta == 1.0
    assert algorithm.num_updates == 5 and algorithm.current_beta == 1.0


def test_beta_reaches_sampling_of_tianshous_vector_buffer_too() -> None:
    algorithm = PEROffPolicyWrapper(wrapped_algorithm=dqn(), beta=0.0)
    buf = filled(algorithm, buffer=PrioritizedVectorReplayBuffer(1000, 2, alpha=0.6, beta=0.4))
    stats = update(algorithm, buf)
    assert buf._beta == 0.0 and stats.is_weight_mean == 1.0  # its own set_beta would leave 0.4


def test_schedule_leaving_0_1_is_rejected_at_update() -> None:
    algorithm = PEROffPolicyWrapper(wrapped_algorithm=dqn(), beta=lambda update: 0.5 + update)
    buf = filled(algorithm)
    update(algorithm, buf)
    with pytest.raises(ValueError, match="beta schedule at update 1"):
        update(algorithm, buf)
    assert buf.beta == 0.5 and algorithm.num_updates == 1


def test_linear_beta_schedule() -> None:
    schedule = LinearBetaSchedule(initial=0.4, final=1.0, num_updates=100)
    assert [schedule(u) for u in (0, 50, 100, 10_000)] == pytest.approx([0.4, 0.7, 1.0, 1.0])
    with pytest.raises(ValueError, match="initial"):
        LinearBetaSchedule(initial=-0.1)
    with pytest.raises(ValueError, match="num_updates"):
        LinearBetaSchedule(num_updates=0)
    with pytest.raises(ValueError, match="update index"):
        schedule(-1)


# -- bad input -----------------------------------------------------------------------------------


class DQNWithOwnStep(DQN):
    def _update_with_batch(self, batch):  # type: ignore[no-untyped-def]
        return super()._update_with_batch(batch)


def test_constructor_rejects_what_it_cannot_guarantee() -> None:
    with pytest.raises(TypeError, match="OffPolicyAlgorithm"):
        PEROffPolicyWrapper(wrapped_algorithm=object(), beta=0.4)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="DQNWithOwnStep"):
        PEROffPolicyWrapper(wrapped_algorithm=dqn(cls=DQNWithOwnStep), beta=0.4)
    with pytest.raises(ValueError, match="beta"):
        PEROffPolicyWrapper(wrapped_algorithm=dqn(), beta=1.5)
    with pytest.raises(ValueError, match="beta"):
        PEROffPolicyWrapper(wrapped_algorithm=dqn(), beta=lambda update: 2.0)
    with pytest.raises(TypeError, match="beta"):
        PEROffPolicyWrapper(wrapped_algorithm=dqn(), beta="high")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("beta", "error", "match"),
    [
        (True, TypeError, "beta must be a real number in \\[0, 1\\], got bool True"),
        (lambda update: "0.5", TypeError, "beta must be a real number.*got str '0.5'"),
        (lambda update: None, TypeError, "beta.*NoneType"),
        (float("nan"), ValueError, "beta.*nan"),
    ],
)
def test_wrapper_beta_errors_name_the_type_and_value(beta, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        PEROffPolicyWrapper(wrapped_algorithm=dqn(), beta=beta)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        (dict(initial=True), TypeError, "initial must be a real number in \\[0, 1\\], got bool"),
        (dict(final="1.0"), TypeError, "final.*str"),
        (dict(final=float("nan")), ValueError, "final"),
        (dict(num_updates=True), TypeError, "num_updates must be an integer, got bool"),
        (dict(num_updates=10.0), TypeError, "num_updates must be an integer, got float"),
    ],
)
def test_linear_beta_schedule_errors_name_the_argument(kwargs: dict, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        LinearBetaSchedule(**kwargs)


def test_linear_beta_schedule_takes_integer_update_indices_only() -> None:
    schedule = LinearBetaSchedule(initial=0.4, final=1.0, num_updates=100)
    assert schedule(np.int64(50)) == pytest.approx(0.7)
    for update in (1.5, "3", True):
        with pytest.raises(TypeError, match="update index must be an integer"):
            schedule(update)


def test_update_rejects_a_uniform_buffer() -> None:
    algorithm = PEROffPolicyWrapper(wrapped_algorithm=dqn(), beta=0.4)
    buf = filled(algorithm, buffer=VectorReplayBuffer(1000, 2))
    with pytest.raises(TypeError, match="prioritized buffer"):
        update(algorithm, buf)
    assert algorithm.num_updates == 0


# -- what Tianshou's wrapper base misses -----------------------------------------------------------


def test_wrapped_learning_rate_schedulers_are_stepped() -> None:
    schedule = LRSchedulerFactoryLinear(max_epochs=1, epoch_num_steps=10, collection_step_num_env_steps=1)
    algorithm = PEROffPolicyWrapper(wrapped_algorithm=dqn(optim=AdamOptimizerFactory(lr=1e-3).with_lr_scheduler_factory(schedule)),
                                    beta=0.4)  # fmt: skip
    buf = filled(algorithm)
    for _ in range(4):
        update(algorithm, buf)
    lr = algorithm.wrapped_algorithm.optim._optim.param_groups[0]["lr"]
    assert lr == pytest.approx(1e-3 * (1 - 4 / 10))


def test_state_dict_round_trip_keeps_optimizer_and_schedule_position() -> None:
    algorithm = PEROffPolicyWrapper(wrapped_algorithm=dqn(), beta=LinearBetaSchedule(0.4, 1.0, 10))
    buf = filled(algorithm)
    for _ in range(3):
        update(algorithm, buf)
    restored = PEROffPolicyWrapper(wrapped_algorithm=dqn(), beta=LinearBetaSchedule(0.4, 1.0, 10))
    restored.load_state_dict(algorithm.state_dict())
    assert restored.num_updates == 3 and restored.current_beta == pytest.approx(0.58)
    adam = restored.wrapped_algorithm.optim._optim
    assert int(adam.state_dict()["state"][0]["step"]) == 3
    obs = torch.randn(5, 4)
    with torch.no_grad():
        torch.testing.assert_close(restored.policy.model(obs)[0], algorithm.policy.model(obs)[0])
    with pytest.raises(KeyError, match="optimizer"):
        state = algorithm.state_dict()
        del state["wrapped_algorithm._optimizers"]
        restored.load_state_dict(state)


def test_train_leaves_every_module_in_the_mode_a_full_walk_would() -> None:
    """train() skips walks that would change nothing, and only those: whatever changed a
    module's mode in between (a collector's eval phase, a user, a new module), the modes
    after each call are those ``nn.Module.train`` gives a twin that always walks."""
    algorithm = PEROffPolicyWrapper(wrapped_algorithm=dqn(), beta=0.4)
    twin = copy.deepcopy(algorithm.wrapped_algorithm)

    def modes(module: torch.nn.Module) -> list[bool]:
        return [m.training for m in module.modules()]

    def both(action) -> None:
        action(algorithm.wrapped_algorithm)
        action(twin)

    steps = [
        lambda m: None,
        lambda m: m.policy.eval(),  # the collector's eval phase
        lambda m: m.policy.model.train(),  # a user puts one submodule back
        lambda m: m.policy.model.model.model[0].eval(),  # one deep Linear
        lambda m: setattr(m.policy, "extra_head", torch.nn.Linear(2, 2).eval()),  # a module appears
        lambda m: m.policy.model.model.model.__setitem__(0, torch.nn.Linear(4, 128).eval()),  # one is replaced
        lambda m: hasattr(m.policy, "extra_head") and delattr(m.policy, "extra_head"),  # and one removed
    ]
    for step in steps:
        for mode in (True, False, True, True):
            both(step)
            algorithm.train(mode)
            torch.nn.Module.train(twin, mode)
            assert modes(algorithm.wrapped_algorithm) == modes(twin)
            assert algorithm.training is mode
    assert not algorithm.wrapped_algorithm.model_old.module.training  # the target network stays in eval
