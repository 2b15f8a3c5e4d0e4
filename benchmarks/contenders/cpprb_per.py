"""cpprb's ``PrioritizedReplayBuffer``: C++ binary sum/min trees behind a Cython API."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from contenders import OBS_DIM, Contender, Workload

FILL_CHUNK = 100_000


class CpprbContender(Contender):
    """``cpprb.PrioritizedReplayBuffer``, filled and fed with whole arrays per ``add``."""

    label = "cpprb"
    library = "cpprb"
    role = "anchor"
    setup = (
        "cpprb.PrioritizedReplayBuffer(N, env_dict, alpha, eps); add(**arrays) in chunks of "
        f"{FILL_CHUNK:,}; sample(B, beta) -> dict with 'weights', 'indexes'; update_priorities"
    )

    def __init__(self, capacity: int, workload: Workload) -> None:
        import cpprb

        env_dict = {
            "obs": {"shape": OBS_DIM, "dtype": np.float32},
            "action": {"dtype": np.int64},
            "reward": {"dtype": np.float32},
            "next_obs": {"shape": OBS_DIM, "dtype": np.float32},
            "done": {"dtype": np.float32},
        }
        self.rb = cpprb.PrioritizedReplayBuffer(capacity, env_dict, alpha=workload.alpha, eps=workload.eps)
        self.beta = workload.beta

    def fill(self, data: Mapping[str, np.ndarray]) -> None:
        rows = len(data["obs"])
        for start in range(0, rows, FILL_CHUNK):
            self.rb.add(**{k: v[start : start + FILL_CHUNK] for k, v in data.items()})

    def prepare_insert(self, chunk: Mapping[str, np.ndarray]) -> Any:
        return dict(chunk)

    def insert(self, prepared: Any) -> None:
        self.rb.add(**prepared)

    def sample(self, batch_size: int) -> dict[str, np.ndarray]:
        return self.rb.sample(batch_size, beta=self.beta)

    def indices(self, sample: dict[str, np.ndarray]) -> np.ndarray:
        return sample["indexes"]

    def update(self, indices: Any, td: Any) -> None:
        self.rb.update_priorities(indices, td)

    def close(self) -> None:
        del self.rb


def make(capacity: int, workload: Workload) -> list[Contender]:
    """The cpprb anchor."""
    return [CpprbContender(capacity, workload)]
