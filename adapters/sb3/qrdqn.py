"""QR-DQN (sb3-contrib) with prioritized experience replay."""

from __future__ import annotations

import numpy as np
import torch as th
from sb3_contrib import QRDQN

from hetero_replay.adapters.sb3.buffers import PrioritizedReplayBufferSamples
from hetero_replay.adapters.sb3.common import PERMixin
from hetero_replay.adapters.sb3.quantile import weighted_loss_and_mean_td


class PERQRDQN(PERMixin, QRDQN):
    """Quantile-regression DQN (Dabney et al., 2018) with prioritized experience replay.

    The same update as sb3-contrib's :class:`~sb3_contrib.QRDQN` (double-DQN-style greedy target
    from the target network, gradient clipping), with PER's two changes:

    * the quantile Huber loss is taken per transition (summed over the quantiles, averaged over
      the target quantiles, as sb3-contrib does) and weighted by the transition's
      importance-sampling weight before averaging over the batch;
    * the new priority is ``|mean of the current quantiles - mean of the target quantiles|``: the
      TD error of the expected return, the quantity PERDQN uses, not the quantile loss
      (:func:`~hetero_replay.adapters.sb3.quantile.weighted_loss_and_mean_td` says why).

    Takes every argument of :class:`~sb3_contrib.QRDQN`, plus ``beta_schedule``, ``placement``
    and ``staleness`` (see :class:`~hetero_replay.adapters.sb3.common.PERMixin`). PER options go
    in ``replay_buffer_kwargs``, e.g. ``dict(alpha=0.6, beta=0.4)``.

    Example:
        >>> model = PERQRDQN("MlpPolicy", "CartPole-v1", replay_buffer_kwargs=dict(alpha=0.6), seed=0)
        >>> model = model.learn(10_000)
    """

    def train(self, gradient_steps: int, batch_size: int = 100) -> None:
        """``gradient_steps`` updates of the quantile network on PER batches of ``batch_size``."""
        self.policy.set_training_mode(True)
        self._update_learning_rate(self.policy.optimizer)
        self._update_beta()
        losses = []
        for _ in range(gradient_steps):
            batch = self.replay_buffer.sample(batch_size, env=self._vec_normalize_env)
            current = _quantiles_of(self.quantile_net(batch.observations), batch.actions)
            loss, td_errors = weighted_loss_and_mean_td(current, self._target_quantiles(batch), batch.weights, True)
            self.replay_buffer.update_priorities(batch.indices, td_errors)
            losses.append(loss.item())
            self.policy.optimizer.zero_grad()
            loss.backward()
            if self.max_grad_norm is not None:
                th.nn.utils.clip_grad_norm_(self.policy.parameters(), self.max_grad_norm)
            self.policy.optimizer.step()
        self._n_updates += gradient_steps
        self.logger.record("train/n_updates", self._n_updates, exclude="tensorboard")
        self.logger.record("train/loss", np.mean(losses))

    def _target_quantiles(self, batch: PrioritizedReplayBufferSamples) -> th.Tensor:
        """``r + discount * Z'(s', a*)``, shape ``(batch_size, n_quantiles)``.

        ``a*`` maximises the target network's expected return (the mean of its quantiles); the
        discount is the buffer's per-transition one when it has n-step returns.
        """
        discount = self.gamma if batch.discounts is None else batch.discounts
        with th.no_grad():
            next_quantiles = self.quantile_net_target(batch.next_observations)
            greedy = next_quantiles.mean(dim=1).argmax(dim=1)
            return batch.rewards + (1 - batch.dones) * discount * _quantiles_of(next_quantiles, greedy)


def _quantiles_of(quantiles: th.Tensor, actions: th.Tensor) -> th.Tensor:
    """Each row's quantiles of its own action: ``(batch, n_quantiles, n_actions)`` -> ``(batch, n_quantiles)``."""
    index = actions.long().view(-1, 1, 1).expand(-1, quantiles.shape[1], 1)
    return quantiles.gather(dim=2, index=index).squeeze(dim=2)
