"""Where one learner step's time goes, per call: SB3 ``PERDQN`` vs ``DQN``, Tianshou's wrapper on our buffer vs
on Tianshou's own PER buffer.

Each setup trains a real model (CartPole-v1, batch 64, buffer 50k, ``--warmup`` env steps
(2 000 by default) through the library's own loop), then runs ``--steps`` learner steps of the
library's own ``train()`` / ``update()`` with the buffer's calls timed in place: the
buffer's and the engine's classes are swapped for subclasses whose methods time
themselves, so the step itself is untouched. All setups live in one process and
take turns every 50 steps; each phase's figure is its median over those chunks.
Torch and our tree run on one thread.

Phases (µs per learner step; "rest of the step" is what remains: forward, backward,
optimizer, the losses' ``.item()``):

* **sample**: the buffer's ``sample`` call, all of it; **engine**: the part spent in
  the core engine (our ``PrioritizedReplay``/``RelaxedReplay.sample``, our Tianshou
  buffer's ``_draw``, Tianshou's ``sample_indices``; for SB3's uniform buffer, all but
  its ``to_torch`` calls); **tensors + checks** = sample - engine (SB3: the batch's
  tensors, dones, weights; Tianshou: the rows' ``Batch`` and IS weights);
* **index**: ``buffer[indices]`` reads (Tianshou's n-step targets);
* **update**: ``update_priorities`` / ``update_weight`` (queued or applied);
* **logging**: SB3's ``logger.record`` calls of the step (with PER's ``_record_per``).

Before/after in one run: ``--compare DIR`` runs every repeat twice, in a fresh process
each, alternating: once with the installed code and once with ``DIR`` first on
``sys.path`` (a ``git worktree`` of the older commit, with the built ``_native*.so`` copied
into its ``hetero_replay/`` and links ``hetero_replay/adapters -> ../adapters``,
``hetero_replay/apps -> ../apps``; the ``sitecustomize.py`` drops the editable install's
finder from ``sys.meta_path`` and puts the worktree first on ``sys.path``).

    python benchmarks/profile_learner_step.py                       # after only, 5 repeats
    python benchmarks/profile_learner_step.py --setups sb3-dqn sb3-perdqn-k0 --warmup 10000 [--flush-denormal]

``--warmup 10000`` times the step of a model that has learned for a while, as in the last part of an
end-to-end run; ``--flush-denormal`` runs torch with denormal floats flushed to zero
(``torch.set_flush_denormal``), which shows what subnormal values in the trained weights and the
optimizer's state cost each setup.
    python benchmarks/profile_learner_step.py --compare /tmp/before-site --repeats 5 \\
        --out benchmarks/results/profile-learner-step.md
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

#: The setups, in the order each repeat runs them.
SETUPS = ("sb3-dqn", "sb3-perdqn-k0", "sb3-perdqn-k1", "tianshou-per", "tianshou-ours-k0", "tianshou-ours-k1")
PHASES = ("step", "sample", "engine", "tensors", "index", "update", "logging")
BATCH, BUFFER = 64, 50_000

#: SB3 DQN on CartPole as the rl-zoo tunes it (as in bench_sb3_throughput.py).
DQN_ARGS = dict(
    learning_rate=2.3e-3, batch_size=BATCH, buffer_size=BUFFER, learning_starts=1000, gamma=0.99,
    target_update_interval=10, train_freq=4, gradient_steps=1, exploration_fraction=0.16,
    exploration_final_eps=0.04, policy_kwargs=dict(net_arch=[256, 256]), device="cpu",
)  # fmt: skip


class Clock:
    """Seconds accumulated per phase; a phase nested in itself (a method calling its parent) counts once."""

    def __init__(self) -> None:
        self.total: dict[str, float] = dict.fromkeys(PHASES, 0.0)
        self._open: set[str] = set()

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        if name in self._open or (name == "index" and "sample" in self._open):  # sample's own reads are sample's
            yield
            return
        self._open.add(name)
        start = time.perf_counter()
        try:
            yield
        finally:
            self.total[name] += time.perf_counter() - start
            self._open.discard(name)


def timed(obj: Any, clock: Clock, phases: dict[str, str]) -> None:
    """Swap ``obj``'s class for a subclass whose methods ``phases`` (method -> phase) time themselves."""
    cls = type(obj)

    def wrap(method: str, phase: str) -> Callable[..., Any]:
        inner = getattr(cls, method)

        def call(self: Any, *args: Any, **kwargs: Any) -> Any:
            with clock.phase(phase):
                return inner(self, *args, **kwargs)

        return call

    obj.__class__ = type(cls.__name__, (cls,), {m: wrap(m, p) for m, p in phases.items()})


