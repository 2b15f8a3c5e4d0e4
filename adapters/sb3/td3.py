"""TD3 and DDPG with prioritized experience replay.

SB3's DDPG is TD3 with one critic, no target smoothing and no policy delay,
and it inherits ``TD3.train``; so one train mixin serves both.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch as th
from stable_baselines3 import DDPG, TD3
from stable_baselines3.common.utils import polyak_update

from hetero_replay.adapters.sb3.buffers import PrioritizedReplayBufferSamples
from hetero_replay.adapters.sb3.common import PERMixin
from hetero_replay.adapters.sb3.gradient import descend, weighted_critic_loss_and_td

if TYPE_CHECKING:
    # The train mixin is only ever mixed into TD3 or DDPG (a TD3): type-check it
    # as one (self.actor, self.critic, ... are TD3's). At run time it adds no base.
    _TD3Base = TD3
else:
    _TD3Base = object


class PERTD3TrainMixin(PERMixin, _TD3Base):
    """``TD3.train`` with prioritized replay: TD3's update (clipped target-policy noise, the smaller target
    critic, delayed actor and target updates), with PER's two changes.

    * Each critic's squared error is weighted per transition by its
      importance-sampling weight before averaging.
    * The new priority of a transition is the **mean over the critics** of
      ``|Q_k(s, a) - target|`` (with DDPG's single critic, just its ``|TD error|``;
      :func:`~hetero_replay.adapters.sb3.gradient.weighted_critic_loss_and_td`).
    * The actor loss is left unweighted: IS weights correct the bias of the
      critics' regression targets, which the actor's objective does not have.
    """

    def train(self, gradient_steps: int, batch_size: int = 100) -> None:
        """``gradient_steps`` critic updates on PER batches; every ``policy_delay``-th also updates the actor."""
        self.policy.set_training_mode(True)
        self._update_learning_rate([self.actor.optimizer, self.critic.optimizer])
        self._update_beta()
        actor_losses, critic_losses = [], []
        for _ in range(gradient_steps):
            self._n_updates += 1
            batch = self.replay_buffer.sample(batch_size, env=self._vec_normalize_env)
            critic_loss, td_errors = weighted_critic_loss_and_td(
                self.critic(batch.observations, batch.actions), self._target(batch), batch.weights
            )
            self.replay_buffer.update_priorities(batch.indices, td_errors)
            critic_losses.append(critic_loss.item())
            descend(self.critic.optimizer, critic_loss)

            if self._n_updates % self.policy_delay == 0:
                # q1_forward is annotated obs: Tensor but takes SB3's PyTorchObs (a dict under MultiInputPolicy).
                q_pi = self.critic.q1_forward(batch.observations, self.actor(batch.observations))  # type: ignore[arg-type]
                actor_loss = -q_pi.mean()
                actor_losses.append(actor_loss.item())
                descend(self.actor.optimizer, actor_loss)
                polyak_update(self.critic.parameters(), self.critic_target.parameters(), self.tau)
                polyak_update(self.actor.parameters(), self.actor_target.parameters(), self.tau)
                # Batch-norm running statistics are copied, not averaged (SB3 issue 996).
                polyak_update(self.critic_batch_norm_stats, self.critic_batch_norm_stats_target, 1.0)
                polyak_update(self.actor_batch_norm_stats, self.actor_batch_norm_stats_target, 1.0)
        self.logger.record("train/n_updates", self._n_updates, exclude="tensorboard")
        if actor_losses:
            self.logger.record("train/actor_loss", np.mean(actor_losses))
        self.logger.record("train/critic_loss", np.mean(critic_losses))

    def _target(self, batch: PrioritizedReplayBufferSamples) -> th.Tensor:
        """``r + discount * min_k Q'_k(s', a')``, ``a'`` the target actor's action plus clipped noise; ``(B, 1)``."""
        discount = self.gamma if batch.discounts is None else batch.discounts
        with th.no_grad():
            noise = th.empty_like(batch.actions).normal_(0, self.target_policy_noise)
            noise = noise.clamp(-self.target_noise_clip, self.target_noise_clip)
            next_actions = (self.actor_target(batch.next_observations) + noise).clamp(-1, 1)
            next_q = th.cat(self.critic_target(batch.next_observations, next_actions), dim=1)
            return batch.rewards + (1 - batch.dones) * discount * next_q.min(dim=1, keepdim=True).values


class PERTD3(PERTD3TrainMixin, TD3):
    """Twin Delayed DDPG with prioritized experience replay.

    SB3's :class:`~stable_baselines3.TD3` with the ``train()`` of
    :class:`PERTD3TrainMixin`. Takes every argument of TD3, plus
    ``beta_schedule`` (see :class:`~hetero_replay.adapters.sb3.common.PERMixin`);
    PER options go in ``replay_buffer_kwargs``.
    """


class PERDDPG(PERTD3TrainMixin, DDPG):
    """Deep Deterministic Policy Gradient with prioritized experience replay.

    SB3's :class:`~stable_baselines3.DDPG` (which trains with ``TD3.train``)
    with the ``train()`` of :class:`PERTD3TrainMixin`. Takes every argument of
    DDPG, plus ``beta_schedule`` (see
    :class:`~hetero_replay.adapters.sb3.common.PERMixin`); PER options go in
    ``replay_buffer_kwargs``.
    """
