"""hetero-replay: prioritized experience replay for Stable-Baselines3 and Tianshou.

The core (this package) never imports SB3 or Tianshou; their adapters live in
:mod:`hetero_replay.adapters` and build on this facade and
:mod:`hetero_replay.extend`. Tree backends and storages are listed in
:mod:`hetero_replay.registry`; other packages add theirs with
:func:`register_backend` / :func:`register_storage` or an entry point.
"""

from importlib import metadata as _metadata

from hetero_replay._native import num_threads, set_num_threads
from hetero_replay.distributed import ShardedReplay  # Ray is imported when one is built
from hetero_replay.options import DEFAULT_EPS, UNSET, PEROptions, StalenessOptions
from hetero_replay.pipeline import RelaxedReplay
from hetero_replay.placement import DeviceUnavailableError, Placement
from hetero_replay.priorities import Priorities
from hetero_replay.protocol import Replay, Sample
from hetero_replay.rate_limiter import RateLimited, RateLimiter
from hetero_replay.registry import backends, register_backend, register_storage, storages
from hetero_replay.replay import PrioritizedReplay
from hetero_replay.storage import Field, HostStorage, Schema, Storage
from hetero_replay.storage.checkpoint import ReplayFileError
from hetero_replay.storage.files import BufferInUseError
from hetero_replay.trees import SumTree, make_tree
from hetero_replay.trees.base import DeviceTree

try:  # the version is written once, in pyproject.toml
    __version__ = _metadata.version("hetero-replay")
except _metadata.PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0+unknown"

__all__ = [
    "BufferInUseError",
    "DEFAULT_EPS",
    "UNSET",
    "PEROptions",
    "Placement",
    "DeviceUnavailableError",
    "Priorities",
    "RateLimited",
    "RateLimiter",
    "Storage",
    "Field",
    "HostStorage",
    "PrioritizedReplay",
    "RelaxedReplay",
    "Replay",
    "ReplayFileError",
    "Sample",
    "ShardedReplay",
    "Schema",
    "StalenessOptions",
    "SumTree",
    "DeviceTree",
    "backends",
    "make_tree",
    "num_threads",
    "register_backend",
    "register_storage",
    "set_num_threads",
    "storages",
]
