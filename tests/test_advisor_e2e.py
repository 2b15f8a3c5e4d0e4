"""The advisor end to end on this machine: real profiles, the cache, validation, the CLI, ``placement="auto"``.

Tiny setups (N = 2000, B = 32) and three repetitions per timing keep each
profile to a few seconds; nothing asserts how fast anything is.
"""

from __future__ import annotations

import json

import pytest

pytest.importorskip("stable_baselines3")

import gymnasium as gym  # noqa: E402
import torch  # noqa: E402

import hetero_replay  # noqa: E402
from hetero_replay.advisor import (  # noqa: E402
    Advice,
    AutoPlacement,
    Profile,
    advise,
    make_workload,
    validate,
    validation,  # noqa: E402
)
from hetero_replay.advisor import profile as profiling  # noqa: E402
from hetero_replay.apps.cli import main  # noqa: E402
from hetero_replay.placement import Placement  # noqa: E402

N, B = 2000, 32
SETUP = dict(algo="dqn", env="CartPole-v1", batch_size=B, buffer_size=N)


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    """Every test caches its profiles in its own folder, and gets the thread settings back."""
    monkeypatch.setenv("HETERO_REPLAY_CACHE", str(tmp_path / "cache"))
    threads, torch_threads = hetero_replay.num_threads(), torch.get_num_threads()
    yield
    hetero_replay.set_num_threads(threads)
    torch.set_num_threads(torch_threads)


def quick_advice(**kwargs) -> Advice:
    return advise(lib="sb3", repeats=3, threads=[1, 2], **{**SETUP, **kwargs})


def test_a_second_advise_of_the_same_setup_reads_the_cached_profile(tmp_path):
    first = quick_advice()
    cached = list((tmp_path / "cache" / "profiles").glob("*.json"))
    assert len(cached) == 1
    mtime = cached[0].stat().st_mtime_ns
    second = quick_advice()
    assert cached[0].stat().st_mtime_ns == mtime  # read, not measured and written again
    assert second.profile.to_dict() == first.profile.to_dict()  # the same measurements, timestamp included
    assert [r.candidate for r in second.rows] == [r.candidate for r in first.rows]
    other = quick_advice(batch_size=16)  # another setup: another profile
    assert other.profile.workload.batch_size == 16
    assert len(list((tmp_path / "cache" / "profiles").glob("*.json"))) == 2


def test_a_profile_covers_every_configuration_and_every_primitive():
    advice = quick_advice(staleness=(0, 1))
    profile = advice.profile
    assert set(profile.host["cpu"]) == {*profiling.HOST_STEPS, "reference"}
    trees = {e.config.tree for e in profile.replay}
    assert {"native", "numpy"} <= trees
    for entry in profile.replay:
        assert all(t.median > 0 and t.n >= 3 for t in entry.times.values() if t is not None)
    assert len(advice.rows) == 2 * len(profile.replay)
    assert {"best", "default", "baseline"} <= set().union(*(r.tags for r in advice.rows))


def test_an_unreadable_cached_profile_is_measured_again(tmp_path):
    quick_advice()
    (path,) = (tmp_path / "cache" / "profiles").glob("*.json")
    path.write_text("{broken")
    advice = quick_advice()
    assert advice.profile.seconds > 0
    assert Profile.load(path).to_dict() == advice.profile.to_dict()  # rewritten


def test_a_profile_of_another_setup_is_refused(tmp_path):
    saved = quick_advice().profile.save(tmp_path / "p.json")
    workload = make_workload("sb3", **{**SETUP, "batch_size": 64})
    with pytest.raises(ValueError, match="the profile is of"):
        advise(workload, profile=saved)


def test_validation_measures_the_chosen_rows_and_reports_their_errors():
    advice = quick_advice(staleness=(0,))
    workload = make_workload("sb3", **SETUP)
    rows = validation.choose(advice, top=1)
    assert rows[0] is advice.rows[0]
    assert {"default", "baseline"} <= set().union(*(r.tags for r in rows))
    summary = validate(advice, workload, rows, env_steps=400, repeats=2)
    for row in rows:
        assert row.measured is not None and row.measured > 0
        low, high = row.measured_spread
        assert low <= row.measured <= high
    assert summary["validated"] == len(rows)
    assert summary["mape"] == pytest.approx(sum(abs(r.error) for r in rows) / len(rows))
    assert isinstance(summary["top_ranked_within_5pct"], bool)
    with pytest.raises(ValueError, match="repeats"):
        validate(advice, workload, rows, repeats=0)
    with pytest.raises(ValueError, match="the advice is for"):
        validate(advice, make_workload("sb3", **{**SETUP, "batch_size": 16}), rows)


# -- the command ---------------------------------------------------------------------------------


