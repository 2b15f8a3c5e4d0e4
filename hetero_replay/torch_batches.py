"""TorchBatches: how a buffer hands batches to a torch learner on any device.

:class:`~hetero_replay.replay.PrioritizedReplay` holds one of these when its
``storage`` is not ``"host"`` or its ``device`` is set; the PER rules,
checkpoints and validation stay the buffer's. What differs is where a training
step's data goes:

* ``draw`` returns ``data`` and ``weights`` on :attr:`TorchBatches.device` and
  ``indices`` where the tree lives; when the CUDA kernel tree (``tree="cupy"``),
  the storage and the learner share a device, draws, IS weights and the gather
  of every field are one kernel;
* ``tree_inputs`` hands a device tree indices and ``|TD errors|`` as tensors on
  any device (or NumPy arrays) without a host round trip.

With tree, storage and learner on one device, a training step moves no
transition and no priority between host and device: only the uniforms of the
draws (8 bytes per draw, drawn by the buffer's seeded NumPy generator so runs
are reproducible) go to the device, and each update ends with one read of a
few scalars (the tree's total and minimum, the validation flags, the largest
priority). Any other placement pays exactly its boundary: e.g. a host tree with a
GPU learner copies the batch and weights over and the TD errors back.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from hetero_replay.priorities import Priorities
from hetero_replay.storage import HostStorage, Storage
from hetero_replay.storage.torch_storage import TorchStorage
from hetero_replay.trees import SumTree
from hetero_replay.trees.base import DeviceTree, FusedSampleTree


class TorchBatches:
    """Delivers sampled batches as torch tensors on ``device``.

    Args:
        storage: the buffer's storage (host NumPy or :class:`TorchStorage`).
        tree: the buffer's sum tree (a host tree, or a :class:`DeviceTree`).
        device: the learner's torch device; ``None``: the storage's device
            (the CPU for host or pinned storage).
    """

    def __init__(self, storage: Storage, tree: SumTree, device: Any = None) -> None:
        self.storage = storage
        if device is not None:
            self.device = torch.device(device)
        elif isinstance(storage, HostStorage) or getattr(storage, "pin_memory", False):
            self.device = torch.device("cpu")
        else:
            self.device = torch.device(getattr(storage, "device", "cpu"))
        # Device trees (torch, cupy) take and give tensors where they live; host trees speak NumPy.
        self._device_tree = tree if isinstance(tree, DeviceTree) else None
        # The kernel tree gathers the rows itself when they are all in one place.
        self._fused = (
            tree
            if isinstance(tree, FusedSampleTree)
            and isinstance(storage, TorchStorage)
            and not storage.pin_memory
            and same_device(storage.device, tree.device)
            and same_device(self.device, storage.device)
            else None
        )

    def draw(
        self, priorities: Priorities, batch_size: int, rng: np.random.Generator, beta: float
    ) -> tuple[Any, Any, Any]:
        """``(data, indices, weights)`` of ``batch_size`` draws; arguments already checked."""
        if self._fused is not None:
            assert isinstance(self.storage, TorchStorage)  # _fused is set for a TorchStorage only
            indices, weights, data = self._fused.sample_rows(
                batch_size, rng, beta, self.storage.arrays, priorities.stratified
            )
            return data, indices, weights
        if self._device_tree is not None:
            indices, weights = self._device_tree.sample_tensors(batch_size, rng, beta, priorities.stratified)
        else:
            idx_np, w_np = priorities.draw(batch_size, rng, beta)
            indices, weights = torch.from_numpy(idx_np), torch.from_numpy(w_np)
        return self.read_all(indices), indices, weights.to(self.device)

    def read_all(self, indices: torch.Tensor) -> dict[str, torch.Tensor]:
        """Every field's rows at ``indices``, on :attr:`device`."""
        if isinstance(self.storage, HostStorage):
            rows = self.storage.gather(indices.cpu().numpy())
            return {name: torch.from_numpy(a).to(self.device) for name, a in rows.items()}
        return self.storage.gather(indices, device=self.device)  # type: ignore[call-arg]

    def read(self, name: str, indices: Any) -> torch.Tensor:
        """Field ``name`` at ``indices`` (a tensor on any device, or array-like), on :attr:`device`."""
        idx = indices if isinstance(indices, torch.Tensor) else torch.as_tensor(np.asarray(indices, np.int64))
        if isinstance(self.storage, HostStorage):
            return torch.from_numpy(self.storage.gather(idx.cpu().numpy(), fields=[name])[name]).to(self.device)
        return self.storage.gather(idx, fields=[name], device=self.device)[name]  # type: ignore[call-arg]

    def tree_inputs(self, indices: Any, td_errors: Any) -> tuple[Any, Any]:
        """Indices and TD errors as the tree takes them: tensors for a device tree, NumPy for a host tree."""
        if self._device_tree is not None:
            return indices, td_errors
        return _host(indices), _host(td_errors)


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


__all__ = ["TorchBatches", "same_device"]
