"""Rainbow (C51 + n-step returns + dueling + noisy nets + PER) on CartPole-v1, with hetero-replay's buffer.

Tianshou's own Rainbow setup (its test/discrete/test_rainbow.py: RainbowDQN, a dueling Net with
NoisyLinear heads over 51 atoms, 3-step returns, batch-maximum IS normalisation
``weight_norm=True``) with two changes:

1. the buffer: ``HeteroPrioritizedVectorReplayBuffer`` instead of Tianshou's
   ``PrioritizedVectorReplayBuffer`` (same ``weight_norm=True``);
2. ``PEROffPolicyWrapper(wrapped_algorithm=rainbow, beta=...)``: it anneals beta on the
   buffer (Tianshou's example does it in a ``training_fn``), checks that C51's update
   step weights its cross-entropy by the IS weights, and logs beta and the IS weights.

    python examples/tianshou_rainbow_cartpole.py                 # 20k env steps
    python examples/tianshou_rainbow_cartpole.py --steps 50000 --seed 1
"""

from __future__ import annotations

import argparse

import gymnasium as gym
import numpy as np
import torch
from tianshou.algorithm import RainbowDQN
from tianshou.algorithm.modelfree.c51 import C51Policy
from tianshou.algorithm.optim import AdamOptimizerFactory
from tianshou.data import Collector, CollectStats
from tianshou.env import DummyVectorEnv
from tianshou.trainer import OffPolicyTrainerParams
from tianshou.utils.net.common import Net
from tianshou.utils.net.discrete import NoisyLinear
from tianshou.utils.torch_utils import policy_within_training_step

from hetero_replay.adapters.tianshou import (
    HeteroPrioritizedVectorReplayBuffer,
    LinearBetaSchedule,
    PEROffPolicyWrapper,
)


def build(seed: int, steps: int, n_envs: int = 8) -> tuple[PEROffPolicyWrapper, Collector, Collector, int]:
    """The wrapped Rainbow, its training and test collectors, and the number of gradient updates of a run."""
    np.random.seed(seed)
    torch.manual_seed(seed)
    env = gym.make("CartPole-v1")
    train_envs = DummyVectorEnv([lambda: gym.make("CartPole-v1") for _ in range(n_envs)])
    test_envs = DummyVectorEnv([lambda: gym.make("CartPole-v1") for _ in range(10)])
    train_envs.seed(seed)
    test_envs.seed(seed + 100)

    def noisy_linear(x: int, y: int) -> NoisyLinear:
        return NoisyLinear(x, y, 0.1)

    net = Net(
        state_shape=env.observation_space.shape, action_shape=env.action_space.n, hidden_sizes=[128, 128, 128, 128],
        softmax=True, num_atoms=51,
        dueling_param=({"linear_layer": noisy_linear}, {"linear_layer": noisy_linear}),
    )  # fmt: skip
    policy = C51Policy(model=net, action_space=env.action_space, num_atoms=51, v_min=-10.0, v_max=10.0,
                       eps_training=0.1, eps_inference=0.05)  # fmt: skip
    rainbow = RainbowDQN(policy=policy, optim=AdamOptimizerFactory(lr=1e-3), gamma=0.9, n_step_return_horizon=3,
                         target_update_freq=320)  # fmt: skip
    updates = int(steps * 0.125)  # update_step_num_gradient_steps_per_sample below
    algorithm = PEROffPolicyWrapper(wrapped_algorithm=rainbow, beta=LinearBetaSchedule(0.4, 1.0, updates))
    buffer = HeteroPrioritizedVectorReplayBuffer(20_000, n_envs, alpha=0.6, beta=0.4, weight_norm=True,
                                                 random_seed=seed)  # fmt: skip
    train_collector = Collector[CollectStats](algorithm, train_envs, buffer, exploration_noise=True)
    test_collector = Collector[CollectStats](algorithm, test_envs, exploration_noise=True)
    with policy_within_training_step(policy):
        train_collector.reset()
        train_collector.collect(n_step=64 * n_envs)  # warm-up, as Tianshou's example
    return algorithm, train_collector, test_collector, updates


def train(seed: int = 0, steps: int = 20_000, stop_at: float | None = None, epochs: int = 10) -> float:
    """Train for ``steps`` env steps (or until a test return of ``stop_at``); returns the best test return."""
    algorithm, train_collector, test_collector, _ = build(seed, steps)
    result = algorithm.run_training(
        OffPolicyTrainerParams(
            training_collector=train_collector, test_collector=test_collector, max_epochs=epochs,
            epoch_num_steps=steps // epochs, collection_step_num_env_steps=8,
            update_step_num_gradient_steps_per_sample=0.125, batch_size=64, test_step_num_episodes=10,
            stop_fn=None if stop_at is None else (lambda mean_rewards: mean_rewards >= stop_at),
            show_progress=False,
        )
    )  # fmt: skip
    return float(result.best_reward)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=20_000, help="training env steps")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(1)  # small networks: one thread is fastest
    best = train(args.seed, args.steps)
    print(f"best test return {best:.1f} (CartPole-v1 caps it at 500; Tianshou's example stops at 195)")


if __name__ == "__main__":
    main()
