"""Side-by-side training runs: stock replay vs ours, several seeds, one report."""

from hetero_replay.compare.base import LibraryRunner, RunResult, RunSpec, register_runner, runner_for

__all__ = ["LibraryRunner", "RunResult", "RunSpec", "register_runner", "runner_for"]
