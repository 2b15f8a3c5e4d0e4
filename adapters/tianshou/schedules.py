"""Schedules for the IS-weight exponent beta, indexed by gradient update.

PER anneals beta towards 1 over training, so the importance-sampling correction
is complete by the time the policy converges (Schaul et al., 2016, section 3.4).
A schedule is any callable ``update_index -> beta``;
:class:`~hetero_replay.adapters.tianshou.PEROffPolicyWrapper` calls it before
each update with the number of updates it has performed so far.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from hetero_replay.extend import check_beta, check_int

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
        check_int(self.num_updates, "num_updates", low=1)

    def __call__(self, update: int) -> float:
        check_int(update, "update index", low=0)
        fraction = min(1.0, update / self.num_updates)
        return self.initial + (self.final - self.initial) * fraction
