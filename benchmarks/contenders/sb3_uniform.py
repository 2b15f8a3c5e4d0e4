"""Stable-Baselines3's uniform ``ReplayBuffer``: the cost of replay without priorities.

SB3 has no prioritized buffer; its ``sample`` (uniform indices, gather, copy to
torch tensors) is what a DQN user pays today, so "PER for free" means our
prioritized sample keeps up with it. Its learner step is ``sample`` alone.

``add`` writes one row of ``n_envs`` transitions. The sampled buffer uses
:data:`FILL_ENVS` environments so it fills in ``N / FILL_ENVS`` calls; its
``sample`` draws a random row and a random environment column per transition
whatever ``n_envs`` is, so this does not change the sampling cost. Inserts of
1 and of 64 transitions go to buffers of the same capacity with ``n_envs`` 1
and 64 (SB3 needs a row to match ``n_envs``); insert cost does not depend on
how full a uniform buffer is.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from contenders import N_ACTIONS, OBS_DIM, Contender, Workload

FILL_ENVS = 1000


class SB3Contender(Contender):
    """``stable_baselines3.common.buffers.ReplayBuffer`` on the CPU."""

    label = "sb3-uniform"
    library = "stable-baselines3"
    role = "uniform"
    prioritized = False
    setup = (
        f"ReplayBuffer(N, Box(8,), Discrete(4), device='cpu', n_envs={FILL_ENVS}) filled with "
        f"add() of {FILL_ENVS} rows; inserts into buffers with n_envs = chunk size; "
        "sample(B) -> ReplayBufferSamples of torch tensors; no priorities"
    )

    def __init__(self, capacity: int, workload: Workload) -> None:
        from gymnasium import spaces

        if capacity % FILL_ENVS:
            raise ValueError(f"capacity {capacity} is not a multiple of {FILL_ENVS} environments")
        self.capacity = capacity
        self._spaces = spaces.Box(-np.inf, np.inf, (OBS_DIM,), np.float32), spaces.Discrete(N_ACTIONS)
        self.rb = self._buffer(FILL_ENVS)

    def _buffer(self, n_envs: int) -> Any:
        from stable_baselines3.common.buffers import ReplayBuffer

        return ReplayBuffer(self.capacity, *self._spaces, device="cpu", n_envs=n_envs)

    @staticmethod
    def _row(rb: Any, arrays: Mapping[str, np.ndarray]) -> dict[str, Any]:
        return {
            "obs": arrays["obs"],
            "next_obs": arrays["next_obs"],
            "action": arrays["action"],
            "reward": arrays["reward"],
            "done": arrays["done"],
            "infos": [{} for _ in range(rb.n_envs)],
        }

    def fill(self, data: Mapping[str, np.ndarray]) -> None:
        rows = len(data["obs"])
        for start in range(0, rows, FILL_ENVS):
            self.rb.add(**self._row(self.rb, {k: v[start : start + FILL_ENVS] for k, v in data.items()}))

    def prepare_insert(self, chunk: Mapping[str, np.ndarray]) -> Any:
        # np.zeros storage: an insert-only buffer costs memory only for the rows written.
        rb = self._buffer(len(chunk["obs"]))
        return rb, self._row(rb, chunk)

    def insert(self, prepared: Any) -> None:
        rb, row = prepared
        rb.add(**row)

    def sample(self, batch_size: int) -> Any:
        return self.rb.sample(batch_size)

    def close(self) -> None:
        del self.rb


def make(capacity: int, workload: Workload) -> list[Contender]:
    """The SB3 uniform reference."""
    return [SB3Contender(capacity, workload)]
