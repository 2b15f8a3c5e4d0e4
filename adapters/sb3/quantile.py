"""QR-DQN's and TQC's loss per transition, so PER can weight each one, and the priority PER gives it.

sb3-contrib's :func:`~sb3_contrib.common.utils.quantile_huber_loss` returns the loss already
averaged over the batch; PER needs it per transition. :func:`quantile_huber_loss_per_sample`
is the same loss reduced over everything but the batch dimension, so that its mean over the
batch equals sb3-contrib's (``tests/test_sb3_contrib.py`` checks it);
:func:`weighted_loss_and_mean_td` weights it and makes the new priorities.
"""

from __future__ import annotations

import torch as th
from torch.nn import functional as F


def quantile_huber_loss_per_sample(
    current_quantiles: th.Tensor, target_quantiles: th.Tensor, sum_over_quantiles: bool = True
) -> th.Tensor:
    """The quantile Huber loss (kappa = 1) of each transition, shape ``(batch_size,)``.

    Args:
        current_quantiles: ``(batch_size, n_quantiles)`` (QR-DQN) or
            ``(batch_size, n_critics, n_quantiles)`` (TQC), at the midpoints ``(i + 0.5) / n_quantiles``.
        target_quantiles: ``(batch_size, n_target_quantiles)`` or ``(batch_size, 1, n_target_quantiles)``
            (the same number of dimensions as ``current_quantiles``).
        sum_over_quantiles: sum over the current quantiles before averaging (QR-DQN, as in its
            paper), or average over them too (TQC).
    """
    if current_quantiles.ndim not in (2, 3) or current_quantiles.ndim != target_quantiles.ndim:
        raise ValueError(
            f"current_quantiles ({tuple(current_quantiles.shape)}) and target_quantiles "
            f"({tuple(target_quantiles.shape)}) must both be (batch, quantiles) or (batch, critics, quantiles)"
        )
    n = current_quantiles.shape[-1]
    # The fraction each current quantile estimates: the midpoint of its 1/n slice of [0, 1].
    fractions = (th.arange(n, device=current_quantiles.device, dtype=th.float) + 0.5) / n
    # errors[..., i, j]: target sample j minus current quantile i (every pair is a regression).
    errors = target_quantiles.unsqueeze(-2) - current_quantiles.unsqueeze(-1)
    huber = F.huber_loss(errors, th.zeros_like(errors), reduction="none", delta=1.0)
    # Quantile regression's asymmetry: quantile i pays fraction_i for an error above it and
    # 1 - fraction_i below it, so its minimum is the fraction_i quantile of the targets.
    asymmetry = (fractions.unsqueeze(-1) - (errors.detach() < 0).float()).abs()
    pairs = asymmetry * huber
    if sum_over_quantiles:
        pairs = pairs.sum(dim=-2)
    return pairs.flatten(start_dim=1).mean(dim=1)


def weighted_loss_and_mean_td(
    current_quantiles: th.Tensor, target_quantiles: th.Tensor, weights: th.Tensor, sum_over_quantiles: bool
) -> tuple[th.Tensor, th.Tensor]:
    """The IS-weighted quantile loss of a batch, and each transition's TD error of the expected return.

    The TD error (mean of the current quantiles minus mean of the target ones) is the new priority,
    not the transition's quantile loss: the quantiles of a random return are spread, so the loss
    stays positive once the distribution is learned exactly and would keep such a transition's
    priority high for good, while the error of the mean goes to 0.

    Args:
        current_quantiles, target_quantiles, sum_over_quantiles: as in :func:`quantile_huber_loss_per_sample`.
        weights: the batch's importance-sampling weights, one per transition.

    Returns:
        ``(loss, td_errors)``: the loss to minimise (a 0-d tensor) and ``(batch_size,)`` detached errors.
    """
    per_sample = quantile_huber_loss_per_sample(current_quantiles, target_quantiles, sum_over_quantiles)
    loss = (weights.view(-1) * per_sample).mean()
    td_errors = current_quantiles.detach().flatten(start_dim=1).mean(dim=1) - target_quantiles.flatten(
        start_dim=1
    ).mean(dim=1)
    return loss, td_errors
