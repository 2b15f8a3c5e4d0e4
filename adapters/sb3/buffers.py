"""Prioritized replay buffers that plug into Stable-Baselines3's off-policy algorithms.

``PrioritizedReplayBuffer`` is a drop-in ``replay_buffer_class`` for DQN, DDPG,
TD3 and SAC; ``DictPrioritizedReplayBuffer`` is its counterpart for
``MultiInputPolicy`` (``Dict`` observation spaces). Transitions live in the
core engine (:class:`hetero_replay.PrioritizedReplay`), not in SB3's NumPy
arrays: one priority per transition, sampled and updated in one native call each.

Placement: with ``placement=`` (a :class:`hetero_replay.placement.Placement`) the core
engine is built from ``placement.replay_kwargs()``: the tree backend and its
device, where transitions are stored, and the learner's device. When the
engine hands out torch tensors already on the learner's device (storage on a
device, or a GPU learner), :meth:`~PrioritizedReplayBuffer.sample` passes them
on untouched and :meth:`~PrioritizedReplayBuffer.update_priorities` hands the
TD-error tensor to the tree where it lives.

Thread safety: each buffer has its own re-entrant lock (a ``ForkSafeLock``) that every public
operation holds (see :class:`PrioritizedReplayBuffer`); a fork waits for the
operations under way, so the child gets consistent buffers with free locks.
"""

from __future__ import annotations

import functools
import math
import warnings
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt
import torch as th
from gymnasium import spaces
from stable_baselines3.common.buffers import ReplayBuffer
from stable_baselines3.common.utils import get_device
from stable_baselines3.common.vec_env import VecNormalize

from hetero_replay import (
    UNSET,
    Field,
    PEROptions,
    Placement,
    PrioritizedReplay,
    RateLimiter,
    RelaxedReplay,
    Replay,
    Sample,
    Schema,
    ShardedReplay,
    StalenessOptions,
)
from hetero_replay.extend import (
    OUTER,
    CheckedRows,
    ForkSafeLock,
    Normalise,
    RowStager,
    check_bool,
    check_int,
    check_normalise,
    check_seed,
    close_when_gone,
    normalise_by_batch,
    one_policy_placement,
    same_device,
    td_magnitudes,
)

#: A buffer sampled this many times in a row without ``update_priorities`` warns once.
WARN_AFTER_SAMPLES = 100

#: At most this many rows are staged by ``add`` before they go to the core engine.
STAGE_ROWS = 256

#: Batches of at most this many IS weights are summed as a list (``math.fsum``), larger ones by NumPy.
_FSUM_MAX = 1024


class PrioritizedReplayBufferSamples(NamedTuple):
    """A sampled batch: SB3's ``ReplayBufferSamples`` fields, in SB3's order, plus PER.

    The first six fields match ``ReplayBufferSamples`` (``DictReplayBufferSamples``
    for Dict observations) by name and position, so SB3's own ``train()`` reads
    them unchanged. ``weights`` are the importance-sampling weights, shaped like
    ``rewards``; ``indices`` identify the transitions for
    :meth:`PrioritizedReplayBuffer.update_priorities` (a NumPy array, or a
    tensor where the tree is when the buffer hands out device batches).
    """

    observations: th.Tensor | dict[str, th.Tensor]
    actions: th.Tensor
    next_observations: th.Tensor | dict[str, th.Tensor]
    dones: th.Tensor
    rewards: th.Tensor
    discounts: th.Tensor | None
    weights: th.Tensor
    indices: np.ndarray | th.Tensor