def test_the_advise_command_prints_the_ranking_and_writes_table_json_plot_profile(tmp_path, capsys):
    out = tmp_path / "out"
    code = main(["advise", "--lib", "sb3", "--algo", "dqn", "--env", "CartPole-v1", "--batch-size", str(B),
                 "--buffer-size", str(N), "--no-progress", "--out", str(out)])  # fmt: skip
    assert code == 0
    printed = capsys.readouterr().out
    assert "chose" in printed and "native" in printed
    assert {p.name for p in out.iterdir()} == {"advice.txt", "advice.json", "advice.png", "profile.json"}
    data = json.loads((out / "advice.json").read_text())
    assert len(data["rows"]) >= 2
    # the saved profile plans for that machine from anywhere, without the host library
    again = tmp_path / "again"
    assert main(["advise", "--profile", str(out / "profile.json"), "--no-progress", "--out", str(again)]) == 0
    assert json.loads((again / "advice.json").read_text())["rows"][0]["label"] == data["rows"][0]["label"]


@pytest.mark.parametrize(
    "argv, message",
    [
        (["advise"], "give --lib"),
        (["advise", "--profile", "missing.json"], "missing.json"),
        (["advise", "--lib", "keras"], "lib must be one of"),
        (["advise", "--lib", "sb3", "--staleness", "0,x"], "--staleness"),
        (["advise", "--lib", "sb3", "--algo", "dqn", "--env", "Pendulum-v1"], "Discrete"),
    ],
)
def test_the_advise_command_refuses_bad_input_with_a_message(argv, message, capsys):
    assert main([*argv, "--no-progress"]) == 2
    assert message in capsys.readouterr().err


def test_validating_from_a_profile_alone_is_refused(tmp_path, capsys):
    path = quick_advice().profile.save(tmp_path / "p.json")
    assert main(["advise", "--profile", str(path), "--validate", "--no-progress"]) == 2
    assert "--validate trains" in capsys.readouterr().err


# -- the adapters' placement="auto" -----------------------------------------------------------------


def test_perdqn_auto_takes_the_advisors_best_placement_and_threads(counting_env):
    from hetero_replay.adapters.sb3 import PERDQN

    advise(lib="sb3", algo=PERDQN, env="CartPole-v1", batch_size=B, buffer_size=N, repeats=3, staleness=(0,))
    user_env = counting_env("CartPole-v1")
    hetero_replay.set_num_threads(1 if hetero_replay.num_threads() > 1 else 2)  # auto must set it
    model = PERDQN("MlpPolicy", user_env, batch_size=B, buffer_size=N, placement="auto", learning_starts=50, seed=0)
    assert user_env.calls == 0  # profiled through copies (here: read from the cache)
    best = model.advice.best
    assert isinstance(model.placement, Placement) and model.placement == best.placement
    assert hetero_replay.num_threads() == best.threads
    assert model.staleness == best.staleness == 0
    model.learn(200)
    assert model.replay_buffer.size() > 0


def test_perdqn_auto_keeps_the_staleness_and_device_asked_for():
    from hetero_replay.adapters.sb3 import PERDQN

    model = PERDQN("MlpPolicy", "CartPole-v1", batch_size=B, buffer_size=N, placement="auto", staleness=2, device="cpu")
    assert model.staleness == 2
    assert {r.candidate.staleness for r in model.advice.rows} == {2}
    assert {r.candidate.replay.learner for r in model.advice.rows} == {"cpu"}


def test_a_placement_string_other_than_auto_is_refused():
    from hetero_replay.adapters.sb3 import PERDQN

    with pytest.raises(TypeError, match="'auto' or None, got str 'fastest'"):
        PERDQN("MlpPolicy", "CartPole-v1", placement="fastest")


def test_tianshou_wrapper_takes_the_advisors_best_placement():
    pytest.importorskip("tianshou")
    from hetero_replay.adapters.tianshou import HeteroPrioritizedVectorReplayBuffer, PEROffPolicyWrapper
    from hetero_replay.adapters.tianshou.workload import STANDARD_HYPERPARAMS, standard_algorithm

    dqn = standard_algorithm("dqn", gym.make("CartPole-v1"), STANDARD_HYPERPARAMS["dqn"])
    before = {k: v.clone() for k, v in dqn.policy.state_dict().items()}
    auto = AutoPlacement(env="CartPole-v1", batch_size=B, buffer_size=N, n_envs=2)
    with pytest.raises(ValueError, match="AutoPlacement"):
        PEROffPolicyWrapper(wrapped_algorithm=dqn, beta=0.4, placement="auto")
    algorithm = PEROffPolicyWrapper(wrapped_algorithm=dqn, beta=0.4, placement=auto)
    assert isinstance(algorithm.placement, Placement)
    assert algorithm.placement == algorithm.advice.best.placement
    assert hetero_replay.num_threads() == algorithm.advice.best.threads
    after = dqn.policy.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)  # profiled copies, not the algorithm
    HeteroPrioritizedVectorReplayBuffer(N, 2, placement=algorithm.placement)  # the buffer takes the same placement
