r"""The performance model: a placement's env steps/s and learner steps/s from a profile.

Notation, per workload (:class:`~hetero_replay.advisor.workload.WorkloadSpec`):
``n`` envs stepped together, ``f`` collect steps per training phase (SB3's
``train_freq``), ``g`` gradient steps per phase; ``C`` cores, ``P`` torch
threads. Per learner device ``d`` the profile holds the host library's steps,
timed inside its own training loop with a reference replay configuration
``r``: ``phase_d`` (one training phase: ``f`` collect steps, then ``g``
gradient steps), ``learn_d`` (one of its gradient steps), ``inline_d`` (a phase
with staleness 1 on the learner's thread), and, alone, the env step and the
policy's forward pass (for the breakdown). Per replay configuration ``c``
(tree, threads ``t_c``, storage, learner) it holds ``I_c`` insert, ``S_c``
sample and ``U_c`` update, each timed per call inside the same loop (so what
the other stages cost them, caches and allocator, is counted), and
``thread_c``, a phase with staleness 1 and the worker thread.

The model keeps the phase and swaps the reference's replay primitives for the
candidate's::

    H       = phase_d - f * I_r - g * (S_r + U_r)     the phase without the replay
    T_train = learn_d - S_r - U_r                     a gradient step without the replay
    R_c     = S_c + U_c                               the replay's share of a gradient step

**Strict** (``k = 0``; stages add up)::

    T_phase = H + f * I_c + g * R_c

**Relaxed** (``k >= 1``): the relaxed pipeline runs its work on a worker
thread or on the learner's thread, as ``worker="auto"`` decides (its rule: the
thread once the replay work it sees, the core engine's sample and update, is at
least ``AUTO_WORKER_SHARE``, 1/4, of the median interval between two samples).
The profile holds ``relaxed_c``, a phase with staleness 1 once ``auto`` has
decided, and what it decided; a workload without a worker thread (Tianshou)
always runs inline and has none.

*On the learner's thread*: the same work plus the pipeline's bookkeeping
``Q = inline_d - phase_d``, measured for the configuration where it can be::

    T_phase = relaxed_c        (without it: H + f * I_c + g * R_c + Q)

*With the worker thread*: the worker samples and updates while the learner's
thread collects and trains. A collect phase's inserts void the batch drawn
ahead across them (a batch never misses rows added before its ``sample``
call), so the first sample of each phase is drawn again on the learner's
thread. The overlapped work shares the cores: the shorter side is slowed by the
share ``rho`` of the cores both sides want beyond ``C`` (two threads that each
want a core do not both get one). That bounds the phase from below; what the
thread costs besides (GIL hand-overs, waking the worker, the voided draw) is in
the measured ``relaxed_c``::

    rho        = clip((P + t_c) / C - 1, 0, 1)
    over(a, b) = max(a, b) + rho * min(a, b)
    main       = H + f * I_c + S_c,   worker = g * R_c
    T_phase    = max(over(main, worker), relaxed_c)

Where the profile does not say what ``auto`` decided, the model applies its
rule: a gradient step lasts ``T_step = T_train + R_c + Q / g``; the interval
that spans a collect phase lasts the inline phase less ``(g - 1) * T_step``.
With ``g = 1`` every interval spans one, with ``g >= 3`` most do not
(``T_step``), ``g = 2`` averages the two.

**Throughput**::

    env steps/s     = f * n / T_phase
    learner steps/s = g / T_phase

Per env step, the time splits into env step, inference, insert, sample,
train, update, host-library bookkeeping (the rest of ``H``) and pipeline
(bookkeeping, or hand-off less the overlap gained); the report stacks these.
"""

from __future__ import annotations

import dataclasses

from hetero_replay.advisor.profile import Profile, ReplayEntry
from hetero_replay.advisor.workload import Candidate
from hetero_replay.pipeline import AUTO_WORKER_SHARE

#: Parts of an env step's time, in the report's order.
PARTS = ("env step", "inference", "host library", "insert", "sample", "train", "update", "pipeline")


