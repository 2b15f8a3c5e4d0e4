"""The NumPy reference backend: the readable specification of the sum tree.

Every other backend is tested against this one on the same operations and must
agree to the bit on ``find``, ``sample`` indices, ``total`` and ``min``. The
layout mirrors the C++ tree: one array per level (level 0 = leaves), each
padded to whole sibling groups of ``fanout`` nodes.

Numerical contract (see ``csrc/hetero_replay/descent.hpp``):

* prefix sums inside a sibling group are float64 sums taken left to right
  (``np.cumsum``); a parent is the last prefix sum, rounded once to ``dtype``;
  parents are recomputed from their children, never adjusted by deltas;
* a descent takes the first child whose prefix sum exceeds the remaining mass;
  past a group's end (rounding) it takes the last child whose prefix sum grows.

The two powers of PER, ``(|td| + eps) ** alpha`` and the IS weights
``(min / p) ** beta``, come from the C++ routines every CPU backend shares
(``_native.td_priorities`` / ``_native.is_weights``): NumPy's own ``power``
picks SIMD code by CPU model and can differ from the C library's by one ulp.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from hetero_replay import _native
from hetero_replay.trees.base import TreeBase, as_1d, describe_max_leaf, max_leaf


def as_indices(indices: Any, capacity: int) -> np.ndarray:
    """Indices in ``[0, capacity)`` as int64, or ``TypeError``/``IndexError`` naming the first bad one."""
    arr = as_1d(indices, "indices")
    if arr.size and arr.dtype.kind not in "iu":
        raise TypeError(f"indices must be integers, got dtype {arr.dtype}")
    arr = arr.astype(np.int64, copy=False)
    bad = np.flatnonzero((arr < 0) | (arr >= capacity))
    if bad.size:
        i = int(bad[0])
        raise IndexError(f"index at position {i} is {int(arr[i])}, outside [0, {capacity})")
    return arr


def as_priorities(values: Any, dtype: np.dtype, capacity: int, n: int | None = None) -> np.ndarray:
    """Priorities as ``dtype``, or ``ValueError`` naming the first bad one.

    A priority must be ``>= 0`` and at most
    :func:`~hetero_replay.trees.base.max_leaf` of a tree of ``capacity``
    leaves: NaN, inf and values whose sums would overflow the tree are refused.
    """
    arr = as_1d(values, "priorities")
    if arr.size and arr.dtype.kind not in "fiu":
        raise TypeError(f"priorities must be real numbers, got dtype {arr.dtype}")
    if n is not None and arr.size != n:
        raise ValueError(f"got {n} indices but {arr.size} priorities")
    with np.errstate(over="ignore"):
        arr = arr.astype(dtype, copy=False)
    bad = np.flatnonzero(~((arr >= 0) & (arr <= max_leaf(dtype, capacity))))
    if bad.size:
        i = int(bad[0])
        raise ValueError(
            f"priority at position {i} is {arr[i]}; priorities must be >= 0 and <= {describe_max_leaf(dtype, capacity)}"
        )
    return arr


def priorities_from_td(
    td_errors: Any, n: int, alpha: float, eps: float, dtype: np.dtype, capacity: int
) -> tuple[np.ndarray, float]:
    """``(td + eps) ** alpha`` as ``dtype`` and ``max(td + eps)``; ``ValueError`` on a bad entry.

    A TD error must be a finite magnitude ``>= 0`` whose priority a tree of
    ``capacity`` leaves accepts (see :func:`~hetero_replay.trees.base.max_leaf`).
    """
    td = as_1d(td_errors, "td_errors")
    if td.size and td.dtype.kind not in "fiu":
        raise TypeError(f"td_errors must be real numbers, got dtype {td.dtype}")
    if td.size != n:
        raise ValueError(f"got {n} indices but {td.size} TD errors")
    priorities, max_raw = _native.td_priorities(td, alpha, eps, dtype)
    bad = np.flatnonzero(~(priorities <= max_leaf(dtype, capacity)))
    if bad.size:
        i = int(bad[0])
        raise ValueError(
            f"TD error at position {i} is {float(td[i])!r}: its priority (td + eps) ** alpha = "
            f"{priorities[i]} exceeds the largest priority this tree can sum, "
            f"{describe_max_leaf(dtype, capacity)}"
        )
    return priorities, max_raw


def choose_children(prefix: np.ndarray, mass: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Vectorised ``choose_in_prefix``: child per row and the remaining mass."""
    rows = np.arange(len(mass))
    k = prefix.shape[1]
    j = (prefix <= mass[:, None]).sum(axis=1)
    past = j == k
    prev = np.where(j > 0, prefix[rows, np.maximum(j - 1, 0)], 0.0)
    remaining = np.maximum(mass - prev, 0.0)
    if past.any():  # rounding put the mass at or past the group's end
        grows = prefix[past, 1:] > prefix[past, :-1]
        last = np.where(grows.any(axis=1), k - 1 - np.argmax(grows[:, ::-1], axis=1), 0)
        rp = rows[past]
        j[past] = last
        remaining[past] = prefix[rp, last] - np.where(last > 0, prefix[rp, np.maximum(last - 1, 0)], 0.0)
    return j, remaining


