"""DQN with prioritized experience replay."""

from __future__ import annotations

import numpy as np
import torch as th
from stable_baselines3 import DQN
from torch.nn import functional as F

from hetero_replay.adapters.sb3.common import PERMixin


class PERDQN(PERMixin, DQN):
    """Deep Q-Network with prioritized experience replay (Schaul et al., 2016).

    SB3's :class:`~stable_baselines3.DQN` with two changes in ``train()``, marked
    ``# PER`` below: the Huber loss of each transition is multiplied by its
    importance-sampling weight before averaging, and ``|TD error|`` (the
    difference between the current Q-value and its target) becomes the
    transition's new priority.

    Takes every argument of :class:`~stable_baselines3.DQN`, plus ``beta_schedule``
    (see :class:`~hetero_replay.adapters.sb3.common.PERMixin`). PER options go in
    ``replay_buffer_kwargs``, e.g. ``dict(alpha=0.6, beta=0.4)``.

    Example:
        >>> model = PERDQN("MlpPolicy", "CartPole-v1", replay_buffer_kwargs=dict(alpha=0.6), seed=0)
        >>> model = model.learn(10_000)
    """

    def train(self, gradient_steps: int, batch_size: int = 100) -> None:
        # Switch to train mode (this affects batch norm / dropout)
        self.policy.set_training_mode(True)
        # Update learning rate according to schedule
        self._update_learning_rate(self.policy.optimizer)
        beta = self._update_beta()  # PER: anneal beta

        losses, mean_weights = [], []
        for _ in range(gradient_steps):
            # Sample replay buffer
            replay_data = self.replay_buffer.sample(batch_size, env=self._vec_normalize_env)
            discounts = replay_data.discounts if replay_data.discounts is not None else self.gamma

            with th.no_grad():
                # Compute the next Q-values using the target network
                next_q_values = self.q_net_target(replay_data.next_observations)
                # Follow greedy policy: use the one with the highest value
                next_q_values, _ = next_q_values.max(dim=1)
                # Avoid potential broadcast issue
                next_q_values = next_q_values.reshape(-1, 1)
                # 1-step TD target
                target_q_values = replay_data.rewards + (1 - replay_data.dones) * discounts * next_q_values

            # Get current Q-values estimates
            current_q_values = self.q_net(replay_data.observations)

            # Retrieve the q-values for the actions from the replay buffer
            current_q_values = th.gather(current_q_values, dim=1, index=replay_data.actions.long())

            # PER: Huber loss per transition, weighted by its importance-sampling weight
            elementwise_loss = F.smooth_l1_loss(current_q_values, target_q_values, reduction="none")
            loss = (replay_data.weights * elementwise_loss).mean()
            losses.append(loss.item())
            # PER: |TD error| becomes the new priority
            self.replay_buffer.update_priorities(replay_data.indices, current_q_values.detach() - target_q_values)
            mean_weights.append(replay_data.weights.mean())  # PER: a tensor, read once per train() (no sync)

            # Optimize the policy
            self.policy.optimizer.zero_grad()
            loss.backward()
            # Clip gradient norm
            th.nn.utils.clip_grad_norm_(self.policy.parameters(), self.max_grad_norm)
            self.policy.optimizer.step()

        # Increase update counter
        self._n_updates += gradient_steps

        self.logger.record("train/n_updates", self._n_updates, exclude="tensorboard")
        self.logger.record("train/loss", np.mean(losses))
        self._record_per(beta, mean_weights)
