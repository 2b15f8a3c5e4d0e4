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
from torch.nn import functional as F

from hetero_replay.adapters.sb3.common import PERMixin

if TYPE_CHECKING:
    # The train mixin is only ever mixed into TD3 or DDPG (a TD3): type-check it
    # as one (self.actor, self.critic, ... are TD3's). At run time it adds no base.
    _TD3Base = TD3
else:
    _TD3Base = object


class PERTD3TrainMixin(PERMixin, _TD3Base):
    """``TD3.train`` with prioritized replay; the changes are marked ``# PER``.

    * Each critic's squared error is weighted per transition by its
      importance-sampling weight before averaging.
    * The new priority of a transition is the **mean over the critics** of
      ``|Q_k(s, a) - target|`` (with DDPG's single critic, just its ``|TD error|``).
      The mean keeps every critic's error in the priority, where the mean of
      signed errors could cancel out.
    * The actor loss is left unweighted: IS weights correct the bias of the
      critics' regression targets, which the actor's objective does not have.
    """

    def train(self, gradient_steps: int, batch_size: int = 100) -> None:
        # Switch to train mode (this affects batch norm / dropout)
        self.policy.set_training_mode(True)

        # Update learning rate according to lr schedule
        self._update_learning_rate([self.actor.optimizer, self.critic.optimizer])
        beta = self._update_beta()  # PER: anneal beta

        actor_losses, critic_losses, mean_weights = [], [], []
        for _ in range(gradient_steps):
            self._n_updates += 1
            # Sample replay buffer
            replay_data = self.replay_buffer.sample(batch_size, env=self._vec_normalize_env)
            discounts = replay_data.discounts if replay_data.discounts is not None else self.gamma

            with th.no_grad():
                # Select action according to policy and add clipped noise
                noise = replay_data.actions.clone().data.normal_(0, self.target_policy_noise)
                noise = noise.clamp(-self.target_noise_clip, self.target_noise_clip)
                next_actions = (self.actor_target(replay_data.next_observations) + noise).clamp(-1, 1)

                # Compute the next Q-values: min over all critics targets
                next_q_values = th.cat(self.critic_target(replay_data.next_observations, next_actions), dim=1)
                next_q_values, _ = th.min(next_q_values, dim=1, keepdim=True)
                target_q_values = replay_data.rewards + (1 - replay_data.dones) * discounts * next_q_values

            # Get current Q-values estimates for each critic network
            current_q_values = self.critic(replay_data.observations, replay_data.actions)

            # PER: squared error per transition, weighted by its importance-sampling weight
            critic_loss = sum(
                (replay_data.weights * F.mse_loss(current_q, target_q_values, reduction="none")).mean()
                for current_q in current_q_values
            )
            assert isinstance(critic_loss, th.Tensor)
            critic_losses.append(critic_loss.item())
            # PER: new priority = mean over critics of |Q_k - target|
            td_errors = th.stack([(q.detach() - target_q_values).abs() for q in current_q_values]).mean(dim=0)
            self.replay_buffer.update_priorities(replay_data.indices, td_errors)
            mean_weights.append(replay_data.weights.mean())  # PER: a tensor, read once per train() (no sync)

            # Optimize the critics
            self.critic.optimizer.zero_grad()
            critic_loss.backward()
            self.critic.optimizer.step()

            # Delayed policy updates
            if self._n_updates % self.policy_delay == 0:
                # Compute actor loss
                # q1_forward is annotated obs: Tensor, but it takes SB3's PyTorchObs (a dict of
                # tensors under MultiInputPolicy), as SB3's own TD3.train passes it.
                actor_loss = -self.critic.q1_forward(
                    replay_data.observations,  # type: ignore[arg-type]  # Tensor or dict: see above
                    self.actor(replay_data.observations),
                ).mean()
                actor_losses.append(actor_loss.item())

                # Optimize the actor
                self.actor.optimizer.zero_grad()
                actor_loss.backward()
                self.actor.optimizer.step()

                polyak_update(self.critic.parameters(), self.critic_target.parameters(), self.tau)
                polyak_update(self.actor.parameters(), self.actor_target.parameters(), self.tau)
                # Copy running stats, see GH issue #996
                polyak_update(self.critic_batch_norm_stats, self.critic_batch_norm_stats_target, 1.0)
                polyak_update(self.actor_batch_norm_stats, self.actor_batch_norm_stats_target, 1.0)

        self.logger.record("train/n_updates", self._n_updates, exclude="tensorboard")
        if len(actor_losses) > 0:
            self.logger.record("train/actor_loss", np.mean(actor_losses))
        self.logger.record("train/critic_loss", np.mean(critic_losses))
        self._record_per(beta, mean_weights)


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
