"""This project's buffer, once per tree backend in ``hetero_replay.backends()``.

The native (C++, multi-threaded) backend appears twice on the same buffer: pinned to one
thread and with every core, switched by :func:`hetero_replay.set_num_threads`
before each timed repeat. Backends added to ``hetero_replay.backends()`` later
(torch, CUDA, FPGA) show up here without changes.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any

import numpy as np

import hetero_replay
from contenders import SCHEMA, Contender, Factory, Workload
from hetero_replay import PrioritizedReplay, Sample

FILL_CHUNK = 100_000


class HeteroContender(Contender):
    """A :class:`hetero_replay.PrioritizedReplay` on one tree backend and thread count."""

    library = "hetero-replay"
    role = "ours"
    profile_parts = ("tree.sample", "storage.gather", "tree.update_td")

    def __init__(self, buf: PrioritizedReplay, backend: str, threads: int | None, owns_buffer: bool = True) -> None:
        self.buf = buf
        self.backend = backend
        self.threads = threads
        self.owns_buffer = owns_buffer
        suffix = "" if threads is None else (" 1t" if threads == 1 else f" {threads}t")
        self.label = f"ours/{backend}{suffix}"
        self.setup = (
            f"PrioritizedReplay(tree={backend!r}, fanout=16, float32 priorities, stratified); "
            + ("threads: n/a" if threads is None else f"hetero_replay.set_num_threads({threads})")
            + (f"; filled with add() in chunks of {FILL_CHUNK:,}" if owns_buffer else "; the 1-thread column's buffer")
        )

    def activate(self) -> None:
        if self.threads is not None:
            hetero_replay.set_num_threads(self.threads)

    def fill(self, data: Mapping[str, np.ndarray]) -> None:
        rows = len(data["obs"])
        for start in range(0, rows, FILL_CHUNK):
            self.buf.add({k: v[start : start + FILL_CHUNK] for k, v in data.items()})

    def prepare_insert(self, chunk: Mapping[str, np.ndarray]) -> Any:
        return dict(chunk)

    def insert(self, prepared: Any) -> None:
        self.buf.add(prepared)

    def sample(self, batch_size: int) -> Sample:
        return self.buf.sample(batch_size)

    def indices(self, sample: Sample) -> np.ndarray:
        return sample.indices

    def update(self, indices: Any, td: Any) -> None:
        self.buf.update_priorities(indices, td)

    def profile_ops(self, batch_size: int, td: np.ndarray) -> dict[str, Callable[[], Any]]:
        # The same calls PrioritizedReplay.sample / update_priorities make, one by one;
        # whatever a full learner step costs beyond their sum is Python glue.
        buf, tree = self.buf, self.buf.tree
        indices = buf.sample(batch_size).indices
        return {
            "tree.sample": lambda: tree.sample(batch_size, buf.rng, buf.beta, buf.stratified),
            "storage.gather": lambda: buf.storage.gather(indices),
            "tree.update_td": lambda: tree.update_td(indices, td, buf.alpha, buf.eps, None),
        }

    def close(self) -> None:
        del self.buf


def factories() -> list[tuple[str, Factory]]:
    """One factory per tree backend, so a backend that cannot run here only loses its own column."""
    return [(f"hetero-replay/{backend}", partial(make, backend)) for backend in hetero_replay.backends()]


def make(backend: str, capacity: int, workload: Workload) -> list[Contender]:
    """Contenders on one backend: native twice (one thread, all cores), any other once."""
    buf = PrioritizedReplay(
        capacity, SCHEMA, alpha=workload.alpha, beta=workload.beta, eps=workload.eps, tree=backend, seed=0
    )
    if backend != "native":
        return [HeteroContender(buf, backend, None)]
    cores = os.cpu_count() or 1
    single = HeteroContender(buf, backend, 1)
    return [single, HeteroContender(buf, backend, cores, owns_buffer=False)] if cores > 1 else [single]