def sb3_setup(name: str, clock: Clock, warmup: int) -> Callable[[], None]:
    """An SB3 model after its warm-up; returns one learner step (``train(1, 64)``) with its calls timed."""
    import gymnasium as gym
    from stable_baselines3 import DQN

    from hetero_replay.adapters.sb3 import PERDQN

    env = gym.make("CartPole-v1")
    if name == "sb3-dqn":
        model = DQN("MlpPolicy", env, seed=0, **DQN_ARGS)
    else:
        model = PERDQN("MlpPolicy", env, seed=0, staleness=int(name[-1]), **DQN_ARGS)
    model.learn(warmup)
    buffer = model.replay_buffer
    timed(model.logger, clock, {"record": "logging"})
    if name == "sb3-dqn":
        timed(buffer, clock, {"sample": "sample", "to_torch": "tensors"})  # engine: the rest of its sample
    else:
        timed(buffer, clock, {"sample": "sample", "update_priorities": "update"})
        timed(buffer._replay, clock, {"sample": "engine"})
        timed(model, clock, {"_record_per": "logging"})

    def step() -> None:
        with clock.phase("step"):
            model.train(gradient_steps=1, batch_size=BATCH)

    return step


def tianshou_setup(name: str, clock: Clock, warmup: int) -> Callable[[], None]:
    """Tianshou DQN on CartPole (4 envs) in ``PEROffPolicyWrapper`` after its warm-up; returns one ``update``."""
    import gymnasium as gym
    import numpy as np
    from tianshou.data import Collector, CollectStats, PrioritizedVectorReplayBuffer
    from tianshou.env import DummyVectorEnv
    from tianshou.utils.torch_utils import policy_within_training_step

    from hetero_replay.adapters.tianshou import (
        HeteroPrioritizedVectorReplayBuffer,
        LinearBetaSchedule,
        PEROffPolicyWrapper,
    )
    from hetero_replay.adapters.tianshou.workload import STANDARD_HYPERPARAMS, standard_algorithm

    envs = DummyVectorEnv([lambda: gym.make("CartPole-v1") for _ in range(4)])
    envs.seed(0)
    staleness = int(name[-1]) if name.startswith("tianshou-ours") else 0
    algorithm = PEROffPolicyWrapper(
        wrapped_algorithm=standard_algorithm("dqn", gym.make("CartPole-v1"), STANDARD_HYPERPARAMS["dqn"]),
        beta=LinearBetaSchedule(0.4, 1.0, 100_000),
        staleness=staleness,
    )
    if name == "tianshou-per":
        buffer: Any = PrioritizedVectorReplayBuffer(BUFFER, 4, alpha=0.6, beta=0.4)
    else:
        buffer = HeteroPrioritizedVectorReplayBuffer(BUFFER, 4, alpha=0.6, beta=0.4, random_seed=0)
    np.random.seed(0)
    collector = Collector[CollectStats](algorithm, envs, buffer, exploration_noise=True)
    collector.reset()
    collector.collect(n_step=warmup, random=True)
    timed(buffer, clock, {"sample": "sample", "__getitem__": "index", "update_weight": "update"})
    if name == "tianshou-per":
        timed(buffer, clock, {"sample_indices": "engine"})
    else:
        timed(buffer, clock, {"_draw": "engine", "update_weight_since": "update"})

    def step() -> None:
        with clock.phase("step"), policy_within_training_step(algorithm.policy):
            algorithm.update(buffer=buffer, sample_size=BATCH)

    return step


