"""DQN with prioritized experience replay."""

from __future__ import annotations

import numpy as np
import torch as th
from stable_baselines3 import DQN
from torch.nn import functional as F

from hetero_replay.adapters.sb3.common import PERMixin


class PERDQN(PERMixin, DQN):
    """Deep Q-Network with prioritized experience replay (Schaul et al., 2016).

    The same update as SB3's :class:`~stable_baselines3.DQN` (greedy target from
    the target network, Huber loss, gradient clipping), with PER's two changes:
    each transition's Huber loss is multiplied by its importance-sampling weight
    before the batch mean, and its ``|TD error|`` (current Q-value minus target)
    becomes its new priority.

    Takes every argument of :class:`~stable_baselines3.DQN`, plus ``beta_schedule``,
    ``placement`` and ``staleness`` (see
    :class:`~hetero_replay.adapters.sb3.common.PERMixin`). PER options go in
    ``replay_buffer_kwargs``, e.g. ``dict(alpha=0.6, beta=0.4)``.

    Example:
        >>> model = PERDQN("MlpPolicy", "CartPole-v1", replay_buffer_kwargs=dict(alpha=0.6), seed=0)
        >>> model = model.learn(10_000)
    """

    def train(self, gradient_steps: int, batch_size: int = 100) -> None:
        """``gradient_steps`` updates of the Q-network on PER batches of ``batch_size``."""
        self.policy.set_training_mode(True)
        self._update_learning_rate(self.policy.optimizer)
        self._update_beta()
        losses = []
        for _ in range(gradient_steps):
            batch = self.replay_buffer.sample(batch_size, env=self._vec_normalize_env)
            discount = self.gamma if batch.discounts is None else batch.discounts
            with th.no_grad():
                best_next = self.q_net_target(batch.next_observations).max(dim=1).values.reshape(-1, 1)
                target = batch.rewards + (1 - batch.dones) * discount * best_next
            current = th.gather(self.q_net(batch.observations), dim=1, index=batch.actions.long())
            loss = (batch.weights * F.smooth_l1_loss(current, target, reduction="none")).mean()
            self.replay_buffer.update_priorities(batch.indices, current.detach() - target)
            losses.append(loss.item())
            self.policy.optimizer.zero_grad()
            loss.backward()
            th.nn.utils.clip_grad_norm_(self.policy.parameters(), self.max_grad_norm)
            self.policy.optimizer.step()
        self._n_updates += gradient_steps
        self.logger.record("train/n_updates", self._n_updates, exclude="tensorboard")
        self.logger.record("train/loss", np.mean(losses))
