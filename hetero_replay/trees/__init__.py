"""Sum-tree backends behind one protocol, and ``make_tree`` to pick one.

The built-in backends, registered here in :mod:`hetero_replay.registry`
(``hetero-replay info`` lists them with what this machine can run):

========  ================  ====================================================
backend   devices           what it is
========  ================  ====================================================
native    cpu               C++17 K-ary tree, multi-threaded across the batch, GIL released
numpy     cpu               vectorised NumPy: the readable reference every backend matches
torch     any torch device  torch tensor ops (usable when torch is installed)
cupy      cuda              CUDA kernels loaded through CuPy (usable with CuPy and a CUDA
                            device: the ``cuda`` extra)
fpga      fpga              the FPGA RMM (``hls/``), fixed-point leaves and exact integer
                            sums: on a PYNQ board (``HETERO_REPLAY_FPGA_BITFILE``), else
                            its bit-exact emulation (device ``"fpga:emu"``)
========  ================  ====================================================

Other packages add theirs with :func:`hetero_replay.registry.register_backend`
or an entry point (see ``docs/backends.md``).
"""

from __future__ import annotations

import functools
import importlib.util
import os
from typing import Any

from hetero_replay import registry
from hetero_replay.registry import ANY_TORCH_DEVICE, backends, install_hint, register_backend
from hetero_replay.trees.base import FANOUTS, SumTree, check_tree_args


def _native(capacity: int, fanout: int, dtype: Any, device: Any = None) -> SumTree:
    from hetero_replay.trees.native_tree import NativeSumTree

    return NativeSumTree(capacity, fanout, dtype)


def _numpy(capacity: int, fanout: int, dtype: Any, device: Any = None) -> SumTree:
    from hetero_replay.trees.numpy_tree import NumpySumTree

    return NumpySumTree(capacity, fanout, dtype)


def _torch(capacity: int, fanout: int, dtype: Any, device: Any = None) -> SumTree:
    from hetero_replay.trees.torch_tree import TorchSumTree

    return TorchSumTree(capacity, fanout, dtype, device)


def _cupy(capacity: int, fanout: int, dtype: Any, device: Any = None) -> SumTree:
    from hetero_replay.trees.cupy_tree import CupySumTree

    return CupySumTree(capacity, fanout, dtype, device)


def _fpga(capacity: int, fanout: int, dtype: Any, device: Any = None) -> SumTree:
    from hetero_replay.trees.fpga_tree import FpgaSumTree, resolve_device

    return FpgaSumTree(capacity, fanout, dtype, resolve_device(device))


def _fpga_check() -> str | None:
    """A board is what makes "fpga" devices present; the emulation (device "fpga:emu") needs none, if it was built."""
    from hetero_replay.fpga.emulator import emulation_unavailable
    from hetero_replay.trees.fpga_tree import BITFILE_ENV

    if not os.environ.get(BITFILE_ENV):
        if emulation_unavailable() is not None:  # a build with HETERO_REPLAY_FPGA_EMU=OFF
            return (
                f"no FPGA board ({BITFILE_ENV} is not set), and this installation was built without the "
                "emulation (device 'fpga:emu'; HETERO_REPLAY_FPGA_EMU=OFF)"
            )
        return f"no FPGA board ({BITFILE_ENV} is not set); tree='fpga' runs the emulation, device 'fpga:emu'"
    if importlib.util.find_spec("pynq") is None:
        return f"{BITFILE_ENV} is set, but pynq is not installed"
    return None


def _torch_check() -> str | None:
    """Found without importing torch."""
    return None if importlib.util.find_spec("torch") is not None else "torch is not installed"


@functools.lru_cache(maxsize=1)
def _cupy_usable() -> bool:
    """CuPy installed and a CUDA device present (imports CuPy only if it is installed; asked once)."""
    if importlib.util.find_spec("cupy") is None:
        return False
    from hetero_replay.trees.cupy_tree import cuda_available

    return cuda_available()


def _cupy_check() -> None:
    """Raise :class:`~hetero_replay.trees.cupy_tree.CudaUnavailableError` unless CuPy sees a CUDA device."""
    if _cupy_usable():
        return
    from hetero_replay.trees.cupy_tree import CudaUnavailableError

    missing = "CuPy" if importlib.util.find_spec("cupy") is None else "a CUDA device, and CuPy finds none"
    raise CudaUnavailableError(f"the 'cupy' tree backend needs {missing}; {install_hint('cuda')}")


