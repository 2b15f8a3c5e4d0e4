"""What every PER algorithm adds to its SB3 parent: the buffer, the beta schedule, the logs.

The algorithm classes (``PERDQN``, ``PERDDPG``, ``PERTD3``, ``PERSAC``) put
:class:`PERMixin` before the SB3 class they extend; their own file holds only
their ``train()``.
"""

from __future__ import annotations

import io
import logging
import pathlib
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from gymnasium import spaces
from stable_baselines3.common.utils import ConstantSchedule, LinearSchedule, get_device

from hetero_replay import Placement
from hetero_replay.adapters.sb3.buffers import DictPrioritizedReplayBuffer, PrioritizedReplayBuffer
from hetero_replay.adapters.sb3.nstep import NStepPrioritizedReplayBuffer
from hetero_replay.extend import Advice, check_beta, check_staleness, is_real, one_policy_placement, same_device

_log = logging.getLogger("hetero_replay.adapters.sb3")
#: A model's arguments that say where it runs or what it logs, not what it trains: placement="auto" leaves them out.
_NOT_WORKLOAD = ("policy", "env", "seed", "device", "verbose", "tensorboard_log", "_init_setup_model")

#: ``progress_remaining`` (1 at the start of training, 0 at the end) -> beta.
BetaSchedule = Callable[[float], float]

if TYPE_CHECKING:
    from stable_baselines3.common.off_policy_algorithm import OffPolicyAlgorithm

    # PERMixin is only ever mixed into SB3's off-policy algorithms: type-check it as one
    # (its attributes and super() calls are theirs). At run time it is a plain mixin.
    _OffPolicyBase = OffPolicyAlgorithm
else:
    _OffPolicyBase = object


def has_priorities(buffer_class: type) -> bool:
    """Whether ``buffer_class`` takes priority updates (its samples carry ``weights`` and ``indices``)."""
    return callable(getattr(buffer_class, "update_priorities", None))


