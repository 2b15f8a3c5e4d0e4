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

from hetero_replay.checks import check_int

#: Fanouts every backend supports; 16 float32 values fill one 64-byte cache line.
FANOUTS = (2, 4, 8, 16, 32, 64)

#: Largest capacity of any tree (and buffer): 2**40 leaves, far past any replay
#: buffer, and far from the integer overflows of level-size arithmetic.
MAX_CAPACITY = 2**40


def max_leaf(dtype: Any, capacity: int) -> float:
    """Largest leaf a tree of ``capacity`` leaves accepts.

    ``capacity`` such leaves sum to at most half the dtype's largest finite
    value, so no node sum, nor the total, can overflow to inf (rounding
    included). Every backend refuses larger priorities; the C++ tree computes
    the same bound.
    """
    return float(np.finfo(np.dtype(dtype)).max) / 2.0 / float(capacity)


def describe_max_leaf(dtype: Any, capacity: int) -> str:
    """The bound as error messages state it: its value and where it comes from."""
    dt = np.dtype(dtype)
    return (
        f"{max_leaf(dt, capacity)!r} (the largest {dt.name} / (2 * capacity {capacity}), "
        "so the tree's sums stay finite)"
    )


def check_priority_dtype(value: Any) -> np.dtype:
    if value is None:  # np.dtype(None) would silently mean float64
        raise TypeError("priority dtype must be 'float32' or 'float64', got None")
    try:
        dtype = np.dtype(value)
    except TypeError as e:
        raise TypeError(f"priority dtype must be 'float32' or 'float64', got {value!r}") from e
    if dtype not in (np.float32, np.float64):
        raise ValueError(f"priority dtype must be float32 or float64, got {dtype}")
    return dtype


def check_fanout(value: Any) -> int:
    fanout = check_int(value, "fanout")
    if fanout not in FANOUTS:
        raise ValueError(f"fanout must be one of {FANOUTS}; got {value}")
    return fanout


def as_1d(values: Any, what: str) -> np.ndarray:
    """``values`` as a 1-D array; ``ValueError`` naming ``what`` otherwise."""
    arr = np.asarray(values)
    if arr.ndim != 1:
        raise ValueError(f"{what} must be 1-D, got {arr.ndim}-D")
    return arr


def check_tree_args(capacity: Any, fanout: Any, dtype: Any) -> tuple[int, int, np.dtype]:
    """Validated ``(capacity, fanout, dtype)`` of a tree; ``TypeError``/``ValueError`` naming the argument."""
    return check_int(capacity, "capacity", 1, MAX_CAPACITY), check_fanout(fanout), check_priority_dtype(dtype)


@runtime_checkable
class SumTree(Protocol):
    """Batch sum tree over ``capacity`` leaves with an exact positive minimum."""

    @property
    def capacity(self) -> int: ...

    @property
    def fanout(self) -> int: ...

    @property
    def dtype(self) -> np.dtype: ...

    @property
    def max_leaf(self) -> float:
        """Largest leaf accepted (see :func:`max_leaf`)."""
        ...

    def update(self, indices: Any, priorities: Any) -> None:
        """Set ``leaf[indices] = priorities``; for repeated indices the last write wins.

        Raises ``IndexError`` for an index outside ``[0, capacity)``, ``ValueError``
        for a NaN or negative priority or one above :attr:`max_leaf`; in both
        cases nothing is written.
        """

    def update_td(self, indices: Any, td_errors: Any, alpha: float, eps: float, limit: int | None = None) -> float:
        """The PER priority update: ``leaf[indices] = (td + eps) ** alpha``.

        ``td_errors`` are magnitudes ``|TD error|``. Returns ``max(td + eps)`` (the
        raw priority new transitions inherit). Indices must lie in
        ``[0, limit)`` (default ``capacity``). A NaN, infinite or negative TD
        error, or one whose priority exceeds :attr:`max_leaf`, raises
        ``ValueError`` naming its position, a bad index ``IndexError``; nothing
        is written on error.
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


@runtime_checkable
class DeviceTree(SumTree, Protocol):
    """A tree on a device (torch, cupy) that also takes and gives tensors where it lives."""

    @property
    def device(self) -> Any: ...

    def sample_tensors(self, batch_size: int, rng: Any, beta: float, stratified: bool = True) -> tuple[Any, Any]:
        """:meth:`SumTree.sample`, returning ``(indices int64, weights float32)`` on :attr:`device`."""
        ...


#: Per tree class, whether it is a :class:`DeviceTree` (see :func:`is_device_tree`).
_DEVICE_TREE_CLASSES: dict[type, bool] = {}


def is_device_tree(tree: SumTree) -> bool:
    """``isinstance(tree, DeviceTree)``, asked once per tree class.

    Against a runtime-checkable protocol ``isinstance`` checks every member (~85 µs a call); the
    late-update and Tianshou update paths ask on every learner step.
    """
    known = _DEVICE_TREE_CLASSES.get(type(tree))
    if known is None:
        known = _DEVICE_TREE_CLASSES[type(tree)] = isinstance(tree, DeviceTree)
    return known


@runtime_checkable
class FusedSampleTree(DeviceTree, Protocol):
    """A device tree that also gathers the sampled rows of a storage on its device, in one kernel."""

    def sample_rows(
        self, batch_size: int, rng: Any, beta: float, sources: Any, stratified: bool = True
    ) -> tuple[Any, Any, dict[str, Any]]:
        """``(indices, weights, {field: rows})`` for the field arrays ``sources`` on :attr:`device`."""
        ...


class TreeBase:
    """What the Python-side backends share: checked arguments, the level layout
    (the same as the C++ tree's) and the read-only parts of the protocol.

    ``self._alloc[l]`` is the allocated size of level ``l`` (0 = leaves): every
    level is padded to whole sibling groups and reaches the children of its
    parent level's padding, so every group a parent points at exists.
    Subclasses keep ``self._total`` (float) and ``self._min`` (float) current.
    """

    def __init__(self, capacity: int, fanout: int, dtype: Any) -> None:
        self._capacity, self._k, self._dtype = check_tree_args(capacity, fanout, dtype)
        self._max_leaf = max_leaf(self._dtype, self._capacity)
        k = self._k

        def round_up(n: int) -> int:
            return max(k, -(-n // k) * k)

        sizes = [round_up(self._capacity)]
        while sizes[-1] != k:
            sizes.append(round_up(sizes[-1] // k))
        self._alloc = [sizes[level + 1] * k for level in range(len(sizes) - 1)] + [k]
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
    def max_leaf(self) -> float:
        return self._max_leaf

    @property
    def num_levels(self) -> int:
        return len(self._alloc)

    def total(self) -> float:
        return float(self._total)

    def min(self) -> float:
        return float(self._min)

    def _require_mass(self) -> None:
        if not self._total > 0:
            raise ValueError("the tree holds no priority mass (all priorities are 0)")

    def _checked_masses(self, mass: Any) -> np.ndarray:
        """``mass`` (host values) as float64, each in ``[0, total)``; ``ValueError`` naming the first outside."""
        self._require_mass()
        m = as_1d(mass, "mass").astype(np.float64)
        bad = np.flatnonzero(~((m >= 0) & (m < self._total)))
        if bad.size:
            i = int(bad[0])
            raise ValueError(f"mass at position {i} is {m[i]}, outside [0, total={self._total})")
        return m
