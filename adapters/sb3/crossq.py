"""CrossQ (sb3-contrib) with prioritized experience replay."""

from __future__ import annotations

import numpy as np
import torch as th
from sb3_contrib import CrossQ

from hetero_replay.adapters.sb3.buffers import PrioritizedReplayBufferSamples
from hetero_replay.adapters.sb3.common import PERMixin
from hetero_replay.adapters.sb3.gradient import descend, start_max_entropy_train


class PERCrossQ(PERMixin, CrossQ):
    """CrossQ (Bhatt et al., 2024: batch-normalised critics, no target networks) with prioritized replay.

    The same update as sb3-contrib's :class:`~sb3_contrib.CrossQ` (one joint batch-normalised
    critic pass over ``(s, a)`` and ``(s', a')``, delayed actor and entropy updates), with PER's two
    changes, the same as :class:`~hetero_replay.adapters.sb3.PERSAC`'s: each critic's squared error
    is weighted per transition by its importance-sampling weight, and the new priority is the mean
    over the critics of ``|Q_k - target|``. The batch-norm statistics still come from the joint,
    unweighted forward pass of observations and next observations (CrossQ's point); the actor and
    entropy losses are not weighted.

    Takes every argument of :class:`~sb3_contrib.CrossQ`, plus ``beta_schedule``, ``placement`` and
    ``staleness`` (:class:`~hetero_replay.adapters.sb3.common.PERMixin`).
    """

    def train(self, gradient_steps: int, batch_size: int = 64) -> None:
        """``gradient_steps`` critic updates on PER batches; every ``policy_delay``-th also updates actor and entropy."""
        logs = start_max_entropy_train(self)
        for _ in range(gradient_steps):
            self._n_updates += 1
            batch = self.replay_buffer.sample(batch_size, env=self._vec_normalize_env)
            if self.use_sde:
                self.actor.reset_noise()  # log_std may have moved since the last step
            # Detached: the losses below must not move the coefficient; its own loss does.
            ent_coef = self.ent_coef_tensor if self.log_ent_coef is None else th.exp(self.log_ent_coef.detach())
            logs["ent_coef"].append(ent_coef.item())

            current, target = self._q_values_and_target(batch, ent_coef)
            # Each critic's mean weighted squared error, halved and summed over the critics.
            critic_loss = 0.5 * (batch.weights * (current - target) ** 2).mean(dim=(1, 2)).sum()
            self.replay_buffer.update_priorities(batch.indices, (current.detach() - target).abs().mean(dim=0))
            logs["critic_loss"].append(critic_loss.item())
            descend(self.critic.optimizer, critic_loss)

            if self._n_updates % self.policy_delay == 0:
                logs["actor_loss"].append(self._update_actor(batch, ent_coef, logs["ent_coef_loss"]))
        self.logger.record("train/n_updates", self._n_updates, exclude="tensorboard")
        for name, values in logs.items():
            if values:
                self.logger.record(f"train/{name}", np.mean(values))

    def _q_values_and_target(
        self, batch: PrioritizedReplayBufferSamples, ent_coef: th.Tensor
    ) -> tuple[th.Tensor, th.Tensor]:
        """Each critic's ``Q(s, a)``, shape ``(n_critics, batch_size, 1)``, and the soft target ``(batch_size, 1)``.

        ``(s, a)`` and ``(s', a' ~ pi)`` go through the critics in one pass in training mode: batch
        norm then normalises with the statistics of both, which is how CrossQ does without target
        networks. The actor draws ``a'`` with its batch norm in evaluation mode.
        """
        discount = self.gamma if batch.discounts is None else batch.discounts
        with th.no_grad():
            self.actor.set_bn_training_mode(False)
            next_actions, next_log_prob = self.actor.action_log_prob(batch.next_observations)
        observations = th.cat([batch.observations, batch.next_observations])  # type: ignore[list-item]
        self.critic.set_bn_training_mode(True)
        q_values = th.cat(self.critic(observations, th.cat([batch.actions, next_actions])), dim=1)
        self.critic.set_bn_training_mode(False)
        current, next_q = q_values.split(len(batch.rewards))
        with th.no_grad():
            soft = next_q.min(dim=1, keepdim=True).values - ent_coef * next_log_prob.reshape(-1, 1)
            target = batch.rewards + (1 - batch.dones) * discount * soft
        return current.T.unsqueeze(-1), target

    def _update_actor(
        self, batch: PrioritizedReplayBufferSamples, ent_coef: th.Tensor, ent_coef_losses: list[float]
    ) -> float:
        """One actor step (and one of a learned entropy coefficient) on the batch's states; returns the actor loss.

        Unweighted: the actor's loss is no TD regression, so PER's sampling bias does not enter it.
        """
        self.actor.set_bn_training_mode(True)  # this pass updates the actor's batch-norm statistics
        actions_pi, log_prob = self.actor.action_log_prob(batch.observations)
        log_prob = log_prob.reshape(-1, 1)
        self.actor.set_bn_training_mode(False)
        if self.ent_coef_optimizer is not None:
            assert self.log_ent_coef is not None and not isinstance(self.target_entropy, str)  # set by _setup_model
            ent_coef_loss = -(self.log_ent_coef * (log_prob + self.target_entropy).detach()).mean()
            ent_coef_losses.append(ent_coef_loss.item())
            descend(self.ent_coef_optimizer, ent_coef_loss)
        self.critic.set_bn_training_mode(False)
        min_q_pi = th.cat(self.critic(batch.observations, actions_pi), dim=1).min(dim=1, keepdim=True).values
        actor_loss = (ent_coef * log_prob - min_q_pi).mean()
        descend(self.actor.optimizer, actor_loss)
        return actor_loss.item()