@dataclasses.dataclass(frozen=True)
class Prediction:
    """What the model predicts for one candidate.

    Attributes:
        env_steps_per_s: environment steps per second of training.
        learner_steps_per_s: gradient steps per second.
        worker: ``"none"`` (strict), ``"inline"`` or ``"thread"`` (where the relaxed pipeline's work runs).
        breakdown: seconds per environment step, by part (:data:`PARTS`).
        phase_s: seconds of one training phase (``f`` collect steps and ``g`` gradient steps).
    """

    env_steps_per_s: float
    learner_steps_per_s: float
    worker: str
    breakdown: dict[str, float]
    phase_s: float


def predict(profile: Profile, candidate: Candidate) -> Prediction:
    """The model's throughput for ``candidate`` from ``profile`` (the formulas are in the module docstring).

    Raises:
        KeyError: the profile has no entry for the candidate's replay configuration or learner device.
    """
    spec = profile.workload
    learner = candidate.replay.learner
    if learner not in profile.host:
        raise KeyError(f"the profile has no host steps on {learner!r}")
    entry = profile.entry(candidate.replay)
    ref = profile.entry(profile.reference(learner))
    f, g, n = spec.collect_steps, spec.gradient_steps, spec.n_envs

    env, inference = profile.host_time(learner, "env_step"), profile.host_time(learner, "inference")
    phase_ref, learn = profile.host_time(learner, "phase"), profile.host_time(learner, "learn")
    bookkeeping = profile.host_time(learner, "phase_inline") - phase_ref
    insert, sample, update = entry["insert"], entry["sample"], entry["update"]
    replay = sample + update
    rest = phase_ref - f * ref["insert"] - g * (ref["sample"] + ref["update"])
    t_train = max(0.0, learn - ref["sample"] - ref["update"])
    strict = rest + f * insert + g * replay

    worker, phase = "none", strict
    if candidate.staleness and g:
        relaxed = entry.times.get("phase_relaxed")
        worker = entry.worker or choose_worker(profile, entry, strict + bookkeeping, t_train + replay + bookkeeping / g)
        if relaxed is None:
            phase = strict + bookkeeping
        elif worker == "inline":
            phase = relaxed.expected
        else:
            main, work = rest + f * insert + sample, g * replay
            phase = max(overlap(main, work, contention(profile, entry)), relaxed.expected)
    steps = f * n
    parts = {
        "env step": f * env,
        "inference": f * inference,
        "insert": f * insert,
        "sample": g * sample,
        "train": g * t_train,
        "update": g * update,
        "host library": rest - f * (env + inference) - g * t_train,
        "pipeline": phase - strict,
    }
    return Prediction(
        env_steps_per_s=steps / phase,
        learner_steps_per_s=g / phase,
        worker=worker,
        breakdown={k: v / steps for k, v in parts.items()},
        phase_s=phase,
    )


def overlap(a: float, b: float, rho: float) -> float:
    """Time of two overlapped stages of lengths ``a`` and ``b`` when a share ``rho`` of the shorter must wait for cores."""
    return max(a, b) + rho * min(a, b)


def contention(profile: Profile, entry: ReplayEntry) -> float:
    """``rho``: the share of the overlapped work that finds no free core (torch threads + replay threads vs cores)."""
    cores = max(1, int(profile.machine.get("cores") or 1))
    torch_threads = max(1, int(profile.machine.get("torch_threads") or 1))
    wanted = torch_threads + max(1, entry.config.threads)
    return min(1.0, max(0.0, wanted / cores - 1.0))


def choose_worker(profile: Profile, entry: ReplayEntry, phase_inline: float, step: float) -> str:
    """``"thread"`` or ``"inline"``: what ``worker="auto"`` settles on for this entry (see the module docstring).

    Args:
        profile: the profile ``entry`` belongs to.
        entry: the candidate's replay configuration.
        phase_inline: the candidate's phase with the relaxed schedule inline.
        step: one of its gradient steps.
    """
    if entry.times.get("phase_relaxed") is None:
        return "inline"
    g = profile.workload.gradient_steps
    with_collect = phase_inline - (g - 1) * step
    if g == 1:
        interval = with_collect
    elif g == 2:
        interval = (with_collect + step) / 2
    else:
        interval = step
    work = entry["engine_work"] if entry.times.get("engine_work") is not None else entry["sample"] + entry["update"]
    share = work / max(interval, 1e-12)
    return "thread" if share >= AUTO_WORKER_SHARE else "inline"


__all__ = ["PARTS", "Prediction", "choose_worker", "contention", "overlap", "predict"]
