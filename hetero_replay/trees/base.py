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