def measure(
    names: Sequence[str], steps: int, warmup: int, flush_denormal: bool, chunk: int = 50
) -> dict[str, dict[str, float]]:
    """µs per learner step of every phase, for each setup: the median over chunks of ``chunk`` steps, the
    setups taking turns chunk by chunk (so a burst of load on a shared machine hits them alike)."""
    import torch

    import hetero_replay

    torch.set_num_threads(1)
    hetero_replay.set_num_threads(1)
    if flush_denormal and not torch.set_flush_denormal(True):
        raise RuntimeError("--flush-denormal: this CPU cannot flush denormals (torch.set_flush_denormal)")
    clocks = {name: Clock() for name in names}
    steps_of = {
        name: (sb3_setup if name.startswith("sb3") else tianshou_setup)(name, clocks[name], warmup) for name in names
    }
    for step in steps_of.values():
        for _ in range(50):  # settle: caches, the pipeline's worker mode
            step()
    chunks: dict[str, list[dict[str, float]]] = {name: [] for name in names}
    for _ in range(max(1, steps // chunk)):
        for name, step in steps_of.items():
            clock = clocks[name]
            clock.total = dict.fromkeys(clock.total, 0.0)
            for _ in range(chunk):
                step()
            chunks[name].append({phase: seconds / chunk * 1e6 for phase, seconds in clock.total.items()})
    return {name: {p: statistics.median(c[p] for c in chunks[name]) for p in PHASES} for name in names}


def child(args: argparse.Namespace) -> None:
    """One pass, as JSON on stdout (run in a fresh process per repeat)."""
    import warnings

    warnings.filterwarnings("ignore")
    print(json.dumps(measure(args.setups, args.steps, args.warmup, args.flush_denormal)))


def run_pass(code: str, site: str | None, args: argparse.Namespace) -> dict[str, dict[str, float]]:
    """A pass in a fresh process; ``site``: a folder whose ``sitecustomize`` puts another checkout first."""
    env = dict(os.environ)
    if site is not None:
        env["PYTHONPATH"] = site + os.pathsep + env.get("PYTHONPATH", "")
    cmd = [sys.executable, __file__, "--child", "--steps", str(args.steps), "--warmup", str(args.warmup),
           *(["--flush-denormal"] if args.flush_denormal else []), "--setups", *args.setups]  # fmt: skip
    result = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd="/", check=False)
    if result.returncode != 0:
        raise RuntimeError(f"{code} pass failed:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def markdown(runs: dict[str, list[dict[str, dict[str, float]]]], args: argparse.Namespace) -> str:
    """Median µs per phase over the repeats, a row per (code, setup)."""
    import platform

    lines = [
        "# One learner step, per call",
        "",
        f"- **Run:** {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {platform.processor() or 'cpu'}, "
        f"{os.cpu_count()} cores, load {os.getloadavg()[0]:.2f} at the end; torch and our tree on 1 thread",
        f"- **Workload:** CartPole-v1, batch {BATCH}, buffer {BUFFER:,}, {args.warmup:,} env steps of warm-up"
        f"{', denormals flushed to zero' if args.flush_denormal else ''}; {args.steps} learner steps per setup and "
        f"repeat, the setups taking turns every 50 steps; median over those chunks, then over {args.repeats} "
        "repeats (a fresh process per repeat and code, codes alternating)",
        "- **Command:** `python benchmarks/profile_learner_step.py "
        + " ".join(a for a in sys.argv[1:] if not a.startswith("--out"))
        + "`",
        "",
        "µs per learner step (`tensors + checks` = sample - engine; `rest` = step - sample - index - update - "
        "logging: forward, backward, optimizer, `.item()`).",
        "",
        "| code | setup | step | sample | engine | tensors + checks | index | update | logging | rest |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for code, passes in runs.items():
        for name in args.setups:
            med = {p: statistics.median(run[name][p] for run in passes) for p in PHASES}
            if med["tensors"]:  # SB3's uniform buffer: its to_torch calls were timed, the rest is its NumPy draw
                med["engine"] = med["sample"] - med["tensors"]
            rest = med["step"] - med["sample"] - med["index"] - med["update"] - med["logging"]
            cells = [med["step"], med["sample"], med["engine"], med["sample"] - med["engine"], med["index"],
                     med["update"], med["logging"], rest]  # fmt: skip
            lines.append(f"| {code} | {name} | " + " | ".join(f"{c:.1f}" for c in cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=2000, help="learner steps per setup and repeat (default 2000)")
    p.add_argument("--repeats", type=int, default=5, help="repeats, each in fresh processes (default 5)")
    p.add_argument("--setups", nargs="+", default=list(SETUPS), choices=SETUPS)
    p.add_argument("--warmup", type=int, default=2000, help="env steps each model learns before timing (2000)")
    p.add_argument("--flush-denormal", action="store_true", help="torch flushes denormals to zero")
    p.add_argument("--compare", metavar="SITE", help="also run the code SITE's sitecustomize puts first ('before')")
    p.add_argument("--out", help="write the Markdown there too")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        child(args)
        return
    codes = {"after": None} if args.compare is None else {"before": args.compare, "after": None}
    runs: dict[str, list[dict[str, dict[str, float]]]] = {code: [] for code in codes}
    for r in range(args.repeats):
        for code, site in codes.items():
            runs[code].append(run_pass(code, site, args))
            print(f"repeat {r + 1}/{args.repeats} {code} done", file=sys.stderr, flush=True)
    text = markdown(runs, args)
    if args.out:
        Path(args.out).write_text(text)
    print(text)


if __name__ == "__main__":
    main()
