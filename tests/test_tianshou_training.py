"""End to end: Tianshou's trainer with our buffer and wrapper, the comparison runner and the CLI.

Runs are real (Collector, OffPolicyTrainer, gymnasium envs) but short; they
check what prioritization did, not how well the agent learned.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

pytest.importorskip("tianshou")

import gymnasium as gym  # noqa: E402
from tianshou.data import Collector, CollectStats  # noqa: E402
from tianshou.env import DummyVectorEnv  # noqa: E402
from tianshou.trainer import OffPolicyTrainerParams  # noqa: E402
from tianshou.utils import TensorboardLogger  # noqa: E402
from torch.utils.tensorboard import SummaryWriter  # noqa: E402

from hetero_replay.adapters.tianshou import (  # noqa: E402
    HeteroPrioritizedVectorReplayBuffer,
    LinearBetaSchedule,
    PEROffPolicyWrapper,
)
from hetero_replay.apps.cli import main  # noqa: E402
from hetero_replay.apps.compare import RunSpec, driver, runner_for  # noqa: E402
from hetero_replay.apps.compare.tianshou_runs import HYPERPARAMS, make_algorithm  # noqa: E402


def train(algo: str, env_id: str, steps: int, logger: TensorboardLogger | None = None):
    """``steps`` env steps of ``algo`` with our buffer and wrapper (2 envs, 1 gradient step per 2 env steps)."""
    torch.manual_seed(0)
    np.random.seed(0)
    envs = DummyVectorEnv([lambda: gym.make(env_id) for _ in range(2)])
    envs.seed(0)
    num_updates = steps // 2
    algorithm = PEROffPolicyWrapper(
        wrapped_algorithm=make_algorithm(algo, gym.make(env_id), HYPERPARAMS[algo]),
        beta=LinearBetaSchedule(0.4, 1.0, num_updates),
    )
    buf = HeteroPrioritizedVectorReplayBuffer(5000, 2, random_seed=0)
    collector = Collector[CollectStats](algorithm, envs, buf, exploration_noise=True)
    collector.reset()
    collector.collect(n_step=200, random=True)
    algorithm.run_training(
        OffPolicyTrainerParams(
            training_collector=collector,
            test_collector=None,
            max_epochs=1,
            epoch_num_steps=steps,
            collection_step_num_env_steps=4,
            update_step_num_gradient_steps_per_sample=0.5,
            batch_size=32,
            logger=logger,
            verbose=False,
            show_progress=False,
        )  # fmt: skip
    )
    return algorithm, buf


def assert_prioritized(algorithm: PEROffPolicyWrapper, buf: HeteroPrioritizedVectorReplayBuffer, updates: int) -> None:
    assert algorithm.num_updates == updates
    assert buf.beta == pytest.approx(1.0 - 0.6 / updates)  # the last update's beta
    stored = np.sort(buf.sample_indices(0))
    leaves = buf.priority_tree.leaves()
    assert np.all(leaves[stored] > 0) and np.count_nonzero(leaves) == len(stored)
    assert len(np.unique(leaves[stored])) > updates  # TD errors were fed back
    assert np.isclose(buf.priority_tree.total(), leaves.sum(dtype=np.float64), rtol=1e-5)


def test_dqn_cartpole_run_prioritizes_anneals_and_logs(tmp_path) -> None:
    logger = TensorboardLogger(SummaryWriter(str(tmp_path)), update_interval=1)
    algorithm, buf = train("dqn", "CartPole-v1", steps=400, logger=logger)
    assert_prioritized(algorithm, buf, updates=200)
    logged = TensorboardLogger.restore_logged_data(str(tmp_path))["update"]["smoothed_loss"]
    assert {"loss", "beta", "is_weight_mean", "td_error_abs_mean"} <= set(logged)
    beta = logged["beta"]  # moving averages over updates
    assert len(beta) == 100 and beta[0] == pytest.approx(0.4) and np.all(np.diff(beta) > 0)  # one per collect phase
    assert np.all(logged["is_weight_mean"] <= 1.0) and logged["is_weight_mean"][-1] < 1.0
    assert np.all(np.isfinite(logged["loss"])) and np.all(logged["td_error_abs_mean"] > 0)


def test_ddpg_pendulum_run_prioritizes_and_anneals() -> None:
    algorithm, buf = train("ddpg", "Pendulum-v1", steps=200)
    assert_prioritized(algorithm, buf, updates=100)
    assert buf.max_priority > 1.0  # Pendulum's TD errors are large at the start


# -- the comparison runner ------------------------------------------------------------------------


def test_runner_registers_stock_per_first() -> None:
    runner = runner_for("tianshou")
    assert runner.variants[:3] == runner.defaults == ("stock-per", "hetero-per", "uniform")
    assert runner.algos == ("dqn", "ddpg", "td3", "sac", "rainbow")
    specs = driver.build_specs("tianshou", "dqn", "CartPole-v1", 1000, seeds=[0, 1], n_envs=4)
    assert [(s.variant, s.seed) for s in specs] == [
        ("stock-per", 0), ("hetero-per", 0), ("uniform", 0), ("uniform", 1), ("hetero-per", 1), ("stock-per", 1),
    ]  # fmt: skip


@pytest.mark.parametrize("variant", ["stock-per", "hetero-per", "uniform"])
def test_runner_runs_each_variant(variant: str) -> None:
    spec = RunSpec(
        "tianshou", "dqn", "CartPole-v1", variant, seed=0, steps=96, eval_every=48, eval_episodes=2, n_envs=2
    )
    reported: list[int] = []
    result = runner_for("tianshou").run(spec, reported.append)
    assert sum(reported) == 96
    assert result.eval_steps == [0, 48, 96] and len(result.eval_returns) == 3
    assert all(r >= 5 for r in result.eval_returns)  # CartPole pays 1 per step; episodes last 8+ steps
    assert 0 < result.train_s < result.wall_s and result.extra["env_steps_done"] == 96
    if variant == "uniform":
        assert "final_beta" not in result.extra
    else:  # beta annealed through the run (the last update sees 1 - 0.6 / updates)
        assert result.extra["final_beta"] > 0.9 and result.extra["max_priority"] > 0


def test_is_weight_study_variants_set_the_buffer() -> None:
    """The study's variants (docs/is-weights.md) run only when named, each ``hetero-per`` with one option changed."""
    from hetero_replay.apps.compare.tianshou_runs import HYPERPARAMS, make_buffer

    named = ["hetero-per", "hetero-per-batchnorm", "hetero-per-eps1e-3"]
    specs = driver.build_specs("tianshou", "dqn", "CartPole-v1", 1000, seeds=[0], variants=named)
    assert [s.variant for s in specs] == named
    buffers = [make_buffer(v, HYPERPARAMS["dqn"], 2, seed=0) for v in named]
    assert [(b._normalise, b.priorities.eps) for b in buffers] == [
        ("global", 1e-6), ("batch", 1e-6), ("global", 1e-3),
    ]  # fmt: skip


