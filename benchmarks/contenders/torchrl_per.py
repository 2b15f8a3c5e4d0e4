"""TorchRL's ``PrioritizedReplayBuffer`` over a ``LazyTensorStorage``.

TorchRL's prioritized sampler needs its C++ extension ``torchrl._torchrl``
(binary sum and min segment trees). A wheel built against another torch fails
to load it (``undefined symbol``), and the sampler then refuses to work. The
wheel ships the extension's sources under ``torchrl/csrc/``, so when the
shipped binary does not load we compile those sources with
``torch.utils.cpp_extension.load`` (``-O3``, as TorchRL's own setup.py does)
into a cache directory under the system temp dir, and register the result as
``torchrl._torchrl`` before TorchRL is imported. Nothing in site-packages is
touched. :func:`extension_origin` says which of the two happened.
"""

from __future__ import annotations

import importlib.machinery
import importlib.metadata
import importlib.util
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from contenders import Contender, Workload

FILL_CHUNK = 100_000
_origin: str | None = None


def extension_origin() -> str | None:
    """``"wheel"`` or ``"built from the wheel's csrc (<dir>)"`` once loaded, else ``None``."""
    return _origin


def load_extension() -> None:
    """Make ``import torchrl._torchrl`` work; must run before TorchRL is imported."""
    if "torchrl._torchrl" in sys.modules:
        return
    if "torchrl" in sys.modules:
        raise RuntimeError("torchrl was imported before its C++ extension could be set up")
    import torch  # the extension links against the libtorch this loads

    spec = importlib.util.find_spec("torchrl")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("torchrl is not installed (pip install 'hetero-replay[bench]')")
    package_dir = Path(spec.submodule_search_locations[0])
    shipped = importlib.machinery.PathFinder.find_spec("_torchrl", [str(package_dir)])
    if shipped is not None:
        try:
            module = importlib.util.module_from_spec(shipped)
            shipped.loader.exec_module(module)  # type: ignore[union-attr]
            _register(module, "wheel")
            return
        except ImportError:
            pass  # built against another torch: compile the shipped sources instead
    _register(_build(package_dir / "csrc", torch.__version__), None)


def _build(csrc: Path, torch_version: str) -> ModuleType:
    from torch.utils.cpp_extension import load

    sources = [csrc / "pybind.cpp", csrc / "utils.cpp"]
    missing = [str(s) for s in sources if not s.exists()]
    if missing:
        raise ImportError(f"torchrl's C++ extension does not load and its sources are missing: {missing}")
    version = importlib.metadata.version("torchrl")
    build_dir = Path(tempfile.gettempdir()) / "hetero-replay-bench" / f"torchrl-{version}-torch-{torch_version}"
    build_dir.mkdir(parents=True, exist_ok=True)
    # ninja skips the compile when the cached build is up to date.
    return load(
        name="_torchrl",
        sources=[str(s) for s in sources],
        extra_cflags=["-O3", "-std=c++17"],
        build_directory=str(build_dir),
        verbose=False,
    )


def _register(module: ModuleType, origin: str | None) -> None:
    global _origin
    sys.modules["torchrl._torchrl"] = module
    _origin = origin or f"built from the wheel's csrc ({Path(module.__file__ or '').parent})"


class TorchRLContender(Contender):
    """``torchrl.data.PrioritizedReplayBuffer`` storing a flat TensorDict of the schema."""

    label = "torchrl"
    library = "torchrl"
    role = "anchor"

    def __init__(self, capacity: int, workload: Workload) -> None:
        import torch
        from tensordict import TensorDict
        from torchrl.data import LazyTensorStorage, PrioritizedReplayBuffer

        self._torch, self._TensorDict = torch, TensorDict
        self.rb = PrioritizedReplayBuffer(
            alpha=workload.alpha, beta=workload.beta, eps=workload.eps, storage=LazyTensorStorage(capacity)
        )
        self.setup = (
            "PrioritizedReplayBuffer(alpha, beta, eps, storage=LazyTensorStorage(N)), C++ extension: "
            f"{extension_origin()}; extend(TensorDict) in chunks of {FILL_CHUNK:,}, add() for one "
            "transition; sample(B, return_info=True) -> (data, {index, priority_weight}); "
            "update_priority(index, torch tensor)"
        )

    def _tensordict(self, arrays: Mapping[str, np.ndarray]) -> Any:
        tensors = {k: self._torch.from_numpy(np.ascontiguousarray(v)) for k, v in arrays.items()}
        return self._TensorDict(tensors, [len(arrays["obs"])])

    def fill(self, data: Mapping[str, np.ndarray]) -> None:
        rows = len(data["obs"])
        for start in range(0, rows, FILL_CHUNK):
            self.rb.extend(self._tensordict({k: v[start : start + FILL_CHUNK] for k, v in data.items()}))

    def prepare_insert(self, chunk: Mapping[str, np.ndarray]) -> Any:
        td = self._tensordict(chunk)
        # one transition goes in through add(), TorchRL's single-item path
        return (self.rb.add, td[0]) if len(td) == 1 else (self.rb.extend, td)

    def insert(self, prepared: Any) -> None:
        add, td = prepared
        add(td)

    def sample(self, batch_size: int) -> Any:
        return self.rb.sample(batch_size, return_info=True)

    def indices(self, sample: Any) -> Any:
        return sample[1]["index"]

    def prepare_td(self, td: np.ndarray) -> Any:
        return self._torch.from_numpy(td)

    def update(self, indices: Any, td: Any) -> None:
        self.rb.update_priority(indices, td)

    def close(self) -> None:
        del self.rb


def make(capacity: int, workload: Workload) -> list[Contender]:
    """The TorchRL anchor (raises ImportError/RuntimeError when its extension is unusable)."""
    load_extension()
    return [TorchRLContender(capacity, workload)]
