"""The advisor's core: timing, profiles on disk, the model's formulas, the design space, the ranking.

The model is checked against hand-computed numbers on constructed profiles
(data, not timings), so nothing here depends on this machine's speed. The host
libraries' workloads have their own tests (test_advisor_*_workload.py); the
end-to-end paths (cache, CLI, ``placement="auto"``) are in test_advisor_e2e.py.
"""

from __future__ import annotations

import json
import math

import pytest

from hetero_replay import registry
from hetero_replay.advisor import (
    Advice,
    Candidate,
    Profile,
    ProfileError,
    ReplayConfig,
    Timing,
    WorkloadSpec,
    advise,
    explore,
    model,
    profile,
)
from hetero_replay.advisor.profile import MODELLED, ReplayEntry
from hetero_replay.placement import Placement

US = 1e-6


def spec(**overrides) -> WorkloadSpec:
    base = dict(lib="sb3", algo="dqn", env="CartPole-v1", batch_size=256, buffer_size=1000, n_envs=1,
                collect_steps=4, gradient_steps=1)  # fmt: skip
    return WorkloadSpec(**{**base, **overrides})


def entry(config: ReplayConfig, insert=10, sample=100, update=50, phase_relaxed=None, source=profile.MEASURED,
          worker=None):  # fmt: skip
    times = {
        "insert": Timing.of(insert * US),
        "sample": Timing.of(sample * US),
        "update": Timing.of(update * US),
        "phase_relaxed": None if phase_relaxed is None else Timing.of(phase_relaxed * US),
    }
    return ReplayEntry(config, times, source, worker)


NATIVE = ReplayConfig("native", 1, "host")
NUMPY = ReplayConfig("numpy", 1, "host")


def make_profile(entries, workload=None, cores=2, torch_threads=1, env=20, inference=60, collect=200, learn=1000,
                 phase=1800, phase_inline=1830, reference=NATIVE) -> Profile:  # fmt: skip
    """Host steps of a DQN-like phase: f = 4 collect steps of 200 us, g = 1 gradient step of 1000 us."""
    host = {
        "cpu": {
            "env_step": Timing.of(env * US),
            "inference": Timing.of(inference * US),
            "collect": Timing.of(collect * US),
            "learn": Timing.of(learn * US),
            "phase": Timing.of(phase * US),
            "phase_inline": Timing.of(phase_inline * US),
            "reference": reference.to_dict(),
        }
    }
    machine = {"cores": cores, "torch_threads": torch_threads}
    return Profile(workload or spec(), machine, host, list(entries), seconds=1.0)


# -- measure ------------------------------------------------------------------------------


def test_measure_reports_the_median_of_the_repetitions_per_call():
    calls = []
    timing = profile.measure(lambda: calls.append(1), repeats=20, warmup=2)
    assert timing.n == 20
    assert timing.calls >= 1
    assert len(calls) == 2 + 20 * timing.calls  # warm-up, then repeats x calls per repetition
    assert 0 < timing.q1 <= timing.median <= timing.q3


def test_measure_groups_fast_calls_into_repetitions_of_the_minimum_length():
    fast = profile.measure(lambda: None, repeats=5, min_repetition_s=1e-3)
    assert fast.calls > 1  # a no-op takes far less than 1 ms


@pytest.mark.parametrize("kwargs", [dict(repeats=0), dict(warmup=-1)])
def test_measure_refuses_bad_counts(kwargs):
    with pytest.raises(ValueError, match="repeats"):
        profile.measure(lambda: None, **kwargs)


# -- profiles on disk -----------------------------------------------------------------------


def test_a_profile_round_trips_through_its_file(tmp_path):
    original = make_profile([entry(NATIVE, phase_relaxed=900), entry(NUMPY, source=MODELLED)])
    original.skipped.append({"config": ReplayConfig("cupy", 1, "host").to_dict(), "reason": "no GPU"})
    path = original.save(tmp_path / "deep" / "p.json")
    loaded = Profile.load(path)
    assert loaded.to_dict() == original.to_dict()
    assert loaded.entry(NUMPY).source == MODELLED
    assert loaded.entry(NATIVE).times["phase_relaxed"].median == pytest.approx(900 * US)
    assert not list(tmp_path.rglob("*.tmp"))  # written atomically


@pytest.mark.parametrize(
    "text, match",
    [
        ("not json", "not a hetero-replay profile"),
        ('{"format": 99}', "format 99"),
        ('{"format": 1, "workload": {}}', "not a hetero-replay profile"),
        ("[]", "not a hetero-replay profile"),
    ],
)
def test_a_file_that_is_not_a_profile_is_a_clear_error(tmp_path, text, match):
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(ProfileError, match=match):
        Profile.load(path)


