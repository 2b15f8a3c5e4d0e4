"""Side-by-side training runs: stock replay vs ours, several seeds, one report.

========================  =====================================================
``base``                  the runner interface: ``RunSpec``, ``RunResult``, registry
``driver``                plan the runs (variants interleaved per seed) and run them
``report``                table, CSV, JSON and PNG from the results
``sb3_runs``              the Stable-Baselines3 runner (``--lib sb3``)
``tianshou_runs``         the Tianshou runner (``--lib tianshou``)
========================  =====================================================

``hetero-replay compare`` (:mod:`hetero_replay.apps.cli`) ties them together.
"""

from hetero_replay.apps.compare.base import LibraryRunner, RunResult, RunSpec, register_runner, runner_for

__all__ = ["LibraryRunner", "RunResult", "RunSpec", "register_runner", "runner_for"]
