"""Schedules for the IS-weight exponent beta, indexed by gradient update.

PER anneals beta towards 1 over training, so the importance-sampling correction
is complete by the time the policy converges (Schaul et al., 2016, section 3.4).
A schedule is any callable ``update_index -> beta``;
:class:`~hetero_replay.adapters.tianshou.PEROffPolicyWrapper` calls it before
each update with the number of updates it has performed so far.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from hetero_replay.options import check_beta

#: ``schedule(update_index) -> beta in [0, 1]``.
BetaSchedule = Callable[[int], float]


def checked_beta(value: Any, what: str) -> float:
    """``value`` as a float if the core accepts it as beta (a finite real number in [0, 1], not a bool).

    Raises ``TypeError`` or ``ValueError``, as the core's check does, naming
    ``what`` (a schedule's value, a wrapper argument) with the value received.
    """
    try:
        return check_beta(value)
    except (TypeError, ValueError) as e:
        raise type(e)(f"{what} must be a real number in [0, 1], got {type(value).__name__} {value!r}") from None


@dataclass(frozen=True)
class LinearBetaSchedule:
    """Beta rising linearly from ``initial`` to ``final`` over ``num_updates`` updates, then constant.

    Choose ``num_updates`` as the number of gradient steps of the run; with
    Tianshou's ``OffPolicyTrainer`` that is
    ``max_epochs * epoch_num_steps * update_step_num_gradient_steps_per_sample``.

    Example:
        >>> schedule = LinearBetaSchedule(initial=0.4, final=1.0, num_updates=100)
        >>> schedule(0), schedule(50), schedule(1000)
        (0.4, 0.7, 1.0)
    """

    initial: float = 0.4
    final: float = 1.0
    num_updates: int = 100_000

    def __post_init__(self) -> None:
        for name in ("initial", "final"):
            checked_beta(getattr(self, name), name)
        if isinstance(self.num_updates, bool) or not isinstance(self.num_updates, numbers.Integral):
            raise TypeError(
                f"num_updates must be an integer, got {type(self.num_updates).__name__} {self.num_updates!r}"
            )
        if self.num_updates < 1:
            raise ValueError(f"num_updates must be a positive integer, got {self.num_updates!r}")

    def __call__(self, update: int) -> float:
        if isinstance(update, bool) or not isinstance(update, numbers.Integral):
            raise TypeError(f"update index must be an integer, got {type(update).__name__} {update!r}")
        if update < 0:
            raise ValueError(f"update index must be >= 0, got {update}")
        fraction = min(1.0, update / self.num_updates)
        return self.initial + (self.final - self.initial) * fraction
