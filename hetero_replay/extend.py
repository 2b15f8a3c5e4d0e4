"""The extension API: what adapters and plug-ins build on, beyond the facade.

Users import :mod:`hetero_replay` (the replays, their options, placements,
storages, trees, the registry). A host-library adapter (``hetero_replay.adapters``)
or a third-party plug-in needs a few more pieces of the core to behave like
the package's own buffers; they are published here, and an adapter imports
nothing of the core but :mod:`hetero_replay` and this module
(``tests/test_architecture.py`` checks it):

* argument checks, so that every public edge refuses the same values with
  the same messages (:mod:`hetero_replay.checks`, ``check_beta``);
* a fork-safe lock, for a buffer that keeps state of its own beside the
  engine (:mod:`hetero_replay.forksafe`), and ``close_when_gone``: a buffer
  left unclosed is closed when collected or at exit, before the replay below
  it goes (:mod:`hetero_replay.closing`);
* placement helpers: the host storage's name, and the check for libraries
  whose one policy both acts and trains (``one_policy_placement``);
* the staleness schedule (``Schedule``, ``PendingUpdate``), for a wrapper that
  applies deferred updates itself, and the pipeline's ``AUTO_WINDOW``;
* durable points: the file a buffer flushes to, its flush schedule and the
  reader, so that every buffer has one durability scheme and one state format;
* the advisor's pieces a host library's workload implements or calls
  (``Candidate``, ``ReplayConfig``, ``WorkloadSpec``, the timers, ``advise``,
  ``AutoPlacement``);
* ``install_hint``: how a user installs an extra, for "needs X" messages;
* ``RowStager``: one environment step's transitions checked and copied into
  staging rows in one native call, for an adapter whose host library adds a
  step at a time (it only accepts; the adapter's checks handle the rest), and
  ``CheckedRows``: those staged rows handed to the replay, which does not check
  them again;
* ``same_device``, ``Normalise`` (with ``check_normalise`` and the batch rule
  ``normalise_by_batch``) and ``PLAIN_KINDS``: the device comparison, the
  IS-weight normalisations and the dtype kinds a schema stores as is.
"""

from hetero_replay._native import RowStager
from hetero_replay.advisor import Advice, AutoPlacement, advise
from hetero_replay.advisor.profile import HOST_REPETITION_S, Clock, Timer, Timing
from hetero_replay.advisor.workload import ALGOS, Candidate, ReplayConfig, WorkloadSpec
from hetero_replay.checks import (
    MAX_BATCH,
    check_bool,
    check_int,
    check_real,
    check_seed,
    check_staleness,
    is_int,
    is_real,
)
from hetero_replay.closing import close_when_gone
from hetero_replay.forksafe import OUTER, ForkSafeLock, holding
from hetero_replay.options import check_beta
from hetero_replay.pipeline import AUTO_WINDOW
from hetero_replay.placement import HOST, one_policy_placement
from hetero_replay.priorities import Normalise, check_normalise, normalise_by_batch, td_magnitudes
from hetero_replay.registry import install_hint
from hetero_replay.schedule import PendingUpdate, Schedule
from hetero_replay.storage.base import CheckedRows
from hetero_replay.storage.durable import DURABLE, DurableFile, FlushSchedule, check_path, read_point
from hetero_replay.storage.schema import PLAIN_KINDS
from hetero_replay.torch_batches import same_device
from hetero_replay.trees.base import is_device_tree

__all__ = [
    "td_magnitudes",
    "is_device_tree",
    "ALGOS",
    "AUTO_WINDOW",
    "DURABLE",
    "HOST",
    "HOST_REPETITION_S",
    "MAX_BATCH",
    "OUTER",
    "PLAIN_KINDS",
    "Advice",
    "AutoPlacement",
    "Candidate",
    "CheckedRows",
    "Clock",
    "DurableFile",
    "FlushSchedule",
    "ForkSafeLock",
    "Normalise",
    "PendingUpdate",
    "ReplayConfig",
    "RowStager",
    "Schedule",
    "Timer",
    "Timing",
    "WorkloadSpec",
    "advise",
    "check_beta",
    "check_bool",
    "check_int",
    "check_normalise",
    "check_real",
    "check_path",
    "check_seed",
    "check_staleness",
    "close_when_gone",
    "holding",
    "install_hint",
    "is_int",
    "is_real",
    "normalise_by_batch",
    "one_policy_placement",
    "read_point",
    "same_device",
]
