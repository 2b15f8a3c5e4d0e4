"""The sum-tree protocol every backend implements.

A tree holds one non-negative value per leaf (a priority already raised to
alpha). Backends differ in where the leaves live (host memory, a torch device,
CUDA, an FPGA) but not in what they compute: `find` and `sample` follow the
numerical contract in ``csrc/hetero_replay/descent.hpp``, which the NumPy
reference backend spells out in Python.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import numpy as np

#: Fanouts every backend supports; 16 float32 values fill one 64-byte cache line.
FANOUTS = (2, 4, 8, 16, 32, 64)


@runtime_checkable
class SumTree(Protocol):
    """Batch sum tree over ``capacity`` leaves with an exact positive minimum."""

    @property
    def capacity(self) -> int: ...

    @property
    def fanout(self) -> int: ...

    @property
    def dtype(self) -> np.dtype: ...

    def update(self, indices: Any, priorities: Any) -> None:
        """Set ``leaf[indices] = priorities``; for repeated indices the last write wins.

        Raises ``IndexError`` for an index outside ``[0, capacity)``, ``ValueError``
        for a NaN, infinite or negative priority; in both cases nothing is written.
        """

    def update_td(
        self, indices: Any, td_errors: Any, alpha: float, eps: float, limit: int | None = None
    ) -> float:
        """The PER priority update: ``leaf[indices] = (td + eps) ** alpha``.

        ``td_errors`` are magnitudes ``|TD error|``. Returns ``max(td + eps)`` (the
        raw priority new transitions inherit). Indices must lie in
        ``[0, limit)`` (default ``capacity``). A NaN, infinite or negative TD
        error raises ``ValueError`` naming its position, a bad index
        ``IndexError``; nothing is written on error.
        """

    def get(self, indices: Any) -> np.ndarray:
        """Leaf values at ``indices``."""

    def find(self, mass: Any) -> np.ndarray:
        """For each mass in ``[0, total)``, the leaf whose prefix-sum interval holds it."""

    def sample(
        self, batch_size: int, rng: np.random.Generator, beta: float, stratified: bool = True
    ) -> tuple[np.ndarray, np.ndarray]:
        """Draw leaves with probability ``leaf / total``.

        Stratified sampling takes one draw in each of ``batch_size`` equal slices
        of the total mass. Returns ``(indices int64, weights float32)`` with the
        importance-sampling weights ``(min / leaf) ** beta``, i.e. ``(N P(i))^-beta``
        normalised by its maximum over all leaves.
        """

    def total(self) -> float:
        """Sum of all leaves, as a Python float (float64)."""

    def min(self) -> float:
        """Smallest leaf greater than zero, or ``inf`` if there is none."""

    def leaves(self) -> np.ndarray:
        """A copy of all ``capacity`` leaves."""

    def load_leaves(self, leaves: Any) -> None:
        """Replace every leaf and rebuild the tree."""


class TreeBase:
    """What the Python-side backends share: checked arguments, the level layout
    (the same as the C++ tree's) and the read-only parts of the protocol.

    ``self._alloc[l]`` is the allocated size of level ``l`` (0 = leaves): every
    level is padded to whole sibling groups and reaches the children of its
    parent level's padding, so every group a parent points at exists.
    Subclasses keep ``self._total`` (float) and ``self._min`` (float) current.
    """

    def __init__(self, capacity: int, fanout: int, dtype: Any) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        if fanout not in FANOUTS:
            raise ValueError(f"fanout must be one of {FANOUTS}; got {fanout}")
        self._dtype = np.dtype(dtype)
        if self._dtype not in (np.float32, np.float64):
            raise ValueError(f"dtype must be float32 or float64, got {self._dtype}")
        self._capacity, self._k = int(capacity), int(fanout)
        k = self._k

        def round_up(n: int) -> int:
            return max(k, -(-n // k) * k)

        sizes = [round_up(self._capacity)]
        while sizes[-1] != k:
            sizes.append(round_up(sizes[-1] // k))
        self._alloc = [sizes[l + 1] * k for l in range(len(sizes) - 1)] + [k]
        self._total = 0.0
        self._min = float("inf")

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
    def num_levels(self) -> int:
        return len(self._alloc)

    def total(self) -> float:
        return float(self._total)

    def min(self) -> float:
        return float(self._min)
