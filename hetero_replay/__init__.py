"""hetero-replay: prioritized experience replay for Stable-Baselines3 and Tianshou.

The core (this package) never imports SB3 or Tianshou; their adapters live in
:mod:`hetero_replay.adapters`.
"""

from hetero_replay._native import num_threads, set_num_threads
from hetero_replay.checkpoint import ReplayFileError
from hetero_replay.replay import PrioritizedReplay, Sample
from hetero_replay.storage import Field, HostStorage, Schema
from hetero_replay.trees import SumTree, backends, make_tree

__version__ = "0.1.0"

__all__ = [
    "Field",
    "HostStorage",
    "PrioritizedReplay",
    "ReplayFileError",
    "Sample",
    "Schema",
    "SumTree",
    "backends",
    "make_tree",
    "num_threads",
    "set_num_threads",
]
