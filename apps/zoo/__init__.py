"""Train hetero-replay's PER algorithms from rl-zoo3, with its YAML hyperparameters.

rl-zoo3 picks an algorithm by name from its table ``rl_zoo3.utils.ALGOS`` and reads its
hyperparameters from ``hyperparams/<algo>.yml``; it has no plug-in hook, and ``train``'s
``--algo`` choices are fixed from the table when its parser is built. So this module adds our
algorithms to the table (:func:`register`) and then runs rl-zoo3's own ``train`` (or ``enjoy``)
entry point, with our hyperparameter file unless ``--conf-file`` names another::

    python -m hetero_replay.apps.zoo --algo perdqn --env CartPole-v1
    python -m hetero_replay.apps.zoo enjoy --algo perdqn --env CartPole-v1 -f logs/

Every other argument is rl-zoo3's (``-n``, ``--seed``, ``-params``, ``--eval-freq``, ``-f`` ...).
``hyperparams/<algo>.yml`` holds rl-zoo3's own settings for the base algorithm on CartPole-v1
(discrete) and Pendulum-v1 (continuous), plus the PER options in ``replay_buffer_kwargs``.
Needs the ``zoo`` extra (rl_zoo3; sb3-contrib comes with it).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

from hetero_replay.registry import install_hint

#: Our hyperparameter files, one per algorithm: ``HYPERPARAMS / f"{name}.yml"``.
HYPERPARAMS = Path(__file__).resolve().parent / "hyperparams"


def algorithms() -> dict[str, type]:
    """rl-zoo3 name -> class: the SB3 and sb3-contrib PER algorithms."""
    from hetero_replay.adapters.sb3 import PERDDPG, PERDQN, PERQRDQN, PERSAC, PERTD3, PERTQC, PERCrossQ

    classes = (PERDQN, PERDDPG, PERTD3, PERSAC, PERQRDQN, PERTQC, PERCrossQ)
    return {cls.__name__.lower(): cls for cls in classes}


def register() -> dict[str, type]:
    """Add :func:`algorithms` to rl-zoo3's table (idempotent); returns them.

    Raises:
        ImportError: rl_zoo3 is not installed (the message says how to install the ``zoo`` extra).
    """
    try:
        from rl_zoo3.utils import ALGOS
    except ImportError as e:
        raise ImportError(f"training from rl-zoo3 needs rl_zoo3: {install_hint('zoo')}") from e
    ours = algorithms()
    ALGOS.update(ours)
    return ours


def with_our_hyperparams(argv: Sequence[str]) -> list[str]:
    """``argv`` plus ``--conf-file`` naming our YAML of the chosen algorithm, unless it names a file or another algorithm."""
    args = list(argv)
    if any(a in ("-conf", "--conf-file") or a.startswith("--conf-file=") for a in args):
        return args
    algo = next((args[i + 1] for i, a in enumerate(args[:-1]) if a == "--algo"), None)
    algo = algo or next((a.split("=", 1)[1] for a in args if a.startswith("--algo=")), None)
    if algo is not None and (HYPERPARAMS / f"{algo}.yml").is_file():
        args += ["--conf-file", str(HYPERPARAMS / f"{algo}.yml")]
    return args


def main(argv: Sequence[str] | None = None) -> None:
    """``[train|enjoy] <rl-zoo3 arguments>``: register our algorithms, then run rl-zoo3's entry point."""
    args = list(sys.argv[1:] if argv is None else argv)
    command = args.pop(0) if args and args[0] in ("train", "enjoy") else "train"
    register()
    if command == "train":
        from rl_zoo3.train import train as run

        args = with_our_hyperparams(args)
    else:
        from rl_zoo3.enjoy import enjoy as run
    saved = sys.argv
    sys.argv = [f"rl_zoo3.{command}", *args]  # rl-zoo3's entry points parse sys.argv
    try:
        run()
    finally:
        sys.argv = saved
