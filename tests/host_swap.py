"""A pytest plugin that runs a host library's own tests with our buffers in place of its own.

``tests/test_host_suites.py`` runs Tianshou's and Stable-Baselines3's released
buffer and collector tests in a subprocess ``pytest -p host_swap
--host-swap=tianshou`` (or ``=sb3``). Before those test modules are imported,
this plugin rebinds the names they import (``tianshou.data.PrioritizedReplayBuffer``,
``stable_baselines3.common.buffers.ReplayBuffer``, ...) to our subclasses, so
every test that builds one of the host's buffers builds ours. The host
libraries' own modules keep the classes they imported at their import time,
which happens here first: only the tests see the swap.
"""

from __future__ import annotations

from typing import Any

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--host-swap",
        choices=("tianshou", "sb3"),
        required=True,
        help="which host library's buffer classes to replace with hetero-replay's",
    )


def pytest_configure(config: pytest.Config) -> None:
    swaps = {"tianshou": _tianshou_swaps, "sb3": _sb3_swaps}[config.getoption("--host-swap")]()
    for module, name, ours, base in swaps:
        if not issubclass(ours, base):  # the gate's premise: ours passes wherever the host expects its class
            raise TypeError(f"{ours.__name__} does not subclass {base.__module__}.{base.__name__}")
        setattr(module, name, ours)


def _tianshou_swaps() -> list[tuple[Any, str, type, type]]:
    import tianshou.data

    from hetero_replay.adapters.tianshou import HeteroPrioritizedReplayBuffer, HeteroPrioritizedVectorReplayBuffer

    data = tianshou.data
    return [
        (data, "PrioritizedReplayBuffer", HeteroPrioritizedReplayBuffer, data.PrioritizedReplayBuffer),
        (
            data,
            "PrioritizedVectorReplayBuffer",
            HeteroPrioritizedVectorReplayBuffer,
            data.PrioritizedVectorReplayBuffer,
        ),
    ]


def _sb3_swaps() -> list[tuple[Any, str, type, type]]:
    import stable_baselines3  # noqa: F401  (every algorithm, HER's buffer included, binds SB3's classes first)
    from stable_baselines3.common import buffers

    from hetero_replay.adapters.sb3 import (
        DictPrioritizedReplayBuffer,
        NStepPrioritizedReplayBuffer,
        PrioritizedReplayBuffer,
    )

    # The adapter's Dict buffer stands for SB3's DictReplayBuffer (MultiInputPolicy) but, like
    # every buffer SB3's off-policy algorithms take, subclasses SB3's ReplayBuffer.
    return [
        (buffers, "ReplayBuffer", PrioritizedReplayBuffer, buffers.ReplayBuffer),
        (buffers, "DictReplayBuffer", DictPrioritizedReplayBuffer, buffers.ReplayBuffer),
        (buffers, "NStepReplayBuffer", NStepPrioritizedReplayBuffer, buffers.ReplayBuffer),
    ]
