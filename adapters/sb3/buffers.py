"""Prioritized replay buffers that plug into Stable-Baselines3's off-policy algorithms.

``PrioritizedReplayBuffer`` is a drop-in ``replay_buffer_class`` for DQN, DDPG,
TD3 and SAC; ``DictPrioritizedReplayBuffer`` is its counterpart for
``MultiInputPolicy`` (``Dict`` observation spaces). Transitions live in the
core engine (:class:`hetero_replay.PrioritizedReplay`), not in SB3's NumPy
arrays: one priority per transition, sampled and updated in one native call each.

Placement: with ``mapping=`` (a :class:`hetero_replay.mapping.Mapping`) the core
engine is built from ``mapping.replay_kwargs()``: the tree backend and its
device, where transitions are stored, and the learner's device. When the
engine hands out torch tensors already on the learner's device (storage on a
device, or a GPU learner), :meth:`~PrioritizedReplayBuffer.sample` passes them
on untouched and :meth:`~PrioritizedReplayBuffer.update_priorities` hands the
TD-error tensor to the tree where it lives.
"""

from __future__ import annotations

import warnings
from typing import Any, NamedTuple

import numpy as np
import torch as th
from gymnasium import spaces
from stable_baselines3.common.buffers import ReplayBuffer
from stable_baselines3.common.utils import get_device
from stable_baselines3.common.vec_env import VecNormalize

from hetero_replay import Field, PrioritizedReplay, Schema
from hetero_replay.replay import DEFAULT_EPS
from hetero_replay.mapping import Mapping, one_policy_mapping
from hetero_replay.torch_replay import TorchBatchReplay, same_device

#: A buffer sampled this many times in a row without ``update_priorities`` warns once.
WARN_AFTER_SAMPLES = 100