class PrioritizedReplayBuffer(ReplayBuffer):
    """Prioritized experience replay (Schaul et al., 2016) for SB3's off-policy algorithms.

    Transition ``i`` is sampled with probability ``p_i^alpha / sum_k p_k^alpha``
    and comes with the importance-sampling weight ``(N P(i))^-beta``, normalised
    by its maximum over the whole buffer (or over the batch: ``weight_norm``). New transitions get the largest
    priority seen so far; :meth:`update_priorities` sets ``p_i = |TD error| + eps``.

    With :class:`~hetero_replay.adapters.sb3.PERDQN` (and ``PERDDPG``, ``PERTD3``,
    ``PERSAC``) the losses are weighted and priorities are fed back. As the
    ``replay_buffer_class`` of SB3's *stock* algorithms it runs too, but those
    never call :meth:`update_priorities` and ignore ``weights``: every
    priority stays at its initial value, so sampling is uniform. The buffer
    warns once when it is sampled ``WARN_AFTER_SAMPLES`` times in a row
    without a priority update.

    Each ``add`` writes one row of ``n_envs`` transitions; transition ``env`` of
    row ``row`` has the flat index ``row * n_envs + env``, and sampling picks
    the (row, env) pair itself, by priority.

    Thread safety: every public operation (:meth:`add`, :meth:`sample`,
    :meth:`update_priorities`, :meth:`reset`, :meth:`size`, the properties and
    array views, pickling for ``save_replay_buffer``) holds the buffer's own
    re-entrant lock (held across ``fork``), so any of them may be called from several threads at
    once: each ``add`` lands whole (no row lost or torn), a sample never
    contains a transition that is half written or never written, and a
    pickled buffer is one consistent snapshot. What is *not* covered: reading
    or writing through the array views (``observations``, ``dones``, ...) or
    through :attr:`replay` after they are returned, and ``pos``/``full``
    written by hand. A ``fork`` waits for the operations under way, so the
    child's buffers are consistent and their locks free.

    Args:
        buffer_size: transitions kept (rounded down to a multiple of ``n_envs``,
            at least one row), a positive integer.
        observation_space: the environment's observation space.
        action_space: the environment's action space.
        device: torch device of the sampled tensors (``"auto"``: cuda if available).
        n_envs: parallel environments writing each row, a positive integer.
        optimize_memory_usage: store each observation once (the next observation
            of row ``r`` is the observation of row ``r + 1``). The row whose next
            observation is not written yet has priority 0, so it is never sampled.
            Needs ``handle_timeout_termination=False``, as in SB3.
        handle_timeout_termination: store time-limit truncations and sample
            ``dones * (1 - timeouts)``, so targets bootstrap through truncation.
        alpha, beta, eps, tree, fanout, priority_dtype, stratified: the PER
            options, documented (with their defaults) once in
            :class:`hetero_replay.PEROptions`. ``beta`` is the starting value;
            the PER algorithms anneal it to 1 over training.
        seed: seed of the buffer's own random generator. ``None`` draws one from
            NumPy's global generator, which SB3 seeds from the algorithm's
            ``seed`` just before building the buffer, so seeded runs repeat exactly.
        placement: where the replay primitives run
            (:class:`hetero_replay.placement.Placement`); ``None`` is the C++ tree
            (``tree``) with NumPy storage. With a placement, the tree backend, its
            device, the storage and the device of sampled batches come from
            ``placement.replay_kwargs()``; ``tree`` must stay ``"auto"`` and
            ``device`` must be ``"auto"`` (then it is the placement's learner
            device) or that device. The PER algorithms take ``placement=`` too and
            pass it here.
        options: a ready :class:`hetero_replay.PEROptions`; the PER keyword
            arguments above, where given, override its fields.
        staleness: how many learner steps a priority update may lag behind
            sampling (:class:`hetero_replay.pipeline.RelaxedReplay`): with
            ``k >= 1`` the next batches are drawn and priority updates applied
            on a fixed schedule (seeded runs repeat exactly), on a worker
            thread behind training where that pays. ``0`` (the default) is exact PER.
        prefetch: batches the worker prepares ahead (at most ``staleness``).
        storage: where transitions live when no ``placement`` says: ``"host"``
            (NumPy, the default), ``"shared"`` (a file mapping other processes
            can add to) or ``"disk"`` (a ring file with durable points, for
            buffers larger than RAM); see :mod:`hetero_replay.storage`.
        storage_options: the storage's keyword arguments (``"disk"``:
            ``path=`` a directory, required; ``reopen=True`` continues from the
            buffer a killed run left there, at its last durable point: ``pos``
            and ``full`` follow it). See :class:`hetero_replay.PrioritizedReplay`.
        distributed: keep the transitions in a
            :class:`~hetero_replay.distributed.ShardedReplay` (Ray actors, on
            this machine or a cluster) instead of a local engine, sampled
            exactly from the global distribution. Either a dict of its keyword
            arguments (``num_shards`` required; ``address``, ``durable_dir``,
            ``storage``, ...; the capacity ``buffer_size`` is split evenly over the
            shards; the PER options and ``seed`` are this buffer's), or a ready
            ``ShardedReplay`` whose schema is this buffer's (then its own
            options apply). ``staleness`` (0, 1 or 2) is the ShardedReplay's. Not with
            ``optimize_memory_usage``, ``placement`` or ``storage``; the array attributes (``observations``,
            ...) are not available, and ``save_replay_buffer`` is refused
            (shards make durable points themselves).
        rate_limiter: a :class:`hetero_replay.RateLimiter` the engine buffer's ``add`` and ``sample`` ask
            (see :class:`hetero_replay.PrioritizedReplay`): for writer processes adding to a
            ``"shared"`` or ``"disk"`` buffer at their own pace. With ``distributed=``, give it there
            (``distributed=dict(num_shards=2, rate_limiter=...)``).
        compress: keep image observations (uint8, two dimensions or more) compressed, each distinct
            frame once: ``"zstd"`` or ``"lz4"``, or ``(name, level)``; ``storage="host"`` or ``"shared"``.
            Shorthand for ``storage_options=dict(codec=compress, frames=True)`` (docs/compression.md).
        weight_norm: what the IS weights are divided by: ``"global"`` (the default, PER's rule) their
            maximum over the whole buffer, so a weight means the same in every batch; ``"batch"`` the
            batch's largest, so each batch's largest weight is 1 (Tianshou's ``weight_norm=True``).
            The ratios within a batch are the same either way; docs/is-weights.md says what the
            scale does to learning (``train/per_mean_weight``).

    With device batches (storage on a device, or a learner off the CPU), the
    sampled tensors come from the core engine untouched, the ``indices`` are a
    tensor where the tree is, and the array attributes (``observations``,
    ``dones``, ...) are torch tensors where the storage is. Normalising with a
    ``VecNormalize`` then takes the batch through the host (it works in NumPy).

    Raises:
        TypeError: ``buffer_size``, ``n_envs`` or ``seed`` not an integer;
            ``optimize_memory_usage`` or ``handle_timeout_termination`` not a
            bool; a PER option of the wrong type (as
            :class:`~hetero_replay.PEROptions` says); ``placement`` not a
            :class:`~hetero_replay.placement.Placement`.
        ValueError: a ``Dict`` observation space (that is
            :class:`DictPrioritizedReplayBuffer`'s), ``buffer_size`` or
            ``n_envs`` below 1, a negative ``seed``, a PER option out of range
            (as :class:`~hetero_replay.PEROptions` says), an unknown
            ``tree``, a ``weight_norm`` other than ``"global"`` or ``"batch"``, ``optimize_memory_usage`` together with
            ``handle_timeout_termination``, a ``placement`` whose inference and
            train devices differ (SB3 acts and trains with one policy), or a
            ``tree`` or ``device`` that contradicts the placement.
        hetero_replay.placement.DeviceUnavailableError: the placement names a
            device this machine lacks.
    """

    def __init__(
        self,
        buffer_size: int,
        observation_space: spaces.Space,
        action_space: spaces.Space,
        device: th.device | str = "auto",
        n_envs: int = 1,
        optimize_memory_usage: bool = False,
        handle_timeout_termination: bool = True,
        alpha: float = UNSET,
        beta: float = UNSET,
        eps: float = UNSET,
        tree: str = UNSET,
        fanout: int = UNSET,
        priority_dtype: str = UNSET,
        stratified: bool = UNSET,
        seed: int | None = None,
        placement: Placement | None = None,
        options: PEROptions | None = None,
        staleness: int = 0,
        prefetch: int = 1,
        storage: str = "host",
        storage_options: dict[str, Any] | None = None,
        distributed: Any = None,
        rate_limiter: RateLimiter | None = None,
        compress: Any = None,
        weight_norm: Normalise = "global",
    ) -> None:
        # The PER options are checked by PEROptions; these arguments are the
        # adapter's own (or would reach NumPy unnamed).
        check_int(buffer_size, "buffer_size", low=1)
        #: What IS weights are divided by: the buffer's largest (``"global"``) or the batch's (``"batch"``).
        self.weight_norm = check_normalise(weight_norm, "weight_norm")
        _check_distributed(distributed, optimize_memory_usage, placement, storage, rate_limiter)
        #: The staleness schedule's options (validated here, once).
        self.schedule_options = StalenessOptions(staleness, prefetch)
        self.staleness, self.prefetch = self.schedule_options.staleness, self.schedule_options.prefetch
        check_int(n_envs, "n_envs", low=1)
        check_bool(optimize_memory_usage, "optimize_memory_usage")  # a string such as "False" would count as True
        check_bool(handle_timeout_termination, "handle_timeout_termination")
        check_seed(seed)
        options = PEROptions.of(
            options, alpha=alpha, beta=beta, eps=eps, tree=tree, fanout=fanout,
            priority_dtype=priority_dtype, stratified=stratified,
        )  # fmt: skip
        if not isinstance(storage, str):
            raise TypeError(f"storage must be a storage name such as 'host' or 'disk', got {storage!r}")
        if placement is not None and storage != "host":
            raise ValueError(f"storage={storage!r} and the placement both place the storage; set it in the placement")
        if placement is not None:
            placement = one_policy_placement(placement, type(self).__name__)
            device = _placed_device(device, placement)
            if options.tree != "auto":
                raise ValueError(
                    f"tree={options.tree!r} and the placement both choose the tree backend; "
                    f"set it in the placement instead (Placement(tree={options.tree!r}, ...))"
                )
        # Skip ReplayBuffer.__init__: it would allocate SB3's NumPy arrays, a
        # second copy of what the core engine stores.
        super(ReplayBuffer, self).__init__(buffer_size, observation_space, action_space, device, n_envs=n_envs)
        if optimize_memory_usage and handle_timeout_termination:
            raise ValueError(
                "optimize_memory_usage=True needs handle_timeout_termination=False (as in SB3's ReplayBuffer); "
                "pass replay_buffer_kwargs=dict(handle_timeout_termination=False)"
            )
        self.buffer_size = max(buffer_size // n_envs, 1)  # rows, as in SB3
        self.optimize_memory_usage = bool(optimize_memory_usage)
        self.handle_timeout_termination = bool(handle_timeout_termination)
        # The core engine's keyword arguments: the options, and where the placement puts the tree, rows and batches.
        self._config: dict[str, Any] = dict(options=options, storage=storage)
        self.placement = placement
        if placement is not None:
            self._config.update(placement.replay_kwargs())
        if compress is not None:
            storage_options = _compressed_options(compress, storage, storage_options)
        if storage_options is not None:
            self._config["storage_options"] = storage_options
        if rate_limiter is not None:
            self._config["rate_limiter"] = rate_limiter
        self._action_shapes, self._action_bounds = _action_rules(action_space, self.action_dim, n_envs)
        if seed is None:
            seed = int(np.random.randint(2**31 - 1))
        # Who builds the replay: a ShardedReplay given ready is used as it is, and never rebuilt (see reset).
        self._owns_replay = not isinstance(distributed, ShardedReplay)
        # Where the user named the replay's durable files: a reset cannot start over there (see reset).
        self._durable_at = _durable_place(storage_options, distributed)
        self._build_replay = _replay_builder(distributed, self._config, self.schedule_options)
        self._replay: Replay = self._build_replay(self.buffer_size * self.n_envs, self._schema(), seed)
        if self._replay.filled:  # a reopened "disk" buffer or a given replay: SB3's position follows the replay's
            self.full = self._replay.filled >= self.buffer_size * self.n_envs
            self.pos = self._replay.position // self.n_envs % self.buffer_size
        self._stage_new()
        self._samples_since_update = 0
        self._warned_no_update = False
        self._weight_sum: Any = 0.0  # the sampled batches' IS weights summed (float64), for take_mean_weight()
        self._weights_sampled = 0
        self._lock = ForkSafeLock(OUTER)
        self._closed = False
        close_when_gone(self, _still_open)

    # -- what a transition holds ------------------------------------------------

    def _observation_fields(self) -> dict[str, Field]:
        """Schema fields of one observation, keyed by name suffix ("" for a plain array)."""
        if isinstance(self.observation_space, spaces.Dict):
            raise ValueError(
                f"PrioritizedReplayBuffer stores array observations, got {self.observation_space}; "
                "use DictPrioritizedReplayBuffer (or MultiInputPolicy, which picks it)"
            )
        return {"": Field(self.obs_shape, _field_dtype(self.observation_space.dtype))}

    def _observation_rows(self, prefix: str, obs: Any) -> dict[str, np.ndarray]:
        """One row of observations (``prefix``: "obs" or "next_obs") as schema fields, shape-checked."""
        return {prefix: self._env_rows(prefix, obs, self.observation_space, self.obs_shape)}

    def _env_rows(self, name: str, value: Any, space: spaces.Space, shape: tuple[int, ...]) -> np.ndarray:
        """``value`` as one row of ``n_envs`` observations of ``shape``.

        Raises:
            ValueError: another shape, naming ``name``. As in SB3, a ``Discrete``
                space's ``(n_envs,)`` (what a VecEnv returns) is taken as ``(n_envs, 1)``.
        """
        arr = np.asarray(value)
        if isinstance(space, spaces.Discrete) and arr.shape == (self.n_envs,):
            arr = arr.reshape(self.n_envs, 1)
        if arr.shape != (self.n_envs, *shape):
            raise ValueError(
                f"add: {name} must have shape {(self.n_envs, *shape)} (n_envs={self.n_envs}, then the "
                f"observation shape), got {arr.shape}"
            )
        return arr

    def _action_rows(self, action: Any) -> np.ndarray:
        """``action`` as a ``(n_envs, action_dim)`` row, checked against the action space.

        Raises:
            ValueError: a shape other than the ones SB3 stores (see
                :func:`_action_rules`), or, for ``Discrete``, ``MultiDiscrete``
                and ``MultiBinary`` spaces, a value that is not an integer of the space.
        """
        arr = np.asarray(action)
        if arr.shape not in self._action_shapes:
            allowed = " or ".join(str(s) for s in sorted(self._action_shapes, key=len))
            raise ValueError(
                f"add: action must have shape {allowed} (n_envs={self.n_envs}, {self.action_space}), got {arr.shape}"
            )
        arr = arr.reshape(self.n_envs, self.action_dim)
        if self._action_bounds is not None:
            low, high = self._action_bounds
            if arr.dtype.kind not in "biu":
                raise ValueError(
                    f"add: action must hold integers for {self.action_space}, got dtype {arr.dtype}: {arr.tolist()}"
                )
            outside = (arr < low) | (arr >= high)
            if outside.any():
                env, item = np.argwhere(outside)[0]
                raise ValueError(
                    f"add: action {arr[env, item].item()!r} of env {env} is outside {self.action_space} "
                    f"(integers from {np.broadcast_to(low, arr.shape[1:])[item]} to "
                    f"{np.broadcast_to(high, arr.shape[1:])[item] - 1})"
                )
        return arr

    def _env_values(self, name: str, value: Any) -> np.ndarray:
        """``value`` as one scalar per environment, shape ``(n_envs,)``; ``ValueError`` naming ``name``."""
        arr = np.asarray(value)
        if arr.shape != (self.n_envs,):
            raise ValueError(f"add: {name} must have shape ({self.n_envs},) (one per env), got {arr.shape}")
        return arr

    def _truncation_flags(self, infos: Any) -> list[Any]:
        """Each environment's ``TimeLimit.truncated`` value in ``infos`` (a list of ``n_envs`` dicts), as given.

        Raises:
            TypeError: ``infos`` is not a list (or tuple) of dicts.
            ValueError: it holds another number of dicts.
        """
        if not isinstance(infos, (list, tuple)):
            raise TypeError(
                f"add: infos must be a list of {self.n_envs} dicts (one per env), got {type(infos).__name__}"
            )
        if len(infos) != self.n_envs:
            raise ValueError(f"add: infos must hold {self.n_envs} dicts (one per env), got {len(infos)}")
        try:
            return [info.get("TimeLimit.truncated", False) for info in infos]
        except AttributeError:
            types = [type(info).__name__ for info in infos]
            raise TypeError(f"add: infos must be dicts, got {types}") from None

    def _timeouts(self, flags: list[Any]) -> np.ndarray:
        """The truncation ``flags`` as one value per environment; ``ValueError`` if a flag is not one value."""
        truncated = np.asarray(flags)
        if truncated.size != self.n_envs:
            raise ValueError(f"add: infos[i]['TimeLimit.truncated'] must be one bool per env, got {truncated.tolist()}")
        return truncated.reshape(self.n_envs)  # SB3's own tests pass one-element arrays as flags

    def _observation_tensor(self, prefix: str, data: dict[str, Any], env: VecNormalize | None) -> th.Tensor:
        """Sampled observations from gathered fields, normalised by ``env`` if given."""
        obs = self._normalize_obs(data[prefix], env)
        assert not isinstance(obs, dict)  # an array field gives an array (Dict spaces: the subclass's override)
        return self._tensor(obs)

    def _tensor(self, value: np.ndarray | th.Tensor) -> th.Tensor:
        """A sampled field as a tensor on :attr:`device`; the core engine's tensors are already there.

        On the CPU a view of the array (``torch.from_numpy``, no copy: the gathered rows are this batch's
        own); elsewhere one copy to the device.
        """
        if isinstance(value, th.Tensor):
            return value
        return th.from_numpy(value) if self.device.type == "cpu" else self.to_torch(value, copy=False)

    @property
    def _device_batches(self) -> bool:
        """Whether the core engine hands out torch tensors on the learner's device."""
        return self._replay.device is not None

    def _schema(self) -> Schema:
        """The fields of one stored transition."""
        fields = {(f"obs/{key}" if key else "obs"): f for key, f in self._observation_fields().items()}
        fields["action"] = Field((self.action_dim,), _field_dtype(self._maybe_cast_dtype(self.action_space.dtype)))
        fields["reward"] = Field((), np.dtype(np.float32))
        if not self.optimize_memory_usage:
            fields.update({f"next_{n}": f for n, f in list(fields.items()) if n.startswith("obs")})
        fields["done"] = Field((), np.dtype(np.float32))
        if self.handle_timeout_termination:
            fields["timeout"] = Field((), np.dtype(np.float32))
        return Schema(fields)

    # -- SB3's buffer interface ---------------------------------------------------

    def add(
        self,
        obs: np.ndarray,
        next_obs: np.ndarray,
        action: np.ndarray,
        reward: np.ndarray,
        done: np.ndarray,
        infos: list[dict[str, Any]],
    ) -> None:
        """Store one row: a transition from each of the ``n_envs`` environments.

        What SB3's off-policy algorithms pass: ``obs`` and ``next_obs`` of shape
        ``(n_envs, *obs_shape)`` (``(n_envs,)`` for a ``Discrete`` space; a dict
        of such arrays for ``Dict`` spaces), ``action`` of shape
        ``(n_envs, *action_shape)`` or ``(n_envs, action_dim)`` (with one
        environment also ``action_shape``, as SB3 reshapes it), ``reward`` and
        ``done`` of shape ``(n_envs,)``, ``infos`` a list of ``n_envs`` dicts.
        Anything else is refused, never broadcast: values go into the core
        engine's fields under its casting rules (within a kind, no value
        changed), and actions of a ``Discrete``, ``MultiDiscrete`` or
        ``MultiBinary`` space must be integers of the space.

        The new transitions get the largest priority seen so far. Rows are
        staged (in NumPy, on the host, where the environments produce them)
        and handed to the core engine in one call per batch of rows (at the
        latest before the next sample, priority update or read): the engine's
        per-call cost, and with device storage the copy to the device, is then
        paid once per ``train()``, not per step. Nothing else changes, since
        priorities only move in :meth:`update_priorities`. The usual row
        (C-contiguous arrays of the fields' shapes, dtypes that cast safely,
        actions inside the space, ``bool`` truncation flags) is checked and
        staged by one native call; any other row by the checks in Python, which
        raise the errors below. Both store the same values.

        Raises:
            ValueError: a shape, dtype or value as above, naming the argument
                (or the field it goes to).
            TypeError: ``obs`` of a ``Dict`` space is not a dict, or ``infos``
                is not a list of dicts.
            Nothing is stored on error.
        """
        flags = self._truncation_flags(infos)
        with self._lock:
            values = (obs, next_obs, action, reward, done, flags)
            # The usual row (arrays of the fields' shapes and dtypes) in one native call; anything else,
            # errors included, through the checks. Either writes the row whole or not at all.
            if self._stager is None or not self._stager.put(self._staged_rows, values[: self._stager_values]):
                self._stage_checked(*values)
            self._staged_rows += 1
            self.pos += 1
            if self.pos == self.buffer_size:
                self.full = True
                self.pos = 0
            if self._staged_rows == self._stage_capacity:
                self._commit()

    def _stage_checked(self, obs: Any, next_obs: Any, action: Any, reward: Any, done: Any, flags: list[Any]) -> None:
        """Check one row as :meth:`add` documents, cast it, and write it to the next staging row. Hold the lock."""
        # Check and shape everything before writing: a refused row leaves no trace.
        row = self._observation_rows("obs", obs)
        row.update(self._observation_rows("next_obs", next_obs))
        row["action"] = self._action_rows(action)
        row["reward"] = self._env_values("reward", reward)
        row["done"] = self._env_values("done", done)
        if self.handle_timeout_termination:  # unstored flags are not read (neither does the stager)
            row["timeout"] = self._timeouts(flags)
        self._check_casts(row)
        start = self._staged_rows * self.n_envs
        for name, value in row.items():  # shapes match exactly: nothing is broadcast
            self._staged[name][start : start + self.n_envs] = value

    def _check_casts(self, row: dict[str, np.ndarray]) -> None:
        """Check that ``row``'s values cast to their fields unchanged, by the core engine's rule.

        A safe cast (same dtype, bool -> float32, ...) changes no value, and
        the pairs seen are remembered, so the usual ``add`` pays one set lookup
        per field; any other cast goes through
        :meth:`hetero_replay.Field.cast` (within a kind, no value
        changed: no float into an int field, no integer that would wrap, no
        float that would overflow to inf), whose ``ValueError`` names the field.
        """
        for name, value in row.items():
            if (name, value.dtype) not in self._safe_casts:
                field = self._stage_fields[name]
                if np.can_cast(value.dtype, field.dtype, casting="safe"):
                    self._safe_casts.add((name, value.dtype))
                else:
                    row[name] = field.cast(name, value)

    def _stage_new(self) -> None:
        """New, empty staging rows (up to ``STAGE_ROWS``) for :meth:`add`.

        They hold the core engine's fields, plus ``next_obs`` with
        ``optimize_memory_usage`` (the engine keeps it only for the newest row).
        """
        self._stage_capacity = min(STAGE_ROWS, self.buffer_size)
        self._stage_schema = self._replay.schema
        self._stage_fields = dict(self._stage_schema.items())
        if self.optimize_memory_usage:
            self._stage_fields["next_obs"] = self._stage_fields["obs"]
        rows = self._stage_capacity * self.n_envs
        self._staged = {name: np.zeros((rows, *f.shape), f.dtype) for name, f in self._stage_fields.items()}
        self._staged_rows = 0
        self._safe_casts: set[tuple[str, np.dtype]] = set()
        self._stager, self._stager_values = self._row_stager()

    def _row_stager(self) -> tuple[RowStager | None, int]:
        """The native stager of :meth:`add`'s usual rows and how many of its values it takes (``None``
        for ``Dict`` observations, whose fields the checking path splits, and for fields of other dtypes
        than the stager's, such as float16)."""
        if isinstance(self.observation_space, spaces.Dict) or any(
            np.dtype(rows.dtype) not in _STAGER_DTYPES for rows in self._staged.values()
        ):
            return None, 0
        n = self.n_envs
        obs_shapes = [(n, *self.obs_shape)]
        if isinstance(self.observation_space, spaces.Discrete):
            obs_shapes.append((n,))
        bounds = None
        if self._action_bounds is not None:
            bounds = tuple(np.broadcast_to(b, (self.action_dim,)).astype(np.int64) for b in self._action_bounds)
        shapes = {"obs": obs_shapes, "next_obs": obs_shapes, "action": sorted(self._action_shapes)}
        fields: list[dict[str, Any]] = [
            dict(dest=self._staged[name], sources=_safe_sources(self._stage_fields[name].dtype),
                 shapes=shapes.get(name, [(n,)]), bounds=bounds if name == "action" else None)
            for name in ("obs", "next_obs", "action", "reward", "done")
        ]  # fmt: skip
        if self.handle_timeout_termination:
            fields.append(dict(dest=self._staged["timeout"], sources=[], shapes=[], flags=True))
        return RowStager(fields, n), len(fields)

    def _commit(self) -> None:
        """Hand the staged rows to the core engine (they get the max priority there). Hold the lock."""
        if self._staged_rows == 0:
            return
        n = self._staged_rows * self.n_envs
        # Rows add checked, in arrays made for the replay's schema (_stage_new): the replay takes them unchecked.
        schema = self._stage_schema
        self._replay.add(CheckedRows(schema, {name: self._staged[name][:n] for name in schema}))
        self._staged_rows = 0
        if self.optimize_memory_usage:
            # Row `pos` now holds the next observations of the last row added;
            # until its own add it is not a valid transition: priority 0.
            start = self.pos * self.n_envs
            self._replay.write_rows(start, {"obs": self._staged["next_obs"][n - self.n_envs : n]})
            if self.full:
                self._replay.clear_priorities(np.arange(start, start + self.n_envs, dtype=np.int64))

    def size(self) -> int:
        """Rows stored (each of ``n_envs`` transitions), at most ``buffer_size``."""
        with self._lock:
            return super().size()

    def sample(self, batch_size: int, env: VecNormalize | None = None) -> PrioritizedReplayBufferSamples:  # type: ignore[override]
        """Draw ``batch_size`` transitions by priority, with their IS weights and indices.

        Args:
            batch_size: number of transitions (drawn with replacement).
            env: a ``VecNormalize`` to normalise observations and rewards with, as in SB3.

        Raises:
            ValueError: an empty buffer, or ``batch_size`` not a positive
                integer. Nothing changes on error (not even the random state).
        """
        with self._lock:
            if self._staged_rows:
                self._commit()
            batch = self._replay.sample(batch_size)
            if self.weight_norm == "batch":  # every engine normalises globally: rescaling keeps the ratios exact
                batch = batch._replace(weights=normalise_by_batch(batch.weights))
            data = self._batch_data(batch)
            self._count_sample(batch.weights)
            # Still under the lock: torch's conversions must not run on a daemon thread at interpreter exit
            # (the exit handler waits for buffer locks; torch aborts there).
            if env is not None and self._device_batches:
                # VecNormalize works on NumPy arrays: normalising takes the batch through the host.
                data = {name: value.cpu().numpy() for name, value in data.items()}
            dones = data["done"]
            if self.handle_timeout_termination:
                dones = dones * (1.0 - data["timeout"])  # as in SB3: no termination at a time limit
            tensor = self._tensor
            return PrioritizedReplayBufferSamples(
                observations=self._observation_tensor("obs", data, env),
                actions=tensor(data["action"]),
                next_observations=self._observation_tensor("next_obs", data, env),
                dones=tensor(dones.reshape(-1, 1)),
                rewards=tensor(self._normalize_reward(data["reward"].reshape(-1, 1), env)),
                discounts=None,
                weights=tensor(batch.weights.reshape(-1, 1)),
                indices=batch.indices,
            )

    def _batch_data(self, batch: Sample) -> dict[str, Any]:
        """A sampled batch's fields by name, as :meth:`sample` builds its tensors from them. Hold the lock.

        The one place a subclass changes what is sampled (HER relabels goals here), before
        normalisation and the conversion to tensors.
        """
        if self.optimize_memory_usage:
            return {**batch.data, "next_obs": self._next_observations(batch.indices)}
        return batch.data

    def _next_observations(self, indices: np.ndarray | th.Tensor) -> np.ndarray | th.Tensor:
        """With ``optimize_memory_usage``: the next observations of sampled slots.

        The next observation of slot ``i`` is the observation one row later.
        Device batches gather them where the storage is and deliver them to
        the learner's device, like the rest of the batch.
        """
        return self._replay.read_rows("obs", (indices + self.n_envs) % self._replay.capacity)

    def update_priorities(self, indices: np.ndarray | th.Tensor, td_errors: th.Tensor | np.ndarray) -> None:
        """Set the priorities of sampled transitions to ``(|td_errors| + eps) ** alpha``.

        With device batches the TD errors stay tensors: the core engine hands
        them to a device tree where they are (with the tree on the learner's
        device, nothing is copied) and to a host tree as NumPy arrays.

        Args:
            indices: the ``indices`` of a sample from this buffer (1-D).
            td_errors: one TD error per index, any shape with that many
                elements (a tensor on any device, or an array); its absolute
                value is taken.

        Raises:
            ValueError: ``indices`` not 1-D, lengths that differ, a NaN or
                infinite TD error (naming its position) or one too large for
                the tree.
            TypeError: non-integer indices or non-numeric TD errors.
            IndexError: an index outside the filled part of the buffer.
            Nothing changes on error.
        """
        # Under the lock, torch's conversions too: the exit handler waits for buffer locks (torch aborts at exit).
        with self._lock:
            self._update(indices, td_errors)

    def _update(self, indices: np.ndarray | th.Tensor, td_errors: th.Tensor | np.ndarray) -> None:
        """:meth:`update_priorities` under the lock. Its locals die with it, inside the lock: freeing a tensor
        releases the GIL, which at interpreter exit ends a (daemon) thread mid C++ frame (std::terminate)."""
        td: np.ndarray | th.Tensor
        if isinstance(indices, th.Tensor) or (isinstance(td_errors, th.Tensor) and not td_errors.is_cpu):
            # Stays a tensor where it is: a device tree (whose indices are tensors) takes it there, and the
            # relaxed pipeline copies it off the device behind an event, so the learner does not wait here.
            td = th.as_tensor(td_errors).detach().reshape(-1).abs()
            indices = th.as_tensor(indices)
        else:  # a host tree: CPU tensors too (a view and one NumPy abs cost less than three torch calls)
            raw: np.ndarray
            if isinstance(td_errors, th.Tensor):
                # A zero-copy view of a CPU tensor (detached; one copy off the device), in one torch call.
                raw = td_errors.numpy(force=True)
            else:
                raw = np.asarray(td_errors)
            if raw.dtype.kind not in "biuf":
                raise TypeError(f"update_priorities: td_errors must be numbers, got dtype {raw.dtype}")
            td = td_magnitudes(raw)
            del raw
            indices = np.asarray(indices)
        if indices.ndim != 1:
            raise ValueError(
                f"update_priorities: indices must be 1-D (the indices of a sample), got shape {tuple(indices.shape)}"
            )
        if indices.shape != td.shape:
            raise ValueError(f"update_priorities: {indices.shape[0]} indices but {td.shape[0]} TD errors")
        if self._staged_rows:
            self._commit()
        if self.optimize_memory_usage and self.full:
            # Transitions overwritten since they were sampled keep priority 0 (see add).
            valid = (indices // self.n_envs) != self.pos
            indices, td = indices[valid], td[valid.to(td.device) if isinstance(td, th.Tensor) else valid]
        self._replay.update_priorities(indices, td)
        self._samples_since_update = 0

    def reset(self) -> None:
        """Empty the buffer (priorities and the max priority start over).

        Raises:
            ValueError: the replay is not this buffer's to empty (a ``ShardedReplay`` it was
                given), or its files are at a ``path`` the user named (``storage="disk"``):
                refused before anything changes, SB3's counters included.
        """
        with self._lock:
            if not self._owns_replay:
                raise ValueError(
                    "reset() would empty a ShardedReplay this buffer was given; close and rebuild it yourself"
                )
            if self._durable_at is not None:
                raise ValueError(
                    f"reset() would discard the durable buffer at {self._durable_at}; "
                    "close() this buffer and build a new one at another path"
                )
            super().reset()
            old = self._replay
            seed = int(old.rng.integers(2**31 - 1))
            old.close()  # its worker, shards or files go first: the new replay may take the same places
            self._replay = self._build_replay(self.buffer_size * self.n_envs, self._schema(), seed)
            self._stage_new()

    # -- PER state ------------------------------------------------------------------

    @property
    def beta(self) -> float:
        """Importance-sampling exponent used by the next :meth:`sample`, in ``[0, 1]``."""
        with self._lock:
            return self._replay.beta

    @beta.setter
    def beta(self, value: float) -> None:
        with self._lock:  # the core engine checks the value
            self._replay.beta = value

    @property
    def alpha(self) -> float:
        """Priority exponent."""
        with self._lock:
            return self._replay.alpha

    @property
    def max_priority(self) -> float:
        """Largest ``|TD error| + eps`` seen so far (1 until the first update)."""
        with self._lock:
            return self._replay.max_priority

    @property
    def dropped_updates(self) -> int:
        """Priority updates skipped because their slot was rewritten first (``staleness >= 1`` only)."""
        return self._replay.dropped_updates

    def flush(self) -> None:
        """Apply every queued priority update now (``staleness >= 1``) and make a durable point where the replay
        makes them (``storage="disk"``; with ``distributed``, every shard)."""
        with self._lock:
            self._commit()
            self._replay.flush()

    def close(self) -> None:
        """Hand the staged rows to the replay, make its last durable point and release it.

        A durable buffer (``storage="disk"``; with ``distributed=``, every shard)
        keeps every row added: reopen its ``path`` to continue. A buffer not closed
        is closed the same way when it is garbage collected or the interpreter
        exits normally (in the process that built it, not in forked children);
        only a crash loses the rows added since the last durable point. A
        ``ShardedReplay`` given with ``distributed=`` is flushed, not closed (it
        is not this buffer's). Closing twice does nothing.
        """
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if self._replay.closed:  # (closed through .replay)
                return
            try:
                self._commit()
                self._replay.flush()
            finally:
                if self._owns_replay:
                    self._replay.close()

    @property
    def replay(self) -> Replay:
        """The core replay that holds the transitions and their priorities (relaxed with ``staleness >= 1``).

        Calls on it do not take this buffer's lock: use it from one thread.
        """
        with self._lock:
            self._commit()
            return self._replay

    def priorities(self) -> np.ndarray:
        """Current sampling priorities ``p^alpha``, shape ``(buffer_size, n_envs)`` (queued updates applied first)."""
        with self._lock:
            self._commit()
            return self._replay.leaves().reshape(self.buffer_size, self.n_envs)

    # -- SB3's array attributes, as views into the core storage ----------------------

    def _rows(self, name: str) -> np.ndarray:
        """Field ``name`` as a ``(buffer_size, n_envs, ...)`` view (writes go through).

        A NumPy array, or a torch tensor where the storage is when it is on a
        device. The view is live: reads and writes through it do not take the lock.
        """
        with self._lock:
            self._commit()
            try:
                arr = self._replay.view(name)
            except NotImplementedError:  # rows in a file ("disk"): read and written through the engine
                return _FieldRows(self._replay, name, self.buffer_size, self.n_envs)  # type: ignore[return-value]
            return arr.reshape(self.buffer_size, self.n_envs, *arr.shape[1:])

    @property
    def observations(self) -> np.ndarray:  # type: ignore[override]
        return self._rows("obs")

    @property
    def next_observations(self) -> np.ndarray:  # type: ignore[override]
        if self.optimize_memory_usage:
            raise AttributeError("with optimize_memory_usage the next observations are the observations one row later")
        return self._rows("next_obs")

    @property
    def actions(self) -> np.ndarray:  # type: ignore[override]
        return self._rows("action")

    @property
    def rewards(self) -> np.ndarray:  # type: ignore[override]
        return self._rows("reward")

    @property
    def dones(self) -> np.ndarray:  # type: ignore[override]
        # SB3's _setup_learn writes `dones[pos - 1] = True` to cut the last episode.
        return self._rows("done")

    @property
    def timeouts(self) -> np.ndarray:  # type: ignore[override]
        if not self.handle_timeout_termination:
            return np.zeros((self.buffer_size, self.n_envs), np.float32)
        return self._rows("timeout")

    # -- pickling and helpers -------------------------------------------------------------

    def __getstate__(self) -> dict[str, Any]:
        # SB3's save_replay_buffer pickles the buffer. Everything is read under
        # the lock, the core engine included (pickle would otherwise read it
        # after __getstate__ returns, while other threads may add).
        with self._lock:
            self._commit()
            state = self.__dict__.copy()
            del state["_lock"], state["_staged"], state["_stager"]  # the staging rows are empty after the commit
            state["_replay"] = (type(self._replay), self._replay.__getstate__())
            if self.optimize_memory_usage and not self.full:
                # The newest next observations sit in row `pos`, past the
                # engine's filled part, which is all the engine saves.
                start = self.pos * self.n_envs
                newest = self._replay.read_rows("obs", np.arange(start, start + self.n_envs))
                state["_newest_next_obs"] = _host_copy(newest)
            return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        state = dict(state)
        replay_class, replay_state = state.pop("_replay")
        newest_next_obs = state.pop("_newest_next_obs", None)
        if "_weight_sums" in state:  # saved before the IS-weight sum became one number: its batches' sums
            state["_weight_sum"] = sum(map(float, state.pop("_weight_sums")), 0.0)
        self.__dict__.update(state)
        replay = replay_class.__new__(replay_class)
        replay.__setstate__(replay_state)
        self._replay = replay
        if newest_next_obs is not None:
            self._replay.write_rows(self.pos * self.n_envs, {"obs": newest_next_obs})
        self._stage_new()
        self._lock = ForkSafeLock(OUTER)
        self._closed = False
        close_when_gone(self, _still_open)

    def take_mean_weight(self) -> float:
        """The mean IS weight of the transitions sampled since the last call (NaN if none): what SB3 logs.

        The batches' weights are summed as they are sampled, in float64 (on the host, or as a device
        tensor): reading the sum here costs at most one device sync per call, and the sum takes the
        same memory however long the buffer goes unread (SB3 reads it at each log dump).
        """
        with self._lock:
            total, n = self._weight_sum, self._weights_sampled
            self._weight_sum, self._weights_sampled = 0.0, 0
        if n == 0:
            return float("nan")
        return (total.item() if isinstance(total, th.Tensor) else float(total)) / n

    def _count_sample(self, weights: np.ndarray | th.Tensor) -> None:
        """Count a successful sample and its IS weights; warn once when priorities never move. Hold the lock."""
        total: Any
        small = len(weights) <= _FSUM_MAX
        if isinstance(weights, th.Tensor) and not (small and weights.is_cpu):
            total = weights.sum(dtype=th.float64)  # stays where it is: no device sync per batch
        elif small:
            # Called right after a gradient step, a reduction runs cold (NumPy's ~18 us for 64 weights, torch's
            # ~15); a list's exact sum ~5 us.
            total = math.fsum(weights.tolist())
        else:
            total = float(np.sum(weights, dtype=np.float64))  # (an array: a large tensor took the first branch)
        self._weight_sum = self._weight_sum + total
        self._weights_sampled += len(weights)
        self._samples_since_update += 1
        if self._samples_since_update == WARN_AFTER_SAMPLES and not self._warned_no_update:
            self._warned_no_update = True
            warnings.warn(
                f"{type(self).__name__} was sampled {WARN_AFTER_SAMPLES} times without update_priorities(): "
                "priorities never change, so replay stays uniform and the IS weights are unused. "
                "Use PERDQN / PERDDPG / PERTD3 / PERSAC from hetero_replay.adapters.sb3 for prioritized replay.",
                stacklevel=3,
            )


class DictPrioritizedReplayBuffer(PrioritizedReplayBuffer):
    """:class:`PrioritizedReplayBuffer` for ``Dict`` observation spaces (``MultiInputPolicy``).

    Each key is its own field in the core storage (``obs/<key>``,
    ``next_obs/<key>``); sampled observations are dicts of tensors, as with
    SB3's ``DictReplayBuffer``. Takes the same arguments as
    :class:`PrioritizedReplayBuffer`, except that ``optimize_memory_usage`` is
    not supported (SB3's ``DictReplayBuffer`` does not support it either).
    ``add`` takes ``obs`` and ``next_obs`` as dicts with exactly the space's
    keys, each value shaped as for :class:`PrioritizedReplayBuffer`.
    """

    observation_space: spaces.Dict
    obs_shape: dict[str, tuple[int, ...]]  # type: ignore[assignment]

    def __init__(
        self,
        buffer_size: int,
        observation_space: spaces.Dict,
        action_space: spaces.Space,
        device: th.device | str = "auto",
        n_envs: int = 1,
        optimize_memory_usage: bool = False,
        handle_timeout_termination: bool = True,
        **per_kwargs: Any,
    ) -> None:
        if not isinstance(observation_space, spaces.Dict):
            raise ValueError(
                f"DictPrioritizedReplayBuffer needs a Dict observation space, got {observation_space}; "
                "use PrioritizedReplayBuffer"
            )
        if optimize_memory_usage:
            raise ValueError(
                "DictPrioritizedReplayBuffer does not support optimize_memory_usage (nor does SB3's DictReplayBuffer)"
            )
        super().__init__(
            buffer_size, observation_space, action_space, device, n_envs,
            optimize_memory_usage, handle_timeout_termination, **per_kwargs,
        )  # fmt: skip

    def _observation_fields(self) -> dict[str, Field]:
        return {
            key: Field(shape, _field_dtype(self.observation_space[key].dtype)) for key, shape in self.obs_shape.items()
        }

    def _observation_rows(self, prefix: str, obs: Any) -> dict[str, np.ndarray]:
        if not isinstance(obs, Mapping):
            raise TypeError(f"add: {prefix} must be a dict with keys {list(self.obs_shape)}, got {type(obs).__name__}")
        if obs.keys() != self.obs_shape.keys():
            missing = [key for key in self.obs_shape if key not in obs]
            unknown = [key for key in obs if key not in self.obs_shape]
            raise ValueError(
                f"add: {prefix} must have the keys {list(self.obs_shape)}: missing {missing}, unknown {unknown}"
            )
        return {
            f"{prefix}/{key}": self._env_rows(f"{prefix}[{key!r}]", obs[key], self.observation_space[key], shape)
            for key, shape in self.obs_shape.items()
        }

    def _observation_tensor(  # type: ignore[override]
        self, prefix: str, data: dict[str, Any], env: VecNormalize | None
    ) -> dict[str, th.Tensor]:
        obs = self._normalize_obs({key: data[f"{prefix}/{key}"] for key in self.obs_shape}, env)
        assert isinstance(obs, dict)
        return {key: self._tensor(value) for key, value in obs.items()}

    def _rows_dict(self, prefix: str) -> dict[str, np.ndarray]:
        return {key: self._rows(f"{prefix}/{key}") for key in self.obs_shape}

    @property
    def observations(self) -> dict[str, np.ndarray]:  # type: ignore[override]
        return self._rows_dict("obs")

    @property
    def next_observations(self) -> dict[str, np.ndarray]:  # type: ignore[override]
        return self._rows_dict("next_obs")


# -- argument checks ----------------------------------------------------------------------


def _action_rules(
    space: spaces.Space, action_dim: int, n_envs: int
) -> tuple[set[tuple[int, ...]], tuple[np.ndarray, np.ndarray] | None]:
    """The action shapes ``add`` takes, and ``(low, high)`` integer bounds for discrete spaces.

    Shapes: ``(n_envs, *space.shape)`` (what SB3's algorithms pass),
    ``(n_envs, action_dim)`` (the stored layout) and, for one environment,
    ``space.shape`` (an ``action_space.sample()``, as SB3's own tests pass).
    SB3 reshapes any array of ``n_envs * action_dim`` values; other layouts of
    them (a flat array, or ``(action_dim, n_envs)``) are ambiguous or would be
    stored scrambled, so they are refused. Bounds: an action ``a`` must satisfy
    ``low <= a < high``; ``None`` for ``Box`` (SB3 stores the policy's
    rescaled actions there, not values of the space).
    """
    shape = tuple(space.shape or ())
    shapes = {(n_envs, *shape), (n_envs, action_dim)}
    if n_envs == 1:
        shapes.add(shape)
    if isinstance(space, spaces.Discrete):
        bounds = (np.asarray(space.start), np.asarray(space.start + space.n))
    elif isinstance(space, spaces.MultiDiscrete):
        bounds = (np.asarray(space.start).reshape(-1), np.asarray(space.start + space.nvec).reshape(-1))
    elif isinstance(space, spaces.MultiBinary):
        bounds = (np.asarray(0), np.asarray(2))
    else:
        bounds = None
    return shapes, bounds


#: The value dtypes the native stager copies (others go through the adapter's checks).
_STAGER_DTYPES = tuple(np.dtype(t) for t in (bool, "i1", "i2", "i4", "i8", "u1", "u2", "u4", "u8", "f4", "f8"))


def _safe_sources(dtype: np.dtype) -> list[np.dtype]:
    """The stager's value dtypes NumPy casts safely (no value changed) to a field of ``dtype``."""
    return [t for t in _STAGER_DTYPES if np.can_cast(t, dtype, casting="safe")]


def _field_dtype(dtype: npt.DTypeLike | None) -> np.dtype:
    """A space's dtype as the ``np.dtype`` a :class:`~hetero_replay.Field` holds.

    ``None`` (a space without a dtype) is refused as ``Field`` refuses it,
    rather than read by NumPy as float64.
    """
    if dtype is None:
        raise TypeError("field dtype must be a numeric or bool dtype, got None")
    return np.dtype(dtype)


def _host_copy(value: np.ndarray | th.Tensor) -> np.ndarray:
    """A NumPy copy of storage rows, wherever the storage is."""
    return value.cpu().numpy().copy() if isinstance(value, th.Tensor) else np.array(value)


def _durable_place(storage_options: dict[str, Any] | None, distributed: Any) -> str | None:
    """The argument naming where the replay keeps durable files (``path=...`` of ``"disk"``, ``durable_dir=...``
    of ``distributed=``), as ``name=value``; ``None`` where there is none."""
    if storage_options and storage_options.get("path") is not None:
        return f"storage_options path={storage_options['path']!r}"
    if isinstance(distributed, dict) and distributed.get("durable_dir") is not None:
        return f"distributed durable_dir={distributed['durable_dir']!r}"
    return None


def _still_open(state: dict[str, Any]) -> bool:
    return not state.get("_closed", True)


def _compressed_options(compress: Any, storage: str, storage_options: dict[str, Any] | None) -> dict[str, Any]:
    """``storage_options`` with the image fields compressed by ``compress`` and their frames stored once."""
    if storage not in ("host", "shared"):
        raise ValueError(
            f"compress= keeps rows compressed in memory, each frame once: it needs storage='host' or 'shared', "
            f"got {storage!r}"
        )
    if storage_options and ("codec" in storage_options or "frames" in storage_options):
        raise ValueError("compress= and storage_options' codec/frames both choose the codec; give one of them")
    return {**(storage_options or {}), "codec": compress, "frames": True}


def _check_distributed(
    distributed: Any, optimize_memory_usage: Any, placement: Any, storage: Any, rate_limiter: Any
) -> None:
    """``distributed=`` is a dict of ShardedReplay arguments or a ShardedReplay, and excludes what a local engine needs."""
    if distributed is None:
        return
    if not isinstance(distributed, (dict, ShardedReplay)):
        raise TypeError(
            f"distributed must be a dict of ShardedReplay arguments (e.g. dict(num_shards=2)) or a ShardedReplay, "
            f"got {type(distributed).__name__}"
        )
    if isinstance(distributed, dict) and "num_shards" not in distributed:
        raise ValueError("distributed needs num_shards, e.g. distributed=dict(num_shards=2)")
    for name, value, default in [
        ("optimize_memory_usage", optimize_memory_usage, False),
        ("placement", placement, None),
        ("storage", storage, "host"),
        ("rate_limiter", rate_limiter, None),
    ]:
        if value != default:
            raise ValueError(
                f"{name}={value!r} does not apply with distributed= (the shards hold the rows and priorities; "
                "their storage goes in distributed=dict(storage=...))"
            )


def _replay_builder(
    distributed: Any, config: dict[str, Any], schedule: StalenessOptions
) -> Callable[[int, Schema, int], Replay]:
    """How the buffer builds its replay, ``(capacity, schema, seed) -> Replay``: chosen once, from the arguments.

    A local engine buffer (relaxed with ``staleness >= 1``); with ``distributed=``, a ``ShardedReplay``
    built from its arguments, or the one given, checked against the buffer.
    """
    if distributed is None:
        return functools.partial(_local_replay, config=config, schedule=schedule)
    return functools.partial(_sharded_replay, distributed, config=config, staleness=schedule.staleness)


def _local_replay(
    capacity: int, schema: Schema, seed: int, config: dict[str, Any], schedule: StalenessOptions
) -> Replay:
    """An engine buffer in this process, driven by the staleness schedule when ``staleness >= 1``."""
    replay = PrioritizedReplay(capacity, schema, seed=seed, **config)
    return RelaxedReplay(replay, schedule) if schedule.staleness else replay


def _sharded_replay(
    distributed: Any, capacity: int, schema: Schema, seed: int, config: dict[str, Any], staleness: int
) -> ShardedReplay:
    """The ShardedReplay of a buffer with ``distributed=``: built from its arguments, or the given one checked."""
    if isinstance(distributed, ShardedReplay):
        if distributed.schema != schema:
            raise ValueError(
                f"the ShardedReplay's schema {distributed.schema!r} is not this buffer's {schema!r} "
                "(build it with the same spaces, or pass distributed=dict(num_shards=...))"
            )
        if distributed.staleness != staleness:
            raise ValueError(
                f"staleness={staleness}, but the ShardedReplay given has staleness={distributed.staleness}: "
                "build it with ShardedReplay(..., staleness=...)"
            )
        return distributed
    kwargs = dict(distributed)
    num_shards = kwargs.pop("num_shards")
    check_int(num_shards, "distributed num_shards", low=1)
    per_shard = -(-capacity // num_shards)
    return ShardedReplay(
        num_shards, per_shard, schema, seed=seed, options=config["options"], staleness=staleness, **kwargs
    )


class _FieldRows:
    """SB3's array attribute (``dones``, ``observations``...) over a storage with no live view.

    Indexing reads the rows through the engine; assigning writes them (one
    engine call per row written), so SB3's occasional ``dones[pos] = True``
    works on a ``"disk"`` buffer. Slow for bulk use: sample through the buffer.
    """

    def __init__(self, replay: Any, name: str, rows: int, n_envs: int) -> None:
        self._replay, self._name = replay, name
        self._field = replay.schema[name]
        self._slots = np.arange(rows * n_envs, dtype=np.int64).reshape(rows, n_envs)

    @property
    def shape(self) -> tuple[int, ...]:
        return (*self._slots.shape, *self._field.shape)

    @property
    def dtype(self) -> np.dtype:
        return self._field.dtype

    def __len__(self) -> int:
        return len(self._slots)

    def __getitem__(self, key: Any) -> np.ndarray:
        slots = self._slots[key]
        rows = _host_copy(self._replay.read_rows(self._name, np.ravel(slots)))
        return rows.reshape(*np.shape(slots), *self._field.shape)

    def __setitem__(self, key: Any, value: Any) -> None:
        slots = np.atleast_1d(self._slots[key])
        values = np.broadcast_to(np.asarray(value, self._field.dtype), (*slots.shape, *self._field.shape))
        flat = values.reshape(-1, *self._field.shape)
        for k, slot in enumerate(slots.ravel()):
            self._replay.write_rows(int(slot), {self._name: flat[k : k + 1]})

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        out = self[:]
        return out if dtype is None else out.astype(dtype)


def _placed_device(device: th.device | str, placement: Placement) -> str:
    """The buffer's device under ``placement``: its learner device (``"auto"`` or that device).

    Raises:
        ValueError: ``device`` is another device; batches must arrive where the network trains.
    """
    learner = placement.learner_device
    if str(device) != "auto" and not same_device(get_device(device), learner):
        raise ValueError(
            f"device {str(device)!r} is not the placement's learner device {learner!r}: sampled batches go "
            f"where the network trains. Pass device={learner!r} to the algorithm, or use PERDQN / PERDDPG / "
            "PERTD3 / PERSAC with placement=..., which take their device from the placement"
        )
    return learner
