"""The sum tree as CUDA kernels (backend ``"cupy"``), compiled at run time through CuPy.

The kernels (``csrc/cuda/*.cu``, shipped inside the package) are thin
``__global__`` wrappers over per-item functions that the C++ build compiles
too (``csrc/hetero_replay/batch_items.hpp``, ``descent.hpp``). CuPy compiles
them with NVRTC the first time a tree of a given value type and fanout is
built (and caches the result on disk), so users need no ``nvcc``; they need
CuPy with NVRTC: the ``cuda`` extra.

Where the kernels run is a :class:`CudaKernels` (a CUDA device, through
``cupy.RawModule``) or a :class:`HostKernels` (the CPU: the same per-item code
in loops, through ``hetero_replay._native.kernels``). ``make_tree("cupy",
device="cpu")`` gives the latter: slow, but it runs this module's launch
sequence and the GPU's arithmetic where there is no GPU, which is how the
tests check both.

Per call, on the device:

* ``update`` / ``update_td``: check (validate, sort keys, TD transform) ->
  sort -> write leaves -> one refresh per level -> root; ``levels + 4``
  launches plus the sort, then **one** read of a 40-byte status word array
  (validation result, ``max(td + eps)``, total, minimum). Cost
  ``O(B log_K N)``, nothing ``O(N)``; duplicates resolved by the sort (last
  write wins), each parent recomputed by exactly one thread, no float atomics.
* ``sample``: one launch (stratified draws + descent + IS weights), or one
  launch that also gathers the sampled rows of every storage field
  (:meth:`CupySumTree.sample_rows`). The uniforms come from the caller's NumPy
  generator (the same stream as every backend: one host-to-device copy of
  ``8 * batch_size`` bytes) or from a ``cupy.random.Generator`` on the device.

Kernels run on CuPy's current stream; torch tensors handed in or out share
memory with CuPy arrays (``__cuda_array_interface__`` / DLPack) and are ordered
with torch's work when both use the default stream.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from hetero_replay.registry import install_hint
from hetero_replay.trees.base import TreeBase, describe_max_leaf
from hetero_replay.trees.numpy_tree import as_indices, as_priorities, priorities_from_td

#: Kernel source files, each loaded as one CuPy RawModule.
KERNEL_FILES = {"update": "update.cu", "search": "search.cu"}
#: Kernel -> its file, and whether it is templated on the fanout.
_KERNELS = {
    "check_priorities": ("update", False),
    "check_td": ("update", False),
    "write_leaves": ("update", False),
    "refresh_level": ("update", True),
    "rebuild_level": ("update", True),
    "refresh_root": ("update", True),
    "find": ("search", True),
    "sample": ("search", True),
    "sample_gather": ("search", True),
}
_CTYPES = {np.dtype(np.float32): "float", np.dtype(np.float64): "double"}
_STATUS_WORDS = 5  # kStatusWords in batch_items.hpp: bad index, bad value, max raw, total, min
_BLOCK = 256  # threads per block of the item-wise kernels
_GATHER_BLOCK = 128  # threads (= rows gathered together) per block of sample_gather
_EXTRA = install_hint("cuda")


class CudaUnavailableError(ImportError):
    """CuPy, NVRTC or a CUDA device is missing (the ``cuda`` extra)."""


def cuda_available() -> bool:
    """Whether CuPy imports and sees at least one CUDA device."""
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:  # no CuPy, no driver, no device: all mean "not here"
        return False


def kernel_source_dir() -> Path:
    """The directory holding ``cuda/*.cu`` and ``hetero_replay/*.hpp``.

    A source checkout's ``csrc/`` (so edits take effect without reinstalling),
    else the copy installed with the package (``hetero_replay/_csrc``).
    """
    package = Path(__file__).resolve().parents[1]
    import hetero_replay._native as native

    for root in (package.parent / "csrc", Path(native.__file__).resolve().parent / "_csrc", package / "_csrc"):
        if (root / "cuda" / KERNEL_FILES["update"]).is_file():
            return root
    raise FileNotFoundError(f"the CUDA kernel sources are missing (looked under {package.parent / 'csrc'} and _csrc)")


def nvrtc_options(root: Path) -> tuple[str, ...]:
    """NVRTC options for the kernel sources under ``root``.

    ``--fmad=false`` keeps every multiply and add separately rounded, as on the CPU.
    """
    cuda = root / "cuda"
    return ("-std=c++17", "--fmad=false", f"-I{root}", f"-I{cuda}", f"-I{cuda / 'nvrtc_std'}")


def kernel_name(kernel: str, dtype: Any, fanout: int) -> str:
    """The C++ name expression of a kernel instance, e.g. ``hr_find<float, 16>``."""
    ctype = _CTYPES[np.dtype(dtype)]
    return f"hr_{kernel}<{ctype}, {fanout}>" if _KERNELS[kernel][1] else f"hr_{kernel}<{ctype}>"


class HostKernels:
    """Runs the kernels on the CPU: the same per-item code, in loops (``_native.kernels``)."""

    xp = np
    device = "cpu"

    def __init__(self) -> None:
        from hetero_replay._native import kernels

        self._module = kernels

    def launch(self, kernel: str, items: int, args: tuple, block: int = _BLOCK) -> None:
        """Run ``kernel`` over ``items`` items with the kernel's arguments ``args``."""
        fn = getattr(self._module, kernel)
        extra = (block,) if kernel == "sample_gather" else ()
        fanout = (self._fanout,) if _KERNELS[kernel][1] else ()
        fn(*fanout, *args, *extra)

    def bind(self, dtype: np.dtype, fanout: int) -> None:
        """Prepare the kernels of one tree type (the fanout is an argument on the CPU)."""
        self._fanout = fanout

    @staticmethod
    def address(arr: Any) -> int:
        return _address(arr)

    @staticmethod
    def to_host(arr: np.ndarray) -> np.ndarray:
        return np.array(arr, copy=True)

    @staticmethod
    def to_torch(arr: np.ndarray) -> Any:
        import torch

        return torch.from_numpy(arr)

    @staticmethod
    def accepts(x: Any) -> bool:
        """Whether ``x`` already lives where the kernels run (never: the CPU path takes NumPy)."""
        return False


class CudaKernels:
    """Launches the kernels on a CUDA device through ``cupy.RawModule`` (NVRTC)."""

    def __init__(self, device: Any = None) -> None:
        try:
            import cupy
        except ImportError as e:
            raise CudaUnavailableError(f"the 'cupy' tree backend needs CuPy: {_EXTRA}") from e
        if not cuda_available():
            raise CudaUnavailableError(f"the 'cupy' tree backend needs a CUDA device; none is available ({_EXTRA})")
        self.xp = cupy
        index = _cuda_index(device, cupy)
        self._device = cupy.cuda.Device(index)
        self.device = f"cuda:{index}"
        self._functions: dict[str, Any] = {}

    def bind(self, dtype: np.dtype, fanout: int) -> None:
        """Compile (or load from CuPy's cache) the kernels of one tree type."""
        root = kernel_source_dir()
        options = nvrtc_options(root)
        with self._device:
            for module, filename in KERNEL_FILES.items():
                names = {k: kernel_name(k, dtype, fanout) for k, (m, _) in _KERNELS.items() if m == module}
                code = (root / "cuda" / filename).read_text()
                try:
                    raw = self.xp.RawModule(code=code, options=options, name_expressions=list(names.values()))
                    self._functions.update({k: raw.get_function(name) for k, name in names.items()})
                except self.xp.cuda.compiler.CompileException:
                    raise  # a kernel that does not compile is a bug, not a missing dependency
                except (OSError, RuntimeError) as e:  # NVRTC or the driver could not be loaded
                    raise CudaUnavailableError(f"NVRTC could not compile {filename} here ({e}); {_EXTRA}") from e

    def launch(self, kernel: str, items: int, args: tuple, block: int = _BLOCK) -> None:
        """Run ``kernel`` over ``items`` items with the kernel's arguments ``args``."""
        grid = max(1, math.ceil(items / block))
        converted = tuple(_kernel_arg(a) for a in args)
        with self._device:
            self._functions[kernel]((grid,), (block,), converted)

    @staticmethod
    def address(arr: Any) -> int:
        return _address(arr)

    def to_host(self, arr: Any) -> np.ndarray:
        return self.xp.asnumpy(arr)

    @staticmethod
    def to_torch(arr: Any) -> Any:
        import torch

        return torch.from_dlpack(arr)

    @staticmethod
    def accepts(x: Any) -> bool:
        """Whether ``x`` is device memory the kernels can take without a copy to the host."""
        return hasattr(x, "__cuda_array_interface__") or (_is_torch(x) and x.is_cuda)


class CupySumTree(TreeBase):
    """K-ary sum tree whose operations are the CUDA kernels of ``csrc/cuda/``.

    Same protocol, layout and numerical contract as the NumPy reference; on a
    GPU and on the CPU executor it agrees with it to the bit (indices, totals,
    minima; IS weights to the last bits of ``powf``).

    Args:
        capacity: number of leaves.
        fanout: children per node, one of ``FANOUTS``.
        dtype: ``"float32"`` or ``"float64"`` leaf values.
        device: ``None`` / ``"cuda"`` / ``"cuda:N"`` for a CUDA device, or
            ``"cpu"`` to run the same kernels in CPU loops (tests, debugging).
    """

    def __init__(self, capacity: int, fanout: int = 16, dtype: Any = "float32", device: Any = None) -> None:
        super().__init__(capacity, fanout, dtype)
        self._kernels = HostKernels() if str(device) == "cpu" else CudaKernels(device)
        self._kernels.bind(self._dtype, fanout)
        xp = self._kernels.xp
        self._values = [xp.zeros(n, self._dtype) for n in self._alloc]
        # Index 0 unused: leaves need no minimum and keep no prefix sums.
        self._mins = [None] + [xp.full(n, np.inf, self._dtype) for n in self._alloc[1:]]
        self._prefix = [None] + [xp.zeros(n, np.float64) for n in self._alloc[1:]]
        table = [0] + [self._kernels.address(p) for p in self._prefix[1:]]
        self._table = xp.asarray(np.array(table, dtype=np.uint64))
        self._status = xp.zeros(_STATUS_WORDS, np.uint64)

    # -- protocol ------------------------------------------------------------------

    @property
    def device(self) -> str:
        """``"cuda:N"``, or ``"cpu"`` for the CPU executor."""
        return self._kernels.device

    def update(self, indices: Any, priorities: Any) -> None:
        if self._kernels.accepts(indices) or self._kernels.accepts(priorities):
            idx = self._device_indices(indices)
            val = self._device_reals(priorities, "priorities")
            if val.size != idx.size:
                raise ValueError(f"got {idx.size} indices but {val.size} priorities")
            if idx.size:
                self._run_update(idx, val.astype(self._dtype), None, self._capacity, 0.0, 0.0)
            return
        idx = as_indices(_host(indices), self._capacity)
        val = as_priorities(_host(priorities), self._dtype, self._capacity, len(idx))
        if idx.size:
            self._run_update(self._upload(idx), self._upload(val), None, self._capacity, 0.0, 0.0)

    def update_td(self, indices: Any, td_errors: Any, alpha: float, eps: float, limit: int | None = None) -> float:
        bound = self._capacity if limit is None else min(limit, self._capacity)
        if self._kernels.accepts(indices) or self._kernels.accepts(td_errors):
            idx = self._device_indices(indices)
            td = self._device_reals(td_errors, "td_errors")
            if td.size != idx.size:
                raise ValueError(f"got {idx.size} indices but {td.size} TD errors")
            if idx.size == 0:
                return 0.0
            return self._run_update(idx, None, td.astype(np.float64), bound, float(alpha), float(eps))
        # Host input: validated and transformed on the host exactly as the
        # reference does it (same errors, same bits), then uploaded.
        idx = as_indices(_host(indices), bound)
        priorities, max_raw = priorities_from_td(_host(td_errors), len(idx), alpha, eps, self._dtype, self._capacity)
        if idx.size:
            self._run_update(self._upload(idx), self._upload(priorities), None, bound, 0.0, 0.0)
        return max_raw

    def load_leaves(self, leaves: Any) -> None:
        val = as_priorities(_host(leaves), self._dtype, self._capacity)
        if val.size != self._capacity:
            raise ValueError(f"expected {self._capacity} leaves, got {val.size}")
        self._values[0][: self._capacity] = self._upload(val)
        for level in range(1, self.num_levels):
            child_mins, child_prefix = self._children(level)
            nodes = self._alloc[level - 1] // self._k
            args = (nodes, self._values[level - 1], child_mins, child_prefix, self._values[level], self._mins[level])
            self._kernels.launch("rebuild_level", nodes, args)
        self._status.fill(0)
        self._refresh_root()
        self._read_status()

    def get(self, indices: Any) -> np.ndarray:
        idx = as_indices(_host(indices), self._capacity)
        return self._kernels.to_host(self._values[0][self._upload(idx)])

    def leaves(self) -> np.ndarray:
        return self._kernels.to_host(self._values[0][: self._capacity])

    def find(self, mass: Any) -> np.ndarray:
        m = self._checked_masses(_host(mass))
        xp = self._kernels.xp
        out = xp.empty(m.size, np.int64)
        args = (m.size, self._upload(m), self._values[0], self._table, self.num_levels, out)
        self._kernels.launch("find", m.size, args)
        return self._kernels.to_host(out)

    def sample(
        self, batch_size: int, rng: np.random.Generator, beta: float, stratified: bool = True
    ) -> tuple[np.ndarray, np.ndarray]:
        idx, weights = self._draw(batch_size, rng, beta, stratified)
        return self._kernels.to_host(idx), self._kernels.to_host(weights)

    def sample_tensors(self, batch_size: int, rng: Any, beta: float, stratified: bool = True) -> tuple[Any, Any]:
        """:meth:`sample`, returning torch tensors on :attr:`device` (shared memory, no copy)."""
        idx, weights = self._draw(batch_size, rng, beta, stratified)
        return self._kernels.to_torch(idx), self._kernels.to_torch(weights)

    def sample_rows(
        self, batch_size: int, rng: Any, beta: float, sources: Mapping[str, Any], stratified: bool = True
    ) -> tuple[Any, Any, dict[str, Any]]:
        """Sample and gather in one launch: ``(indices, weights, {field: rows})``.

        ``sources`` are contiguous torch tensors of shape ``(capacity, ...)`` on
        :attr:`device` (the storage's fields); the rows come back as new
        tensors there, next to the indices and weights.
        """
        import torch

        rows = {
            name: torch.empty((batch_size, *src.shape[1:]), dtype=src.dtype, device=src.device)
            for name, src in sources.items()
        }
        table = []
        for name, src in sources.items():
            if str(src.device) != self.device or not src.is_contiguous() or src.shape[0] < self._capacity:
                raise ValueError(
                    f"field {name!r}: sample_rows needs contiguous tensors of at least {self._capacity} rows "
                    f"on {self.device}, got {tuple(src.shape)} on {src.device}"
                )
            table += [src.data_ptr(), rows[name].data_ptr(), src[0].numel() * src.element_size()]
        fields = self._kernels.xp.asarray(np.array(table, dtype=np.int64))
        idx, weights = self._draw(batch_size, rng, beta, stratified, fields)
        return self._kernels.to_torch(idx), self._kernels.to_torch(weights), rows

    def __getstate__(self) -> dict[str, Any]:
        return {
            "capacity": self._capacity,
            "fanout": self._k,
            "dtype": self._dtype.name,
            "device": self.device,
            "leaves": self.leaves(),
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        CupySumTree.__init__(self, state["capacity"], state["fanout"], state["dtype"], state["device"])
        self.load_leaves(state["leaves"])

    def __repr__(self) -> str:
        return (
            f"CupySumTree(capacity={self._capacity}, fanout={self._k}, dtype={self._dtype.name}, device={self.device})"
        )

    # -- internals -----------------------------------------------------------------

    def _children(self, level: int) -> tuple[Any, Any]:
        """Minima and prefix-sum arrays of the children of ``level`` (None for leaves)."""
        return (None, None) if level == 1 else (self._mins[level - 1], self._prefix[level - 1])

    def _upload(self, arr: np.ndarray) -> Any:
        """A host array where the kernels run, contiguous (a copy to the device, or a view)."""
        return self._kernels.xp.asarray(np.ascontiguousarray(arr))

    def _device_indices(self, indices: Any) -> Any:
        arr = self._kernels.xp.asarray(_detach(indices))
        if arr.ndim != 1:
            raise ValueError(f"indices must be 1-D, got {arr.ndim}-D")
        if arr.size and arr.dtype.kind not in "iu":
            raise TypeError(f"indices must be integers, got dtype {arr.dtype}")
        return arr.astype(np.int64)

    def _device_reals(self, values: Any, what: str) -> Any:
        arr = self._kernels.xp.asarray(_detach(values))
        if arr.ndim != 1:
            raise ValueError(f"{what} must be 1-D, got {arr.ndim}-D")
        if arr.size and arr.dtype.kind not in "fiu":
            raise TypeError(f"{what} must be real numbers, got dtype {arr.dtype}")
        return arr

    def _run_update(self, idx: Any, values: Any, td: Any, limit: int, alpha: float, eps: float) -> float:
        """The update launch sequence (see batch_items.hpp); returns ``max(td + eps)``."""
        n, xp, run = int(idx.size), self._kernels.xp, self._kernels.launch
        if self._capacity * n >= 2**63:
            raise ValueError(f"a batch of {n} does not fit the sort keys of a capacity of {self._capacity}")
        self._status.fill(0)
        keys = xp.empty(n, np.int64)
        if td is None:
            run("check_priorities", n, (n, idx, values, limit, self._max_leaf, keys, self._status))
        else:
            values = xp.empty(n, self._dtype)
            run("check_td", n, (n, idx, td, limit, alpha, eps, self._max_leaf, keys, values, self._status))
        keys = xp.sort(keys)
        run("write_leaves", n, (n, keys, values, self._values[0], self._status))
        span = 1
        for level in range(1, self.num_levels):
            span *= self._k
            child_mins, child_prefix = self._children(level)
            args = (
                n,
                keys,
                span,
                self._values[level - 1],
                child_mins,
                child_prefix,
                self._values[level],
                self._mins[level],
                self._status,
            )
            run("refresh_level", n, args)
        self._refresh_root()
        status = self._kernels.to_host(self._status)  # the one read of the update
        if status[0]:
            i = n - int(status[0])
            raise IndexError(f"index at position {i} is {int(idx[i])}, outside [0, {limit})")
        if status[1]:
            i = n - int(status[1])
            bound = describe_max_leaf(self._dtype, self._capacity)
            if td is None:
                raise ValueError(
                    f"priority at position {i} is {self._dtype.type(float(values[i]))}; "
                    f"priorities must be >= 0 and <= {bound}"
                )
            shown = float(td[i])
            if np.isfinite(shown) and shown >= 0:
                raise ValueError(
                    f"TD error at position {i} is {shown!r}: its priority (td + eps) ** alpha = "
                    f"{self._dtype.type(float(values[i]))} exceeds the largest priority this tree can sum, {bound}"
                )
            raise ValueError(f"TD error at position {i} is {shown!r}; pass finite magnitudes |TD error| >= 0")
        self._set_mirrors(status)
        return float(status[2:3].view(np.float64)[0])

    def _refresh_root(self) -> None:
        top = self.num_levels - 1
        mins, prefix = (None, None) if top == 0 else (self._mins[top], self._prefix[top])
        self._kernels.launch("refresh_root", 1, (self._values[top], mins, prefix, self._status))

    def _read_status(self) -> None:
        self._set_mirrors(self._kernels.to_host(self._status))

    def _set_mirrors(self, status: np.ndarray) -> None:
        total, minimum = status[3:5].view(np.float64)
        self._total, self._min = float(total), float(minimum)

    def _draw(self, batch_size: int, rng: Any, beta: float, stratified: bool, fields: Any = None) -> tuple[Any, Any]:
        if batch_size <= 0:
            raise ValueError(f"batch_size must be > 0, got {batch_size}")
        self._require_mass()
        xp = self._kernels.xp
        if isinstance(rng, np.random.Generator):
            u = self._upload(rng.random(batch_size))
        elif xp is not np and isinstance(rng, xp.random.Generator):
            u = rng.random(batch_size, dtype=np.float64)
        else:
            raise TypeError(f"rng must be a numpy.random.Generator (or a cupy one), got {type(rng).__name__}")
        idx = xp.empty(batch_size, np.int64)
        weights = xp.empty(batch_size, np.float32)
        args = (
            batch_size,
            u,
            int(bool(stratified)),
            self._total,
            self._min,
            float(beta),
            self._values[0],
            self._table,
            self.num_levels,
            idx,
            weights,
        )
        if fields is None:
            self._kernels.launch("sample", batch_size, args)
        else:
            fused = (*args, fields.size // 3, fields)
            self._kernels.launch("sample_gather", batch_size, fused, block=_GATHER_BLOCK)
        return idx, weights


def _is_torch(x: Any) -> bool:
    return type(x).__module__.startswith("torch") and hasattr(x, "data_ptr")


def _detach(x: Any) -> Any:
    """A torch tensor without its autograd graph (which blocks zero-copy export)."""
    return x.detach() if _is_torch(x) else x


def _host(x: Any) -> Any:
    """A torch tensor as a host NumPy array; anything else unchanged."""
    return x.detach().cpu().numpy() if _is_torch(x) else x


def _address(arr: Any) -> int:
    """The data address of a NumPy array, CuPy array or torch tensor."""
    if isinstance(arr, np.ndarray):
        return arr.ctypes.data
    if _is_torch(arr):
        return arr.data_ptr()
    return arr.data.ptr


def _kernel_arg(a: Any) -> Any:
    """A launch argument in the width the kernel expects: int64, float64, or a null pointer."""
    if a is None:
        return np.uint64(0)
    if isinstance(a, (bool, int, np.integer)):
        return np.int64(a)
    if isinstance(a, (float, np.floating)):
        return np.float64(a)
    return a


def _cuda_index(device: Any, cupy: Any) -> int:
    if device is None:
        return cupy.cuda.runtime.getDevice()
    name = str(device)
    if name == "cuda":
        return cupy.cuda.runtime.getDevice()
    if name.startswith("cuda:") and name[5:].isdigit():
        index = int(name[5:])
        count = cupy.cuda.runtime.getDeviceCount()
        if index >= count:
            raise CudaUnavailableError(f"device {name!r} requested, but this machine has {count} CUDA device(s)")
        return index
    raise ValueError(f"the 'cupy' tree backend runs on 'cuda', 'cuda:N' or 'cpu' (its CPU executor); got {device!r}")


__all__ = [
    "CudaKernels",
    "CudaUnavailableError",
    "CupySumTree",
    "HostKernels",
    "cuda_available",
    "kernel_name",
    "kernel_source_dir",
    "nvrtc_options",
]
