"""PERQRDQN, PERTQC and PERCrossQ: sb3-contrib's algorithms with PER.

Each is checked as PERDQN/PERSAC are (tests/test_sb3_algorithms.py): the logged loss of one
``train()`` equals the IS-weighted per-transition loss of the batch it drew, not the unweighted
one, and the batch's priorities become the TD errors of the mean. Real sb3-contrib training on
real gymnasium environments, a few hundred steps with small networks; the learning test
(QR-DQN on CartPole, several seeds) is marked ``learning``.
"""

from __future__ import annotations

import pytest
import torch as th
from torch.nn import functional as F

pytest.importorskip("sb3_contrib")

from sb3_contrib.common.utils import quantile_huber_loss  # noqa: E402

from hetero_replay.adapters.sb3 import PERQRDQN, PERTQC, PERCrossQ, PrioritizedReplayBuffer  # noqa: E402
from hetero_replay.adapters.sb3.quantile import quantile_huber_loss_per_sample  # noqa: E402
from tests.test_sb3_algorithms import assert_priorities, filled, replay_of_next_train, small, watch_dumps  # noqa: E402
from tests.test_sb3_learning import NEEDED, SEEDS, THRESHOLD, EvaluateAndStop  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


@pytest.mark.parametrize(
    "current, target, summed",
    [((32, 10), (32, 10), True), ((32, 10), (32, 7), False), ((16, 3, 25), (16, 1, 65), False), ((8, 2, 5), (8, 2, 5), True)],
)  # fmt: skip
def test_the_per_sample_loss_averages_to_sb3_contribs(current: tuple, target: tuple, summed: bool) -> None:
    gen = th.Generator().manual_seed(0)
    cur, tgt = th.randn(current, generator=gen) * 2, th.randn(target, generator=gen) * 2
    per_sample = quantile_huber_loss_per_sample(cur, tgt, summed)
    assert per_sample.shape == (current[0],)
    assert per_sample.mean().item() == pytest.approx(
        quantile_huber_loss(cur, tgt, sum_over_quantiles=summed).item(), rel=1e-6
    )


def test_the_per_sample_loss_refuses_mismatched_shapes() -> None:
    with pytest.raises(ValueError, match="current_quantiles"):
        quantile_huber_loss_per_sample(th.zeros(4, 3), th.zeros(4, 1, 3))


def test_perqrdqn_weights_the_quantile_loss_and_feeds_the_mean_td_error_back() -> None:
    model = filled(PERQRDQN("MlpPolicy", "CartPole-v1", learning_starts=1000, batch_size=16, **small()))
    assert isinstance(model.replay_buffer, PrioritizedReplayBuffer)
    b = replay_of_next_train(model, 16)
    assert b.weights.std() > 0.05  # the check below means something only if weights differ
    with th.no_grad():  # QRDQN.train's target and estimates
        next_quantiles = model.quantile_net_target(b.next_observations)
        greedy = next_quantiles.mean(dim=1, keepdim=True).argmax(dim=2, keepdim=True).expand(16, model.n_quantiles, 1)
        next_quantiles = next_quantiles.gather(dim=2, index=greedy).squeeze(dim=2)
        target = b.rewards + (1 - b.dones) * model.gamma * next_quantiles
        actions = b.actions[..., None].long().expand(16, model.n_quantiles, 1)
        current = th.gather(model.quantile_net(b.observations), dim=2, index=actions).squeeze(dim=2)
        per_sample = quantile_huber_loss_per_sample(current, target)
    model.train(gradient_steps=1, batch_size=16)
    model._record_per()  # what dump_logs records: the batches since the last dump
    logged = model.logger.name_to_value
    assert logged["train/loss"] == pytest.approx((b.weights.view(-1) * per_sample).mean().item(), rel=1e-5)
    assert logged["train/loss"] != pytest.approx(quantile_huber_loss(current, target).item(), rel=1e-2)
    assert logged["train/per_mean_weight"] == pytest.approx(b.weights.mean().item(), rel=1e-6)
    assert_priorities(model, b.indices, current.mean(dim=1) - target.mean(dim=1))


def test_pertqc_weights_the_critics_quantile_loss() -> None:
    model = filled(PERTQC("MlpPolicy", "Pendulum-v1", learning_starts=1000, batch_size=16, ent_coef=0.1, **small()))
    b = replay_of_next_train(model, 16)
    assert b.weights.std() > 0.05
    th.manual_seed(7)
    with th.no_grad():  # TQC.train's random draws, in the same order, and its truncated target
        model.actor.action_log_prob(b.observations)
        next_actions, next_log_prob = model.actor.action_log_prob(b.next_observations)
        next_quantiles = model.critic_target(b.next_observations, next_actions)
        kept = model.critic.quantiles_total - model.top_quantiles_to_drop_per_net * model.critic.n_critics
        next_quantiles = th.sort(next_quantiles.reshape(16, -1))[0][:, :kept]
        target = next_quantiles - 0.1 * next_log_prob.reshape(-1, 1)
        target = (b.rewards + (1 - b.dones) * model.gamma * target).unsqueeze(1)
        current = model.critic(b.observations, b.actions)
        per_sample = quantile_huber_loss_per_sample(current, target, sum_over_quantiles=False)
    th.manual_seed(7)
    model.train(gradient_steps=1, batch_size=16)
    logged = model.logger.name_to_value
    assert logged["train/critic_loss"] == pytest.approx((b.weights.view(-1) * per_sample).mean().item(), rel=1e-5)
    unweighted = quantile_huber_loss(current, target, sum_over_quantiles=False).item()
    assert logged["train/critic_loss"] != pytest.approx(unweighted, rel=1e-2)
    assert_priorities(model, b.indices, current.mean(dim=(1, 2)) - target.mean(dim=(1, 2)))


