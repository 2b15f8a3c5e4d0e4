"""CrossQ (sb3-contrib) with prioritized experience replay."""

from __future__ import annotations

import numpy as np
import torch as th
from sb3_contrib import CrossQ
from torch.nn import functional as F

from hetero_replay.adapters.sb3.common import PERMixin


class PERCrossQ(PERMixin, CrossQ):
    """CrossQ (Bhatt et al., 2024: batch-normalised critics, no target networks) with prioritized replay.

    sb3-contrib's :class:`~sb3_contrib.CrossQ` with two changes in ``train()``, marked ``# PER``,
    the same as :class:`~hetero_replay.adapters.sb3.PERSAC`'s: each critic's squared error is
    multiplied per transition by its importance-sampling weight, and the new priority is the mean
    over the critics of ``|Q_k - target|``. The batch-norm statistics still come from the joint,
    unweighted forward pass of observations and next observations (CrossQ's point); the actor and
    entropy losses are not weighted.

    Takes every argument of :class:`~sb3_contrib.CrossQ`, plus ``beta_schedule``, ``placement`` and
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

        for _ in range(gradient_steps):
            self._n_updates += 1
            # Sample replay buffer
            replay_data = self.replay_buffer.sample(batch_size, env=self._vec_normalize_env)
            # For n-step replay, discount factor is gamma**n_steps (when no early termination)
            discounts = replay_data.discounts if replay_data.discounts is not None else self.gamma

            # We need to sample because `log_std` may have changed between two gradient steps
            if self.use_sde:
                self.actor.reset_noise()

            # Note: in the following lines we always need to make sure to set train/eval modes
            # of actor and critic carefully. This is because of the BatchNorm layers in the networks
            # which behave differently in train and eval modes.

            if self.log_ent_coef is not None:
                # Important: detach the variable from the graph
                # so we don't change it with other losses
                # see https://github.com/rail-berkeley/softlearning/issues/60
                ent_coef = th.exp(self.log_ent_coef.detach())
            else:
                ent_coef = self.ent_coef_tensor

            ent_coefs.append(ent_coef.item())

            with th.no_grad():
                # Select action according to policy
                # Use more precise set_training_mode to allow the use of Dropout
                self.actor.set_bn_training_mode(False)
                next_actions, next_log_prob = self.actor.action_log_prob(replay_data.next_observations)

            # Joint forward pass of obs/next_obs and actions/next_state_actions: the batch-norm
            # statistics of the mixture of both distributions, in one pass (see sb3-contrib's CrossQ).
            all_obs = th.cat([replay_data.observations, replay_data.next_observations], dim=0)  # type: ignore[list-item]
            all_actions = th.cat([replay_data.actions, next_actions], dim=0)
            # Update critic BN stats
            self.critic.set_bn_training_mode(True)
            all_q_values = th.cat(self.critic(all_obs, all_actions), dim=1)
            self.critic.set_bn_training_mode(False)
            # (2 * batch_size, n_critics) -> (batch_size, n_critics), (batch_size, n_critics)
            current_q_values, next_q_values = th.split(all_q_values, batch_size, dim=0)
            # (batch_size, n_critics) -> (n_critics, batch_size, 1)
            current_q_values = current_q_values.T[..., None]

            with th.no_grad():
                # Compute the target Q value
                next_q_values, _ = th.min(next_q_values.detach(), dim=1, keepdim=True)
                # Add entropy term
                next_q_values = next_q_values - ent_coef * next_log_prob.reshape(-1, 1)
                # td error + entropy term
                target_q_values = replay_data.rewards + (1 - replay_data.dones) * discounts * next_q_values

            # PER: squared error per transition, weighted by its importance-sampling weight
            critic_loss = 0.5 * sum(
                (replay_data.weights * F.mse_loss(current_q, target_q_values, reduction="none")).mean()
                for current_q in current_q_values
            )
            assert isinstance(critic_loss, th.Tensor)  # for type checker
            critic_losses.append(critic_loss.item())
            # PER: new priority = mean over critics of |Q_k - target|
            td_errors = (current_q_values.detach() - target_q_values).abs().mean(dim=0)
            self.replay_buffer.update_priorities(replay_data.indices, td_errors)
            mean_weights.append(replay_data.weights.mean())  # PER: a tensor, read once per train() (no sync)

            # Optimize the critic
            self.critic.optimizer.zero_grad()
            critic_loss.backward()
            self.critic.optimizer.step()

            # Delayed policy updates
            if self._n_updates % self.policy_delay == 0:
                # Sample action according to policy and update actor BN stats
                self.actor.set_bn_training_mode(True)
                actions_pi, log_prob = self.actor.action_log_prob(replay_data.observations)
                log_prob = log_prob.reshape(-1, 1)
                self.actor.set_bn_training_mode(False)

                # Optimize entropy coefficient, also called entropy temperature or alpha in the paper
                if self.ent_coef_optimizer is not None:
                    assert self.log_ent_coef is not None and not isinstance(
                        self.target_entropy, str
                    )  # for type checker
                    ent_coef_loss = -(self.log_ent_coef * (log_prob + self.target_entropy).detach()).mean()
                    ent_coef_losses.append(ent_coef_loss.item())

                    self.ent_coef_optimizer.zero_grad()
                    ent_coef_loss.backward()
                    self.ent_coef_optimizer.step()

                # Compute actor loss
                self.critic.set_bn_training_mode(False)
                q_values_pi = th.cat(self.critic(replay_data.observations, actions_pi), dim=1)

                min_qf_pi, _ = th.min(q_values_pi, dim=1, keepdim=True)
                actor_loss = (ent_coef * log_prob.reshape(-1, 1) - min_qf_pi).mean()
                actor_losses.append(actor_loss.item())

                # Optimize the actor
                self.actor.optimizer.zero_grad()
                actor_loss.backward()
                self.actor.optimizer.step()

        self.logger.record("train/n_updates", self._n_updates, exclude="tensorboard")
        self.logger.record("train/ent_coef", np.mean(ent_coefs))
        if len(actor_losses) > 0:
            self.logger.record("train/actor_loss", np.mean(actor_losses))
        self.logger.record("train/critic_loss", np.mean(critic_losses))
        if len(ent_coef_losses) > 0:
            self.logger.record("train/ent_coef_loss", np.mean(ent_coef_losses))
        self._record_per(beta, mean_weights)