def test_the_cache_key_changes_with_the_workload_and_the_configurations(tmp_path, monkeypatch):
    monkeypatch.setenv("HETERO_REPLAY_CACHE", str(tmp_path))
    a = profile.cache_path(spec(), [NATIVE], ["cpu"])
    assert a.parent == tmp_path / "profiles"
    assert a == profile.cache_path(spec(), [NATIVE], ["cpu"])
    assert a != profile.cache_path(spec(batch_size=64), [NATIVE], ["cpu"])
    assert a != profile.cache_path(spec(), [NATIVE, NUMPY], ["cpu"])


# -- the model ------------------------------------------------------------------------------
# Reference (native): I_r = 10, S_r = 100, U_r = 50 us; phase 1800 us with f = 4, g = 1, so the
# phase without the replay is H = 1800 - 4 * 10 - 150 = 1610 us and T_train = 1000 - 150 = 850 us.
H = 1800 - 4 * 10 - 150


def test_the_reference_predicts_its_measured_phase():
    p = make_profile([entry(NATIVE)])
    prediction = model.predict(p, Candidate(NATIVE, 0))
    assert prediction.phase_s == pytest.approx(1800 * US)
    assert prediction.env_steps_per_s == pytest.approx(4 / prediction.phase_s)
    assert prediction.learner_steps_per_s == pytest.approx(1 / prediction.phase_s)
    assert prediction.worker == "none"


def test_strict_swaps_the_replay_primitives_into_the_phase():
    p = make_profile([entry(NATIVE), entry(NUMPY, insert=30, sample=400, update=200)])
    numpy = model.predict(p, Candidate(NUMPY, 0))
    assert numpy.phase_s == pytest.approx((H + 4 * 30 + 600) * US)


def test_the_breakdown_adds_up_to_the_phase_per_env_step():
    p = make_profile([entry(NATIVE), entry(NUMPY, insert=30, sample=400, update=200)],
                     workload=spec(n_envs=4, collect_steps=2, gradient_steps=3), phase=4000)  # fmt: skip
    for candidate in (Candidate(NUMPY, 0), Candidate(NUMPY, 1)):
        prediction = model.predict(p, candidate)
        assert sum(prediction.breakdown.values()) == pytest.approx(prediction.phase_s / 8)
        assert set(prediction.breakdown) == set(model.PARTS)
    parts = model.predict(p, Candidate(NUMPY, 0)).breakdown
    assert parts["train"] == pytest.approx(3 * 850 * US / 8)
    assert parts["env step"] == pytest.approx(2 * 20 * US / 8)


def test_relaxed_inline_adds_the_pipelines_bookkeeping():
    p = make_profile([entry(NATIVE)])  # no worker thread timed: inline
    strict = model.predict(p, Candidate(NATIVE, 0))
    relaxed = model.predict(p, Candidate(NATIVE, 1))
    assert relaxed.worker == "inline"
    assert relaxed.phase_s - strict.phase_s == pytest.approx(30 * US)  # phase_inline - phase
    assert relaxed.breakdown["pipeline"] == pytest.approx(30 * US / 4)


def test_relaxed_with_a_thread_overlaps_replay_with_the_rest_of_the_phase():
    # A replay-heavy configuration: R = 3000 us a gradient step, the worker thread measured at 3500 us a phase.
    heavy = entry(NUMPY, sample=2000, update=1000, phase_relaxed=3500)
    p = make_profile([entry(NATIVE), heavy], workload=spec(collect_steps=1), phase=1200, phase_inline=1230)
    prediction = model.predict(p, Candidate(NUMPY, 1))
    assert prediction.worker == "thread"  # share = 3000 / (strict phase + bookkeeping) >= 1/4
    rest = 1200 - 10 - 150
    main, work = rest + 10 + 2000, 3000  # the phase's first sample is drawn again on the learner's thread
    assert model.contention(p, heavy) == 0.0  # 1 torch thread + 1 replay thread on 2 cores
    assert prediction.phase_s == pytest.approx(max(model.overlap(main, work, 0.0), 3500) * US)
    assert prediction.phase_s < model.predict(p, Candidate(NUMPY, 0)).phase_s


