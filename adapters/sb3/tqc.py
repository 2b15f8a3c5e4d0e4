"""TQC (sb3-contrib) with prioritized experience replay."""

from __future__ import annotations

import numpy as np
import torch as th
from sb3_contrib import TQC
from stable_baselines3.common.utils import polyak_update

from hetero_replay.adapters.sb3.buffers import PrioritizedReplayBufferSamples
from hetero_replay.adapters.sb3.common import PERMixin
from hetero_replay.adapters.sb3.gradient import descend, entropy_coefficient, start_max_entropy_train
from hetero_replay.adapters.sb3.quantile import weighted_loss_and_mean_td


class PERTQC(PERMixin, TQC):
    """Truncated Quantile Critics (Kuznetsov et al., 2020) with prioritized experience replay.

    The same update as sb3-contrib's :class:`~sb3_contrib.TQC` (learned entropy coefficient,
    truncated target from the pooled, sorted quantiles of every target critic, Polyak-averaged
    targets), with PER's two changes: the critics' quantile Huber loss is taken per transition
    (averaged over critics and quantiles, as sb3-contrib averages it) and weighted by the
    transition's importance-sampling weight, as :class:`~hetero_replay.adapters.sb3.PERSAC` weights
    its critics' loss; and the new priority is ``|mean of the critics' quantiles - mean of the
    truncated target quantiles|``, the TD error of the expected return
    (:func:`~hetero_replay.adapters.sb3.quantile.weighted_loss_and_mean_td` says why not the loss).
    The actor and entropy losses are not weighted, as in PERSAC: they are not TD regressions.

    Takes every argument of :class:`~sb3_contrib.TQC`, plus ``beta_schedule``, ``placement`` and
    ``staleness`` (:class:`~hetero_replay.adapters.sb3.common.PERMixin`).
    """

    def train(self, gradient_steps: int, batch_size: int = 64) -> None:
        """``gradient_steps`` updates of the entropy coefficient, critics and actor on PER batches."""
        logs = start_max_entropy_train(self)
        for step in range(gradient_steps):
            batch = self.replay_buffer.sample(batch_size, env=self._vec_normalize_env)
            if self.use_sde:
                self.actor.reset_noise()  # log_std may have moved since the last step
            actions_pi, log_prob = self.actor.action_log_prob(batch.observations)
            log_prob = log_prob.reshape(-1, 1)
            ent_coef = entropy_coefficient(self, log_prob, logs["ent_coef_loss"])
            logs["ent_coef"].append(ent_coef.item())

            target = self._target_quantiles(batch, ent_coef)
            current = self.critic(batch.observations, batch.actions)
            critic_loss, td_errors = weighted_loss_and_mean_td(current, target, batch.weights, False)
            self.replay_buffer.update_priorities(batch.indices, td_errors)
            logs["critic_loss"].append(critic_loss.item())
            descend(self.critic.optimizer, critic_loss)

            # The actor climbs the critics' mean quantile, with the entropy bonus.
            q_pi = self.critic(batch.observations, actions_pi).flatten(start_dim=1).mean(dim=1, keepdim=True)
            actor_loss = (ent_coef * log_prob - q_pi).mean()
            logs["actor_loss"].append(actor_loss.item())
            descend(self.actor.optimizer, actor_loss)

            if step % self.target_update_interval == 0:
                polyak_update(self.critic.parameters(), self.critic_target.parameters(), self.tau)
                # Batch-norm running statistics are copied, not averaged (SB3 issue 996).
                polyak_update(self.batch_norm_stats, self.batch_norm_stats_target, 1.0)
        self._n_updates += gradient_steps
        self.logger.record("train/n_updates", self._n_updates, exclude="tensorboard")
        for name, values in logs.items():
            if values:
                self.logger.record(f"train/{name}", np.mean(values))

    def _target_quantiles(self, batch: PrioritizedReplayBufferSamples, ent_coef: th.Tensor) -> th.Tensor:
        """The soft target quantiles, shape ``(batch_size, 1, kept)``: broadcast over the critics.

        The target critics' quantiles at ``(s', a' ~ pi)`` are pooled and sorted, and the highest
        ``top_quantiles_to_drop_per_net`` per critic are dropped: TQC's control of overestimation.
        """
        discount = self.gamma if batch.discounts is None else batch.discounts
        kept = self.critic.quantiles_total - self.top_quantiles_to_drop_per_net * self.critic.n_critics
        with th.no_grad():
            next_actions, next_log_prob = self.actor.action_log_prob(batch.next_observations)
            pooled = self.critic_target(batch.next_observations, next_actions).flatten(start_dim=1)
            lowest = pooled.sort(dim=1).values[:, :kept]
            soft = lowest - ent_coef * next_log_prob.reshape(-1, 1)
            return (batch.rewards + (1 - batch.dones) * discount * soft).unsqueeze(1)
