"""Update steps that scale every sample's TD loss by its importance-sampling weight.

Tianshou's algorithms read the IS weights from ``batch.weight`` and, after the
update, leave their TD errors there for ``buffer.update_weight``. Whether the
weights actually reach the loss depends on the algorithm and its configuration;
in Tianshou 2.0.1 (read from the source):

==================  ==========================================================
algorithm           TD loss
==================  ==========================================================
DQN, MSE            ``(td ** 2 * weight).mean()`` -- weighted
DQN, Huber          ``huber_loss(q, returns, reduction="mean")`` -- weights
                    **dropped** (``huber_loss_delta`` set)
DDPG, TD3, SAC      ``_minimize_critic_squared_loss``: ``(td ** 2 * weight).mean()``
                    per critic -- weighted
C51, RainbowDQN     ``(cross_entropy * weight).mean()`` (cross-entropy of the
                    projected target distribution per sample) -- weighted;
                    RainbowDQN samples the noisy layers' noise, then runs C51's step
==================  ==========================================================

:func:`weighted_update` runs a step that is guaranteed to weight the loss:
Tianshou's own step where it does, and for DQN's Huber path the same step with
the weighted per-sample Huber loss. :func:`check_supported` rejects algorithms
whose step has not been checked with ``TypeError``, instead of letting them
train silently without the correction.

The TD errors fed back as priorities are Tianshou's own: ``returns - q`` for DQN,
``q - target`` for DDPG, and for TD3 and SAC the mean of the two critics'
errors, ``(td1 + td2) / 2``, which can understate a transition's priority where
the two critics straddle the target. C51 and RainbowDQN feed back the per-sample
cross-entropy (the Rainbow paper's KL loss up to the target's entropy), which is
never 0; that is Tianshou's choice, kept.
"""

from __future__ import annotations

import numpy as np
import torch
from tianshou.algorithm import C51, DDPG, DQN, RainbowDQN
from tianshou.algorithm.algorithm_base import OffPolicyAlgorithm, TrainingStats
from tianshou.algorithm.modelfree.reinforce import SimpleLossTrainingStats
from tianshou.algorithm.modelfree.sac import SAC
from tianshou.algorithm.modelfree.td3 import TD3
from tianshou.data import to_torch_as
from tianshou.data.types import RolloutBatchProtocol

#: Update steps that weight their TD loss by ``batch.weight`` in every configuration.
_WEIGHTING_STEPS = (
    DDPG._update_with_batch,
    TD3._update_with_batch,
    SAC._update_with_batch,
    C51._update_with_batch,
    RainbowDQN._update_with_batch,
)

#: What :func:`check_supported` accepts, for error messages.
SUPPORTED = "DQN (MSE or Huber loss), DDPG, TD3, SAC, C51, RainbowDQN and subclasses that keep their update step"


def check_supported(algorithm: OffPolicyAlgorithm) -> None:
    """``TypeError`` unless :func:`weighted_update` knows how ``algorithm`` uses the IS weights.

    Unknown are, e.g., other algorithms and subclasses that override ``_update_with_batch``.
    """
    step = type(algorithm)._update_with_batch
    if step is not DQN._update_with_batch and step not in _WEIGHTING_STEPS:
        raise TypeError(
            f"cannot guarantee that {type(algorithm).__name__}'s update step applies the "
            f"importance-sampling weights; supported: {SUPPORTED}"
        )


def weighted_update(algorithm: OffPolicyAlgorithm, batch: RolloutBatchProtocol) -> TrainingStats:
    """One gradient step of ``algorithm`` on a pre-processed ``batch``, each sample's TD
    loss multiplied by its IS weight (``batch.weight``); call :func:`check_supported` first.
    """
    # Decided per step: huber_loss_delta is a plain attribute a user may change.
    if type(algorithm)._update_with_batch is DQN._update_with_batch and algorithm.huber_loss_delta is not None:
        return dqn_weighted_huber_step(algorithm, batch)  # type: ignore[arg-type]
    return algorithm._update_with_batch(batch)  # Tianshou's own step weights the loss


def dqn_weighted_huber_step(algorithm: DQN, batch: RolloutBatchProtocol) -> SimpleLossTrainingStats:
    """``DQN._update_with_batch`` with the Huber loss weighted per sample.

    Identical to Tianshou 2.0.1's step (target-network refresh, TD errors left
    in ``batch.weight`` for the priority update, one optimizer step) except the
    loss: ``mean(weight * huber(q, returns, delta))`` instead of the unweighted mean.
    """
    delta = algorithm.huber_loss_delta
    if delta is None:
        raise ValueError("this DQN uses the squared loss (huber_loss_delta is None), which Tianshou weights itself")
    algorithm._periodically_update_lagged_network_weights()
    weight = batch.pop("weight", 1.0)
    q = algorithm.policy(batch).logits
    q = q[np.arange(len(q)), batch.act]
    returns = to_torch_as(batch.returns.flatten(), q)
    td_error = returns - q
    per_sample = torch.nn.functional.huber_loss(q, returns, delta=delta, reduction="none")
    loss = (per_sample * weight).mean()
    batch.weight = td_error  # the priority feedback, as Tianshou's step leaves it
    algorithm.optim.step(loss)
    return SimpleLossTrainingStats(loss=loss.item())
