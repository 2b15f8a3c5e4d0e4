"""Placing the replay primitives with a Placement: PERDQN on CartPole-v1.

A ``Placement`` names where each primitive runs (inference, sample, update,
train) and where transitions are stored. ``PERDQN(..., placement=m)`` trains on
``m.learner_device`` and builds its buffer from ``m.replay_kwargs()``. The
script trains PERDQN on CartPole (a mean return above 150 usually within a few
thousand steps, about a minute on a CPU), counts what one ``train()`` call really moves between devices
(``TransferCounter``) next to what the placement says it moves
(``m.transfers()``), and saves and loads the model with its placement.

    python examples/sb3_placement.py                         # torch tree + torch storage on the CPU
    python examples/sb3_placement.py --placement cpu         # the default: C++ tree, NumPy storage
    python examples/sb3_placement.py --placement gpu         # everything on one GPU (needs CUDA)
    python examples/sb3_placement.py --placement hybrid      # C++ tree, pinned storage, GPU learner (needs CUDA)
"""

from __future__ import annotations

import argparse
import tempfile
from collections import Counter

import torch
from stable_baselines3.common.callbacks import EvalCallback, StopTrainingOnRewardThreshold
from stable_baselines3.common.env_util import make_vec_env

from hetero_replay.adapters.sb3 import PERDQN
from hetero_replay.placement import DeviceUnavailableError, Placement, TransferCounter

PLACEMENTS = {
    "cpu": Placement.cpu,
    "torch": lambda: Placement(storage="cpu", tree="torch"),  # tree, transitions, learner on one device
    "gpu": Placement.gpu,
    "hybrid": Placement.cpu_replay_gpu_learner,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--placement", choices=sorted(PLACEMENTS), default="torch")
    parser.add_argument("--steps", type=int, default=20_000, help="most environment steps")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(1)  # small networks: one thread is fastest
    try:
        placement = PLACEMENTS[args.placement]()
    except DeviceUnavailableError as error:  # names the primitive whose device is missing
        raise SystemExit(f"--placement {args.placement}: {error}") from None

    model = PERDQN(
        "MlpPolicy", "CartPole-v1", placement=placement, seed=args.seed,
        learning_rate=2.3e-3, batch_size=64, buffer_size=50_000, learning_starts=1000, target_update_interval=100,
        train_freq=16, gradient_steps=8, exploration_fraction=0.16, exploration_final_eps=0.04,
        policy_kwargs=dict(net_arch=[256, 256]),
    )  # fmt: skip
    core = model.replay_buffer.replay
    print(f"placement: {placement}")
    print(f"  model device {model.device}; core engine {type(core).__name__} with {core.tree!r}")
    print(
        f"  storage {type(core.storage).__name__}; a step moves: {[tuple(t) for t in placement.transfers()] or 'nothing'}"
    )

    # evaluate every 1,000 steps; stop once the mean return reaches 475 (CartPole-v1 caps it at 500)
    solved = StopTrainingOnRewardThreshold(475, verbose=0)
    evaluation = EvalCallback(make_vec_env("CartPole-v1", seed=args.seed + 100), n_eval_episodes=5, eval_freq=1000,
                              callback_on_new_best=solved, verbose=0)  # fmt: skip
    model.learn(args.steps, callback=evaluation)
    print(f"best mean evaluation return {evaluation.best_mean_reward:.0f} after {model.num_timesteps:,} steps")

    core = model.replay_buffer.replay  # also hands the rows staged since the last train() to the core engine
    with TransferCounter() as moved:
        model.train(gradient_steps=8, batch_size=64)
    copied = sum(n for _, _, n in moved.copies)
    inputs = ", ".join(f"{n} x {dtype}{list(shape)}" for (dtype, shape), n in Counter(moved.host_inputs).items())
    print(f"one train() of 8 gradient steps: {len(moved.copies)} cross-device copies ({copied:,} bytes); "
          f"host arrays entering torch: {inputs or 'none'}")  # fmt: skip

    with tempfile.TemporaryDirectory() as tmp:
        model.save(f"{tmp}/model")
        loaded = PERDQN.load(f"{tmp}/model", env=model.get_env())
    print(f"saved and loaded: placement kept = {loaded.placement == placement}, device {loaded.device}")


if __name__ == "__main__":
    main()
