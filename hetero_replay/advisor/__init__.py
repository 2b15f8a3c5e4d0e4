"""The placement advisor: which device should run each PER primitive, for this algorithm on this machine.

Design-space exploration over an analytical model (Zhang, Meng, Prasanna,
TPDS 2023), in these steps, one module each:

* :mod:`~hetero_replay.advisor.profile` times every primitive (env step,
  inference, collect, insert, sample, priority update, train) on every usable
  device, backend, thread count and storage, with the host library's real
  code; the profile is cached per machine and setup.
* :mod:`~hetero_replay.advisor.model` predicts env steps/s and learner
  steps/s of a placement, strict or relaxed (formulas in its docstring).
* :mod:`~hetero_replay.advisor.devices` adds devices that are not here, from
  analytical models (the FPGA RMM's cycle model), ranked *predicted only*.
* :mod:`~hetero_replay.advisor.explore` enumerates every valid placement from
  the registry and ranks them; :mod:`~hetero_replay.advisor.report` prints,
  saves and plots the ranking.
* :mod:`~hetero_replay.advisor.validation` trains the top placements end to end
  and reports measured against predicted.

Example::

    from hetero_replay.advisor import advise

    advice = advise(lib="sb3", algo="dqn", env="CartPole-v1", batch_size=256, buffer_size=1_000_000)
    print(advice.table())
    choice = advice.best            # .placement, .staleness, .threads
    model = PERDQN("MlpPolicy", "CartPole-v1", placement=choice.apply(), staleness=choice.staleness)

or let the adapters ask: ``PERDQN(..., placement="auto")``. From the shell:
``hetero-replay advise --lib sb3 --algo dqn --env CartPole-v1 --batch-size 256 --buffer-size 1000000``.

The host libraries' side (timing their steps, training end to end) lives in
their adapters (:data:`~hetero_replay.advisor.workload.LIBRARIES`); this
package never imports them.
"""

from hetero_replay.advisor.advice import Advice, AutoPlacement, Choice, advise
from hetero_replay.advisor.explore import Row
from hetero_replay.advisor.profile import Profile, ProfileError, Timing, measure
from hetero_replay.advisor.validation import validate
from hetero_replay.advisor.workload import Candidate, ReplayConfig, Workload, WorkloadSpec, make_workload

__all__ = [
    "Advice",
    "AutoPlacement",
    "Candidate",
    "Choice",
    "Profile",
    "ProfileError",
    "ReplayConfig",
    "Row",
    "Timing",
    "Workload",
    "WorkloadSpec",
    "advise",
    "make_workload",
    "measure",
    "validate",
]
