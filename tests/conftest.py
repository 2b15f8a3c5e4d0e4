"""Shared fixtures: the tree backends that run here, and a small transition schema."""

from __future__ import annotations

import numpy as np
import pytest

from hetero_replay.trees import backends

#: Every backend that runs on this machine; "numpy" is the reference.
CPU_BACKENDS = [b for b in backends() if b in ("numpy", "native", "torch")]

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


@pytest.fixture(params=CPU_BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return request.param


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "learning: trains an agent and asserts that it learned (seconds to a minute of one core; "
        "deselect with -m 'not learning')",
    )