register_backend(
    "native",
    _native,
    devices=("cpu",),
    auto_rank=0,
    threaded=True,
    description="C++17 K-ary tree, threaded over the batch, GIL released",
)
register_backend(
    "numpy",
    _numpy,
    devices=("cpu",),
    auto_rank=10,
    description="vectorised NumPy, the reference every backend matches",
)
register_backend(
    "torch",
    _torch,
    devices=(ANY_TORCH_DEVICE,),
    check=_torch_check,
    auto_rank=30,
    description="torch tensor ops on the tree's device (tree_device=)",
)
register_backend(
    "cupy",
    _cupy,
    devices=("cuda",),
    check=_cupy_check,
    extra="cuda",
    auto_rank=20,
    emulated_on=("cpu",),
    description="CUDA kernels (NVRTC) launched through CuPy",
)

register_backend(
    "fpga",
    _fpga,
    devices=("fpga",),
    check=_fpga_check,
    extra="fpga",
    emulated_on=("fpga:emu",),
    description="FPGA RMM (HLS): fixed-point leaves, exact integer sums; emulated without a board",
)


def make_tree(
    backend: str = "auto", capacity: int = 1, fanout: int = 16, dtype: Any = "float32", device: Any = None
) -> SumTree:
    """Build a sum tree.

    Args:
        backend: ``"auto"`` (the best-ranked usable backend for ``device``:
            the C++ tree on the CPU, CuPy's kernels then the torch tree on
            CUDA, the torch tree on other torch devices), or a registered name
            (:func:`~hetero_replay.registry.backends`).
        capacity: number of leaves.
        fanout: children per node, a power of two in ``FANOUTS``; 16 puts one
            float32 sibling group in one 64-byte cache line.
        dtype: ``"float32"`` (default) or ``"float64"`` leaf values.
        device: where the tree lives, a device the backend runs on (``"torch"``:
            any torch device; ``"cupy"``: a CUDA device, or ``"cpu"`` for its
            slow CPU executor; ``"fpga"``: a board ``"fpga:N"``, or its
            emulation ``"fpga:emu"``). ``None`` is the backend's default: the
            CPU (the current CUDA device for ``"cupy"``; for ``"fpga"`` the
            board when ``HETERO_REPLAY_FPGA_BITFILE`` is set, else the emulation).

    Raises:
        ValueError: an unknown backend (the message lists the registered
            ones), a device the backend does not run on, or bad arguments.
        ImportError: the backend is registered but not usable here; the
            message says why and which extra to install.
    """
    capacity, fanout, dtype = check_tree_args(capacity, fanout, dtype)
    if backend == "auto":
        return _auto(capacity, fanout, dtype, device)
    spec = registry.backend_spec(backend)
    if device is not None and spec.emulates(device):
        return spec.factory(capacity, fanout, dtype, device)
    if device is None and spec.emulated_devices:  # it picks its default itself: the hardware, or its emulation
        return spec.factory(capacity, fanout, dtype, device)
    if device is not None and not spec.runs_on(device):
        raise ValueError(
            f"tree backend {backend!r} runs on {registry.describe_devices(spec.devices)}; got device {device!r}"
        )
    spec.require()
    return spec.factory(capacity, fanout, dtype, device)


def _auto(capacity: int, fanout: int, dtype: Any, device: Any) -> SumTree:
    """The first of :func:`~hetero_replay.registry.ranked_backends` that builds here."""
    reasons = []
    for spec in registry.ranked_backends(device):
        reason = spec.why_unusable()
        if reason is None:
            try:
                return spec.factory(capacity, fanout, dtype, device)
            except ImportError as e:  # e.g. the kernels do not compile here: try the next
                reason = str(e)
        reasons.append(f"{spec.name}: {reason}")
    why = f" ({'; '.join(reasons)})" if reasons else ""
    raise ValueError(f"no tree backend runs on device {device!r} here{why}")


__all__ = ["FANOUTS", "SumTree", "backends", "make_tree"]
