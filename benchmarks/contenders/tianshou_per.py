"""Tianshou's ``PrioritizedVectorReplayBuffer``: one global numba sum tree over sub-buffers.

Tianshou has no batched add for a single buffer: ``add`` writes one row per
sub-buffer (one per environment), with a Python step per row. Filling 4e6
transitions one row per call would take far longer than the benchmark itself,
so the buffer is built with :data:`SUB_BUFFERS` sub-buffers, as a collector
with that many environments would, and every fill call writes that many rows.
This does not change what is timed: the manager keeps one global priority tree
over all sub-buffers (``PrioritizedReplayBufferManager``), and ``sample`` /
``update_weight`` index that tree and the contiguous storage by global index,
whatever the number of sub-buffers.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from contenders import Contender, Workload

SUB_BUFFERS = 1000


class TianshouContender(Contender):
    """``tianshou.data.PrioritizedVectorReplayBuffer(N, SUB_BUFFERS, alpha, beta)``."""

    label = "tianshou"
    library = "tianshou"
    role = "anchor"
    setup = (
        f"PrioritizedVectorReplayBuffer(N, buffer_num={SUB_BUFFERS}, alpha, beta); add(Batch, "
        f"buffer_ids) with {SUB_BUFFERS} rows per fill call, one row per sub-buffer for inserts; "
        "sample(B) -> (Batch with .weight, indices); update_weight(indices, |td|)"
    )

    def __init__(self, capacity: int, workload: Workload) -> None:
        from tianshou.data import Batch, PrioritizedVectorReplayBuffer

        if capacity % SUB_BUFFERS:
            raise ValueError(f"capacity {capacity} is not a multiple of {SUB_BUFFERS} sub-buffers")
        self._Batch = Batch
        self.rb = PrioritizedVectorReplayBuffer(capacity, SUB_BUFFERS, alpha=workload.alpha, beta=workload.beta)

    def _batch(self, arrays: Mapping[str, np.ndarray]) -> Any:
        done = arrays["done"].astype(bool)
        return self._Batch(
            obs=arrays["obs"],
            act=arrays["action"],
            rew=arrays["reward"],
            obs_next=arrays["next_obs"],
            terminated=done,
            truncated=np.zeros_like(done),
        )

    def fill(self, data: Mapping[str, np.ndarray]) -> None:
        rows = len(data["obs"])
        ids = np.arange(SUB_BUFFERS)
        for start in range(0, rows, SUB_BUFFERS):
            self.rb.add(self._batch({k: v[start : start + SUB_BUFFERS] for k, v in data.items()}), ids)

    def prepare_insert(self, chunk: Mapping[str, np.ndarray]) -> Any:
        rows = len(chunk["obs"])
        if rows > SUB_BUFFERS:
            raise ValueError(f"an insert of {rows} rows needs {rows} sub-buffers, there are {SUB_BUFFERS}")
        return self._batch(chunk), np.arange(rows)

    def insert(self, prepared: Any) -> None:
        batch, ids = prepared
        self.rb.add(batch, ids)

    def sample(self, batch_size: int) -> Any:
        return self.rb.sample(batch_size)

    def indices(self, sample: Any) -> np.ndarray:
        return sample[1]

    def update(self, indices: Any, td: Any) -> None:
        self.rb.update_weight(indices, td)

    def close(self) -> None:
        del self.rb


def make(capacity: int, workload: Workload) -> list[Contender]:
    """The Tianshou anchor."""
    return [TianshouContender(capacity, workload)]
