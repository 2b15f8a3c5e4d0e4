"""PERDQN, PERDDPG, PERTD3 and PERSAC: weighted losses, priority feedback, beta, save/load.

Every run is real SB3 training on real gymnasium environments, kept to a few
hundred steps with small networks.
"""

from __future__ import annotations

import pickle
import warnings

import numpy as np
import pytest
import torch as th
from torch.nn import functional as F

pytest.importorskip("stable_baselines3")

from stable_baselines3 import DQN  # noqa: E402
from stable_baselines3.common.buffers import ReplayBuffer  # noqa: E402
from stable_baselines3.common.callbacks import BaseCallback  # noqa: E402
from stable_baselines3.common.env_util import make_vec_env  # noqa: E402
from stable_baselines3.common.envs import SimpleMultiObsEnv  # noqa: E402
from stable_baselines3.common.logger import KVWriter, Logger  # noqa: E402

from hetero_replay import PEROptions  # noqa: E402
from hetero_replay.adapters.sb3 import (  # noqa: E402
    PERDDPG,
    PERDQN,
    PERSAC,
    PERTD3,
    DictPrioritizedReplayBuffer,
    PrioritizedReplayBuffer,
)


def small() -> dict:
    """Small networks, fixed seed, CPU; a fresh dict each time (SB3 edits policy_kwargs in place)."""
    return dict(policy_kwargs=dict(net_arch=[32, 32]), seed=0, device="cpu")


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


def filled(model, steps: int = 120):
    """Collect ``steps`` transitions without training, then spread the priorities."""
    model.learn(steps)
    buf = model.replay_buffer
    n = buf.size() * buf.n_envs
    buf.update_priorities(np.arange(n), np.linspace(0.05, 4.0, n))
    return model


def replay_of_next_train(model, batch_size: int):
    """The batch the next ``train()`` will draw: a copy of the buffer, same random state and beta."""
    copy = pickle.loads(pickle.dumps(model.replay_buffer))
    copy.beta = model.beta_schedule(model._current_progress_remaining)
    return copy.sample(batch_size)


def last_writes(indices: np.ndarray, values: np.ndarray) -> dict[int, float]:
    """Priority updates with repeated indices: the last write wins."""
    return {int(i): float(v) for i, v in zip(indices, values, strict=True)}


def assert_priorities(model, indices: np.ndarray, td: th.Tensor) -> None:
    buf = model.replay_buffer
    leaves = buf.priorities().reshape(-1)
    for i, v in last_writes(indices, td.reshape(-1).numpy()).items():
        assert leaves[i] == pytest.approx((abs(v) + 1e-6) ** buf.alpha, rel=1e-5)


def test_perdqn_weights_the_huber_loss_and_feeds_td_errors_back() -> None:
    model = filled(PERDQN("MlpPolicy", "CartPole-v1", learning_starts=1000, batch_size=16, **small()))
    b = replay_of_next_train(model, 16)
    assert b.weights.std() > 0.05  # the check below means something only if weights differ
    with th.no_grad():
        next_q = model.q_net_target(b.next_observations).max(dim=1)[0].reshape(-1, 1)
        target = b.rewards + (1 - b.dones) * model.gamma * next_q
        q = th.gather(model.q_net(b.observations), 1, b.actions.long())
        huber = F.smooth_l1_loss(q, target, reduction="none")
    model.train(gradient_steps=1, batch_size=16)
    model._record_per()  # what dump_logs records: the batches since the last dump
    logged = model.logger.name_to_value
    assert logged["train/loss"] == pytest.approx((b.weights * huber).mean().item(), rel=1e-5)
    assert logged["train/loss"] != pytest.approx(huber.mean().item(), rel=1e-2)
    assert logged["train/per_mean_weight"] == pytest.approx(b.weights.mean().item(), rel=1e-6)
    assert logged["train/per_beta"] == pytest.approx(model.replay_buffer.beta)
    assert_priorities(model, b.indices, q - target)