class PERMixin(_OffPolicyBase):
    """Prioritized replay for an SB3 off-policy algorithm; put it first in the bases.

    * With no ``replay_buffer_class`` the algorithm uses
      :class:`PrioritizedReplayBuffer` (:class:`DictPrioritizedReplayBuffer` for
      ``Dict`` observations); its options go in ``replay_buffer_kwargs``
      (the PER options ``alpha``, ``beta``, ``eps``, ``tree``, ... or a ready
      ``options=PEROptions(...)``; see :class:`hetero_replay.PEROptions`). A buffer class without
      ``update_priorities`` is refused with a ``TypeError``.
    * ``beta`` is annealed by ``beta_schedule``, called with SB3's
      ``_current_progress_remaining`` at each ``train()``. The default goes
      linearly from the buffer's initial ``beta`` to 1 over ``total_timesteps``.
    * Each log dump (:meth:`dump_logs`, every ``log_interval`` episodes of ``learn``)
      records ``train/per_beta``, ``train/per_mean_weight`` (mean IS weight of the
      batches sampled since the previous dump), ``train/per_max_priority``
      (largest ``|TD error| + eps`` so far), ``train/per_staleness`` and
      ``train/per_dropped_updates`` (late updates skipped because their slot
      was rewritten first, so far). They are taken there, not at every
      ``train()``: SB3 keeps only the last value recorded before a dump, and
      taking them per gradient step cost a CartPole DQN step ~18 us.
    * ``staleness=k`` relaxes the dependency between a step's priority update
      and the next sample (:class:`hetero_replay.pipeline.RelaxedReplay`) on a
      fixed schedule, so seeded runs still repeat exactly; where the replay work
      is a large enough share of a step, a worker thread does it while the
      network trains.
    * ``n_steps=k > 1`` (SB3's argument) trains on n-step returns, as SB3 does:
      the default buffer is then :class:`NStepPrioritizedReplayBuffer` (with
      the model's ``n_steps`` and ``gamma``), whose priorities belong to the
      n-step transition that starts at each stored row. Refused for ``Dict``
      observations, as SB3 refuses it.
    * ``placement`` places the primitives: the model's device is
      ``placement.learner_device`` and the buffer is built from the placement (see
      :class:`~hetero_replay.adapters.sb3.PrioritizedReplayBuffer`). SB3 acts
      and trains with one policy, so ``inference`` and ``train`` must agree. A
      saved model keeps its placement; ``Model.load(path, placement=other)``
      places it anew (the placement, not ``load``'s ``device``, decides the device).

    Args:
        beta_schedule: ``None`` (linear to 1), a constant in ``[0, 1]``, or a
            function of ``progress_remaining`` (1 -> 0) returning beta in ``[0, 1]``.
        placement: a :class:`hetero_replay.placement.Placement`, ``"auto"``, or
            ``None`` for the buffer's defaults (C++ tree, NumPy storage) on
            SB3's ``device``. ``replay_buffer_kwargs=dict(placement=...)`` means
            the same. ``"auto"`` asks :func:`hetero_replay.advisor.advise`: it
            profiles this setup on this machine (cached afterwards), takes the
            top-ranked placement for the given ``staleness`` (and ``device``, if
            given), sets the replay threads it was ranked with
            (:func:`hetero_replay.set_num_threads`), keeps the ranking in
            ``model.advice`` and logs which placement it chose and why (printed
            with ``verbose >= 1``).
        staleness: learner steps a priority update may lag behind sampling,
            an integer in ``[0, 1024]``; ``0`` (the default) is exact PER.
            ``replay_buffer_kwargs=dict(staleness=...)`` means the same; the
            worker prepares ``replay_buffer_kwargs["prefetch"]`` batches ahead
            (default 1).
        **kwargs: the arguments of the SB3 algorithm. With a placement,
            ``device`` may be left out (or name the placement's learner device).

    Raises:
        TypeError: ``placement`` is neither a :class:`~hetero_replay.placement.Placement`, ``"auto"`` nor ``None``.
        ValueError: the placement's inference and train devices differ, or
            ``device`` or ``replay_buffer_kwargs`` contradict the placement;
            ``staleness`` out of range or contradicted by ``replay_buffer_kwargs``;
            ``n_steps > 1`` with ``Dict`` observations, or ``n_steps`` or ``gamma``
            contradicted by ``replay_buffer_kwargs``.
        hetero_replay.placement.DeviceUnavailableError: the placement names a device
            this machine lacks (also for a placement built with ``check=False``).
    """

    placement: Placement | None
    # OffPolicyAlgorithm's, narrowed: _setup_model builds a prioritized buffer, load_replay_buffer keeps one
    replay_buffer: PrioritizedReplayBuffer

    def __init__(
        self,
        *args: Any,
        beta_schedule: BetaSchedule | float | None = None,
        placement: Placement | str | None = None,
        staleness: int = 0,
        **kwargs: Any,
    ) -> None:
        constant = is_real(beta_schedule)
        if beta_schedule is not None and not constant and not callable(beta_schedule):
            raise TypeError(
                "beta_schedule must be None, a float or a callable, "
                f"got {type(beta_schedule).__name__} {beta_schedule!r}"
            )
        if constant and not _is_beta(beta_schedule):
            raise ValueError(f"beta_schedule: a constant beta must be in [0, 1], got {beta_schedule}")
        buffer_kwargs = dict(kwargs.get("replay_buffer_kwargs") or {})
        if "placement" in buffer_kwargs:  # one placement per model, kept on the model
            in_buffer_kwargs = buffer_kwargs.pop("placement")
            if placement is not None and in_buffer_kwargs != placement:
                raise ValueError(
                    f"placement={placement!r} and replay_buffer_kwargs['placement']={in_buffer_kwargs!r} differ; pass one"
                )
            placement = in_buffer_kwargs
            kwargs["replay_buffer_kwargs"] = buffer_kwargs
        staleness = check_staleness(staleness)
        in_buffer_kwargs = buffer_kwargs.get("staleness")
        if in_buffer_kwargs is not None:
            in_buffer_kwargs = check_staleness(in_buffer_kwargs, "replay_buffer_kwargs['staleness']")
            if staleness and in_buffer_kwargs != staleness:
                raise ValueError(
                    f"staleness={staleness} and replay_buffer_kwargs['staleness']={in_buffer_kwargs} differ; pass one"
                )
            staleness = in_buffer_kwargs
        self.staleness = staleness
        self.beta_schedule = beta_schedule
        self.advice: Advice | None = None
        if isinstance(placement, str):
            placement = self._advised_placement(placement, args, kwargs)
        self.placement = placement
        # The device asked for, to check against the placement (load() passes its own here).
        self._device_arg = kwargs.get("device", "auto")
        super().__init__(*args, **kwargs)

    def _advised_placement(self, placement: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Placement:
        """``placement="auto"``: the advisor's best placement for this model on this machine (it also sets the threads).

        The advisor profiles fresh copies of the environment and model (the
        profile is cached, so the next model of the same setup is instant),
        keeps the staleness asked for, and, where ``device`` is given, that
        learner device.
        """
        from hetero_replay.extend import advise

        if placement != "auto":
            raise TypeError(
                f"placement must be a hetero_replay.placement.Placement, 'auto' or None, got str {placement!r}"
            )
        policy = args[0] if args else kwargs.get("policy")
        env = args[1] if len(args) > 1 else kwargs.get("env")
        if env is None:
            raise ValueError("placement='auto' profiles the environment, so the model needs one (env=...)")
        # What places or logs the model is not part of the workload; the advisor sets the placement.
        settings = {k: v for k, v in kwargs.items() if k not in _NOT_WORKLOAD}
        if settings.get("replay_buffer_kwargs"):
            settings["replay_buffer_kwargs"] = {
                k: v for k, v in settings["replay_buffer_kwargs"].items() if k not in ("staleness", "prefetch")
            }
        device = str(kwargs.get("device", "auto"))
        if device == "auto":
            learners = None
        else:
            chosen = get_device(device)
            learners = ["cpu" if chosen.type == "cpu" else f"{chosen.type}:{chosen.index or 0}"]
        self.advice = advise(
            lib="sb3", algo=type(self), env=env, policy=policy, staleness=(self.staleness,), learners=learners,
            **settings,
        )  # fmt: skip
        choice = self.advice.best
        message = f"{type(self).__name__}(placement='auto'): " + self.advice.explain()
        _log.info(message)
        if kwargs.get("verbose", 0) >= 1:
            print(message)
        return choice.apply()

    def _setup_model(self) -> None:
        # The one place the PER buffer is chosen and built (SB3 builds it in
        # super()._setup_model from replay_buffer_class / replay_buffer_kwargs).
        if self.placement is not None:
            self._apply_placement()
        n_steps = getattr(self, "n_steps", 1)
        if self.replay_buffer_class is None:
            self.replay_buffer_class = self._default_buffer_class(n_steps)
            if n_steps > 1:
                self.replay_buffer_kwargs = _with_n_steps(self.replay_buffer_kwargs, n_steps, self.gamma)
        _require_priorities(self.replay_buffer_class, type(self).__name__)
        if self.staleness:
            self.replay_buffer_kwargs = {**self.replay_buffer_kwargs, "staleness": self.staleness}
        with warnings.catch_warnings():
            if n_steps > 1 and self.replay_buffer_kwargs.get("n_steps") == n_steps:
                # SB3 warns that n_steps is ignored with any buffer class given; ours was given n_steps.
                warnings.filterwarnings("ignore", message=r"`n_steps=\d+` is ignored", category=UserWarning)
            super()._setup_model()
        if self.beta_schedule is None:
            self.beta_schedule = LinearSchedule(self.replay_buffer.beta, 1.0, 1.0)
        elif not callable(self.beta_schedule):  # a constant, checked in __init__
            self.beta_schedule = ConstantSchedule(float(self.beta_schedule))

    def _default_buffer_class(self, n_steps: int) -> type[PrioritizedReplayBuffer]:
        """The buffer for ``replay_buffer_class=None``: n-step, ``Dict`` or plain, as SB3 picks its own.

        Raises:
            ValueError: ``n_steps > 1`` with ``Dict`` observations (SB3 has no n-step returns for those).
        """
        if not isinstance(self.observation_space, spaces.Dict):
            return NStepPrioritizedReplayBuffer if n_steps > 1 else PrioritizedReplayBuffer
        if n_steps > 1:
            raise ValueError(
                f"{type(self).__name__}: n_steps={n_steps} with Dict observations: n-step returns are not "
                "supported for Dict observation spaces (nor by SB3); use n_steps=1"
            )
        return DictPrioritizedReplayBuffer

    def _apply_placement(self) -> None:
        """Check the placement and make it the model's: its device and its buffer's placement."""
        placement = one_policy_placement(self.placement, type(self).__name__)
        learner = placement.learner_device
        if str(self._device_arg) != "auto" and not same_device(get_device(self._device_arg), learner):
            raise ValueError(
                f"device={str(self._device_arg)!r} contradicts the placement, whose learner device is {learner!r}; "
                "leave device out: the placement sets it"
            )
        self.placement = placement
        self.device = get_device(learner)
        self.replay_buffer_kwargs = {**self.replay_buffer_kwargs, "placement": placement}

    def _excluded_save_params(self) -> list[str]:
        # The device asked for at construction is not saved: load() passes its own.
        return [*super()._excluded_save_params(), "_device_arg"]

    def load_replay_buffer(self, path: str | pathlib.Path | io.BufferedIOBase, truncate_last_traj: bool = True) -> None:
        """SB3's ``load_replay_buffer``; the loaded buffer keeps the placement it was saved with.

        The model's ``staleness`` becomes the loaded buffer's (its schedule is what
        runs from now on). Refused, with the current buffer kept: a buffer without priorities
        (``TypeError``), one for other spaces or another number of environments
        than the model's, and one whose core engine delivers batches to another
        device than the model's (``ValueError``).
        """
        previous: Any = getattr(self, "replay_buffer", None)  # SB3 loads into a model whose buffer was deleted, too
        try:
            super().load_replay_buffer(path, truncate_last_traj)
            _require_priorities(type(self.replay_buffer), type(self).__name__)
            _require_same_env(self.replay_buffer, self, type(self).__name__)
            # A priority buffer of another kind may have no engine (and so no batch device) to check.
            device = getattr(getattr(self.replay_buffer, "replay", None), "device", None)
            if device is not None and not same_device(device, self.device):
                raise ValueError(
                    f"the loaded buffer delivers batches to {str(device)!r}, but {type(self).__name__} "
                    f"trains on {str(self.device)!r}; load it into a model with the placement it was saved with"
                )
        except BaseException:
            self.replay_buffer = previous
            raise
        self.staleness = getattr(self.replay_buffer, "staleness", 0)  # the buffer's schedule is what runs

    def _update_beta(self) -> None:
        """Set the buffer's beta from the schedule."""
        assert callable(self.beta_schedule)
        beta = self.beta_schedule(self._current_progress_remaining)
        try:
            self.replay_buffer.beta = beta  # the buffer's setter checks it, once per train() call
        except (TypeError, ValueError):
            raise ValueError(
                f"beta_schedule returned {beta!r} at progress_remaining={self._current_progress_remaining:.3f}; "
                "beta must be a number in [0, 1]"
            ) from None

    def dump_logs(self) -> None:
        """SB3's log dump, with the PER state recorded first (see :meth:`_record_per`)."""
        self._record_per()
        super().dump_logs()

    def _record_per(self) -> None:
        """Record the PER state in the logger: beta, the mean IS weight of the batches sampled since the last call
        (if the buffer keeps it), the max priority, the staleness and the dropped updates."""
        self.logger.record("train/per_beta", self.replay_buffer.beta)
        take_mean_weight = getattr(self.replay_buffer, "take_mean_weight", None)
        if take_mean_weight is not None:
            self.logger.record("train/per_mean_weight", take_mean_weight())
        self.logger.record("train/per_max_priority", self.replay_buffer.max_priority)
        self.logger.record("train/per_staleness", self.staleness)
        self.logger.record("train/per_dropped_updates", getattr(self.replay_buffer, "dropped_updates", 0))


def _is_beta(value: Any) -> bool:
    """Whether the core accepts ``value`` as beta (:func:`hetero_replay.options.check_beta`: a finite real in [0, 1])."""
    try:
        check_beta(value)
    except (TypeError, ValueError):
        return False
    return True


def _require_same_env(buffer: Any, model: Any, algo: str) -> None:
    """``ValueError`` unless ``buffer`` holds transitions of ``model``'s spaces and number of environments.

    Another buffer would fail at the first ``add`` of ``learn``, or train on another task's transitions.
    """
    for name in ("observation_space", "action_space", "n_envs"):
        ours, theirs = getattr(model, name), getattr(buffer, name)
        if ours != theirs:
            raise ValueError(
                f"the loaded buffer's {name} is {theirs}, but {algo}'s is {ours}; "
                "load a buffer saved by a model of the same environment"
            )


def _with_n_steps(buffer_kwargs: dict[str, Any], n_steps: int, gamma: float) -> dict[str, Any]:
    """``buffer_kwargs`` with the model's ``n_steps`` and ``gamma`` for the n-step buffer (as SB3 passes them).

    Raises:
        ValueError: ``buffer_kwargs`` names another value of either: the returns would not be the model's.
    """
    for name, value in (("n_steps", n_steps), ("gamma", gamma)):
        if name in buffer_kwargs and buffer_kwargs[name] != value:
            raise ValueError(
                f"{name}={value!r} and replay_buffer_kwargs[{name!r}]={buffer_kwargs[name]!r} differ; pass one"
            )
    return {**buffer_kwargs, "n_steps": n_steps, "gamma": gamma}


def _require_priorities(buffer_class: type, algo: str) -> None:
    if not has_priorities(buffer_class):
        raise TypeError(
            f"{algo} needs a replay buffer with priorities (update_priorities(indices, td_errors), and samples "
            f"with weights and indices); {buffer_class.__name__} has none. Leave replay_buffer_class unset "
            "(PrioritizedReplayBuffer), or use the stock SB3 algorithm for uniform replay."
        )
