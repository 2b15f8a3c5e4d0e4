"""The comparison machinery: run plans, summary arithmetic, report files, and `hetero-replay compare`.

Runs are real (SB3 DQN on CartPole-v1) but tiny; the summary arithmetic is
checked on hand-made results whose answers are known.
"""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest

from hetero_replay.apps.cli import main
from hetero_replay.apps.compare import RunResult, RunSpec, driver, report

pytest.importorskip("stable_baselines3")

TINY = dict(steps=400, eval_every=200, eval_episodes=2)


def result(variant: str, seed: int, train_s: float, returns: list[float], cpu_s: float | None = None) -> RunResult:
    spec = RunSpec("sb3", "dqn", "CartPole-v1", variant, seed, steps=1000, eval_every=500)
    extra = {} if cpu_s is None else {"train_cpu_s": cpu_s}
    return RunResult(spec, wall_s=train_s + 1, train_s=train_s, eval_steps=[0, 500, 1000],
                     eval_returns=[float(r) for r in returns], extra=extra)  # fmt: skip


def test_build_specs_interleaves_variants_and_alternates_their_order() -> None:
    specs = driver.build_specs("sb3", "dqn", "CartPole-v1", 1000, seeds=[0, 1, 2], n_envs=2)
    assert [(s.variant, s.seed) for s in specs] == [
        ("uniform", 0), ("per", 0), ("per", 1), ("uniform", 1), ("uniform", 2), ("per", 2),
    ]  # fmt: skip
    assert all(s.eval_every == 100 and s.n_envs == 2 and s.torch_threads == 1 for s in specs)
    only = driver.build_specs("sb3", "dqn", "CartPole-v1", 1000, seeds=[0], variants=["per", "uniform", "per"])
    assert [s.variant for s in only] == ["uniform", "per"]  # baseline first, once each


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (dict(lib="keras-rl"), "unknown library"),
        (dict(algo="ppo"), "algorithms"),
        (dict(variants=["per", "best"]), "variants"),
        (dict(env_id="NoSuchEnv-v9"), "unknown environment"),
        (dict(steps=0), "steps"),
        (dict(seeds=[]), "seed"),
        (dict(n_steps=0), "n_steps must be >= 1"),
        (dict(lib="tianshou", n_steps=3), "the tianshou runner has no n-step returns"),
    ],
)
def test_build_specs_rejects_bad_requests(args: dict, match: str) -> None:
    request = dict(lib="sb3", algo="dqn", env_id="CartPole-v1", steps=1000, seeds=[0]) | args
    with pytest.raises(ValueError, match=match):
        driver.build_specs(**request)


def test_auc_is_the_mean_return_over_training() -> None:
    assert report.auc([0, 500, 1000], [0.0, 100.0, 100.0]) == pytest.approx(75.0)
    assert report.auc([0, 100, 1000], [10.0, 10.0, 10.0]) == pytest.approx(10.0)
    assert report.auc([0], [7.0]) == 7.0


def test_summarize_pairs_each_seed_with_its_baseline() -> None:
    results = [
        result("uniform", 0, 10.0, [0, 100, 200], cpu_s=10.0),
        result("per", 0, 8.0, [0, 200, 300], cpu_s=12.5),
        result("per", 1, 5.0, [0, 100, 100], cpu_s=5.0),
        result("uniform", 1, 4.0, [0, 50, 100], cpu_s=4.0),
    ]
    uniform, per = report.summarize(results)
    assert (uniform.variant, per.variant) == ("uniform", "per") and per.seeds == (0, 1)
    assert per.final_return.mean == pytest.approx(200.0) and per.final_return.std == pytest.approx(100.0)
    assert per.auc.mean == pytest.approx((175.0 + 75.0) / 2)
    assert per.env_steps_per_s.mean == pytest.approx((125.0 + 200.0) / 2)
    assert per.ratio.mean == pytest.approx((10 / 8 + 4 / 5) / 2)  # seed by seed, not ratio of means
    assert per.cpu_ratio.mean == pytest.approx((10 / 12.5 + 4 / 5) / 2)
    assert uniform.ratio.mean == 1.0
    table = report.format_table(results, [uniform, per])
    assert "baseline = uniform" in table and "1.025" in table and "200.0 ± 100.0" in table