def test_pertd3_weights_each_critic_and_uses_the_mean_td_over_critics() -> None:
    model = filled(PERTD3("MlpPolicy", "Pendulum-v1", learning_starts=1000, batch_size=16, **small()))
    b = replay_of_next_train(model, 16)
    th.manual_seed(7)
    with th.no_grad():  # TD3.train's target, with the same target-policy noise
        noise = b.actions.clone().data.normal_(0, model.target_policy_noise)
        noise = noise.clamp(-model.target_noise_clip, model.target_noise_clip)
        next_actions = (model.actor_target(b.next_observations) + noise).clamp(-1, 1)
        next_q = th.min(th.cat(model.critic_target(b.next_observations, next_actions), dim=1), dim=1, keepdim=True)[0]
        target = b.rewards + (1 - b.dones) * model.gamma * next_q
        qs = model.critic(b.observations, b.actions)
    assert len(qs) == 2
    th.manual_seed(7)
    model.train(gradient_steps=1, batch_size=16)
    expected = sum((b.weights * (q - target) ** 2).mean() for q in qs).item()
    assert model.logger.name_to_value["train/critic_loss"] == pytest.approx(expected, rel=1e-5)
    assert_priorities(model, b.indices, ((qs[0] - target).abs() + (qs[1] - target).abs()) / 2)


def test_persac_weights_each_critic_and_uses_the_mean_td_over_critics() -> None:
    model = filled(PERSAC("MlpPolicy", "Pendulum-v1", learning_starts=1000, batch_size=16, ent_coef=0.1, **small()))
    b = replay_of_next_train(model, 16)
    th.manual_seed(7)
    with th.no_grad():  # SAC.train's random draws, in the same order
        model.actor.action_log_prob(b.observations)
        next_actions, next_log_prob = model.actor.action_log_prob(b.next_observations)
        next_q = th.min(th.cat(model.critic_target(b.next_observations, next_actions), dim=1), dim=1, keepdim=True)[0]
        next_q = next_q - 0.1 * next_log_prob.reshape(-1, 1)
        target = b.rewards + (1 - b.dones) * model.gamma * next_q
        qs = model.critic(b.observations, b.actions)
    th.manual_seed(7)
    model.train(gradient_steps=1, batch_size=16)
    expected = 0.5 * sum((b.weights * (q - target) ** 2).mean() for q in qs).item()
    assert model.logger.name_to_value["train/critic_loss"] == pytest.approx(expected, rel=1e-5)
    assert_priorities(model, b.indices, ((qs[0] - target).abs() + (qs[1] - target).abs()) / 2)


class CountCalls(BaseCallback):
    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def _on_step(self) -> bool:
        self.calls += 1
        return True


class Dumps(KVWriter):
    """The log dumps of a model (``watch_dumps``), as dicts."""

    def __init__(self) -> None:
        self.dumps: list[dict] = []

    def write(self, key_values: dict, key_excluded: dict, step: int = 0) -> None:
        self.dumps.append(dict(key_values))


def watch_dumps(model) -> Dumps:
    """Keep ``model``'s log dumps from now on (SB3 dumps every ``log_interval`` episodes of ``learn``)."""
    dumps = Dumps()
    model.set_logger(Logger(folder=None, output_formats=[dumps]))
    return dumps


def assert_per_was_live(model, steps: int, dumps: Dumps) -> None:
    buf = model.replay_buffer
    assert isinstance(buf, PrioritizedReplayBuffer)
    filled_prios = buf.priorities().reshape(-1)[: buf.size() * buf.n_envs]
    assert filled_prios.std() > 0 and np.mean(filled_prios != 1.0) > 0.5  # most priorities moved off 1
    # beta annealed linearly from 0.4 to 1 over training: close to 1 at the last train()
    assert 0.9 < buf.beta <= 1.0
    model.dump_logs()
    trained = [d for d in dumps.dumps if "train/n_updates" in d]
    assert len(trained) >= 2, "learn dumped the logs of training at least once"
    # A dump with train/n_updates follows a train(): its mean weight is of the batches drawn since the last dump.
    assert all(0 < d["train/per_mean_weight"] <= 1 and d["train/per_staleness"] == 0 for d in trained)
    betas = [d["train/per_beta"] for d in trained]
    assert betas == sorted(betas) and betas[-1] == pytest.approx(buf.beta)
    assert trained[-1]["train/per_max_priority"] == pytest.approx(buf.max_priority)
    assert model.num_timesteps >= steps


