"""``PEROffPolicyWrapper``: prioritized experience replay done right for Tianshou's off-policy algorithms.

Tianshou wires PER by duck typing: a prioritized buffer puts IS weights in
``batch.weight``, the algorithm is expected to scale its loss by them and to
leave its TD errors in ``batch.weight``, and ``Algorithm._postprocess_batch``
hands those to ``buffer.update_weight``. Three things go wrong silently with
stock Tianshou 2.0.1: DQN's Huber loss drops the weights, beta is never annealed
unless the user writes a ``training_fn`` (and ``PrioritizedVectorReplayBuffer.set_beta``
does not even reach sampling), and nothing is logged about the prioritization.

Approach: wrapping, following Tianshou's own ``OffPolicyWrapperAlgorithm`` (as its
``ICMOffPolicyWrapper`` does). The wrapper owns no networks; it

1. sets beta from a schedule on the buffer before every sample (:meth:`update`),
   on our buffers and on Tianshou's, whose vector ``set_beta`` it works around;
2. runs the wrapped algorithm's pre-processing (n-step returns), then its update
   step through :func:`~hetero_replay.adapters.tianshou.weighted_updates.weighted_update`,
   which guarantees the IS weights scale the loss (DQN's Huber path included);
3. checks the step left TD errors, not the IS weights, in ``batch.weight`` and
   lets the wrapped algorithm's post-processing feed them back to the buffer;
4. returns the wrapped step's statistics extended with beta, IS-weight and
   priority statistics (:class:`PERTrainingStats`), which Tianshou's trainer
   averages and sends to its logger like any loss.

Subclassing each algorithm instead would need one subclass per algorithm and
could not fix a user's already-built algorithm; patching Tianshou is ruled out.
The wrapper also fixes two gaps of Tianshou's wrapper base class: the wrapped
algorithm's learning-rate schedulers are stepped, and ``state_dict`` round-trips
(the base class saves the wrapped optimizers under a key it cannot load).

Example:
    >>> dqn = DQN(policy=policy, optim=AdamOptimizerFactory(lr=1e-3), target_update_freq=250,
    ...           huber_loss_delta=1.0)                                     # doctest: +SKIP
    >>> algorithm = PEROffPolicyWrapper(wrapped_algorithm=dqn,
    ...     beta=LinearBetaSchedule(0.4, 1.0, num_updates=2_500))          # doctest: +SKIP
    >>> buf = HeteroPrioritizedVectorReplayBuffer(50_000, buffer_num=4)    # doctest: +SKIP
    >>> algorithm.run_training(OffPolicyTrainerParams(
    ...     training_collector=Collector(algorithm, envs, buf), ...))      # doctest: +SKIP
"""

from __future__ import annotations

import copy
import logging
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from tianshou.algorithm.algorithm_base import (
    OffPolicyAlgorithm,
    OffPolicyWrapperAlgorithm,
    TPolicy,
    TrainingStats,
    TrainingStatsWrapper,
)
from tianshou.data import PrioritizedReplayBuffer, PrioritizedReplayBufferManager, ReplayBuffer
from tianshou.data.types import RolloutBatchProtocol

from hetero_replay import Placement, StalenessOptions
from hetero_replay.adapters.tianshou.buffers import HeteroPrioritizedReplayBuffer, HeteroPrioritizedVectorReplayBuffer
from hetero_replay.adapters.tianshou.schedules import BetaSchedule, checked_beta
from hetero_replay.adapters.tianshou.sharded import ShardedVectorReplayBuffer, check_sharded_training
from hetero_replay.adapters.tianshou.weighted_updates import check_supported, weighted_update
from hetero_replay.extend import (
    Advice,
    AutoPlacement,
    PendingUpdate,
    Schedule,
    advise,
    one_policy_placement,
)

_log = logging.getLogger("hetero_replay.adapters.tianshou")