#: At most this many rows are staged by ``add`` before they go to the core engine.
STAGE_ROWS = 256


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
    by its maximum over the whole buffer. New transitions get the largest
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

    Args:
        buffer_size: transitions kept (rounded down to a multiple of ``n_envs``).
        observation_space: the environment's observation space.
        action_space: the environment's action space.
        device: torch device of the sampled tensors (``"auto"``: cuda if available).
        n_envs: parallel environments writing each row.
        optimize_memory_usage: store each observation once (the next observation
            of row ``r`` is the observation of row ``r + 1``). The row whose next
            observation is not written yet has priority 0, so it is never sampled.
            Needs ``handle_timeout_termination=False``, as in SB3.
        handle_timeout_termination: store time-limit truncations and sample
            ``dones * (1 - timeouts)``, so targets bootstrap through truncation.
        alpha: priority exponent (0 = uniform).
        beta: initial importance-sampling exponent in ``[0, 1]``; the PER
            algorithms anneal it to 1 over training.
        eps: added to every ``|TD error|`` so that no transition gets priority 0.
        tree: sum-tree backend, ``"auto"`` or one of :func:`hetero_replay.backends`.
        fanout: children per tree node, a power of two in 2..64.
        priority_dtype: ``"float32"`` or ``"float64"`` priorities.
        stratified: one draw per equal slice of the priority mass (``False``: i.i.d.).
        seed: seed of the buffer's own random generator. ``None`` draws one from
            NumPy's global generator, which SB3 seeds from the algorithm's
            ``seed`` just before building the buffer, so seeded runs repeat exactly.
        mapping: where the replay primitives run
            (:class:`hetero_replay.mapping.Mapping`); ``None`` is the C++ tree
            (``tree``) with NumPy storage. With a mapping, the tree backend, its
            device, the storage and the device of sampled batches come from
            ``mapping.replay_kwargs()``; ``tree`` must stay ``"auto"`` and
            ``device`` must be ``"auto"`` (then it is the mapping's learner
            device) or that device. The PER algorithms take ``mapping=`` too and
            pass it here.

    With device batches (storage on a device, or a learner off the CPU), the
    sampled tensors come from the core engine untouched, the ``indices`` are a
    tensor where the tree is, and the array attributes (``observations``,
    ``dones``, ...) are torch tensors where the storage is. Normalising with a
    ``VecNormalize`` then takes the batch through the host (it works in NumPy).

    Raises:
        ValueError: for ``alpha < 0``, ``beta`` outside ``[0, 1]``, ``eps < 0``,
            an unknown ``tree``, a bad ``fanout``, ``optimize_memory_usage``
            together with ``handle_timeout_termination``, a ``mapping`` whose
            inference and train devices differ (SB3 acts and trains with one
            policy), or a ``tree`` or ``device`` that contradicts the mapping.
        TypeError: ``mapping`` is not a :class:`~hetero_replay.mapping.Mapping`.
        hetero_replay.mapping.DeviceUnavailableError: the mapping names a
            device this machine lacks.
    """

    _staged_next_obs: np.ndarray | None  # with optimize_memory_usage: the newest next observations

    def __init__(
        self,
        buffer_size: int,
        observation_space: spaces.Space,
        action_space: spaces.Space,
        device: th.device | str = "auto",
        n_envs: int = 1,
        optimize_memory_usage: bool = False,
        handle_timeout_termination: bool = True,
        alpha: float = 0.6,
        beta: float = 0.4,
        eps: float = DEFAULT_EPS,
        tree: str = "auto",
        fanout: int = 16,
        priority_dtype: str = "float32",
        stratified: bool = True,
        seed: int | None = None,
        mapping: Mapping | None = None,
    ) -> None:
        if mapping is not None:
            mapping = one_policy_mapping(mapping, type(self).__name__)
            device = _mapped_device(device, mapping)
            if tree != "auto":
                raise ValueError(
                    f"tree={tree!r} and the mapping both choose the tree backend; "
                    f"set it in the mapping instead (Mapping(tree={tree!r}, ...))"
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
        self.optimize_memory_usage = optimize_memory_usage
        self.handle_timeout_termination = handle_timeout_termination
        self._config: dict[str, Any] = dict(
            alpha=alpha, beta=beta, eps=eps, tree=tree, fanout=fanout,
            priority_dtype=priority_dtype, stratified=stratified,
        )  # fmt: skip
        self.mapping = mapping
        if mapping is not None:
            self._config.update(mapping.replay_kwargs())
        if seed is None:
            seed = int(np.random.randint(2**31 - 1))
        self._replay = self._make_replay(seed)
        self._stage_new()
        self._samples_since_update = 0
        self._warned_no_update = False

    # -- what a transition holds ------------------------------------------------

    def _observation_fields(self) -> dict[str, Field]:
        """Schema fields of one observation, keyed by name suffix ("" for a plain array)."""
        return {"": Field(self.obs_shape, self.observation_space.dtype)}

    def _observation_batch(self, prefix: str, obs: Any) -> dict[str, np.ndarray]:
        """One row of observations as schema fields (``prefix`` is "obs" or "next_obs")."""
        if isinstance(self.observation_space, spaces.Discrete):
            # as in SB3: numpy cannot broadcast (n_envs,) to (n_envs, 1)
            obs = np.reshape(obs, (self.n_envs, *self.obs_shape))
        return {prefix: obs}

    def _observation_tensor(self, prefix: str, data: dict[str, Any], env: VecNormalize | None) -> th.Tensor:
        """Sampled observations from gathered fields, normalised by ``env`` if given."""
        return self._tensor(self._normalize_obs(data[prefix], env))

    def _tensor(self, value: np.ndarray | th.Tensor) -> th.Tensor:
        """A sampled field as a tensor on :attr:`device`; the core engine's tensors are already there."""
        return value if isinstance(value, th.Tensor) else self.to_torch(value, copy=False)

    @property
    def _device_batches(self) -> bool:
        """Whether the core engine hands out torch tensors on the learner's device."""
        return isinstance(self._replay, TorchBatchReplay)

    def _make_replay(self, seed: int) -> PrioritizedReplay:
        fields = {(f"obs/{key}" if key else "obs"): f for key, f in self._observation_fields().items()}
        fields["action"] = Field((self.action_dim,), self._maybe_cast_dtype(self.action_space.dtype))
        fields["reward"] = Field((), np.float32)
        if not self.optimize_memory_usage:
            fields.update({f"next_{n}": f for n, f in list(fields.items()) if n.startswith("obs")})
        fields["done"] = Field((), np.float32)
        if self.handle_timeout_termination:
            fields["timeout"] = Field((), np.float32)
        return PrioritizedReplay(self.buffer_size * self.n_envs, Schema(fields), seed=seed, **self._config)

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

        The new transitions get the largest priority seen so far. Rows are
        staged (in NumPy, on the host, where the environments produce them)
        and handed to the core engine in one call per batch of rows (at the
        latest before the next sample, priority update or read): the engine's
        per-call cost, and with device storage the copy to the device, is then
        paid once per ``train()``, not per step. Nothing else changes, since
        priorities only move in :meth:`update_priorities`.
        """
        fields = self._observation_batch("obs", obs)
        fields["action"] = np.reshape(action, (self.n_envs, self.action_dim))
        fields["reward"] = reward
        if self.optimize_memory_usage:
            self._staged_next_obs = np.array(next_obs)  # copied, as SB3 copies what it stores
        else:
            fields.update(self._observation_batch("next_obs", next_obs))
        fields["done"] = done
        if self.handle_timeout_termination:
            fields["timeout"] = np.array([info.get("TimeLimit.truncated", False) for info in infos])
        start = self._staged_rows * self.n_envs
        for name, value in fields.items():
            self._staged[name][start : start + self.n_envs] = value
        self._staged_rows += 1
        self.pos += 1
        if self.pos == self.buffer_size:
            self.full = True
            self.pos = 0
        if self._staged_rows == self._stage_capacity:
            self._commit()

    def _stage_new(self) -> None:
        """Allocate the staging rows (up to ``STAGE_ROWS``) for :meth:`add`."""
        self._stage_capacity = min(STAGE_ROWS, self.buffer_size)
        rows = self._stage_capacity * self.n_envs
        self._staged = {n: np.zeros((rows, *f.shape), f.dtype) for n, f in self._replay.schema.items()}
        self._staged_rows = 0
        self._staged_next_obs = None

    def _commit(self) -> None:
        """Hand the staged rows to the core engine (they get the max priority there)."""
        if self._staged_rows == 0:
            return
        n = self._staged_rows * self.n_envs
        self._replay.add({name: arr[:n] for name, arr in self._staged.items()})
        self._staged_rows = 0
        if self.optimize_memory_usage:
            # Row `pos` now holds the next observations of the last row added;
            # until its own add it is not a valid transition: priority 0.
            start = self.pos * self.n_envs
            self._replay.storage.write(start, self._observation_batch("obs", self._staged_next_obs))
            if self.full:
                slots = np.arange(start, start + self.n_envs, dtype=np.int64)
                self._replay.tree.update(slots, np.zeros(self.n_envs, self._replay.tree.dtype))

    def sample(self, batch_size: int, env: VecNormalize | None = None) -> PrioritizedReplayBufferSamples:  # type: ignore[override]
        """Draw ``batch_size`` transitions by priority, with their IS weights and indices.

        Args:
            batch_size: number of transitions (drawn with replacement).
            env: a ``VecNormalize`` to normalise observations and rewards with, as in SB3.
        """
        self._count_sample()
        self._commit()
        batch = self._replay.sample(batch_size)
        data, indices = batch.data, batch.indices
        if self.optimize_memory_usage:
            data["next_obs"] = self._next_observations(indices)
        if env is not None and self._device_batches:
            # VecNormalize works on NumPy arrays: normalising takes the batch through the host.
            data = {name: value.cpu().numpy() for name, value in data.items()}
        dones = data["done"]
        if self.handle_timeout_termination:
            dones = dones * (1.0 - data["timeout"])  # as in SB3: no termination at a time limit
        return PrioritizedReplayBufferSamples(
            observations=self._observation_tensor("obs", data, env),
            actions=self._tensor(data["action"]),
            next_observations=self._observation_tensor("next_obs", data, env),
            dones=self._tensor(dones.reshape(-1, 1)),
            rewards=self._tensor(self._normalize_reward(data["reward"].reshape(-1, 1), env)),
            discounts=None,
            weights=self._tensor(batch.weights.reshape(-1, 1)),
            indices=indices,
        )

    def _next_observations(self, indices: np.ndarray | th.Tensor) -> np.ndarray | th.Tensor:
        """With ``optimize_memory_usage``: the next observations of sampled slots.

        The next observation of slot ``i`` is the observation one row later.
        Device batches gather them where the storage is and deliver them to
        the learner's device, like the rest of the batch.
        """
        slots = (indices + self.n_envs) % self._replay.capacity
        obs = self._replay.storage.arrays["obs"]
        if not self._device_batches:
            return obs.take(slots, axis=0)
        obs = th.as_tensor(obs)  # NumPy storage: a view, no copy
        return obs.index_select(0, slots.to(obs.device)).to(self.device)

    def update_priorities(self, indices: np.ndarray | th.Tensor, td_errors: th.Tensor | np.ndarray) -> None:
        """Set the priorities of sampled transitions to ``(|td_errors| + eps) ** alpha``.

        With device batches the TD errors stay tensors: the core engine hands
        them to a device tree where they are (with the tree on the learner's
        device, nothing is copied) and to a host tree as NumPy arrays.

        Args:
            indices: the ``indices`` of a sample from this buffer.
            td_errors: one TD error per index (a tensor on any device, or an
                array); its absolute value is taken.

        Raises:
            ValueError: a NaN or infinite TD error (naming its position), or
                lengths that differ.
            IndexError: an index outside the filled part of the buffer.
            Nothing changes on error.
        """
        if self._device_batches:
            td = th.as_tensor(td_errors).detach().reshape(-1).abs()
            indices = th.as_tensor(indices)
        else:
            if isinstance(td_errors, th.Tensor):
                td_errors = td_errors.detach().reshape(-1).cpu().numpy()
            td = np.abs(np.asarray(td_errors).reshape(-1))
            indices = np.asarray(indices)
        if indices.shape != td.shape:
            raise ValueError(f"update_priorities: {indices.shape[0]} indices but {td.shape[0]} TD errors")
        self._commit()
        if self.optimize_memory_usage and self.full:
            # Transitions overwritten since they were sampled keep priority 0 (see add).
            valid = (indices // self.n_envs) != self.pos
            indices, td = indices[valid], td[valid.to(td.device) if self._device_batches else valid]
        self._replay.update_priorities(indices, td)
        self._samples_since_update = 0

    def reset(self) -> None:
        """Empty the buffer (priorities and the max priority start over)."""
        super().reset()
        self._replay = self._make_replay(int(self._replay.rng.integers(2**31 - 1)))
        self._stage_new()

    # -- PER state ------------------------------------------------------------------

    @property
    def beta(self) -> float:
        """Importance-sampling exponent used by the next :meth:`sample`, in ``[0, 1]``."""
        return self._replay.beta

    @beta.setter
    def beta(self, value: float) -> None:
        self._replay.beta = value

    @property
    def alpha(self) -> float:
        """Priority exponent."""
        return self._replay.alpha

    @property
    def max_priority(self) -> float:
        """Largest ``|TD error| + eps`` seen so far (1 until the first update)."""
        return self._replay.max_priority

    @property
    def replay(self) -> PrioritizedReplay:
        """The core engine that holds the transitions and their priorities."""
        self._commit()
        return self._replay

    def priorities(self) -> np.ndarray:
        """Current sampling priorities ``p^alpha``, shape ``(buffer_size, n_envs)``."""
        self._commit()
        return self._replay.tree.leaves().reshape(self.buffer_size, self.n_envs)

    # -- SB3's array attributes, as views into the core storage ----------------------

    def _rows(self, name: str) -> np.ndarray:
        """Field ``name`` as a ``(buffer_size, n_envs, ...)`` view (writes go through).

        A NumPy array, or a torch tensor where the storage is when it is on a device.
        """
        self._commit()
        arr = self._replay.storage.arrays[name]
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
        # SB3's save_replay_buffer pickles the buffer: commit, and leave the
        # (empty) staging rows out.
        self._commit()
        state = self.__dict__.copy()
        del state["_staged"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._stage_new()

    def _count_sample(self) -> None:
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
        return {key: Field(shape, self.observation_space[key].dtype) for key, shape in self.obs_shape.items()}

    def _observation_batch(self, prefix: str, obs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:  # type: ignore[override]
        out = {}
        for key, shape in self.obs_shape.items():
            value = obs[key]
            if isinstance(self.observation_space[key], spaces.Discrete):
                value = np.reshape(value, (self.n_envs, *shape))
            out[f"{prefix}/{key}"] = value
        return out

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


def _mapped_device(device: th.device | str, mapping: Mapping) -> str:
    """The buffer's device under ``mapping``: its learner device (``"auto"`` or that device).

    Raises:
        ValueError: ``device`` is another device; batches must arrive where the network trains.
    """
    learner = mapping.learner_device
    if str(device) != "auto" and not same_device(get_device(device), learner):
        raise ValueError(
            f"device {str(device)!r} is not the mapping's learner device {learner!r}: sampled batches go "
            f"where the network trains. Pass device={learner!r} to the algorithm, or use PERDQN / PERDDPG / "
            "PERTD3 / PERSAC with mapping=..., which take their device from the mapping"
        )
    return learner
