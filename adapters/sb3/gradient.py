"""Steps the PER algorithms written here (TQC, CrossQ) share: one gradient step, and how a ``train()`` of a
maximum-entropy actor-critic starts."""

from __future__ import annotations

from typing import Any

import torch as th


def descend(optimizer: th.optim.Optimizer, loss: th.Tensor) -> None:
    """Clear ``optimizer``'s gradients, back-propagate ``loss`` and take one step."""
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()


def start_max_entropy_train(model: Any) -> tuple[float, dict[str, list[float]]]:
    """Training mode, this step's learning rates (actor, critics, entropy coefficient) and PER's beta.

    Returns ``(beta, logs)``: ``logs`` the empty per-step lists that ``train()`` records at its end.
    """
    model.policy.set_training_mode(True)
    optimizers = [model.actor.optimizer, model.critic.optimizer]
    if model.ent_coef_optimizer is not None:
        optimizers.append(model.ent_coef_optimizer)
    model._update_learning_rate(optimizers)
    return model._update_beta(), {"ent_coef": [], "ent_coef_loss": [], "critic_loss": [], "actor_loss": []}