class PERTrainingStats(TrainingStatsWrapper):
    """The wrapped algorithm's statistics plus what prioritization did in this update.

    Tianshou's trainer keeps a moving average of every field and logs it
    (``update/smoothed_loss/<field>``); each field costs it 25-50 µs per
    update (a few percent of a small DQN's update), so only what changes per
    update is here. The rest are attributes: the buffer's largest priority is
    ``buffer.max_priority``; the staleness and the late updates skipped so far
    because their slot was rewritten first are the wrapper's ``staleness`` and
    ``dropped_updates`` (a constant and a running count, whose moving averages
    would cost 3% of a CartPole DQN's env steps and say nothing).

    Attributes:
        beta: IS-weight exponent the batch was sampled with.
        is_weight_mean: mean IS weight of the batch (1 = no correction).
        td_error_abs_mean: mean ``|TD error|`` of the batch, i.e. of the new
            priorities before ``+ eps`` and ``** alpha``.
    """

    def __init__(
        self,
        wrapped_stats: TrainingStats,
        *,
        beta: float,
        is_weight_mean: float,
        td_error_abs_mean: float,
    ) -> None:
        self.beta = beta
        self.is_weight_mean = is_weight_mean
        self.td_error_abs_mean = td_error_abs_mean
        super().__init__(wrapped_stats)  # last, as TrainingStatsWrapper requires


@dataclass
class _BatchRecord:
    """What the wrapper remembers about the batch in flight.

    A plain object: attributes of an ``nn.Module`` go through its slow ``__setattr__``.
    """

    beta: float = math.nan
    is_weight_mean: float = math.nan
    weight_object: Any = None


