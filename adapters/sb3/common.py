"""What every PER algorithm adds to its SB3 parent: the buffer, the beta schedule, the logs.

The algorithm classes (``PERDQN``, ``PERDDPG``, ``PERTD3``, ``PERSAC``) put
:class:`PERMixin` before the SB3 class they extend; their own file holds only
their ``train()``.
"""

from __future__ import annotations

import io
import pathlib
from typing import Any, Callable

import numpy as np
from gymnasium import spaces
from stable_baselines3.common.utils import ConstantSchedule, LinearSchedule

from hetero_replay.adapters.sb3.buffers import DictPrioritizedReplayBuffer, PrioritizedReplayBuffer

#: ``progress_remaining`` (1 at the start of training, 0 at the end) -> beta.
BetaSchedule = Callable[[float], float]


def has_priorities(buffer_class: type) -> bool:
    """Whether ``buffer_class`` takes priority updates (its samples carry ``weights`` and ``indices``)."""
    return callable(getattr(buffer_class, "update_priorities", None))


class PERMixin:
    """Prioritized replay for an SB3 off-policy algorithm; put it first in the bases.

    * With no ``replay_buffer_class`` the algorithm uses
      :class:`PrioritizedReplayBuffer` (:class:`DictPrioritizedReplayBuffer` for
      ``Dict`` observations); its options go in ``replay_buffer_kwargs``
      (``alpha``, ``beta``, ``eps``, ``tree``, ...). A buffer class without
      ``update_priorities`` is refused with a ``TypeError``.
    * ``beta`` is annealed by ``beta_schedule``, called with SB3's
      ``_current_progress_remaining`` at each ``train()``. The default goes
      linearly from the buffer's initial ``beta`` to 1 over ``total_timesteps``.
    * ``train()`` logs ``train/per_beta``, ``train/per_mean_weight`` (mean IS
      weight of the sampled batches) and ``train/per_max_priority`` (largest
      ``|TD error| + eps`` so far).

    Args:
        beta_schedule: ``None`` (linear to 1), a constant in ``[0, 1]``, or a
            function of ``progress_remaining`` (1 -> 0) returning beta in ``[0, 1]``.
        **kwargs: the arguments of the SB3 algorithm.
    """

    # provided by the SB3 algorithm this mixes into
    replay_buffer: PrioritizedReplayBuffer
    replay_buffer_class: type | None
    observation_space: spaces.Space
    n_steps: int
    _current_progress_remaining: float
    logger: Any

    def __init__(self, *args: Any, beta_schedule: BetaSchedule | float | None = None, **kwargs: Any) -> None:
        if isinstance(beta_schedule, (int, float)) and not 0.0 <= beta_schedule <= 1.0:
            raise ValueError(f"beta_schedule: a constant beta must be in [0, 1], got {beta_schedule}")
        if beta_schedule is not None and not isinstance(beta_schedule, (int, float)) and not callable(beta_schedule):
            raise TypeError(f"beta_schedule must be None, a float or a callable, got {type(beta_schedule).__name__}")
        self.beta_schedule = beta_schedule
        super().__init__(*args, **kwargs)

    def _setup_model(self) -> None:
        # The one place the PER buffer is chosen and built (SB3 builds it in
        # super()._setup_model from replay_buffer_class / replay_buffer_kwargs).
        if self.replay_buffer_class is None:
            dict_obs = isinstance(self.observation_space, spaces.Dict)
            self.replay_buffer_class = DictPrioritizedReplayBuffer if dict_obs else PrioritizedReplayBuffer
        _require_priorities(self.replay_buffer_class, type(self).__name__)
        if getattr(self, "n_steps", 1) > 1:
            raise ValueError(
                f"{type(self).__name__} does not support n-step returns (n_steps={self.n_steps}): "
                "the prioritized buffer stores 1-step transitions"
            )
        super()._setup_model()  # type: ignore[misc]
        if self.beta_schedule is None:
            self.beta_schedule = LinearSchedule(self.replay_buffer.beta, 1.0, 1.0)
        elif isinstance(self.beta_schedule, (int, float)):
            self.beta_schedule = ConstantSchedule(float(self.beta_schedule))

    def load_replay_buffer(self, path: str | pathlib.Path | io.BufferedIOBase, truncate_last_traj: bool = True) -> None:
        """SB3's ``load_replay_buffer``, refusing a buffer without priorities (the current one stays)."""
        previous = self.replay_buffer
        try:
            super().load_replay_buffer(path, truncate_last_traj)  # type: ignore[misc]
            _require_priorities(type(self.replay_buffer), type(self).__name__)
        except BaseException:
            self.replay_buffer = previous
            raise

    def _update_beta(self) -> float:
        """Set the buffer's beta from the schedule; returns it."""
        assert callable(self.beta_schedule)
        beta = float(self.beta_schedule(self._current_progress_remaining))
        if not 0.0 <= beta <= 1.0:
            raise ValueError(
                f"beta_schedule returned {beta} at progress_remaining={self._current_progress_remaining:.3f}; "
                "beta must be in [0, 1]"
            )
        self.replay_buffer.beta = beta
        return beta

    def _record_per(self, beta: float, mean_weights: list[float]) -> None:
        """Log the PER state after one ``train()`` call."""
        self.logger.record("train/per_beta", beta)
        self.logger.record("train/per_mean_weight", float(np.mean(mean_weights)))
        self.logger.record("train/per_max_priority", self.replay_buffer.max_priority)


def _require_priorities(buffer_class: type, algo: str) -> None:
    if not has_priorities(buffer_class):
        raise TypeError(
            f"{algo} needs a replay buffer with priorities (update_priorities(indices, td_errors), and samples "
            f"with weights and indices); {buffer_class.__name__} has none. Leave replay_buffer_class unset "
            "(PrioritizedReplayBuffer), or use the stock SB3 algorithm for uniform replay."
        )