@pytest.mark.filterwarnings("ignore::tqdm.TqdmExperimentalWarning")  # SB3's progress bar uses tqdm.rich
def test_perdqn_end_to_end_with_four_envs_progress_bar_and_callback() -> None:
    env = make_vec_env("CartPole-v1", n_envs=4, seed=0)
    model = PERDQN("MlpPolicy", env, learning_starts=100, train_freq=1, target_update_interval=50, **small())
    callback, dumps = CountCalls(), watch_dumps(model)
    model.learn(600, callback=callback, progress_bar=True)
    assert callback.calls == 150  # one call per env.step() of the 4 envs
    assert_per_was_live(model, 600, dumps)


@pytest.mark.parametrize("algo", [PERDDPG, PERTD3, PERSAC])
def test_continuous_algorithms_end_to_end(algo) -> None:
    model = algo("MlpPolicy", "Pendulum-v1", learning_starts=100, batch_size=32, **small())
    dumps = watch_dumps(model)
    model.learn(300, log_interval=1)
    assert_per_was_live(model, 300, dumps)


def test_perddpg_keeps_ddpg_single_critic() -> None:
    model = PERDDPG("MlpPolicy", "Pendulum-v1", **small())
    assert len(model.critic.q_networks) == 1 and model.policy_delay == 1


def test_multi_input_policy_uses_the_dict_buffer() -> None:
    model = PERDQN("MultiInputPolicy", SimpleMultiObsEnv(), learning_starts=50, buffer_size=1000, **small())
    dumps = watch_dumps(model)
    model.learn(200, log_interval=1)
    assert isinstance(model.replay_buffer, DictPrioritizedReplayBuffer)
    assert_per_was_live(model, 200, dumps)


def test_optimize_memory_usage_with_a_second_learn_call() -> None:
    model = PERDQN(
        "MlpPolicy", "CartPole-v1", learning_starts=50, train_freq=1, buffer_size=150, optimize_memory_usage=True,
        replay_buffer_kwargs=dict(handle_timeout_termination=False), **small(),
    )  # fmt: skip
    model.learn(200)
    with pytest.warns(UserWarning, match="truncated"):  # SB3 marks the last transition done via buffer.dones
        model.learn(100)
    buf = model.replay_buffer
    assert buf.full
    np.testing.assert_array_equal(buf.priorities()[buf.pos], 0.0)


