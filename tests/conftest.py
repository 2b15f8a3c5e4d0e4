"""Shared fixtures: the tree backends that run here, and a small transition schema.

The session installs a plugin, ``tests/plugins/toy_backend``: a separate
package (``hetero_replay_toy``) with a ``.dist-info`` whose entry point
registers the ``"toy"`` tree backend, found the way an installed plugin is
(``importlib.metadata``). The ``backend`` fixture includes it, so the toy runs
the same reference tests as the built-in backends.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from hetero_replay import registry
from hetero_replay.trees import backends

#: The board-driver tests run in their own environment (pynq pins numpy<2): ``make test-fpga-board``.
collect_ignore = ["fpga_board"]

#: The folder holding the toy plugin's package and its .dist-info.
TOY_PLUGIN = Path(__file__).parent / "plugins" / "toy_backend"

#: Every backend that runs on this machine, and the toy plugin's; "numpy" is the reference.
CPU_BACKENDS = [b for b in backends() if b in ("numpy", "native", "torch")] + ["toy"]

SCHEMA = {
    "obs": ((3,), np.float32),
    "action": ((), np.int64),
    "reward": ((), np.float32),
    "next_obs": ((3,), np.float32),
    "done": ((), np.float32),
}


def make_batch(n: int, start: int = 0) -> dict[str, np.ndarray]:
    """Rows whose values encode their insertion order, so gathers can be checked."""
    k = np.arange(start, start + n)
    return {
        "obs": np.stack([k, k + 0.25, k + 0.5], axis=1).astype(np.float32),
        "action": k.astype(np.int64),
        "reward": (k * 0.5).astype(np.float32),
        "next_obs": np.stack([k + 1, k + 1.25, k + 1.5], axis=1).astype(np.float32),
        "done": (k % 2).astype(np.float32),
    }


@pytest.fixture(scope="module")
def ray_local() -> Iterator[object]:
    """A local Ray instance (2 CPUs, as CI has) for one test module, shut down after it.

    Per module, not per session: Ray's threads and exit hooks must not be alive while other
    modules fork processes.
    """
    ray = pytest.importorskip("ray")
    if not ray.is_initialized():
        ray.init(address="local", num_cpus=2, include_dashboard=False, namespace="hetero_replay", log_to_driver=False)
    yield ray
    ray.shutdown()


@pytest.fixture(params=CPU_BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return request.param


@contextlib.contextmanager
def registry_state() -> Iterator[None]:
    """Restore the registry's entries and its record of loaded plugins on exit."""
    backends, storages = dict(registry._backends), dict(registry._storages)
    loaded, scanned = set(registry._loaded_entry_points), registry._plugins_scanned
    try:
        yield
    finally:
        registry._backends.clear()
        registry._backends.update(backends)
        registry._storages.clear()
        registry._storages.update(storages)
        registry._loaded_entry_points.clear()
        registry._loaded_entry_points.update(loaded)
        registry._plugins_scanned = scanned


@contextlib.contextmanager
def installed(folder: Path, *modules: str) -> Iterator[None]:
    """``folder`` on ``sys.path`` as if its packages and .dist-info were installed, its plugins loaded.

    On exit the folder, its ``modules`` and whatever its plugins registered are gone again.
    """
    with registry_state():
        sys.path.insert(0, str(folder))
        importlib.invalidate_caches()
        try:
            registry.load_plugins()  # a real entry-point scan: importlib.metadata finds the .dist-info
            yield
        finally:
            sys.path.remove(str(folder))
            for name in modules:
                sys.modules.pop(name, None)
            importlib.invalidate_caches()


@pytest.fixture(scope="session", autouse=True)
def toy_plugin() -> Iterator[None]:
    """The toy backend plugin, installed for the whole session (the ``"toy"`` backend of ``CPU_BACKENDS``)."""
    with installed(TOY_PLUGIN, "hetero_replay_toy"):
        yield


@pytest.fixture
def one_torch_thread():
    """torch on one thread for the test (SB3 training is faster and steadier so on a shared machine)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def counting_env():
    """``make(env_id)``: a gymnasium env that counts the steps and resets done to it (``.calls``)."""
    gym = pytest.importorskip("gymnasium")

    class Counting(gym.Wrapper):
        def __init__(self, env) -> None:
            super().__init__(env)
            self.calls = 0

        def step(self, action):
            self.calls += 1
            return super().step(action)

        def reset(self, **kwargs):
            self.calls += 1
            return super().reset(**kwargs)

    return lambda env_id: Counting(gym.make(env_id))


@pytest.fixture(scope="session", autouse=True)
def no_leaked_segments() -> Iterator[None]:
    """The whole session leaves no shared-memory segment of ours behind (storage="shared")."""
    shm = Path("/dev/shm")
    before = set(shm.glob("hetero-replay-*.ring")) if shm.is_dir() else set()
    yield
    after = set(shm.glob("hetero-replay-*.ring")) if shm.is_dir() else set()
    leaked = sorted(str(p) for p in after - before)
    assert not leaked, f"segments left in /dev/shm: {leaked}"


@pytest.fixture
def small_tmpfs(tmp_path):
    """A real 1 MiB file system that fills up (a tmpfs: root only)."""
    mount = tmp_path / "small"
    mount.mkdir(mode=0o700)
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("needs root to mount a small tmpfs")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,mode=0700", "tmpfs", str(mount)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=False)
