"""Plan and run a comparison: every replay variant of one library, over several seeds.

The driver knows only the runner interface of :mod:`hetero_replay.apps.compare.base`,
so every library's runner gets the same plan, progress bar and report.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from dataclasses import replace

from hetero_replay.apps.compare.base import RunResult, RunSpec, runner_for
from hetero_replay.checks import check_staleness


def build_specs(
    lib: str,
    algo: str,
    env_id: str,
    steps: int,
    seeds: Sequence[int],
    *,
    variants: Sequence[str] | None = None,
    n_envs: int = 1,
    eval_every: int | None = None,
    eval_episodes: int = 5,
    torch_threads: int = 1,
    staleness: Sequence[int] | None = None,
    n_steps: int = 1,
) -> list[RunSpec]:
    """The runs of a comparison, in the order they should run.

    Variants are interleaved per seed, and their order alternates from one seed
    to the next (``A B``, ``B A``, ...), so slow drifts of a shared machine
    weigh on every variant alike.

    Args:
        lib: a registered runner (``"sb3"``, ``"tianshou"``).
        algo: one of the runner's algorithms.
        env_id: a gymnasium environment id.
        steps: environment steps per run.
        seeds: one run per variant for each seed.
        variants: a subset of the runner's variants (default: its defaults, baseline first).
        n_envs: parallel environments per run.
        eval_every: environment steps between evaluations (default: ``steps // 10``).
        eval_episodes: episodes per evaluation.
        torch_threads: torch (and replay) threads per run.
        staleness: sweep the relaxed pipeline's staleness: each variant that
            takes one (``runner.relaxable``) runs once per value; the others once.
        n_steps: every variant trains on ``n_steps``-step returns (runners with ``n_step`` only).

    Raises:
        ValueError: an unknown library, algorithm or variant, a non-positive
            count, a negative seed, a staleness out of range, a sweep with no
            variant that takes it, or ``n_steps > 1`` for a runner without n-step returns.
    """
    runner = runner_for(lib)
    if algo not in runner.algos:
        raise ValueError(f"{lib} runs the algorithms {runner.algos}, not {algo!r}")
    chosen = (runner.defaults or runner.variants) if variants is None else tuple(variants)
    unknown = [v for v in chosen if v not in runner.variants]
    if unknown or not chosen:
        raise ValueError(f"{lib} has the variants {runner.variants}; got {list(chosen)}")
    chosen = tuple(v for v in runner.variants if v in chosen)  # baseline first, no repeats
    eval_every = max(steps // 10, 1) if eval_every is None else eval_every
    for name, value in [("steps", steps), ("n_envs", n_envs), ("eval_every", eval_every),
                        ("eval_episodes", eval_episodes), ("torch_threads", torch_threads),
                        ("n_steps", n_steps)]:  # fmt: skip
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    if n_steps > 1 and not runner.n_step:
        raise ValueError(f"--n-steps: the {lib} runner has no n-step returns; use --n-steps 1")
    if not seeds:
        raise ValueError("at least one seed is needed")
    if min(seeds) < 0:  # refused here, not by the environment once the first run started
        raise ValueError(f"seeds must be >= 0, got {min(seeds)}")
    _check_env_id(env_id)
    arms: list[tuple[str, int | None]] = [(v, None) for v in chosen]
    if staleness is not None:
        ks = [check_staleness(k) for k in dict.fromkeys(staleness)]
        if not ks or not any(v in runner.relaxable for v in chosen):
            raise ValueError(
                f"--staleness needs values and one of {lib}'s variants {runner.relaxable}; got {list(chosen)}"
            )
        arms = [(v, k) for v in chosen for k in (ks if v in runner.relaxable else [None])]
    specs = []
    for i, seed in enumerate(seeds):
        for variant, k in arms if i % 2 == 0 else arms[::-1]:
            run = RunSpec(
                lib, algo, env_id, variant, int(seed), steps, eval_every, eval_episodes, n_envs, torch_threads
            )
            specs.append(replace(run, staleness=k, n_steps=n_steps))
    return specs


def _check_env_id(env_id: str) -> None:
    import gymnasium

    try:
        gymnasium.spec(env_id)
    except gymnasium.error.Error as e:
        raise ValueError(f"unknown environment {env_id!r}: {e}") from e


def run_specs(specs: Sequence[RunSpec], progress_bar: bool = True, warmup: bool = True) -> list[RunResult]:
    """Run ``specs`` one after the other, with one progress bar over all their env steps.

    With ``warmup``, a short untimed run of the first spec goes first, so the
    one-off costs of a fresh process (imports, first torch calls) do not land
    on whichever variant happens to run first.
    """
    from tqdm import tqdm

    results = []
    total = sum(spec.steps for spec in specs)
    with tqdm(total=total, unit="step", disable=not progress_bar, file=sys.stderr, dynamic_ncols=True) as bar:
        if warmup and specs:
            bar.set_description("warm-up (untimed)")
            first = specs[0]
            steps = min(first.steps, max(500, first.steps // 20))
            runner_for(first.lib).run(replace(first, steps=steps, eval_every=steps, eval_episodes=1), lambda n: None)
        for spec in specs:
            bar.set_description(f"{spec.lib} {spec.algo} {spec.label} seed {spec.seed}")
            results.append(runner_for(spec.lib).run(spec, bar.update))
    return results


def default_out_dir(lib: str, algo: str, env_id: str) -> str:
    """``out/compare/<lib>-<algo>-<env id>`` in the working directory (``out/`` is git-ignored)."""
    return os.path.join("out", "compare", f"{lib}-{algo}-{env_id}")
