"""TQC (sb3-contrib) with prioritized experience replay."""

from __future__ import annotations

import numpy as np
import torch as th
from sb3_contrib import TQC
from stable_baselines3.common.utils import polyak_update

from hetero_replay.adapters.sb3.common import PERMixin
from hetero_replay.adapters.sb3.quantile import quantile_huber_loss_per_sample


class PERTQC(PERMixin, TQC):
    """Truncated Quantile Critics (Kuznetsov et al., 2020) with prioritized experience replay.

    sb3-contrib's :class:`~sb3_contrib.TQC` with two changes in ``train()``, marked ``# PER``:
    the critics' quantile Huber loss is computed per transition (averaged over critics and
    quantiles, as sb3-contrib averages it) and multiplied by the transition's importance-sampling
    weight, as :class:`~hetero_replay.adapters.sb3.PERSAC` weights its critics' loss; and the new
    priority is ``|mean of the critics' quantiles - mean of the truncated target quantiles|``, the
    TD error of the expected return (why not the quantile loss: see
    :class:`~hetero_replay.adapters.sb3.PERQRDQN`). The actor and entropy losses are not weighted,
    as in PERSAC: they are not TD regressions.

    Takes every argument of :class:`~sb3_contrib.TQC`, plus ``beta_schedule``, ``placement`` and
    ``staleness`` (:class:`~hetero_replay.adapters.sb3.common.PERMixin`).
    """

    def train(self, gradient_steps: int, batch_size: int = 64) -> None:
        # Switch to train mode (this affects batch norm / dropout)
        self.policy.set_training_mode(True)
        # Update optimizers learning rate
        optimizers = [self.actor.optimizer, self.critic.optimizer]
        if self.ent_coef_optimizer is not None:
            optimizers += [self.ent_coef_optimizer]

        # Update learning rate according to lr schedule
        self._update_learning_rate(optimizers)
        beta = self._update_beta()  # PER: anneal beta

        ent_coef_losses, ent_coefs = [], []
        actor_losses, critic_losses, mean_weights = [], [], []

        for gradient_step in range(gradient_steps):
            # Sample replay buffer
            replay_data = self.replay_buffer.sample(batch_size, env=self._vec_normalize_env)
            # For n-step replay, discount factor is gamma**n_steps (when no early termination)
            discounts = replay_data.discounts if replay_data.discounts is not None else self.gamma

            # We need to sample because `log_std` may have changed between two gradient steps
            if self.use_sde:
                self.actor.reset_noise()

            # Action by the current actor for the sampled state
            actions_pi, log_prob = self.actor.action_log_prob(replay_data.observations)
            log_prob = log_prob.reshape(-1, 1)

            ent_coef_loss = None
            if self.ent_coef_optimizer is not None and self.log_ent_coef is not None:
                # Important: detach the variable from the graph
                # so we don't change it with other losses
                # see https://github.com/rail-berkeley/softlearning/issues/60
                ent_coef = th.exp(self.log_ent_coef.detach())
                assert not isinstance(
                    self.target_entropy, str
                )  # for type checker ("auto" was resolved in _setup_model)
                ent_coef_loss = -(self.log_ent_coef * (log_prob + self.target_entropy).detach()).mean()
                ent_coef_losses.append(ent_coef_loss.item())
            else:
                ent_coef = self.ent_coef_tensor

            ent_coefs.append(ent_coef.item())

            # Optimize entropy coefficient, also called
            # entropy temperature or alpha in the paper
            if ent_coef_loss is not None and self.ent_coef_optimizer is not None:
                self.ent_coef_optimizer.zero_grad()
                ent_coef_loss.backward()
                self.ent_coef_optimizer.step()

            with th.no_grad():
                # Select action according to policy
                next_actions, next_log_prob = self.actor.action_log_prob(replay_data.next_observations)
                # Compute and cut quantiles at the next state
                # batch x nets x quantiles
                next_quantiles = self.critic_target(replay_data.next_observations, next_actions)

                # Sort and drop top k quantiles to control overestimation.
                n_target_quantiles = (
                    self.critic.quantiles_total - self.top_quantiles_to_drop_per_net * self.critic.n_critics
                )
                next_quantiles, _ = th.sort(next_quantiles.reshape(batch_size, -1))
                next_quantiles = next_quantiles[:, :n_target_quantiles]

                # td error + entropy term
                target_quantiles = next_quantiles - ent_coef * next_log_prob.reshape(-1, 1)
                target_quantiles = replay_data.rewards + (1 - replay_data.dones) * discounts * target_quantiles
                # Make target_quantiles broadcastable to (batch_size, n_critics, n_target_quantiles).
                target_quantiles.unsqueeze_(dim=1)

            # Get current Quantile estimates using action from the replay buffer
            current_quantiles = self.critic(replay_data.observations, replay_data.actions)
            # PER: the critics' loss per transition (not summed over the quantiles, as in the paper),
            # weighted by its IS weight
            elementwise_loss = quantile_huber_loss_per_sample(current_quantiles, target_quantiles, False)
            critic_loss = (replay_data.weights.view(-1) * elementwise_loss).mean()
            critic_losses.append(critic_loss.item())
            # PER: |TD error of the mean| becomes the new priority
            td_errors = current_quantiles.detach().mean(dim=(1, 2)) - target_quantiles.mean(dim=(1, 2))
            self.replay_buffer.update_priorities(replay_data.indices, td_errors)
            mean_weights.append(replay_data.weights.mean())  # PER: a tensor, read once per train() (no sync)

            # Optimize the critic
            self.critic.optimizer.zero_grad()
            critic_loss.backward()
            self.critic.optimizer.step()

            # Compute actor loss
            qf_pi = self.critic(replay_data.observations, actions_pi).mean(dim=2).mean(dim=1, keepdim=True)
            actor_loss = (ent_coef * log_prob - qf_pi).mean()
            actor_losses.append(actor_loss.item())

            # Optimize the actor
            self.actor.optimizer.zero_grad()
            actor_loss.backward()
            self.actor.optimizer.step()

            # Update target networks
            if gradient_step % self.target_update_interval == 0:
                polyak_update(self.critic.parameters(), self.critic_target.parameters(), self.tau)
                # Copy running stats, see https://github.com/DLR-RM/stable-baselines3/issues/996
                polyak_update(self.batch_norm_stats, self.batch_norm_stats_target, 1.0)

        self._n_updates += gradient_steps

        self.logger.record("train/n_updates", self._n_updates, exclude="tensorboard")
        self.logger.record("train/ent_coef", np.mean(ent_coefs))
        self.logger.record("train/actor_loss", np.mean(actor_losses))
        self.logger.record("train/critic_loss", np.mean(critic_losses))
        if len(ent_coef_losses) > 0:
            self.logger.record("train/ent_coef_loss", np.mean(ent_coef_losses))
        self._record_per(beta, mean_weights)