class PEROffPolicyWrapper(OffPolicyWrapperAlgorithm[TPolicy]):
    """Prioritized experience replay (arXiv:1511.05952) for an off-policy algorithm.

    Use it in place of the wrapped algorithm everywhere (``Collector``,
    ``run_training``), with a prioritized buffer: ideally
    :class:`~hetero_replay.adapters.tianshou.HeteroPrioritizedVectorReplayBuffer`
    (global IS-weight normalisation, stratified sampling), or Tianshou's own
    ``PrioritizedReplayBuffer``/``PrioritizedVectorReplayBuffer``.

    Args:
        wrapped_algorithm: a Tianshou ``DQN`` (MSE or Huber loss), ``DDPG``, ``TD3``
            or ``SAC`` (or a subclass that keeps its update step).
        beta: a constant IS-weight exponent in [0, 1], or a schedule
            ``update_index -> beta`` such as
            :class:`~hetero_replay.adapters.tianshou.LinearBetaSchedule`; it is
            called with the number of updates done so far and set on the buffer
            before each sample, overriding the buffer's beta.
        placement: a :class:`hetero_replay.placement.Placement`; the wrapped
            algorithm (networks, target networks) moves to its learner device,
            where Tianshou's networks then take their batches (Tianshou acts
            and trains with one policy, so ``inference`` and ``train`` must
            agree). Give the buffer the same placement: it puts the buffer's tree.
            ``None`` leaves the algorithm where it is.
            ``AutoPlacement(env=..., batch_size=..., buffer_size=..., n_envs=...)``
            (:class:`hetero_replay.advisor.AutoPlacement`) asks the advisor: it
            profiles copies of the algorithm in that setup on this machine
            (cached afterwards), takes the top-ranked placement for the given
            ``staleness``, sets the replay threads it was ranked with, keeps the
            ranking in ``self.advice`` and logs its choice; build the buffer
            with ``placement=algorithm.placement``.
        staleness: ``k``, learner updates a priority update may lag: the batch
            of update ``t`` is sampled after exactly the priority updates of
            updates ``<= t - k - 1`` were applied (the schedule of
            :class:`hetero_replay.pipeline.RelaxedReplay`), and updates whose
            slot was rewritten since their batch was sampled are skipped. ``0``
            (the default) is exact PER. Needs one of our buffers (they know which
            slots were rewritten). Tianshou's batches are Python objects built
            under the GIL, so the schedule runs on the learner's thread: this
            reproduces the relaxed pipeline's effect on learning, not its
            speed. :meth:`flush_priorities` applies the updates still held back.

    Attributes:
        staleness: ``k``, as given.
        dropped_updates: late priority-update entries skipped so far because
            their slot was rewritten after their batch was sampled.

    Raises:
        TypeError: ``wrapped_algorithm`` is not an off-policy algorithm whose use of
            the IS weights is known, ``beta`` (or the schedule's first value) is
            neither a real number nor callable (a bool is not a number),
            ``placement`` is not a :class:`~hetero_replay.placement.Placement`, or
            ``staleness`` is not an integer.
        ValueError: ``beta`` (or the schedule's first value) is outside [0, 1],
            the placement's inference and train devices differ, or ``staleness``
            is outside ``[0, 1024]``.
        hetero_replay.placement.DeviceUnavailableError: the placement names a device
            this machine lacks.
    """

    def __init__(
        self,
        *,
        wrapped_algorithm: OffPolicyAlgorithm[TPolicy],
        beta: float | BetaSchedule,
        placement: Placement | AutoPlacement | str | None = None,
        staleness: int = 0,
    ) -> None:
        if not isinstance(wrapped_algorithm, OffPolicyAlgorithm):
            raise TypeError(
                f"wrapped_algorithm must be a Tianshou OffPolicyAlgorithm, got {type(wrapped_algorithm).__name__}"
            )
        check_supported(wrapped_algorithm)
        if not (callable(beta) or isinstance(beta, (int, float))):
            raise TypeError(f"beta must be a number or a schedule update -> beta, got {type(beta).__name__}")
        checked_beta(beta(0) if callable(beta) else beta, "beta")
        # The wrapper runs the schedule on the learner's thread: nothing is drawn ahead.
        schedule_options = StalenessOptions(staleness, worker="inline")
        staleness = schedule_options.staleness
        advice = None
        if isinstance(placement, str) and placement != "auto":
            raise TypeError(
                f"placement must be a hetero_replay.placement.Placement or a hetero_replay.advisor.AutoPlacement, "
                f"got str {placement!r}"
            )
        if isinstance(placement, (AutoPlacement, str)):
            advice = _advice_for(placement, wrapped_algorithm, staleness)
            placement = advice.best.apply()
        if placement is not None:
            placement = one_policy_placement(placement, "Tianshou")
        super().__init__(wrapped_algorithm=wrapped_algorithm)
        self.schedule_options = schedule_options
        self.staleness = staleness
        # Priority updates held back (staleness >= 1); its steps are the updates sampled in this process.
        self._schedule = Schedule(staleness)
        self.dropped_updates = 0
        self.beta_schedule = beta
        self.num_updates = 0
        # Share, not copy: Algorithm._update steps *this* object's schedulers, and
        # the wrapped algorithm's _update (which would step its own) is never called.
        self.lr_schedulers = wrapped_algorithm.lr_schedulers
        self._batch = _BatchRecord()
        self._modes_after_train: dict[bool, list[tuple[torch.nn.Module, bool, tuple[Any, ...]]]] = {}  # see train()
        self.placement = placement
        #: The advisor's ranking when ``placement`` was an :class:`~hetero_replay.advisor.AutoPlacement`.
        self.advice = advice
        if placement is not None:
            # Parameters move in place, so the optimizers built with them stay valid.
            self.to(placement.learner_device)

    @property
    def current_beta(self) -> float:
        """The beta the next update samples with."""
        beta = self.beta_schedule(self.num_updates) if callable(self.beta_schedule) else self.beta_schedule
        return checked_beta(beta, f"beta schedule at update {self.num_updates}")

    def update(self, buffer: ReplayBuffer, sample_size: int | None) -> TrainingStats:
        """Set beta on ``buffer``, then sample, update and feed TD errors back as Tianshou does.

        A :class:`~hetero_replay.adapters.tianshou.sharded.ShardedVectorReplayBuffer`
        is sampled through its sharded replay instead: the drawn batch, a buffer
        of its own, goes through the same steps (see :mod:`.sharded`).

        Raises:
            TypeError: ``buffer`` is not a prioritized buffer.
            ValueError: a sharded buffer whose ``n_step`` is not the algorithm's horizon (see
                :func:`~hetero_replay.adapters.tianshou.sharded.check_sharded_training`).
        """
        if isinstance(buffer, ShardedVectorReplayBuffer):
            check_sharded_training(self.wrapped_algorithm, self.staleness, buffer.n_step)
            self._batch.beta = self.current_beta
            buffer = buffer.draw(sample_size, beta=self._batch.beta)
        elif not isinstance(buffer, PrioritizedReplayBuffer):
            raise TypeError(
                f"{type(self).__name__} needs a prioritized buffer (e.g. HeteroPrioritizedVectorReplayBuffer "
                f"or ShardedVectorReplayBuffer), got {type(buffer).__name__}"
            )
        else:
            self._batch.beta = self.current_beta
            _set_beta(buffer, self._batch.beta)
            if self.staleness:
                tracked = _tracking(buffer)
                self._apply_held_back(tracked, lambda: self._schedule.due(self._schedule.served))
                self._schedule.serve(tracked.write_epoch)
        stats = super().update(buffer=buffer, sample_size=sample_size)
        self.num_updates += 1
        return stats

    def flush_priorities(self, buffer: ReplayBuffer) -> None:
        """Apply every priority update still held back (``staleness >= 1``) to ``buffer``."""
        if self._schedule:
            self._apply_held_back(_tracking(buffer), self._schedule.next)

    def _apply_held_back(
        self,
        buffer: HeteroPrioritizedVectorReplayBuffer | HeteroPrioritizedReplayBuffer,
        pop: Callable[[], PendingUpdate | None],
    ) -> None:
        """Apply the held-back updates ``pop`` gives, in order, skipping rewritten slots (the schedule's rule)."""
        while (update := pop()) is not None:
            try:
                self.dropped_updates += buffer.update_weight_since(update.indices, update.td_errors, update.epoch)
            except (TypeError, ValueError, IndexError) as e:
                raise type(e)(
                    f"priority update of learner update {update.step} (staleness {self.staleness}): {e}"
                ) from e

    def _postprocess_batch(self, batch: RolloutBatchProtocol, buffer: ReplayBuffer, indices: np.ndarray) -> None:
        if not self.staleness:
            super()._postprocess_batch(batch, buffer, indices)
            return
        td = batch.weight
        td = td.detach().clone() if isinstance(td, torch.Tensor) else np.array(td, copy=True)
        self._schedule.record(np.array(indices, copy=True), td)

    def _preprocess_batch(
        self, batch: RolloutBatchProtocol, buffer: ReplayBuffer, indices: np.ndarray
    ) -> RolloutBatchProtocol:
        weights = getattr(batch, "weight", None)
        if weights is None:
            raise RuntimeError(f"{type(buffer).__name__}.sample returned no IS weights in batch.weight")
        weights = np.asarray(weights)
        self._batch.is_weight_mean = float(weights.sum()) / max(weights.size, 1)  # now: the algorithm pops the weights
        batch = super()._preprocess_batch(batch, buffer, indices)
        self._batch.weight_object = batch.weight  # what the update step must replace by its TD errors
        return batch

    def _update_with_batch(self, batch: RolloutBatchProtocol) -> TrainingStats:
        stats = weighted_update(self.wrapped_algorithm, batch)
        return self._wrapper_update_with_batch(batch, stats)

    def _wrapper_update_with_batch(
        self, batch: RolloutBatchProtocol, original_stats: TrainingStats
    ) -> PERTrainingStats:
        td = getattr(batch, "weight", None)
        if not isinstance(td, torch.Tensor) or td is self._batch.weight_object:
            raise RuntimeError(
                f"{type(self.wrapped_algorithm).__name__}'s update step did not leave its TD errors in "
                "batch.weight; feeding back the IS weights as priorities would be wrong"
            )
        self._batch.weight_object = None
        return PERTrainingStats(
            original_stats,
            beta=self._batch.beta,
            is_weight_mean=self._batch.is_weight_mean,
            td_error_abs_mean=float(td.detach().abs().mean()),
        )

    def train(self, mode: bool = True) -> PEROffPolicyWrapper:
        """Set training mode on the wrapped algorithm (which holds the policy) and on self.

        Tianshou's wrapper base registers the policy twice (as ``policy`` and inside
        ``wrapped_algorithm``), so ``nn.Module.train`` would walk it twice. And
        ``Algorithm._update`` switches modes twice per update, nearly always to
        the modes the modules already have: a walk that sets every module's flag
        costs ~68 µs for a small DQN (``nn.Module.__setattr__`` per module),
        listing the modules with their flags (``modules()``) ~14 µs. So the
        modules ``train(mode)`` left, with their flags and children, are
        remembered, and while each still has them the walk is skipped: the
        result is the same. Checking that reads each remembered module's flag and
        children (~4 µs): a module added, replaced or removed anywhere changes
        its parent's children.
        """
        if not _unchanged(self._modes_after_train.get(mode)):
            self.wrapped_algorithm.train(mode)
            self._modes_after_train[mode] = _modes(self.wrapped_algorithm)
        if self.training != mode:
            self.training = mode
        return self

    # -- checkpoints -------------------------------------------------------------------------

    def get_extra_state(self) -> dict[str, Any]:
        """Saved in ``state_dict``: the update count, so a resumed run continues the beta schedule."""
        return {"num_updates": self.num_updates}

    def set_extra_state(self, state: Mapping[str, Any]) -> None:
        self.num_updates = int(state["num_updates"])

    def load_state_dict(self, state_dict: Mapping[str, Any], strict: bool = True, assign: bool = False) -> Any:
        """Load a :meth:`state_dict`, including the wrapped algorithm's optimizer states."""
        # Algorithm.state_dict nests the wrapped algorithm's optimizers under this key,
        # which Algorithm.load_state_dict (top-level key only) would reject as unexpected.
        state = dict(state_dict)
        key = f"wrapped_algorithm.{self._STATE_DICT_KEY_OPTIMIZERS}"
        optimizers = self.wrapped_algorithm._optimizers
        optim_states = state.pop(key, None)
        if optim_states is None and strict:
            raise KeyError(f"state_dict lacks {key!r} (the wrapped algorithm's optimizer states)")
        if optim_states is not None and len(optim_states) != len(optimizers):
            raise ValueError(
                f"state_dict holds {len(optim_states)} optimizer states, the wrapped algorithm has {len(optimizers)}"
            )
        result = super().load_state_dict(state, strict=strict, assign=assign)  # checks and loads the networks
        for optim, optim_state in zip(optimizers, optim_states or []):
            optim.load_state_dict(optim_state)
        return result


