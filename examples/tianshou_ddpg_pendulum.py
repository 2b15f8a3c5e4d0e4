"""Prioritized experience replay for Tianshou's DDPG on Pendulum-v1.

The stock DDPG script with two changes: ``HeteroPrioritizedVectorReplayBuffer``
as the buffer, and the algorithm wrapped in ``PEROffPolicyWrapper``, which
anneals beta over the run (Tianshou's ``PrioritizedVectorReplayBuffer.set_beta``
would not even reach sampling), keeps the critic loss weighted by the IS weights,
feeds |TD errors| back as priorities and reports beta and priority statistics.
``TD3`` and ``SAC`` wrap the same way.

    python examples/tianshou_ddpg_pendulum.py                # 8k env steps, a minute or two
    python examples/tianshou_ddpg_pendulum.py --steps 30000  # Pendulum is solved around -200
"""

from __future__ import annotations

import argparse

import gymnasium as gym
import numpy as np
import torch
from tianshou.algorithm import DDPG
from tianshou.algorithm.modelfree.ddpg import ContinuousDeterministicPolicy
from tianshou.algorithm.optim import AdamOptimizerFactory
from tianshou.data import Collector, CollectStats
from tianshou.env import DummyVectorEnv
from tianshou.exploration import GaussianNoise
from tianshou.trainer import OffPolicyTrainerParams
from tianshou.utils.net.common import Net
from tianshou.utils.net.continuous import ContinuousActorDeterministic, ContinuousCritic

from hetero_replay.adapters.tianshou import (
    HeteroPrioritizedVectorReplayBuffer,
    LinearBetaSchedule,
    PEROffPolicyWrapper,
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=8_000, help="training env steps")
    parser.add_argument("--n-envs", type=int, default=2, help="parallel training envs")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(1)  # small networks: one thread is fastest
    np.random.seed(args.seed)  # Gaussian exploration noise draws from np.random
    torch.manual_seed(args.seed)

    train_envs = DummyVectorEnv([lambda: gym.make("Pendulum-v1") for _ in range(args.n_envs)])
    test_envs = DummyVectorEnv([lambda: gym.make("Pendulum-v1") for _ in range(5)])
    train_envs.seed(args.seed)
    test_envs.seed(args.seed + 100)
    env = gym.make("Pendulum-v1")
    obs_shape, act_shape = env.observation_space.shape, env.action_space.shape

    actor = ContinuousActorDeterministic(preprocess_net=Net(state_shape=obs_shape, hidden_sizes=[64, 64]),
                                         action_shape=act_shape)  # fmt: skip
    critic = ContinuousCritic(
        preprocess_net=Net(state_shape=obs_shape, action_shape=act_shape, hidden_sizes=[64, 64], concat=True)
    )
    policy = ContinuousDeterministicPolicy(actor=actor, exploration_noise=GaussianNoise(sigma=0.1),
                                           action_space=env.action_space)  # fmt: skip
    ddpg = DDPG(policy=policy, policy_optim=AdamOptimizerFactory(lr=1e-3), critic=critic,
                critic_optim=AdamOptimizerFactory(lr=1e-3), tau=0.005, gamma=0.99)  # fmt: skip

    updates_per_step = 1.0
    algorithm = PEROffPolicyWrapper(
        wrapped_algorithm=ddpg, beta=LinearBetaSchedule(0.4, 1.0, int(args.steps * updates_per_step))
    )
    buffer = HeteroPrioritizedVectorReplayBuffer(20_000, args.n_envs, alpha=0.6, beta=0.4, random_seed=args.seed)

    train_collector = Collector[CollectStats](algorithm, train_envs, buffer, exploration_noise=True)
    test_collector = Collector[CollectStats](algorithm, test_envs)
    train_collector.reset()
    train_collector.collect(n_step=1000, random=True)  # warm-up with random actions

    epochs = 4
    result = algorithm.run_training(
        OffPolicyTrainerParams(
            training_collector=train_collector,
            test_collector=test_collector,
            max_epochs=epochs,
            epoch_num_steps=args.steps // epochs,
            collection_step_num_env_steps=args.n_envs,
            update_step_num_gradient_steps_per_sample=updates_per_step,
            batch_size=64,
            test_step_num_episodes=5,
            verbose=True,
            show_progress=True,
        )  # fmt: skip
    )

    leaves = buffer.priority_tree.leaves()[buffer.sample_indices(0)]
    print(f"\nbest test return {result.best_reward:.1f} (random play scores about -1200; solved is about -200)")
    print(
        f"{algorithm.num_updates} updates; beta now {buffer.beta:.3f}; largest |TD error| + eps {buffer.max_priority:.2f}"
    )
    print(f"priorities p^alpha of the {len(buffer):,} stored transitions span {leaves.min():.4f} .. {leaves.max():.4f} "
          f"(median {np.median(leaves):.4f})")  # fmt: skip


if __name__ == "__main__":
    main()