def test_report_files(tmp_path) -> None:
    results = [result("uniform", 0, 10.0, [0, 100, 200]), result("per", 0, 8.0, [0, 200, 300])]
    summary = report.summarize(results)
    assert np.isnan(summary[1].cpu_ratio.mean)  # this runner did not report CPU time
    paths = report.write_all(results, summary, str(tmp_path / "out"))
    assert sorted(p.rsplit("/", 1)[1] for p in paths) == ["comparison.png", "curves.csv", "results.json", "runs.csv"]
    rows = list(csv.DictReader(open(tmp_path / "out" / "runs.csv")))
    assert [(r["variant"], float(r["env_steps_per_s"]), float(r["auc"])) for r in rows] == [
        ("uniform", 100.0, 100.0), ("per", 125.0, 175.0),
    ]  # fmt: skip
    curves = list(csv.DictReader(open(tmp_path / "out" / "curves.csv")))
    assert len(curves) == 6 and curves[4] == {"variant": "per", "seed": "0", "env_steps": "500", "mean_return": "200.0"}
    data = json.load(open(tmp_path / "out" / "results.json"))
    assert data["runs"][1]["env_steps_per_s"] == 125.0 and data["summary"][1]["ratio"]["mean"] == 1.25
    png = (tmp_path / "out" / "comparison.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000


def test_sb3_runs_are_deterministic_given_the_seed() -> None:
    from hetero_replay.apps.compare.base import runner_for

    spec = RunSpec("sb3", "dqn", "CartPole-v1", "per", seed=3, **TINY)
    steps: list[int] = []
    a = runner_for("sb3").run(spec, steps.append)
    b = runner_for("sb3").run(spec, lambda n: None)
    assert a.eval_steps == [0, 200, 400] and a.eval_returns == b.eval_returns
    assert sum(steps) == 400  # progress reported every env step exactly once
    assert 0.4 < a.extra["final_beta"] <= 1.0 and a.train_s > 0 and a.wall_s > a.train_s


def test_n_steps_reach_both_variants_of_the_sb3_runner() -> None:
    from stable_baselines3.common.buffers import NStepReplayBuffer

    from hetero_replay.adapters.sb3 import NStepPrioritizedReplayBuffer
    from hetero_replay.apps.compare.sb3_runs import _make_model

    specs = driver.build_specs("sb3", "dqn", "CartPole-v1", 1000, seeds=[0], n_steps=3)
    assert [s.n_steps for s in specs] == [3, 3]
    buffers = {s.variant: _make_model(s).replay_buffer for s in specs}
    assert type(buffers["uniform"]) is NStepReplayBuffer and type(buffers["per"]) is NStepPrioritizedReplayBuffer
    assert buffers["uniform"].n_steps == buffers["per"].n_steps == 3


def test_is_weight_study_variants_run_only_when_named_and_set_the_buffer() -> None:
    """``per-batchnorm`` and ``per-eps1e-3`` (docs/is-weights.md) are ``per`` with one buffer option changed."""
    from hetero_replay.apps.compare.sb3_runs import _make_model

    assert [s.variant for s in driver.build_specs("sb3", "dqn", "CartPole-v1", 1000, seeds=[0])] == ["uniform", "per"]
    variants = ["per", "per-batchnorm", "per-eps1e-3"]
    specs = driver.build_specs("sb3", "sac", "Pendulum-v1", 1000, seeds=[0], variants=variants, staleness=[1])
    assert [s.variant for s in specs] == variants and {s.staleness for s in specs} == {1}
    buffers = {s.variant: _make_model(s).replay_buffer for s in specs}
    assert [(b.weight_norm, b.replay.options.eps, b.staleness) for b in buffers.values()] == [
        ("global", 1e-6, 1), ("batch", 1e-6, 1), ("global", 1e-3, 1),
    ]  # fmt: skip


@pytest.mark.parametrize("algo, stock", [("qrdqn", "QRDQN"), ("tqc", "TQC"), ("crossq", "CrossQ")])
def test_sb3_contrib_algorithms_run_stock_against_per(algo: str, stock: str) -> None:
    pytest.importorskip("sb3_contrib")
    from hetero_replay.apps.compare.sb3_runs import algorithm_class

    uniform, per = algorithm_class(algo, "uniform"), algorithm_class(algo, "per")
    assert uniform.__name__ == stock and uniform.__module__.startswith("sb3_contrib")
    assert per.__name__ == f"PER{stock}" and issubclass(per, uniform)


def test_tianshou_rainbow_runs_with_and_without_per() -> None:
    """The Rainbow runs train Tianshou's RainbowDQN (3-step, noisy dueling C51) on each variant's buffer."""
    pytest.importorskip("tianshou")
    from tianshou.algorithm import RainbowDQN
    from tianshou.data import PrioritizedVectorReplayBuffer, VectorReplayBuffer

    from hetero_replay.adapters.tianshou import HeteroPrioritizedVectorReplayBuffer
    from hetero_replay.adapters.tianshou.workload import STANDARD_HYPERPARAMS, standard_algorithm
    from hetero_replay.apps.compare.base import runner_for
    from hetero_replay.apps.compare.tianshou_runs import make_buffer

    hp = STANDARD_HYPERPARAMS["rainbow"]
    import gymnasium as gym

    rainbow = standard_algorithm("rainbow", gym.make("CartPole-v1"), hp)
    assert type(rainbow) is RainbowDQN and rainbow.n_step == 3
    with pytest.raises(ValueError, match="rainbow needs a discrete action space"):
        standard_algorithm("rainbow", gym.make("Pendulum-v1"), hp)
    buffers = {v: make_buffer(v, hp, 2, 0) for v in ("uniform", "stock-per", "hetero-per-batchnorm")}
    assert type(buffers["uniform"]) is VectorReplayBuffer
    assert type(buffers["stock-per"]) is PrioritizedVectorReplayBuffer and buffers["stock-per"]._weight_norm
    assert isinstance(buffers["hetero-per-batchnorm"], HeteroPrioritizedVectorReplayBuffer)
    assert buffers["hetero-per-batchnorm"]._weight_norm

    spec = RunSpec("tianshou", "rainbow", "CartPole-v1", "hetero-per-batchnorm", seed=0, steps=160, eval_every=80,
                   eval_episodes=2, n_envs=2)  # fmt: skip
    run = runner_for("tianshou").run(spec, lambda n: None)
    assert run.eval_steps == [0, 80, 160] and run.extra["gradient_steps"] == 20  # one per 8 env steps
    assert 0.4 < run.extra["final_beta"] <= 1.0


def test_cli_compare_end_to_end(tmp_path, capsys) -> None:
    out = tmp_path / "cmp"
    code = main(["compare", "--lib", "sb3", "--algo", "dqn", "--env", "CartPole-v1", "--steps", "400",
                 "--seeds", "2", "--eval-every", "200", "--eval-episodes", "2", "--out", str(out)])  # fmt: skip
    assert code == 0
    printed = capsys.readouterr()
    assert "uniform" in printed.out and "per" in printed.out and "x baseline" in printed.out
    assert "1600/1600" in printed.err  # the progress bar reached the total of all runs
    rows = list(csv.DictReader(open(out / "runs.csv")))
    assert sorted((r["variant"], r["seed"]) for r in rows) == [
        ("per", "0"),
        ("per", "1"),
        ("uniform", "0"),
        ("uniform", "1"),
    ]
    assert (out / "comparison.png").exists() and (out / "results.json").exists()


def test_cli_compare_reports_bad_requests(capsys) -> None:
    assert main(["compare", "--algo", "ppo", "--no-progress"]) == 2
    assert "algorithms" in capsys.readouterr().err