def test_runner_rejects_unknown_variant_and_mismatched_env() -> None:
    run = runner_for("tianshou").run
    with pytest.raises(ValueError, match="variants"):
        run(RunSpec("tianshou", "dqn", "CartPole-v1", "per", 0, steps=10, eval_every=10), lambda n: None)
    with pytest.raises(ValueError, match="discrete"):
        run(RunSpec("tianshou", "dqn", "Pendulum-v1", "uniform", 0, steps=10, eval_every=10), lambda n: None)
    with pytest.raises(ValueError, match="continuous"):
        run(RunSpec("tianshou", "ddpg", "CartPole-v1", "uniform", 0, steps=10, eval_every=10), lambda n: None)


def test_cli_compare_tianshou_writes_the_report(tmp_path, capsys) -> None:
    out = tmp_path / "report"
    code = main(["compare", "--lib", "tianshou", "--algo", "dqn", "--env", "CartPole-v1", "--steps", "64",
                 "--seeds", "1", "--n-envs", "2", "--eval-every", "32", "--eval-episodes", "1",
                 "--out", str(out), "--no-progress"])  # fmt: skip
    assert code == 0
    table = capsys.readouterr().out
    for variant in ("stock-per", "hetero-per", "uniform"):
        assert variant in table
    runs = json.loads(next(out.glob("*.json")).read_text())
    assert {r["spec"]["variant"] for r in runs["runs"]} == {"stock-per", "hetero-per", "uniform"}