def _modes(module: torch.nn.Module) -> list[tuple[torch.nn.Module, bool, tuple[Any, ...]]]:
    """Every submodule of ``module`` with its training flag and its children (compared by identity)."""
    return [(m, m.training, tuple(m._modules.values())) for m in module.modules()]


def _unchanged(modes: list[tuple[torch.nn.Module, bool, tuple[Any, ...]]] | None) -> bool:
    """Whether every module of ``modes`` (:func:`_modes`) still has its flag and its children."""
    if modes is None:
        return False
    for module, training, children in modes:
        if module.training != training or tuple(module._modules.values()) != children:
            return False
    return True


def _tracking(buffer: ReplayBuffer) -> HeteroPrioritizedReplayBuffer | HeteroPrioritizedVectorReplayBuffer:
    """``buffer``, recording which slots each add rewrites; ``TypeError`` unless it is one of ours."""
    if not isinstance(buffer, (HeteroPrioritizedReplayBuffer, HeteroPrioritizedVectorReplayBuffer)):
        raise TypeError(
            f"staleness >= 1 needs a HeteroPrioritizedReplayBuffer or HeteroPrioritizedVectorReplayBuffer "
            f"(they know which slots were rewritten since a batch was sampled), got {type(buffer).__name__}"
        )
    buffer.track_writes()
    return buffer


