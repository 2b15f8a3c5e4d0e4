"""QR-DQN (sb3-contrib) with prioritized experience replay."""

from __future__ import annotations

import numpy as np
import torch as th
from sb3_contrib import QRDQN

from hetero_replay.adapters.sb3.common import PERMixin
from hetero_replay.adapters.sb3.quantile import quantile_huber_loss_per_sample


class PERQRDQN(PERMixin, QRDQN):
    """Quantile-regression DQN (Dabney et al., 2018) with prioritized experience replay.

    sb3-contrib's :class:`~sb3_contrib.QRDQN` with two changes in ``train()``, marked ``# PER``:

    * the quantile Huber loss is computed per transition (summed over the quantiles, averaged
      over the target quantiles, as sb3-contrib does) and multiplied by the transition's
      importance-sampling weight before averaging over the batch;
    * the new priority is ``|mean of the current quantiles - mean of the target quantiles|``: the
      TD error of the expected return, the quantity PERDQN uses. Not the per-transition quantile
      loss: that loss stays positive for a transition whose return distribution is already learned
      exactly (the quantiles of a random return are spread, so each one is off by the spread), so
      such a transition would keep a high priority forever; the mean's error goes to 0.

    Takes every argument of :class:`~sb3_contrib.QRDQN`, plus ``beta_schedule``, ``placement``
    and ``staleness`` (see :class:`~hetero_replay.adapters.sb3.common.PERMixin`). PER options go
    in ``replay_buffer_kwargs``, e.g. ``dict(alpha=0.6, beta=0.4)``.

    Example:
        >>> model = PERQRDQN("MlpPolicy", "CartPole-v1", replay_buffer_kwargs=dict(alpha=0.6), seed=0)
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
            # For n-step replay, discount factor is gamma**n_steps (when no early termination)
            discounts = replay_data.discounts if replay_data.discounts is not None else self.gamma

            with th.no_grad():
                # Compute the quantiles of next observation
                next_quantiles = self.quantile_net_target(replay_data.next_observations)
                # Compute the greedy actions which maximize the next Q values
                next_greedy_actions = next_quantiles.mean(dim=1, keepdim=True).argmax(dim=2, keepdim=True)
                # Make "n_quantiles" copies of actions, and reshape to (batch_size, n_quantiles, 1)
                next_greedy_actions = next_greedy_actions.expand(batch_size, self.n_quantiles, 1)
                # Follow greedy policy: use the one with the highest Q values
                next_quantiles = next_quantiles.gather(dim=2, index=next_greedy_actions).squeeze(dim=2)
                # 1-step TD target
                target_quantiles = replay_data.rewards + (1 - replay_data.dones) * discounts * next_quantiles

            # Get current quantile estimates
            current_quantiles = self.quantile_net(replay_data.observations)

            # Make "n_quantiles" copies of actions, and reshape to (batch_size, n_quantiles, 1).
            actions = replay_data.actions[..., None].long().expand(batch_size, self.n_quantiles, 1)
            # Retrieve the quantiles for the actions from the replay buffer
            current_quantiles = th.gather(current_quantiles, dim=2, index=actions).squeeze(dim=2)

            # PER: quantile Huber loss per transition (summed over the quantiles), weighted by its IS weight
            elementwise_loss = quantile_huber_loss_per_sample(current_quantiles, target_quantiles)
            loss = (replay_data.weights.view(-1) * elementwise_loss).mean()
            losses.append(loss.item())
            # PER: |TD error of the mean| becomes the new priority
            td_errors = current_quantiles.detach().mean(dim=1) - target_quantiles.mean(dim=1)
            self.replay_buffer.update_priorities(replay_data.indices, td_errors)
            mean_weights.append(replay_data.weights.mean())  # PER: a tensor, read once per train() (no sync)

            # Optimize the policy
            self.policy.optimizer.zero_grad()
            loss.backward()
            # Clip gradient norm
            if self.max_grad_norm is not None:
                th.nn.utils.clip_grad_norm_(self.policy.parameters(), self.max_grad_norm)
            self.policy.optimizer.step()

        # Increase update counter
        self._n_updates += gradient_steps

        self.logger.record("train/n_updates", self._n_updates, exclude="tensorboard")
        self.logger.record("train/loss", np.mean(losses))
        self._record_per(beta, mean_weights)
