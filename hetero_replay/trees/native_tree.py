"""The C++ backend: ``hetero_replay._native.SumTree`` (multi-threaded, GIL released).

It implements the :class:`~hetero_replay.trees.base.SumTree` protocol directly;
this module only gives it its place among the backends.
"""

from hetero_replay._native import SumTree as NativeSumTree

__all__ = ["NativeSumTree"]
