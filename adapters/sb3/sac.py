"""SAC with prioritized experience replay."""

from __future__ import annotations

import numpy as np
import torch as th
from stable_baselines3 import SAC
from stable_baselines3.common.utils import polyak_update

from hetero_replay.adapters.sb3.buffers import PrioritizedReplayBufferSamples
from hetero_replay.adapters.sb3.common import PERMixin
from hetero_replay.adapters.sb3.gradient import (
    descend,
    entropy_coefficient,
    start_max_entropy_train,
    weighted_critic_loss_and_td,
)


class PERSAC(PERMixin, SAC):
    """Soft Actor-Critic (Haarnoja et al., 2018) with prioritized experience replay.

    The same update as SB3's :class:`~stable_baselines3.SAC` (learned or fixed
    entropy coefficient, soft target from the smaller target critic,
    Polyak-averaged targets), with PER's two changes: each critic's squared
    error is weighted per transition by its importance-sampling weight, and a
    transition's new priority is the **mean over the critics** of
    ``|Q_k(s, a) - target|`` (the target includes the entropy term;
    :func:`~hetero_replay.adapters.sb3.gradient.weighted_critic_loss_and_td`).
    The actor and entropy losses are not weighted: they are not TD regressions
    (as in :class:`~hetero_replay.adapters.sb3.td3.PERTD3TrainMixin`).

    Takes every argument of SAC, plus ``beta_schedule``, ``placement`` and
    ``staleness`` (see :class:`~hetero_replay.adapters.sb3.common.PERMixin`);
    PER options go in ``replay_buffer_kwargs``.
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

            target = self._soft_target(batch, ent_coef)
            critic_loss, td_errors = weighted_critic_loss_and_td(
                self.critic(batch.observations, batch.actions), target, batch.weights
            )
            critic_loss = 0.5 * critic_loss
            self.replay_buffer.update_priorities(batch.indices, td_errors)
            logs["critic_loss"].append(critic_loss.item())
            descend(self.critic.optimizer, critic_loss)

            # The actor climbs the smaller critic, with the entropy bonus.
            q_pi = th.cat(self.critic(batch.observations, actions_pi), dim=1).min(dim=1, keepdim=True).values
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

    def _soft_target(self, batch: PrioritizedReplayBufferSamples, ent_coef: th.Tensor) -> th.Tensor:
        """``r + discount * (min_k Q'_k(s', a') - ent_coef * log pi(a'|s'))`` with ``a' ~ pi(s')``, shape ``(B, 1)``."""
        discount = self.gamma if batch.discounts is None else batch.discounts
        with th.no_grad():
            next_actions, next_log_prob = self.actor.action_log_prob(batch.next_observations)
            next_q = th.cat(self.critic_target(batch.next_observations, next_actions), dim=1)
            soft = next_q.min(dim=1, keepdim=True).values - ent_coef * next_log_prob.reshape(-1, 1)
            return batch.rewards + (1 - batch.dones) * discount * soft
