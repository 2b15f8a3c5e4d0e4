"""The ``hetero-replay`` command.

hetero-replay info       what this installation has: tree backends and storages
                         (devices, usable here or why not), threads
hetero-replay advise     profile every primitive, rank every placement, say which to use (--validate: prove it)
hetero-replay compare    stock replay vs PER in SB3 / Tianshou training runs, over seeds
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence

import hetero_replay
from hetero_replay.checks import check_int
from hetero_replay.extend import install_hint
from hetero_replay.storage.files import check_parents

Command = Callable[[argparse.Namespace], int]
_COMMANDS: dict[str, tuple[Command, Callable[[argparse.ArgumentParser], None], str]] = {}


def command(name: str, help: str, add_arguments: Callable[[argparse.ArgumentParser], None] = lambda p: None):
    """Register ``fn(args) -> exit code`` as a subcommand."""

    def register(fn: Command) -> Command:
        _COMMANDS[name] = (fn, add_arguments, help)
        return fn

    return register


@command("info", "show the registered tree backends and storages, and the thread settings")
def info(args: argparse.Namespace) -> int:
    """Print the version, every registered backend and storage (usable here or why not), the threads."""
    from hetero_replay import registry

    print(f"hetero-replay {hetero_replay.__version__}")
    print(f"threads: {hetero_replay.num_threads()}")
    print()
    print(registry.describe())
    print(f"distributed (ShardedReplay): {_ray_status()}")
    return 0


def _ray_status() -> str:
    """Whether ShardedReplay can run here: Ray's version, or the extra to install."""
    from importlib import metadata

    try:
        return f"usable, ray {metadata.version('ray')}"
    except metadata.PackageNotFoundError:
        return f"not usable: needs Ray; {install_hint('ray')}"


def _advise_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--lib", default=None, help="host library: sb3 or tianshou (not needed with --profile)")
    p.add_argument("--algo", default="dqn", help="dqn, ddpg, td3 or sac")
    p.add_argument("--env", default="CartPole-v1", help="gymnasium environment id")
    p.add_argument("--batch-size", type=int, default=256, help="B, transitions per gradient step")
    p.add_argument("--buffer-size", type=int, default=1_000_000, help="N, transitions the replay holds")
    p.add_argument("--n-envs", type=int, default=1, help="environments stepped together")
    p.add_argument("--staleness", default="0,1", help="comma-separated stalenesses to rank (0 = strict PER)")
    p.add_argument("--profile", default=None, help="advise from this saved profile (e.g. one made on a GPU box)")
    p.add_argument("--no-cache", action="store_true", help="profile again even if a cached profile exists")
    p.add_argument("--validate", action="store_true", help="train the top placements, default and baseline end to end")
    p.add_argument("--top", type=int, default=3, help="how many top-ranked placements --validate trains")
    p.add_argument("--validate-all", action="store_true", help="--validate every ranked placement")
    p.add_argument("--env-steps", type=int, default=None, help="env steps per validation run (default: ~4 s each)")
    p.add_argument("--repeats", type=int, default=3, help="validation runs per placement (the median counts)")
    p.add_argument("--out", default=None, help="output folder (default: out/advise/<lib>-<algo>-<env>-B<B>-N<N>)")
    p.add_argument("--no-progress", action="store_true", help="hide the progress bars")


@command(
    "advise",
    "profile every primitive, rank every placement; table, JSON, PNG (--validate: measured)",
    _advise_arguments,
)
def advise(args: argparse.Namespace) -> int:
    from hetero_replay import advisor

    progress = not args.no_progress
    try:
        staleness = _integers(args.staleness, "--staleness")
        workload = None
        if args.lib is not None:
            workload = advisor.make_workload(
                args.lib, algo=args.algo, env=args.env, batch_size=args.batch_size,
                buffer_size=args.buffer_size, n_envs=args.n_envs,
            )  # fmt: skip
        elif args.profile is None:
            raise ValueError("give --lib (sb3 or tianshou) and the setup, or --profile FILE")
        if args.validate or args.validate_all:
            if workload is None:
                raise ValueError("--validate trains the placements, so it needs --lib and the setup")
            # Refused now, not after the minutes of profiling.
            check_int(args.top, "--top", 1)
            check_int(args.repeats, "--repeats", 1)
            if args.env_steps is not None:
                check_int(args.env_steps, "--env-steps", 1)
        if args.out is not None:
            check_parents(os.path.join(args.out, "advice.json"), "--out")
        advice = advisor.advise(
            workload, staleness=staleness, profile=args.profile, cache=not args.no_cache, progress=progress
        )
    except (ValueError, TypeError, ImportError, advisor.ProfileError, OSError) as e:
        print(f"hetero-replay advise: {e}", file=sys.stderr)
        return 2
    if args.validate or args.validate_all:
        from hetero_replay.advisor import validation

        assert workload is not None  # refused above without --lib

        rows = validation.choose(advice, top=args.top, everything=args.validate_all)
        validation.validate(advice, workload, rows, env_steps=args.env_steps, repeats=args.repeats, progress=progress)
    print(advice.table())
    print("\n" + advice.explain())
    spec = advice.profile.workload
    out = args.out or f"out/advise/{spec.lib}-{spec.algo}-{spec.env}-B{spec.batch_size}-N{spec.buffer_size}"
    print("\nwrote " + ", ".join(str(p) for p in advice.save(out)))
    return 0