def test_stock_dqn_runs_with_the_buffer_uniformly_and_warns_once() -> None:
    model = DQN(
        "MlpPolicy",
        "CartPole-v1",
        learning_starts=50,
        train_freq=1,
        replay_buffer_class=PrioritizedReplayBuffer,
        **small(),
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.learn(1100)
    ours = [w for w in caught if "update_priorities" in str(w.message)]
    assert len(ours) == 1
    prios = model.replay_buffer.priorities().reshape(-1)[:1100]
    np.testing.assert_array_equal(prios, 1.0)  # nothing ever changed them


def test_save_and_load_model() -> None:
    model = PERDQN(
        "MlpPolicy", "CartPole-v1", learning_starts=50, beta_schedule=lambda p: 0.5 + 0.5 * (1 - p), **small()
    )
    model.learn(200)
    obs = np.random.default_rng(0).standard_normal((8, 4)).astype(np.float32)
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        model.save(f"{tmp}/model")
        loaded = PERDQN.load(f"{tmp}/model", env=make_vec_env("CartPole-v1", seed=1), device="cpu")
    np.testing.assert_array_equal(loaded.predict(obs, deterministic=True)[0], model.predict(obs, deterministic=True)[0])
    assert loaded.beta_schedule(0.0) == 1.0 and loaded.beta_schedule(1.0) == 0.5
    assert isinstance(loaded.replay_buffer, PrioritizedReplayBuffer) and loaded.replay_buffer.size() == 0
    loaded.learn(200)
    assert np.mean(loaded.replay_buffer.priorities()[:200] != 1.0) > 0.5


def test_save_and_load_replay_buffer(tmp_path) -> None:
    model = PERDQN("MlpPolicy", "CartPole-v1", learning_starts=50, **small())
    model.learn(200)
    model.save_replay_buffer(tmp_path / "buffer")
    other = PERDQN("MlpPolicy", "CartPole-v1", learning_starts=50, **small())
    other.load_replay_buffer(tmp_path / "buffer")
    a, b = model.replay_buffer, other.replay_buffer
    assert b is not a and b.device == other.device
    np.testing.assert_array_equal(b.priorities(), a.priorities())
    np.testing.assert_array_equal(b.observations, a.observations)
    assert b.max_priority == a.max_priority and b.pos == a.pos
    other.learn(100, reset_num_timesteps=False)
    assert other.replay_buffer.size() == 300


def test_refuses_a_buffer_without_priorities(tmp_path) -> None:
    with pytest.raises(TypeError, match="needs a replay buffer with priorities.*ReplayBuffer"):
        PERDQN("MlpPolicy", "CartPole-v1", replay_buffer_class=ReplayBuffer, **small())
    stock = DQN("MlpPolicy", "CartPole-v1", learning_starts=50, **small())
    stock.learn(60)
    stock.save_replay_buffer(tmp_path / "stock")
    model = PERDQN("MlpPolicy", "CartPole-v1", **small())
    ours = model.replay_buffer
    with pytest.raises(TypeError, match="needs a replay buffer with priorities"):
        model.load_replay_buffer(tmp_path / "stock")
    assert model.replay_buffer is ours


@pytest.mark.parametrize(
    ("env_id", "n_envs", "match"),
    [
        ("Acrobot-v1", 1, r"the loaded buffer's observation_space is Box.*\(4,\).*but PERDQN's is Box.*\(6,\)"),
        ("CartPole-v1", 2, r"the loaded buffer's n_envs is 1, but PERDQN's is 2"),
    ],
)
def test_refuses_a_buffer_of_another_environment_and_keeps_its_own(tmp_path, env_id, n_envs, match: str) -> None:
    saved = PERDQN("MlpPolicy", "CartPole-v1", learning_starts=50, **small())
    saved.learn(60)
    saved.save_replay_buffer(tmp_path / "cartpole")
    model = PERDQN("MlpPolicy", make_vec_env(env_id, n_envs=n_envs), **small())
    ours = model.replay_buffer
    with pytest.raises(ValueError, match=match):
        model.load_replay_buffer(tmp_path / "cartpole")
    assert model.replay_buffer is ours


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        (dict(replay_buffer_kwargs=dict(alpha=-1.0)), ValueError, "alpha must be"),
        (dict(replay_buffer_kwargs=dict(beta=1.5)), ValueError, "beta must be in"),
        (dict(replay_buffer_kwargs=dict(tree="fpga-in-the-cloud")), ValueError, "unknown tree backend"),
        (dict(beta_schedule=1.5), ValueError, "beta_schedule"),
        (dict(beta_schedule="linear"), TypeError, "beta_schedule"),
    ],
)
def test_bad_arguments_raise_clear_errors(kwargs: dict, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        PERDQN("MlpPolicy", "CartPole-v1", **kwargs, **small())


def test_per_options_reach_the_buffer_through_replay_buffer_kwargs() -> None:
    options = PEROptions(alpha=0.3, beta=0.2, tree="numpy")
    model = PERDQN("MlpPolicy", "CartPole-v1", replay_buffer_kwargs=dict(options=options, beta=0.5), **small())
    assert model.replay_buffer.replay.options == options.replace(beta=0.5)
    assert model.beta_schedule(1.0) == 0.5 and model.beta_schedule(0.0) == 1.0  # from the buffer's beta to 1


def test_a_schedule_leaving_0_1_is_reported() -> None:
    model = PERDQN("MlpPolicy", "CartPole-v1", learning_starts=10, beta_schedule=lambda p: 2.0, **small())
    with pytest.raises(ValueError, match="beta_schedule returned 2.0"):
        model.learn(50)
