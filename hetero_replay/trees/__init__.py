"""Sum-tree backends behind one protocol, and ``make_tree`` to pick one.

========  ==========================================================
backend   what it is
========  ==========================================================
native    C++17 K-ary tree, OpenMP across the batch, GIL released
numpy     vectorised NumPy: the readable reference every backend matches
========  ==========================================================
"""

from __future__ import annotations

from typing import Any, Callable

from hetero_replay.trees.base import FANOUTS, SumTree

_BACKENDS: dict[str, Callable[..., SumTree]] = {}


def _native(capacity: int, fanout: int, dtype: Any) -> SumTree:
    from hetero_replay.trees.native_tree import NativeSumTree

    return NativeSumTree(capacity, fanout, dtype)


def _numpy(capacity: int, fanout: int, dtype: Any) -> SumTree:
    from hetero_replay.trees.numpy_tree import NumpySumTree

    return NumpySumTree(capacity, fanout, dtype)


_BACKENDS.update(native=_native, numpy=_numpy)

#: What ``backend="auto"`` resolves to, best first.
_AUTO_ORDER = ("native", "numpy")


def backends() -> tuple[str, ...]:
    """Names accepted by :func:`make_tree` (besides ``"auto"``)."""
    return tuple(_BACKENDS)


def make_tree(
    backend: str = "auto", capacity: int = 1, fanout: int = 16, dtype: Any = "float32"
) -> SumTree:
    """Build a sum tree.

    Args:
        backend: ``"auto"`` (the fastest available), or one of :func:`backends`.
        capacity: number of leaves.
        fanout: children per node, a power of two in ``FANOUTS``; 16 puts one
            float32 sibling group in one 64-byte cache line.
        dtype: ``"float32"`` (default) or ``"float64"`` leaf values.
    """
    if backend == "auto":
        for name in _AUTO_ORDER:
            try:
                return _BACKENDS[name](capacity, fanout, dtype)
            except ImportError:
                continue
    if backend not in _BACKENDS:
        raise ValueError(f"unknown tree backend {backend!r}; choose 'auto' or one of {backends()}")
    return _BACKENDS[backend](capacity, fanout, dtype)


__all__ = ["FANOUTS", "SumTree", "backends", "make_tree"]
