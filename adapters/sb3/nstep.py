"""n-step returns over prioritized replay, with the semantics of SB3's ``NStepReplayBuffer``.

Each stored row stays a 1-step transition, and its priority is the priority of
the *n-step transition that starts there*: sampling picks start rows by
priority, and the batch is built from the ``n_steps`` rows that follow each
start in the same environment, as SB3's ``NStepReplayBuffer`` builds it:

* the reward is ``sum_k gamma^k r_{t+k}`` over the window, which ends at the
  first step that is terminal or truncated (inclusive), and at the newest row
  (the window never reads a row not written yet, nor across ``pos`` into the
  oldest episode);
* ``next_observations`` and ``dones`` are those of the window's last step
  (``dones`` is 0 at a truncation, as in SB3), and ``discounts`` is
  ``gamma ** (steps in the window)``: the factor of the bootstrapped target
  ``r + (1 - done) * discount * Q(s', a')`` that the PER algorithms'
  ``train()`` use.

The TD error fed back by ``update_priorities`` is the n-step one, so the start
row gets the priority of its n-step transition. The windows are read from the
storage when a batch is built (for a batch prepared ahead with ``staleness``,
when it is handed to ``train()``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch as th
from gymnasium import spaces
from stable_baselines3.common.type_aliases import ReplayBufferSamples
from stable_baselines3.common.vec_env import VecNormalize

from hetero_replay.adapters.sb3.buffers import PrioritizedReplayBuffer, PrioritizedReplayBufferSamples
from hetero_replay.extend import check_int, check_real


class NStepPrioritizedReplayBuffer(PrioritizedReplayBuffer):
    """:class:`PrioritizedReplayBuffer` whose samples are n-step transitions (SB3's ``NStepReplayBuffer``).

    With uniform priorities a batch equals the batch SB3's ``NStepReplayBuffer``
    builds from the same rows and start indices (``rewards``, ``discounts``,
    ``next_observations``, ``dones``). ``PERDQN`` / ``PERDDPG`` / ``PERTD3`` /
    ``PERSAC`` (and the sb3-contrib ones) with ``n_steps > 1`` use it, with the
    model's ``n_steps`` and ``gamma``. Unlike SB3's, it also works with
    ``optimize_memory_usage`` (the next observation of the window's last step
    is the observation one row later).

    Args:
        *args, **kwargs: :class:`PrioritizedReplayBuffer`'s.
        n_steps: steps summed into each return, an integer >= 1.
        gamma: the discount factor, in ``[0, 1]`` (the algorithm's ``gamma``).

    Raises:
        TypeError: ``n_steps`` not an integer, ``gamma`` not a real number (and
            :class:`PrioritizedReplayBuffer`'s).
        ValueError: ``n_steps < 1``, ``gamma`` outside ``[0, 1]``, a ``Dict``
            observation space (SB3 has no n-step returns for those either), or
            ``distributed`` (a ``ShardedReplay`` cannot read the rows of a window).
    """

    def __init__(
        self, *args: Any, n_steps: int = 3, gamma: float = 0.99, distributed: Any = None, **kwargs: Any
    ) -> None:
        self.n_steps = check_int(n_steps, "n_steps", low=1)
        self.gamma = check_real(gamma, "gamma", low=0.0, high=1.0)
        space = args[1] if len(args) > 1 else kwargs.get("observation_space")
        if isinstance(space, spaces.Dict):
            raise ValueError(
                "NStepPrioritizedReplayBuffer: n-step returns are not supported for Dict observation spaces "
                "(nor by SB3's NStepReplayBuffer); use n_steps=1 with DictPrioritizedReplayBuffer"
            )
        if distributed is not None:
            raise ValueError(
                "NStepPrioritizedReplayBuffer does not take distributed=: a window reads the rows after each "
                "sampled one, and a ShardedReplay serves rows only through its samples"
            )
        super().__init__(*args, **kwargs)

    def sample(self, batch_size: int, env: VecNormalize | None = None) -> PrioritizedReplayBufferSamples:  # type: ignore[override]
        """Draw ``batch_size`` start rows by priority; their n-step transitions, IS weights and indices.

        ``rewards``, ``next_observations``, ``dones`` and ``discounts`` are
        the n-step ones (see the module); ``observations``, ``actions``,
        ``weights`` and ``indices`` are the start row's. With ``env``, each
        step's reward is normalised before it is discounted, as in SB3.

        Raises:
            ValueError: as :meth:`PrioritizedReplayBuffer.sample`; nothing changes on error.
        """
        with self._lock:  # re-entrant: the windows are read at the position the batch was drawn at
            start = super().sample(batch_size, env)
            return start._replace(**self._n_step(start.indices, env))

    def _get_samples(self, batch_inds: np.ndarray, env: VecNormalize | None = None) -> ReplayBufferSamples:
        """SB3's ``_get_samples``: the n-step transitions starting at rows ``batch_inds``, each in an env drawn
        uniformly, as SB3's ``NStepReplayBuffer`` draws it (no priorities; what SB3's own tests call)."""
        with self._lock:
            self._commit()
            env_indices = np.random.randint(0, self.n_envs, size=batch_inds.shape)
            slots = np.asarray(batch_inds, np.int64) * self.n_envs + env_indices
            return ReplayBufferSamples(
                observations=self._observation_tensor("obs", {"obs": self._replay.read_rows("obs", slots)}, env),
                actions=self._tensor(self._replay.read_rows("action", slots)),
                **self._n_step(slots, env),
            )

    def _n_step(self, indices: np.ndarray | th.Tensor, env: VecNormalize | None) -> dict[str, th.Tensor]:
        """The n-step fields (``next_observations``, ``dones``, ``rewards``, ``discounts``) of the windows that
        start at the slots ``indices``. Hold the lock."""
        first = indices.cpu().numpy() if isinstance(indices, th.Tensor) else np.asarray(indices)
        rows, envs = np.divmod(first.astype(np.int64), self.n_envs)
        steps = np.arange(self.n_steps)
        window = (rows[:, None] + steps) % self.buffer_size  # [batch, n_steps] rows
        slots = (window * self.n_envs + envs[:, None]).reshape(-1)
        shape = window.shape
        rewards = self._normalize_reward(self._host_rows("reward", slots).reshape(shape), env)
        dones = self._host_rows("done", slots).reshape(shape)
        if self.handle_timeout_termination:
            timeouts = self._host_rows("timeout", slots).reshape(shape)
        else:
            timeouts = np.zeros(shape, np.float32)
        # The window ends at the first terminal or truncated step, and at the newest row: the row after it is
        # not written yet, or (full buffer) the oldest episode's.
        ends = (dones != 0) | (timeouts != 0) | (window == (self.pos - 1) % self.buffer_size)
        last = np.where(ends.any(axis=1), ends.argmax(axis=1), self.n_steps - 1)
        inside = steps[None, :] <= last[:, None]
        # SB3's arithmetic, in its order and dtypes, so that uniform batches equal its own.
        discounts = self.gamma ** inside.sum(axis=1, keepdims=True).astype(np.float32)
        returns = (rewards * self.gamma ** steps.astype(np.float32)[None, :] * inside).sum(axis=1, keepdims=True)
        picked = np.arange(len(last)), last
        final_dones = (dones[picked] * (1.0 - timeouts[picked]))[:, None].astype(np.float32)
        last_slots = window[picked] * self.n_envs + envs
        if self.optimize_memory_usage:
            next_obs = self._next_observations(last_slots)
        else:
            next_obs = self._replay.read_rows("next_obs", last_slots)
        if env is not None and isinstance(next_obs, th.Tensor):
            next_obs = next_obs.cpu().numpy()  # VecNormalize works on NumPy arrays
        tensor = self._tensor
        return dict(
            next_observations=self._observation_tensor("next_obs", {"next_obs": next_obs}, env),
            dones=tensor(final_dones),
            rewards=tensor(returns),
            discounts=tensor(discounts),
        )

    def _host_rows(self, name: str, slots: np.ndarray) -> np.ndarray:
        """Field ``name`` of ``slots`` as a NumPy array (the window arithmetic runs on the host)."""
        rows = self._replay.read_rows(name, slots)
        return rows.cpu().numpy() if isinstance(rows, th.Tensor) else np.asarray(rows)