def _compare_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--lib", default="sb3", help="host library: sb3 or tianshou")
    p.add_argument(
        "--algo",
        default="dqn",
        help="dqn, ddpg, td3, sac; with sb3 also qrdqn, tqc, crossq (the contrib extra), with tianshou also rainbow",
    )
    p.add_argument("--env", default="CartPole-v1", help="gymnasium environment id")
    p.add_argument("--steps", type=int, default=50_000, help="environment steps per run")
    p.add_argument("--seeds", type=int, default=3, help="runs per variant, with seeds first-seed, first-seed+1, ...")
    p.add_argument("--first-seed", type=int, default=0)
    p.add_argument("--n-envs", type=int, default=1, help="parallel environments per run")
    p.add_argument("--eval-every", type=int, default=None, help="env steps between evaluations (default: steps/10)")
    p.add_argument("--eval-episodes", type=int, default=5, help="episodes per evaluation")
    p.add_argument("--variants", default=None, help="comma-separated subset of the runner's variants")
    p.add_argument("--threads", type=int, default=1, help="torch and replay threads per run")
    p.add_argument(
        "--staleness",
        default=None,
        help="comma-separated stalenesses of the relaxed pipeline (e.g. 0,1,2,4): the PER variant runs once per "
        "value; adds an interquartile-mean summary with bootstrap CIs and a return-vs-staleness plot (extra: study)",
    )
    p.add_argument("--n-steps", type=int, default=1, help="n-step returns for every variant (sb3; default 1)")
    p.add_argument("--out", default=None, help="output folder (default: out/compare/<lib>-<algo>-<env>)")
    p.add_argument("--no-progress", action="store_true", help="hide the progress bar")


@command("compare", "train with the stock replay and with PER over seeds; table, CSV, JSON, PNG", _compare_arguments)
def compare(args: argparse.Namespace) -> int:
    from hetero_replay.apps.compare import driver, report

    try:
        specs = driver.build_specs(
            args.lib, args.algo, args.env, args.steps,
            seeds=range(args.first_seed, args.first_seed + args.seeds),
            variants=None if args.variants is None else [v.strip() for v in args.variants.split(",") if v.strip()],
            n_envs=args.n_envs, eval_every=args.eval_every, eval_episodes=args.eval_episodes,
            torch_threads=args.threads,
            staleness=None if args.staleness is None else _integers(args.staleness, "--staleness"),
            n_steps=args.n_steps,
        )  # fmt: skip
        out = args.out or driver.default_out_dir(args.lib, args.algo, args.env)
        report.check_out_dir(out)  # refused now, not after the runs
    except (ValueError, ImportError) as e:
        print(f"hetero-replay compare: {e}", file=sys.stderr)
        return 2
    results = driver.run_specs(specs, progress_bar=not args.no_progress)
    summary = report.summarize(results)
    print(report.format_table(results, summary))
    written = report.write_all(results, summary, out)
    if args.staleness is not None:
        from hetero_replay.apps.compare import staleness_study

        study = staleness_study.summarize(results)
        print("\n" + staleness_study.format_table(study))
        written += staleness_study.write(study, results, out)
    print("\nwrote " + ", ".join(written))
    return 0


def _integers(text: str, option: str) -> list[int]:
    """``"0,1,2"`` -> ``[0, 1, 2]``; ``ValueError`` naming ``option`` otherwise."""
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise ValueError(f"{option} takes comma-separated integers, e.g. 0,1,2,4; got {text!r}") from None


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="hetero-replay", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (fn, add_arguments, help) in _COMMANDS.items():
        p = sub.add_parser(name, help=help)
        add_arguments(p)
        p.set_defaults(fn=fn)
    args = parser.parse_args(argv)
    return args.fn(args)


if __name__ == "__main__":
    sys.exit(main())