def test_percrossq_weights_each_critic_and_uses_the_mean_td_over_critics() -> None:
    model = filled(PERCrossQ("MlpPolicy", "Pendulum-v1", learning_starts=1000, batch_size=16, ent_coef=0.1, **small()))
    b = replay_of_next_train(model, 16)
    assert b.weights.std() > 0.05
    th.manual_seed(7)
    with th.no_grad():  # CrossQ.train's joint forward pass (batch-norm statistics of both halves)
        model.actor.set_bn_training_mode(False)
        next_actions, next_log_prob = model.actor.action_log_prob(b.next_observations)
        model.critic.set_bn_training_mode(True)
        all_q = th.cat(
            model.critic(th.cat([b.observations, b.next_observations]), th.cat([b.actions, next_actions])), dim=1
        )
        model.critic.set_bn_training_mode(False)
        qs, next_q = th.split(all_q, 16, dim=0)
        target = b.rewards + (1 - b.dones) * model.gamma * (
            next_q.min(dim=1, keepdim=True)[0] - 0.1 * next_log_prob.reshape(-1, 1)
        )
        qs = qs.T[..., None]
    th.manual_seed(7)
    model.train(gradient_steps=1, batch_size=16)
    logged = model.logger.name_to_value
    expected = 0.5 * sum((b.weights * F.mse_loss(q, target, reduction="none")).mean() for q in qs).item()
    unweighted = 0.5 * sum(F.mse_loss(q, target) for q in qs).item()
    assert logged["train/critic_loss"] == pytest.approx(expected, rel=1e-4)
    assert logged["train/critic_loss"] != pytest.approx(unweighted, rel=1e-2)
    assert_priorities(model, b.indices, (qs - target).abs().mean(dim=0))


@pytest.mark.parametrize(
    "algo, env", [(PERQRDQN, "CartPole-v1"), (PERTQC, "Pendulum-v1"), (PERCrossQ, "Pendulum-v1")], ids=lambda a: getattr(a, "__name__", a)
)  # fmt: skip
def test_short_learn_anneals_beta_and_moves_priorities(algo, env: str) -> None:
    model = algo("MlpPolicy", env, learning_starts=100, batch_size=32, **small())
    dumps = watch_dumps(model)
    model.learn(300, log_interval=1)
    model.dump_logs()
    buf = model.replay_buffer
    leaves = buf.priorities().reshape(-1)[: buf.size() * buf.n_envs]
    assert model._n_updates > 0 and leaves.std() > 0
    trained = [d for d in dumps.dumps if "train/n_updates" in d]  # dumps that follow a train()
    assert trained and trained[-1]["train/per_beta"] == pytest.approx(buf.beta) and buf.beta > 0.4
    assert all(0 < d["train/per_mean_weight"] <= 1 for d in trained)


def test_contrib_algorithms_refuse_a_buffer_without_priorities() -> None:
    from stable_baselines3.common.buffers import ReplayBuffer

    with pytest.raises(TypeError, match="PERQRDQN needs a replay buffer with priorities"):
        PERQRDQN("MlpPolicy", "CartPole-v1", replay_buffer_class=ReplayBuffer, **small())


#: rl-zoo's CartPole-v1 QR-DQN settings with a smaller network ([64, 64], not [256, 256]: a quarter of
#: the CPU, and it learns as reliably here) and PERDQN's learning-test changes (tests/test_sb3_learning.py:
#: train every 16 steps, 8 gradient steps, target synced every 100 steps).
QRDQN_HYPERPARAMS = dict(
    learning_rate=2.3e-3, batch_size=64, buffer_size=100_000, learning_starts=1000, gamma=0.99,
    target_update_interval=100, train_freq=16, gradient_steps=8, exploration_fraction=0.16,
    exploration_final_eps=0.04, policy_kwargs=dict(net_arch=[64, 64], n_quantiles=10),
)  # fmt: skip
#: Env steps per seed: twice the most any of seeds 0-5 needed (measured: 2,000-4,000; 2-5 s of one core each).
QRDQN_BUDGET = 8_000


@pytest.mark.learning
def test_perqrdqn_learns_cartpole_on_most_seeds() -> None:
    """2 of 3 seeds reach a greedy return of 150 (random play: ~22) within QRDQN_BUDGET steps."""
    reached = {}
    for seed in SEEDS:
        model = PERQRDQN("MlpPolicy", "CartPole-v1", seed=seed, device="cpu", **QRDQN_HYPERPARAMS)
        evaluation = EvaluateAndStop(seed, THRESHOLD)
        model.learn(QRDQN_BUDGET, callback=evaluation)
        reached[seed] = (evaluation.curve, model.replay_buffer.beta)
    learned = [s for s, (curve, _) in reached.items() if any(r >= THRESHOLD for _, r in curve)]
    assert len(learned) >= NEEDED, reached
    assert all(beta > 0.4 for _, beta in reached.values()), reached
