"""Sum-tree backends behind one protocol, and ``make_tree`` to pick one.

========  ==========================================================
backend   what it is
========  ==========================================================
native    C++17 K-ary tree, multi-threaded across the batch, GIL released
numpy     vectorised NumPy: the readable reference every backend matches
torch     torch tensor ops on any torch device (listed when torch is installed)
cupy      CUDA kernels loaded through CuPy (listed when CuPy and a CUDA device
          are present; ``pip install hetero-replay[cuda]``)
========  ==========================================================
"""

from __future__ import annotations

import functools
import importlib.util
from typing import Any, Callable

from hetero_replay.trees.base import FANOUTS, SumTree, check_tree_args

_BACKENDS: dict[str, Callable[..., SumTree]] = {}


def _host_only(backend: str, device: Any) -> None:
    if device is not None and str(device) != "cpu":
        raise ValueError(f"tree backend {backend!r} runs on the CPU only; got device {device!r}")


def _native(capacity: int, fanout: int, dtype: Any, device: Any = None) -> SumTree:
    _host_only("native", device)
    from hetero_replay.trees.native_tree import NativeSumTree

    return NativeSumTree(capacity, fanout, dtype)


def _numpy(capacity: int, fanout: int, dtype: Any, device: Any = None) -> SumTree:
    _host_only("numpy", device)
    from hetero_replay.trees.numpy_tree import NumpySumTree

    return NumpySumTree(capacity, fanout, dtype)


def _torch(capacity: int, fanout: int, dtype: Any, device: Any = None) -> SumTree:
    from hetero_replay.trees.torch_tree import TorchSumTree

    return TorchSumTree(capacity, fanout, dtype, device)


def _cupy(capacity: int, fanout: int, dtype: Any, device: Any = None) -> SumTree:
    from hetero_replay.trees.cupy_tree import CupySumTree

    return CupySumTree(capacity, fanout, dtype, device)


_BACKENDS.update(native=_native, numpy=_numpy)
# Optional backends are listed only where they run; torch is found without importing it.
if importlib.util.find_spec("torch") is not None:
    _BACKENDS["torch"] = _torch

#: What ``backend="auto"`` resolves to, best first: on the CPU, on CUDA, on another torch device.
_AUTO_ORDER = ("native", "numpy")
_AUTO_ORDER_CUDA = ("cupy", "torch")
_AUTO_ORDER_OTHER = ("torch",)


@functools.lru_cache(maxsize=1)
def _cupy_usable() -> bool:
    """CuPy installed and a CUDA device present (imports CuPy only if it is installed; asked once)."""
    if importlib.util.find_spec("cupy") is None:
        return False
    from hetero_replay.trees.cupy_tree import cuda_available

    return cuda_available()


def backends() -> tuple[str, ...]:
    """Names accepted by :func:`make_tree` (besides ``"auto"``) that run on this machine."""
    names = tuple(_BACKENDS)
    return names + ("cupy",) if _cupy_usable() else names


def make_tree(
    backend: str = "auto", capacity: int = 1, fanout: int = 16, dtype: Any = "float32", device: Any = None
) -> SumTree:
    """Build a sum tree.

    Args:
        backend: ``"auto"`` (the fastest available for ``device``), or one of
            :func:`backends`. ``"cupy"`` without CuPy or a CUDA device raises
            ``ImportError`` naming the extra to install.
        capacity: number of leaves.
        fanout: children per node, a power of two in ``FANOUTS``; 16 puts one
            float32 sibling group in one 64-byte cache line.
        dtype: ``"float32"`` (default) or ``"float64"`` leaf values.
        device: where the tree lives, for the device backends (``"torch"``:
            any torch device; ``"cupy"``: a CUDA device). ``None`` is the CPU
            (and the current CUDA device for ``"cupy"``); the CPU backends
            accept only ``None`` or ``"cpu"``.
    """
    capacity, fanout, dtype = check_tree_args(capacity, fanout, dtype)
    if backend == "auto":
        on_host = device is None or str(device) == "cpu"
        order = _AUTO_ORDER if on_host else _AUTO_ORDER_CUDA if str(device).startswith("cuda") else _AUTO_ORDER_OTHER
        for name in order:
            factory = _cupy if name == "cupy" else _BACKENDS.get(name)
            if factory is None:
                continue
            try:
                return factory(capacity, fanout, dtype, device)
            except ImportError:
                continue
        if not on_host:
            raise ValueError(f"no tree backend runs on device {device!r} here; install torch or CuPy")
    if backend == "cupy":
        return _cupy(capacity, fanout, dtype, device)
    if backend not in _BACKENDS:
        raise ValueError(f"unknown tree backend {backend!r}; choose 'auto' or one of {backends()}")
    return _BACKENDS[backend](capacity, fanout, dtype, device)


__all__ = ["FANOUTS", "SumTree", "backends", "make_tree"]
