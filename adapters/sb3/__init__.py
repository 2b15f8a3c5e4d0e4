"""Prioritized experience replay for Stable-Baselines3, without patching SB3.

Two ways in:

* swap the buffer of a stock algorithm (runs, but stays uniform: stock
  ``train()`` never updates priorities)::

      DQN("MlpPolicy", env, replay_buffer_class=PrioritizedReplayBuffer)

* or use the PER algorithms, whose ``train()`` weights the loss and feeds
  ``|TD error|`` back::

      PERDQN("MlpPolicy", env, replay_buffer_kwargs=dict(alpha=0.6, beta=0.4))

========================================  =======================================
``PrioritizedReplayBuffer``               drop-in ``replay_buffer_class``
``DictPrioritizedReplayBuffer``           the same for ``MultiInputPolicy``
``PrioritizedHerReplayBuffer``            SB3's HER (goal relabelling) with PER
``NStepPrioritizedReplayBuffer``          n-step returns (what ``n_steps > 1`` picks)
``PERDQN``, ``PERDDPG``, ``PERTD3``,      SB3's algorithms with PER in ``train()``
``PERSAC``
``PERQRDQN``, ``PERTQC``, ``PERCrossQ``   sb3-contrib's, the same way (the ``contrib``
                                          extra; imported when first named)
========================================  =======================================
"""

import importlib
from typing import Any

from hetero_replay.extend import install_hint

try:
    import stable_baselines3  # noqa: F401
except ImportError as e:  # pragma: no cover - depends on the installation
    raise ImportError(f"hetero_replay.adapters.sb3 needs Stable-Baselines3: {install_hint('sb3')}") from e

from hetero_replay.adapters.sb3.buffers import (
    DictPrioritizedReplayBuffer,
    PrioritizedReplayBuffer,
    PrioritizedReplayBufferSamples,
)
from hetero_replay.adapters.sb3.common import PERMixin, has_priorities
from hetero_replay.adapters.sb3.dqn import PERDQN
from hetero_replay.adapters.sb3.her import PrioritizedHerReplayBuffer
from hetero_replay.adapters.sb3.nstep import NStepPrioritizedReplayBuffer
from hetero_replay.adapters.sb3.sac import PERSAC
from hetero_replay.adapters.sb3.td3 import PERDDPG, PERTD3, PERTD3TrainMixin

#: The sb3-contrib algorithms: name -> module. Imported on first use, so sb3-contrib stays optional.
_CONTRIB = {"PERQRDQN": "qrdqn", "PERTQC": "tqc", "PERCrossQ": "crossq"}


def __getattr__(name: str) -> Any:
    if name not in _CONTRIB:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    try:
        import sb3_contrib  # noqa: F401
    except ImportError as e:
        raise ImportError(f"{name} needs sb3-contrib: {install_hint('contrib')}") from e
    return getattr(importlib.import_module(f"{__name__}.{_CONTRIB[name]}"), name)


__all__ = [
    "PERCrossQ",
    "PERQRDQN",
    "PERTQC",
    "PERDDPG",
    "PERDQN",
    "PERMixin",
    "PERSAC",
    "PERTD3",
    "PERTD3TrainMixin",
    "DictPrioritizedReplayBuffer",
    "NStepPrioritizedReplayBuffer",
    "PrioritizedHerReplayBuffer",
    "PrioritizedReplayBuffer",
    "PrioritizedReplayBufferSamples",
    "has_priorities",
]
