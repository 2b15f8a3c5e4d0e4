"""Prioritized experience replay for Tianshou's DQN on CartPole-v1, with the Huber loss.

Two changes to a stock Tianshou DQN script:

1. the buffer: ``HeteroPrioritizedVectorReplayBuffer`` in place of
   ``PrioritizedVectorReplayBuffer`` (priorities in hetero-replay's C++ sum tree,
   stratified seeded sampling, IS weights normalised over the whole buffer);
2. the algorithm: ``PEROffPolicyWrapper(wrapped_algorithm=dqn, beta=...)``, which
   anneals beta, weights the loss by the IS weights -- stock Tianshou drops them
   when ``huber_loss_delta`` is set, as here -- and logs beta and priority statistics.

    python examples/tianshou_dqn_cartpole.py                  # 10k env steps, well under a minute
    python examples/tianshou_dqn_cartpole.py --steps 50000 --logdir log/dqn   # TensorBoard logs
"""

from __future__ import annotations

import argparse

import gymnasium as gym
import numpy as np
import torch
from tianshou.algorithm import DQN
from tianshou.algorithm.modelfree.dqn import DiscreteQLearningPolicy
from tianshou.algorithm.optim import AdamOptimizerFactory
from tianshou.data import Collector, CollectStats
from tianshou.env import DummyVectorEnv
from tianshou.trainer import OffPolicyTrainerParams
from tianshou.utils.net.common import Net

from hetero_replay.adapters.tianshou import (
    HeteroPrioritizedVectorReplayBuffer,
    LinearBetaSchedule,
    PEROffPolicyWrapper,
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=10_000, help="training env steps")
    parser.add_argument("--n-envs", type=int, default=4, help="parallel training envs")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--logdir", default=None, help="write TensorBoard logs here (beta, IS weights, priorities)")
    args = parser.parse_args()
    torch.set_num_threads(1)  # small networks: one thread is fastest
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)

    train_envs = DummyVectorEnv([lambda: gym.make("CartPole-v1") for _ in range(args.n_envs)])
    test_envs = DummyVectorEnv([lambda: gym.make("CartPole-v1") for _ in range(5)])
    train_envs.seed(args.seed)
    test_envs.seed(args.seed + 100)
    env = gym.make("CartPole-v1")

    policy = DiscreteQLearningPolicy(
        model=Net(state_shape=env.observation_space.shape, action_shape=env.action_space.n, hidden_sizes=[64, 64]),
        action_space=env.action_space, eps_training=1.0, eps_inference=0.0,
    )  # fmt: skip
    dqn = DQN(policy=policy, optim=AdamOptimizerFactory(lr=1e-3), gamma=0.99, target_update_freq=250,
              huber_loss_delta=1.0)  # fmt: skip

    updates_per_step = 0.25
    num_updates = int(args.steps * updates_per_step)
    algorithm = PEROffPolicyWrapper(wrapped_algorithm=dqn, beta=LinearBetaSchedule(0.4, 1.0, num_updates))
    buffer = HeteroPrioritizedVectorReplayBuffer(50_000, args.n_envs, alpha=0.6, beta=0.4, random_seed=args.seed)

    train_collector = Collector[CollectStats](algorithm, train_envs, buffer, exploration_noise=True)
    test_collector = Collector[CollectStats](algorithm, test_envs)
    train_collector.reset()
    train_collector.collect(n_step=1000, random=True)  # warm-up with random actions

    def training_fn(epoch: int, env_step: int) -> None:  # epsilon 1 -> 0.05 over the first 30%
        policy.set_eps_training(max(0.05, 1.0 - 0.95 * env_step / (0.3 * args.steps)))

    logger = None
    if args.logdir:
        from tianshou.utils import TensorboardLogger
        from torch.utils.tensorboard import SummaryWriter

        logger = TensorboardLogger(SummaryWriter(args.logdir))  # beta etc. under update/smoothed_loss/

    epochs = 5
    result = algorithm.run_training(
        OffPolicyTrainerParams(
            training_collector=train_collector,
            test_collector=test_collector,
            max_epochs=epochs,
            epoch_num_steps=args.steps // epochs,
            collection_step_num_env_steps=4 * args.n_envs,
            update_step_num_gradient_steps_per_sample=updates_per_step,
            batch_size=64,
            test_step_num_episodes=5,
            training_fn=training_fn,
            logger=logger,
            verbose=True,
            show_progress=True,
        )  # fmt: skip
    )

    leaves = buffer.priority_tree.leaves()[buffer.sample_indices(0)]
    print(f"\nbest test return {result.best_reward:.1f} (CartPole-v1 caps it at 500); "
          f"{result.timing.update_speed:.0f} env steps/s")  # fmt: skip
    print(
        f"{algorithm.num_updates} updates; beta now {buffer.beta:.3f}; largest |TD error| + eps {buffer.max_priority:.3f}"
    )
    print(f"priorities p^alpha of the {len(buffer):,} stored transitions span {leaves.min():.4f} .. {leaves.max():.4f} "
          f"(median {np.median(leaves):.4f})")  # fmt: skip


if __name__ == "__main__":
    main()
