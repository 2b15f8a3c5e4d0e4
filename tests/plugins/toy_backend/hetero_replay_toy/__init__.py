"""hetero-replay-toy: a third-party tree backend, as a plugin package would ship one.

The test suite puts this folder on ``sys.path``; ``importlib.metadata`` then
finds ``hetero_replay_toy-0.1.dist-info`` as an installed distribution whose
entry point ``[hetero_replay.backends] toy = hetero_replay_toy:register``
hetero-replay's registry calls on its first lookup. From then on
``make_tree("toy")``, ``PrioritizedReplay(tree="toy")`` and
``Placement(tree="toy")`` work, and the reference tests run against it.

:class:`ToySumTree` is written from the protocol (``hetero_replay/trees/base.py``)
and its numerical contract, not from the NumPy reference: a *complete* K-ary
tree (``fanout ** levels`` leaves, the padding zero), group sums taken child by
child in float64, a descent that looks for the first prefix sum above the
mass, and the minimum recomputed from the leaves when asked. It reuses
hetero-replay's argument checks (so its errors read like every backend's) and
the shared PER power ``(|td| + eps) ** alpha``.

It declares two device types: ``"cpu"``, and ``"toyaccel"``, a made-up
accelerator (the tree stays in host memory) that shows a plugin adding a
device name a :class:`~hetero_replay.placement.Placement` then accepts.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from hetero_replay.trees.base import check_tree_args, max_leaf
from hetero_replay.trees.numpy_tree import as_indices, as_priorities, priorities_from_td

#: The device types the toy declares.
DEVICES = ("cpu", "toyaccel")


class ToySumTree:
    """A complete K-ary sum tree in NumPy arrays, level 0 the leaves, the last level ``fanout`` nodes."""

    def __init__(self, capacity: int, fanout: int = 16, dtype: Any = "float32") -> None:
        self._capacity, self._k, self._dtype = check_tree_args(capacity, fanout, dtype)
        levels = 1
        while self._k**levels < self._capacity:
            levels += 1
        self._levels = [np.zeros(self._k ** (levels - level), self._dtype) for level in range(levels)]
        self._total = 0.0
        self._min: float | None = float("inf")  # None: recompute from the leaves

    # -- properties ----------------------------------------------------------------------

    @property
    def capacity(self) -> int:
        return self._capacity

    @property
    def fanout(self) -> int:
        return self._k

    @property
    def dtype(self) -> np.dtype:
        return self._dtype

    @property
    def max_leaf(self) -> float:
        return max_leaf(self._dtype, self._capacity)

    # -- writing -------------------------------------------------------------------------

    def update(self, indices: Any, priorities: Any) -> None:
        idx = as_indices(indices, self._capacity)
        val = as_priorities(priorities, self._dtype, self._capacity, len(idx))
        if idx.size == 0:
            return
        order = np.argsort(idx, kind="stable")  # equal indices keep their batch order...
        last = np.append(idx[order][1:] != idx[order][:-1], True)  # ...so the last of each run wins
        leaves = idx[order][last]
        self._levels[0][leaves] = val[order][last]
        self._resum(leaves)

    def update_td(self, indices: Any, td_errors: Any, alpha: float, eps: float, limit: int | None = None) -> float:
        bound = self._capacity if limit is None else min(limit, self._capacity)
        idx = as_indices(indices, bound)
        priorities, max_raw = priorities_from_td(td_errors, len(idx), alpha, eps, self._dtype, self._capacity)
        self.update(idx, priorities)
        return max_raw

    def load_leaves(self, leaves: Any) -> None:
        val = as_priorities(leaves, self._dtype, self._capacity)
        if val.size != self._capacity:
            raise ValueError(f"expected {self._capacity} leaves, got {val.size}")
        self._levels[0][: self._capacity] = val
        self._resum(np.arange(self._capacity))

    def _resum(self, changed: np.ndarray) -> None:
        """Recompute the ancestors of the ``changed`` leaves, then the total."""
        nodes = np.unique(changed)
        for level in range(1, len(self._levels)):
            nodes = np.unique(nodes // self._k)
            self._levels[level][nodes] = self._group_sums(level - 1, nodes)
        self._total = float(self._prefix(self._levels[-1][None, :])[0, -1])
        self._min = None

    def _group_sums(self, level: int, parents: np.ndarray) -> np.ndarray:
        """Sum of each parent's children on ``level``: float64, child by child, then rounded once."""
        total = np.zeros(len(parents))
        for j in range(self._k):
            total += self._levels[level][parents * self._k + j]
        return total.astype(self._dtype)

    # -- reading -------------------------------------------------------------------------

    def get(self, indices: Any) -> np.ndarray:
        return self._levels[0][as_indices(indices, self._capacity)]

    def leaves(self) -> np.ndarray:
        return self._levels[0][: self._capacity].copy()

    def total(self) -> float:
        return self._total

    def min(self) -> float:
        if self._min is None:
            leaves = self._levels[0][: self._capacity]
            positive = leaves[leaves > 0]
            self._min = float(positive.min()) if positive.size else float("inf")
        return self._min

    def find(self, mass: Any) -> np.ndarray:
        self._require_mass()
        m = np.asarray(mass, np.float64)
        if m.ndim != 1:
            raise ValueError(f"mass must be 1-D, got {m.ndim}-D")
        outside = np.flatnonzero(~((m >= 0) & (m < self._total)))
        if outside.size:
            i = int(outside[0])
            raise ValueError(f"mass at position {i} is {m[i]}, outside [0, total={self._total})")
        return self._descend(m)

    def sample(
        self, batch_size: int, rng: np.random.Generator, beta: float, stratified: bool = True
    ) -> tuple[np.ndarray, np.ndarray]:
        if batch_size <= 0:
            raise ValueError(f"batch_size must be > 0, got {batch_size}")
        self._require_mass()
        u = rng.random(batch_size)
        mass = (
            (np.arange(batch_size, dtype=np.float64) + u) * (self._total / batch_size)
            if stratified
            else u * self._total
        )
        idx = self._descend(mass)
        p = self._levels[0][idx].astype(np.float64)
        return idx, ((self.min() / p) ** beta).astype(np.float32)

    def _require_mass(self) -> None:
        if not self._total > 0:
            raise ValueError("the tree holds no priority mass (all priorities are 0)")

    def _prefix(self, groups: np.ndarray) -> np.ndarray:
        """Running float64 sums along each row of ``groups``, left to right."""
        out = np.empty(groups.shape)
        running = np.zeros(len(groups))
        for j in range(groups.shape[1]):
            running += groups[:, j]
            out[:, j] = running
        return out

    def _descend(self, mass: np.ndarray) -> np.ndarray:
        """The contract's descent: in each group, the first child whose prefix sum exceeds the mass;
        past the group's end (rounding), the last child whose prefix sum grows."""
        node = np.zeros(len(mass), np.int64)
        mass = mass.copy()
        rows = np.arange(len(mass))
        for level in range(len(self._levels) - 1, -1, -1):
            children = node[:, None] * self._k + np.arange(self._k)
            prefix = self._prefix(self._levels[level][children])
            above = prefix > mass[:, None]
            child = np.where(above.any(axis=1), above.argmax(axis=1), -1)
            before = np.where(child > 0, prefix[rows, np.maximum(child - 1, 0)], 0.0)
            mass = np.maximum(mass - before, 0.0)
            for r in np.flatnonzero(child < 0):  # rare: the mass reached the group's end
                grows = [j for j in range(1, self._k) if prefix[r, j] > prefix[r, j - 1]]
                c = grows[-1] if grows else 0
                child[r] = c
                mass[r] = prefix[r, c] - (prefix[r, c - 1] if c > 0 else 0.0)
            node = node * self._k + child
        return node

    def __repr__(self) -> str:
        return f"ToySumTree(capacity={self._capacity}, fanout={self._k}, dtype={self._dtype.name})"


def make(capacity: int, fanout: int, dtype: Any, device: Any = None) -> ToySumTree:
    """The registered factory: arguments already checked by hetero-replay; every device is host memory."""
    return ToySumTree(capacity, fanout, dtype)


def register() -> None:
    """The entry point: register the toy backend (called once by hetero-replay's registry)."""
    import hetero_replay

    hetero_replay.register_backend(
        "toy",
        make,
        devices=DEVICES,
        auto_rank=100,  # last: "auto" picks it only on a device no other backend runs on (toyaccel)
        description="toy complete K-ary tree in NumPy (tests/plugins), found by entry point",
    )
