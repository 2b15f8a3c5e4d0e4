"""TorchBatchReplay: a PrioritizedReplay whose batches are torch tensors on the learner's device.

``PrioritizedReplay(..., storage=..., device=...)`` returns one of these when
``storage`` is not ``"host"`` or ``device`` is set; the PER rules, checkpoints
and validation are the base class's. What differs is where a training step's
data goes:

* :meth:`~TorchBatchReplay.sample` returns ``data`` and ``weights`` on
  :attr:`~TorchBatchReplay.device` and ``indices`` where the tree lives; when
  the CUDA kernel tree (``tree="cupy"``), the storage and the learner share a
  device, draws, IS weights and the gather of every field are one kernel;
* :meth:`~TorchBatchReplay.update_priorities` takes indices and ``|TD errors|``
  as tensors on any device (or NumPy arrays) and hands a device tree its input
  without a host round trip.

With tree, storage and learner on one device, a training step moves no
transition and no priority between host and device: only the uniforms of the
draws (8 bytes per draw, drawn by the buffer's seeded NumPy generator so runs
are reproducible) go to the device, and each update ends with one read of a
few scalars (the tree's total and minimum, the validation flags, the largest
priority). Any other mapping pays exactly its boundary: e.g. a host tree with a
GPU learner copies the batch and weights over and the TD errors back.
"""

from __future__ import annotations

from typing import Any

import torch

from hetero_replay.replay import PrioritizedReplay, Sample
from hetero_replay.storage import HostStorage
from hetero_replay.storage.torch_storage import TorchStorage


class TorchBatchReplay(PrioritizedReplay):
    """A :class:`~hetero_replay.replay.PrioritizedReplay` serving torch tensors on :attr:`device`.

    Build it through ``PrioritizedReplay(..., storage=..., device=...)``; the
    arguments are the base class's.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        learner = self._placement["device"]
        if learner is not None:
            self.device = torch.device(learner)
        elif isinstance(self.storage, HostStorage) or self.storage.pin_memory:
            self.device = torch.device("cpu")
        else:
            self.device = self.storage.device
        # Device trees (torch, cupy) take and give tensors where they live;
        # host trees speak NumPy. (The SumTree protocol does not name the device
        # methods, hence the untyped views of the tree below.)
        tree: Any = self.tree
        self._device_tree = hasattr(tree, "sample_tensors")
        # The kernel tree gathers the rows itself when they are all in one place.
        self._fused = (
            hasattr(tree, "sample_rows")
            and isinstance(self.storage, TorchStorage)
            and not self.storage.pin_memory
            and same_device(self.storage.device, tree.device)
            and same_device(self.device, self.storage.device)
        )

    def sample(self, batch_size: int, beta: float | None = None) -> Sample:
        """Draw ``batch_size`` transitions; tensors, already on :attr:`device`.

        ``data`` and ``weights`` are on :attr:`device`; ``indices`` (int64)
        stay where the tree is, which is where :meth:`update_priorities` wants
        them. Arguments and errors as in the base class.
        """
        return super().sample(batch_size, beta)

    def _draw(self, batch_size: int, beta: float) -> Sample:
        tree: Any = self.tree
        if self._fused:
            indices, weights, data = tree.sample_rows(batch_size, self.rng, beta, self.storage.arrays, self.stratified)
            return Sample(data, indices, weights)
        if self._device_tree:
            indices, weights = tree.sample_tensors(batch_size, self.rng, beta, self.stratified)
        else:
            idx_np, w_np = self.tree.sample(batch_size, self.rng, beta, self.stratified)
            indices, weights = torch.from_numpy(idx_np), torch.from_numpy(w_np)
        if isinstance(self.storage, HostStorage):
            rows = self.storage.gather(indices.cpu().numpy())
            data = {name: torch.from_numpy(a).to(self.device) for name, a in rows.items()}
        else:
            data = self.storage.gather(indices, device=self.device)
        return Sample(data, indices, weights.to(self.device))

    def update_priorities(self, indices: Any, td_errors: Any) -> None:
        """Set priorities from ``|TD error|``; tensors on any device or NumPy arrays.

        Same rules and errors as the base class; nothing changes on error.
        """
        super().update_priorities(indices, td_errors)

    def _update(self, indices: Any, td_errors: Any, limit: int | None) -> float:
        if not self._device_tree:
            indices, td_errors = _host(indices), _host(td_errors)
        return self.tree.update_td(indices, td_errors, self._alpha, self._eps, limit)

    def __repr__(self) -> str:
        return super().__repr__()[:-1] + f", storage={self._placement['storage']}, device={self.device})"


def same_device(a: Any, b: Any) -> bool:
    """Whether two device names mean one device (``"cuda"`` is the current CUDA device)."""
    da, db = torch.device(a), torch.device(b)
    if da.type != db.type:
        return False
    if da.type != "cuda":
        return True
    current = torch.cuda.current_device()
    return (da.index if da.index is not None else current) == (db.index if db.index is not None else current)


def _host(x: Any) -> Any:
    """A tensor as a NumPy array on the host (detached); anything else unchanged."""
    return x.detach().cpu().numpy() if isinstance(x, torch.Tensor) else x


__all__ = ["TorchBatchReplay", "same_device"]