def test_cores_that_are_wanted_twice_slow_the_overlap():
    heavy = entry(NUMPY, sample=2000, update=1000, phase_relaxed=1)  # a calibration below the overlap bound
    one_core = make_profile([entry(NATIVE), heavy], workload=spec(collect_steps=1), cores=1, phase=1200)
    two_cores = make_profile([entry(NATIVE), heavy], workload=spec(collect_steps=1), cores=2, phase=1200)
    assert model.contention(one_core, heavy) == 1.0  # two threads on one core: no overlap at all
    assert model.contention(two_cores, heavy) == 0.0
    assert model.overlap(5, 3, 1.0) == 8 and model.overlap(5, 3, 0.0) == 5
    assert model.predict(one_core, Candidate(NUMPY, 1)).phase_s > model.predict(two_cores, Candidate(NUMPY, 1)).phase_s


def test_a_recorded_decision_of_auto_is_used_with_its_measured_phase():
    measured_inline = entry(NUMPY, sample=2000, update=1000, phase_relaxed=7000, worker="inline")
    p = make_profile([entry(NATIVE), measured_inline], workload=spec(collect_steps=1), phase=1200)
    prediction = model.predict(p, Candidate(NUMPY, 1))
    assert prediction.worker == "inline"  # the rule alone would say "thread"
    assert prediction.phase_s == pytest.approx(7000 * US)
    assert Profile.from_dict(p.to_dict()).entry(NUMPY).worker == "inline"


def test_auto_keeps_light_replay_work_on_the_learners_thread():
    light = entry(NATIVE, sample=50, update=20, phase_relaxed=5000)  # a thread would cost a lot
    p = make_profile([light], reference=NATIVE)
    assert model.predict(p, Candidate(NATIVE, 1)).worker == "inline"


@pytest.mark.parametrize("g, expected", [(1, "inline"), (4, "thread")])
def test_auto_counts_collect_phases_in_the_interval_only_when_most_intervals_hold_one(g, expected):
    # R = 400 us; a gradient step ~1300 us; a phase with 4 collect steps of ~1 ms besides.
    c = entry(NATIVE, sample=300, update=100, phase_relaxed=1)
    p = make_profile([c], workload=spec(gradient_steps=g), collect=1000, learn=1300, phase=4000 + g * 1300,
                     phase_inline=4000 + g * 1300)  # fmt: skip
    assert model.predict(p, Candidate(NATIVE, 1)).worker == expected


def test_a_profile_without_the_learner_or_the_config_is_a_key_error():
    p = make_profile([entry(NATIVE)])
    with pytest.raises(KeyError, match="cuda"):
        model.predict(p, Candidate(ReplayConfig("native", 1, "host", learner="cuda:0"), 0))
    with pytest.raises(KeyError, match="numpy"):
        model.predict(p, Candidate(NUMPY, 0))


# -- the design space -----------------------------------------------------------------------


def test_every_enumerated_configuration_is_a_valid_placement_here():
    configs = explore.replay_configs(["cpu"])
    assert configs[0] == explore.default_config("cpu")
    assert len(set(configs)) == len(configs)
    for config in configs:
        config.placement(check=True)  # raises if not valid here
        assert config.tree in registry.backends()


def test_threaded_backends_and_storages_get_each_thread_count():
    configs = explore.replay_configs(["cpu"], threads=[1, 2, 4])
    natives = {c.threads for c in configs if c.tree == "native" and c.storage == "host"}
    assert natives == {1, 2, 4}
    # the torch tree on torch storage runs no native threads: one entry
    assert [c.threads for c in configs if c.tree == "torch" and c.storage == "cpu"] == [1]
    assert explore.thread_counts(6) == [1, 2, 4, 6]
    assert explore.thread_counts(1) == [1]


def test_a_plugin_backend_enters_the_design_space(monkeypatch):
    from hetero_replay.trees import make_tree

    def factory(capacity, fanout, dtype, device):
        return make_tree("numpy", capacity, fanout=fanout, dtype=dtype)

    registry.register_backend("test-plugin", factory, devices=("cpu",), description="test")
    try:
        assert any(c.tree == "test-plugin" for c in explore.replay_configs(["cpu"]))
    finally:
        registry._backends.pop("test-plugin")


# -- ranking and advice ---------------------------------------------------------------------


#: Stands for a device whose times come from an analytical model (the FPGA issue adds a real one).
MODEL_ONLY = ReplayConfig("torch", 1, "host")


def ranked_profile() -> Profile:
    return make_profile(
        [
            entry(NATIVE),
            entry(ReplayConfig("native", 2, "host"), sample=60, update=40),
            entry(NUMPY, insert=30, sample=400, update=200),
            entry(MODEL_ONLY, sample=300, update=100, source=MODELLED),
        ]
    )