def _set_beta(buffer: PrioritizedReplayBuffer, beta: float) -> None:
    buffer.set_beta(beta)
    if isinstance(buffer, PrioritizedReplayBufferManager) and not isinstance(
        buffer, HeteroPrioritizedVectorReplayBuffer
    ):
        # Tianshou's PrioritizedVectorReplayBuffer.set_beta only reaches its children,
        # whose trees are unused; sampling reads the manager's own _beta.
        PrioritizedReplayBuffer.set_beta(buffer, beta)


def _advice_for(auto: AutoPlacement | str, algorithm: OffPolicyAlgorithm, staleness: int) -> Advice:
    """The advisor's ranking for ``algorithm`` in the setup ``auto`` describes, keeping ``staleness``.

    It profiles deep copies of ``algorithm`` (the profile is cached per setup
    and machine), never ``algorithm`` itself, and logs its choice.
    """
    if not isinstance(auto, AutoPlacement):
        raise ValueError(
            f"placement={auto!r}: a Tianshou algorithm knows neither its environment nor its buffer, so the "
            "advisor needs them: placement=hetero_replay.advisor.AutoPlacement(env='CartPole-v1', batch_size=64, "
            "buffer_size=20_000, n_envs=4)"
        )
    from tianshou.algorithm import DDPG, DQN, SAC, TD3

    names = ((TD3, "td3"), (SAC, "sac"), (DDPG, "ddpg"), (DQN, "dqn"))
    algo = next((name for cls, name in names if isinstance(algorithm, cls)), None)
    if algo is None:
        raise TypeError(f"the advisor models DQN, DDPG, TD3 and SAC, not {type(algorithm).__name__}")
    advice = advise(
        lib="tianshou", algo=algo, env=auto.env, batch_size=auto.batch_size, buffer_size=auto.buffer_size,
        n_envs=auto.n_envs, algorithm_factory=lambda: copy.deepcopy(algorithm), staleness=(staleness,),
        profile=auto.profile, cache=auto.cache, **dict(auto.options),
    )  # fmt: skip
    _log.info("PEROffPolicyWrapper(placement=AutoPlacement(...)): %s", advice.explain())
    return advice
