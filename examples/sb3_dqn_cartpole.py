"""Prioritized experience replay for Stable-Baselines3's DQN on CartPole-v1, two ways.

1. Swap the buffer of the stock algorithm: ``DQN(..., replay_buffer_class=PrioritizedReplayBuffer)``.
   It runs, but stock DQN never updates priorities, so replay stays uniform (the
   buffer says so with a warning).
2. Use ``PERDQN``: the same DQN whose ``train()`` weights the loss by the
   importance-sampling weights and feeds ``|TD error|`` back as priorities.

    python examples/sb3_dqn_cartpole.py              # mean return above 150 within ~2-5k steps, about a minute
    python examples/sb3_dqn_cartpole.py --seed 1 --steps 50000
"""

from __future__ import annotations

import argparse
import warnings

import numpy as np
import torch
from stable_baselines3 import DQN
from stable_baselines3.common.callbacks import EvalCallback, StopTrainingOnRewardThreshold
from stable_baselines3.common.env_util import make_vec_env

from hetero_replay.adapters.sb3 import PERDQN, PrioritizedReplayBuffer

# rl-baselines3-zoo's tuned CartPole-v1 settings, training every 16 steps (8 gradient steps)
# instead of every 256 (128): the same amount of training, spread out, learns in fewer steps.
# The target network is synced every 100 steps, not 10: with training this frequent, a sync every
# 10 steps lets the Q-values diverge (stock DQN too; tests/test_sb3_learning.py has the numbers).
HYPERPARAMS = dict(
    learning_rate=2.3e-3, batch_size=64, buffer_size=100_000, learning_starts=1000, gamma=0.99,
    target_update_interval=100, train_freq=16, gradient_steps=8, exploration_fraction=0.16,
    exploration_final_eps=0.04, policy_kwargs=dict(net_arch=[256, 256]),
)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=20_000, help="most environment steps for PERDQN")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(1)  # small networks: one thread is fastest
    eval_env = make_vec_env("CartPole-v1", seed=args.seed + 100)

    print("1) stock DQN with PrioritizedReplayBuffer as replay_buffer_class (2,000 steps)")
    stock = DQN("MlpPolicy", "CartPole-v1", replay_buffer_class=PrioritizedReplayBuffer,
                seed=args.seed, **{**HYPERPARAMS, "train_freq": 4, "gradient_steps": 1})  # fmt: skip
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        stock.learn(2_000)
    priorities = stock.replay_buffer.priorities()[: stock.replay_buffer.size()]
    print(f"   priorities after training: min {priorities.min():.2f}, max {priorities.max():.2f} (never updated)")
    for w in caught:
        if "update_priorities" in str(w.message):
            print(f"   warning: {w.message}")

    print(f"\n2) PERDQN, alpha 0.6, beta annealed 0.4 -> 1, until it solves CartPole (budget {args.steps:,} steps)")
    model = PERDQN("MlpPolicy", "CartPole-v1", replay_buffer_kwargs=dict(alpha=0.6, beta=0.4),
                   seed=args.seed, **HYPERPARAMS)  # fmt: skip
    # evaluate every 1,000 steps; stop once the mean return reaches 475 (CartPole-v1 caps it at 500)
    solved = StopTrainingOnRewardThreshold(475, verbose=0)
    evaluation = EvalCallback(eval_env, n_eval_episodes=5, eval_freq=1000, callback_on_new_best=solved, verbose=0)
    model.learn(args.steps, callback=evaluation, progress_bar=True)
    buf = model.replay_buffer
    priorities = buf.priorities()[: buf.size()]
    print(f"   best mean evaluation return {evaluation.best_mean_reward:.1f} after {model.num_timesteps:,} steps")
    print(f"   beta now {buf.beta:.3f}; largest |TD error| seen {buf.max_priority:.3f}")
    print(f"   priorities p^alpha span {priorities.min():.4f} .. {priorities.max():.4f} "
          f"(median {np.median(priorities):.4f})")  # fmt: skip


if __name__ == "__main__":
    main()