class NumpySumTree(TreeBase):
    """K-ary sum tree with an exact positive minimum, in vectorised NumPy."""

    def __init__(self, capacity: int, fanout: int = 16, dtype: Any = "float32") -> None:
        super().__init__(capacity, fanout, dtype)
        self._values = [np.zeros(n, self._dtype) for n in self._alloc]
        self._mins = [np.full(n, np.inf, self._dtype) for n in self._alloc]  # [0] unused

    # -- protocol ------------------------------------------------------------------

    def update(self, indices: Any, priorities: Any) -> None:
        idx = as_indices(indices, self._capacity)
        val = as_priorities(priorities, self._dtype, self._capacity, len(idx))
        if idx.size == 0:
            return
        # Last write wins: keep each index's last position in the batch.
        leaves, first_in_reversed = np.unique(idx[::-1], return_index=True)
        self._values[0][leaves] = val[len(idx) - 1 - first_in_reversed]
        nodes = np.unique(leaves // self._k)
        for level in range(1, self.num_levels):
            self._recompute(level, nodes)
            nodes = np.unique(nodes // self._k)
        self._refresh_root()

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
        self._values[0][: self._capacity] = val
        for level in range(1, self.num_levels):
            self._recompute(level, np.arange(len(self._values[level - 1]) // self._k))
        self._refresh_root()

    def get(self, indices: Any) -> np.ndarray:
        return self._values[0][as_indices(indices, self._capacity)]

    def leaves(self) -> np.ndarray:
        return self._values[0][: self._capacity].copy()

    def find(self, mass: Any) -> np.ndarray:
        m = self._checked_masses(mass)
        return self._descend(m)

    def sample(
        self, batch_size: int, rng: np.random.Generator, beta: float, stratified: bool = True
    ) -> tuple[np.ndarray, np.ndarray]:
        if batch_size <= 0:
            raise ValueError(f"batch_size must be > 0, got {batch_size}")
        self._require_mass()
        u = rng.random(batch_size)
        if stratified:
            mass = (np.arange(batch_size, dtype=np.float64) + u) * (self._total / batch_size)
        else:
            mass = u * self._total
        idx = self._descend(mass)
        return idx, _native.is_weights(self._values[0][idx], self._min, beta)

    # -- internals -----------------------------------------------------------------

    def _group(self, level: int, nodes: np.ndarray) -> np.ndarray:
        """The child groups of `nodes` (a level above `level`), shape (n, fanout)."""
        return self._values[level][nodes[:, None] * self._k + np.arange(self._k)]

    def _recompute(self, level: int, nodes: np.ndarray) -> None:
        children = self._group(level - 1, nodes)
        self._values[level][nodes] = np.cumsum(children, axis=1, dtype=np.float64)[:, -1]
        if level == 1:
            mins = np.where(children > 0, children, np.inf)
        else:
            mins = self._mins[level - 1][nodes[:, None] * self._k + np.arange(self._k)]
        self._mins[level][nodes] = mins.min(axis=1)

    def _refresh_root(self) -> None:
        top = self._values[-1]
        self._total = float(np.cumsum(top, dtype=np.float64)[-1])
        self._min = (np.where(top > 0, top, np.inf) if self.num_levels == 1 else self._mins[-1]).min()

    def _descend(self, mass: np.ndarray) -> np.ndarray:
        node = np.zeros(len(mass), np.int64)
        m = mass.copy()
        for level in range(self.num_levels - 1, -1, -1):
            prefix = np.cumsum(self._group(level, node), axis=1, dtype=np.float64)
            j, m = choose_children(prefix, m)
            node = node * self._k + j
        return node