def test_rank_sorts_by_prediction_and_tags_best_default_and_baseline():
    rows = explore.rank(ranked_profile(), staleness=(0, 1))
    assert len(rows) == 8
    predicted = [r.predicted for r in rows[1:]]
    assert predicted == sorted(predicted, reverse=True)
    assert rows[0].predicted >= max(predicted) * (1 - explore.TIE)
    assert "best" in rows[0].tags
    assert [r.candidate for r in rows if "default" in r.tags] == [Candidate(NATIVE, 0)]
    assert [r.candidate for r in rows if "baseline" in r.tags] == [Candidate(NUMPY, 0)]


def test_a_modelled_device_is_ranked_and_marked_predicted_only():
    rows = explore.rank(ranked_profile(), staleness=(0,))
    modelled = [r for r in rows if r.candidate.replay == MODEL_ONLY]
    assert modelled and all(r.predicted_only for r in modelled)
    assert not any(r.predicted_only for r in rows if r.candidate.replay != MODEL_ONLY)


def test_near_ties_go_to_the_smaller_staleness():
    rows = explore.rank(make_profile([entry(NATIVE)], phase_inline=1800), staleness=(0, 1, 2))
    assert rows[0].candidate.staleness == 0  # relaxed inline is no faster without bookkeeping cost


def test_advice_from_a_saved_profile_needs_no_host_library(tmp_path):
    path = ranked_profile().save(tmp_path / "p.json")
    advice = advise(profile=path, staleness=(0,))
    assert isinstance(advice, Advice)
    best = advice.best
    assert isinstance(best.placement, Placement) and best.staleness == 0
    assert best.threads == advice.rows[0].candidate.threads
    summary = advice.summary()
    assert summary["speedup_vs_baseline"] == pytest.approx(advice.rows[0].predicted / advice.row("baseline").predicted)
    assert "mape" not in summary  # nothing validated
    assert "chose" in advice.explain()
    table = advice.table()
    assert "predicted only" in table
    written = advice.save(tmp_path / "out")
    assert {p.name for p in written} == {"advice.txt", "advice.json", "advice.png", "profile.json"}
    data = json.loads((tmp_path / "out" / "advice.json").read_text())
    assert json.dumps(data)  # plain JSON


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (dict(), ValueError, "needs a workload"),
        (dict(staleness=()), ValueError, "at least one"),
        (dict(staleness=(-1,)), ValueError, "staleness"),
        (dict(algo="dqn"), TypeError, "without lib"),
        (dict(lib="keras"), ValueError, "lib must be one of"),
    ],
)
def test_bad_advise_arguments_are_refused(kwargs, error, match):
    with pytest.raises(error, match=match):
        advise(**kwargs)


def test_validation_summary_counts_errors_and_the_top_ranked_within_five_percent(tmp_path):
    advice = advise(profile=ranked_profile(), staleness=(0,))
    rows = advice.rows
    for row, factor in zip(rows, (1.1, 0.8, 1.0, 1.25)):
        row.measured = row.predicted / factor  # predicted = factor * measured
    summary = advice.summary()
    assert summary["mape"] == pytest.approx((0.1 + 0.2 + 0.0 + 0.25) / 4)
    measured_top = max(r.measured for r in rows)
    assert summary["top_ranked_within_5pct"] == (rows[0].measured >= 0.95 * measured_top)
    assert math.isfinite(summary["measured_speedup_vs_baseline"])


def test_clock_watch_rest_times_a_call_less_its_inner_calls_call_by_call() -> None:
    """A training step's collection is the step less its gradient steps, per call: never negative."""
    import time
    import types

    from hetero_replay.advisor.profile import Clock, measure_in_loop

    loop = types.SimpleNamespace()
    loop.inner = lambda: time.sleep(0.02)

    def outer() -> None:
        time.sleep(0.002)
        loop.inner()
        loop.inner()

    loop.outer = outer
    clock = Clock()
    clock.watch(loop, "outer")
    clock.watch(loop, "inner")
    clock.watch_rest(loop, "outer", "rest", "inner")
    _, parts = measure_in_loop(lambda: loop.outer(), clock, repeats=3, warmup=1, min_repetition_s=0.0)
    rest, inner, whole = parts["rest"], parts["inner"], parts["outer"]
    # The 2 ms outside the two 20 ms inner calls (with one inner call it would be >= 22 ms; the
    # margin is for a busy machine's late wake-ups).
    assert 0.002 <= rest.q1 <= rest.median < 0.015
    assert inner.median >= 0.02 and whole.median >= 0.042
    assert rest.calls == whole.calls and inner.calls == 2 * whole.calls
    assert clock.seconds["rest"][0] == pytest.approx(
        clock.seconds["outer"][0] - sum(clock.seconds["inner"][:2]), abs=5e-4
    )
