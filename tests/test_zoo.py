"""rl-zoo3 trains our algorithms: ``python -m hetero_replay.apps.zoo`` registers them and runs rl-zoo3's train."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytest.importorskip("rl_zoo3")

from hetero_replay.adapters.sb3 import PERDQN, PrioritizedReplayBuffer  # noqa: E402
from hetero_replay.apps.zoo import HYPERPARAMS, algorithms, register, with_our_hyperparams  # noqa: E402


def test_register_adds_every_per_algorithm_to_rl_zoos_table() -> None:
    from rl_zoo3.utils import ALGOS

    ours = register()
    assert {"perdqn", "persac", "pertd3", "perddpg", "perqrdqn", "pertqc", "percrossq"} == set(ours)
    assert all(ALGOS[name] is cls for name, cls in ours.items())
    assert ALGOS["dqn"].__name__ == "DQN"  # rl-zoo3's own entries stay


def test_every_algorithm_has_rl_zoos_settings_plus_the_per_options() -> None:
    """Each YAML is rl-zoo3's file of the base algorithm for that env, plus replay_buffer_kwargs."""
    zoo = Path(__import__("rl_zoo3").__file__).parent / "hyperparams"
    for name in algorithms():
        ours = yaml.safe_load((HYPERPARAMS / f"{name}.yml").read_text())
        theirs = yaml.safe_load((zoo / f"{name.removeprefix('per')}.yml").read_text())
        assert ours, name
        for env, settings in ours.items():
            assert settings.pop("replay_buffer_kwargs") == "dict(alpha=0.6, beta=0.4)"
            assert settings == theirs[env], (name, env)


def test_our_hyperparameters_unless_the_user_names_a_file() -> None:
    perdqn = str(HYPERPARAMS / "perdqn.yml")
    assert with_our_hyperparams(["--algo", "perdqn", "--env", "CartPole-v1"])[-2:] == ["--conf-file", perdqn]
    assert with_our_hyperparams(["--algo=perdqn"])[-2:] == ["--conf-file", perdqn]
    assert with_our_hyperparams(["--algo", "perdqn", "-conf", "mine.yml"]) == ["--algo", "perdqn", "-conf", "mine.yml"]
    assert with_our_hyperparams(["--algo", "dqn"]) == ["--algo", "dqn"]  # rl-zoo3's own algorithm, its own file


@pytest.mark.usefixtures("one_torch_thread")
def test_a_short_rl_zoo_run_trains_perdqn_with_per(tmp_path: Path) -> None:
    """The README's command, shortened: rl-zoo3 trains PERDQN on CartPole-v1 and saves a model with PER."""
    cmd = [sys.executable, "-m", "hetero_replay.apps.zoo", "--algo", "perdqn", "--env", "CartPole-v1", "-n", "600"]
    cmd += ["--seed", "0", "--eval-freq", "-1", "-f", "logs", "--num-threads", "1"]
    cmd += ["-params", "learning_starts:200", "train_freq:64", "gradient_steps:4"]
    proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=600, env={**os.environ})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    run = tmp_path / "logs" / "perdqn" / "CartPole-v1_1"
    config = (run / "CartPole-v1" / "config.yml").read_text()
    assert "dict(alpha=0.6, beta=0.4)" in config
    model = PERDQN.load(run / "CartPole-v1.zip", device="cpu")
    assert (
        model.replay_buffer_class is PrioritizedReplayBuffer and model.num_timesteps >= 600
    )  # whole train_freq rounds
    assert model._n_updates > 0
