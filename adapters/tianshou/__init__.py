"""Prioritized experience replay for Tianshou 2.x on hetero-replay's sum trees.

* :class:`HeteroPrioritizedReplayBuffer`, :class:`HeteroPrioritizedVectorReplayBuffer`:
  Tianshou's prioritized buffers with priorities in our tree (C++ by default),
  stratified seeded sampling, globally normalised IS weights and a working ``set_beta``.
* :class:`PEROffPolicyWrapper`: wraps ``DQN``, ``DDPG``, ``TD3`` or ``SAC`` so the IS
  weights always scale the loss (DQN's Huber loss included), beta follows a
  schedule (:class:`LinearBetaSchedule`), and beta, IS-weight and priority
  statistics reach Tianshou's logger.
* :class:`ShardedVectorReplayBuffer`: the Collector writes into a
  :class:`hetero_replay.distributed.ShardedReplay` (shards on Ray) and
  :class:`PEROffPolicyWrapper` trains from it (docs/distributed-tianshou.md).

Quick start (CartPole, 4 envs)::

    buf = HeteroPrioritizedVectorReplayBuffer(50_000, buffer_num=4, alpha=0.6, beta=0.4, random_seed=0)
    algorithm = PEROffPolicyWrapper(wrapped_algorithm=DQN(...), beta=LinearBetaSchedule(0.4, 1.0, 2_500))
    collector = Collector(algorithm, train_envs, buf, exploration_noise=True)
    algorithm.run_training(OffPolicyTrainerParams(training_collector=collector, ...))

Reproducibility: ``random_seed`` seeds the buffer's sampling; also seed torch
(``torch.manual_seed``) and the envs (``envs.seed(seed)``).
"""

from hetero_replay.extend import install_hint

try:
    import tianshou  # noqa: F401
except ImportError as e:  # pragma: no cover - depends on the installation
    raise ImportError(f"hetero_replay.adapters.tianshou needs Tianshou: {install_hint('tianshou')}") from e

from hetero_replay.adapters.tianshou.buffers import (
    HeteroPrioritizedReplayBuffer,
    HeteroPrioritizedVectorReplayBuffer,
)
from hetero_replay.adapters.tianshou.schedules import BetaSchedule, LinearBetaSchedule
from hetero_replay.adapters.tianshou.sharded import ShardedVectorReplayBuffer, transition_schema
from hetero_replay.adapters.tianshou.wrapper import PEROffPolicyWrapper, PERTrainingStats

__all__ = [
    "BetaSchedule",
    "HeteroPrioritizedReplayBuffer",
    "HeteroPrioritizedVectorReplayBuffer",
    "LinearBetaSchedule",
    "PEROffPolicyWrapper",
    "PERTrainingStats",
    "ShardedVectorReplayBuffer",
    "transition_schema",
]
