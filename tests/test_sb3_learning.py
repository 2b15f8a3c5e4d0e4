"""PERDQN learns: CartPole-v1 to a mean evaluation return of 400 within a fixed budget.

rl-zoo's CartPole-v1 DQN settings, except that training runs every 16 steps
(8 gradient steps) instead of every 256 (128): the same ratio of gradient steps
to env steps, spread out, which learns in fewer env steps. On seed 0 it gets
there in about 5,000 steps (some 15 s of one core); the budget leaves room.
"""

from __future__ import annotations

import pytest
import torch as th

pytest.importorskip("stable_baselines3")

from stable_baselines3.common.callbacks import EvalCallback, StopTrainingOnRewardThreshold  # noqa: E402
from stable_baselines3.common.env_util import make_vec_env  # noqa: E402

from hetero_replay.adapters.sb3 import PERDQN  # noqa: E402

HYPERPARAMS = dict(
    learning_rate=2.3e-3, batch_size=64, buffer_size=100_000, learning_starts=1000, gamma=0.99,
    target_update_interval=10, train_freq=16, gradient_steps=8, exploration_fraction=0.16,
    exploration_final_eps=0.04, policy_kwargs=dict(net_arch=[256, 256]),
)  # fmt: skip
BUDGET = 20_000
THRESHOLD = 400


def test_perdqn_solves_cartpole_within_budget() -> None:
    threads = th.get_num_threads()
    th.set_num_threads(1)
    try:
        model = PERDQN("MlpPolicy", "CartPole-v1", seed=0, device="cpu", **HYPERPARAMS)
        stop = StopTrainingOnRewardThreshold(THRESHOLD, verbose=0)
        evaluation = EvalCallback(
            make_vec_env("CartPole-v1", seed=100),
            n_eval_episodes=5,
            eval_freq=1000,
            callback_on_new_best=stop,
            verbose=0,
        )
        model.learn(BUDGET, callback=evaluation)
    finally:
        th.set_num_threads(threads)
    assert evaluation.best_mean_reward >= THRESHOLD, (
        f"best mean evaluation return {evaluation.best_mean_reward} after {model.num_timesteps} steps"
    )
    assert model.num_timesteps < BUDGET  # stopped early, on reaching the threshold
    buf = model.replay_buffer
    assert buf.beta > 0.4 and buf.max_priority > 1.0  # PER was live: beta annealing, priorities fed back
