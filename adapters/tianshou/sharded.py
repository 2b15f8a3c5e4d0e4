"""Tianshou off-policy training from a :class:`~hetero_replay.distributed.ShardedReplay` (shards on Ray).

Tianshou's ``Collector`` writes into a buffer and its algorithms sample from the
same buffer by index; a :class:`~hetero_replay.distributed.ShardedReplay` keeps
its transitions in Ray actors, on this machine or across a cluster. Two classes
join them:

* :class:`ShardedVectorReplayBuffer` is what the ``Collector`` writes to. It
  keeps a small local ring per environment, only for the collector's episode
  bookkeeping (``add`` returns insertion and episode-start indices, and the
  collector reads each finished episode back for its statistics), and forwards
  every transition (``obs, act, rew, terminated, truncated, obs_next``) to the
  sharded replay, staged and sent ``send_every`` rows at a time and always
  before a sample. The replay's schema comes from the env spaces or the first
  batch; a ready replay (``replay=``) must match it.
* :class:`ShardedSampleBuffer` is one batch drawn from the sharded replay
  (exact global PER, IS weights normalised by the global minimum priority),
  laid out as a Tianshou buffer of its own: row ``i`` is sampled transition
  ``i``. :class:`~hetero_replay.adapters.tianshou.PEROffPolicyWrapper` hands
  it to Tianshou's update step as the buffer, so the wrapped algorithm's
  pre-processing, weighted update and post-processing run exactly as with a
  local buffer, and the post-processing's ``update_weight`` sends the TD
  errors to the shards (:meth:`ShardedReplay.update_priorities`, without waiting).

Why a batch of its own rather than the local ring: the algorithm's target
computation reads the buffer by index (``buffer[indices].obs_next``,
``buffer.terminated[indices]``), and the sampled rows are not in the local
ring. Each sampled row is a finished one-step transition, so a one-step target
reads everything it needs from that row.

**n-step returns** (``n_step_return_horizon = n > 1``) also read the episode's
next ``n - 1`` rows, which live on other shards (an add's rows are split over
them) or were overwritten. They are stored at write time: with
``ShardedVectorReplayBuffer(..., n_step=n)`` each replay row is a transition
with the *window* of its next ``n`` steps, ``rew``, ``terminated`` and
``truncated`` of shape ``(n,)`` (zeros after an episode's end) and the
``obs_next`` of the window's last step, sent once the window is complete (``n - 1``
steps later, or at the episode's end). A sampled batch lays each transition's
window out as ``n`` consecutive rows of its own, so Tianshou's own n-step
code (``compute_nstep_return``: ``buffer.next``, the rewards, done flags and
the last step's ``obs_next``) computes exactly the return it would on a local
buffer, with the algorithm's ``gamma``. Why not gather the next rows from their
shards at sample time: that is a second round of calls per batch to every
shard holding a successor (the learner's cost is Ray's per-call CPU), and
the successors may be overwritten or lost with a shard; a window costs
``2 (n - 1)`` numbers per row and one step of delay per step of ``n``.

Example:
    >>> buf = ShardedVectorReplayBuffer(4, num_shards=2, capacity_per_shard=50_000,
    ...     alpha=0.6, seed=0, observation_space=env.observation_space,
    ...     action_space=env.action_space)                                   # doctest: +SKIP
    >>> algorithm = PEROffPolicyWrapper(wrapped_algorithm=dqn, beta=LinearBetaSchedule(0.4, 1.0, 5_000))  # doctest: +SKIP
    >>> collector = Collector(algorithm, train_envs, buf, exploration_noise=True)  # doctest: +SKIP
    >>> algorithm.run_training(OffPolicyTrainerParams(training_collector=collector, ...))  # doctest: +SKIP
    >>> buf.close()                                                          # doctest: +SKIP
"""

from __future__ import annotations

import inspect
from collections import deque
from typing import Any

import numpy as np
import torch
from tianshou.algorithm.algorithm_base import OffPolicyAlgorithm
from tianshou.data import Batch, ReplayBuffer, VectorReplayBuffer
from tianshou.data.types import RolloutBatchProtocol

from hetero_replay import Field, Sample, Schema, ShardedReplay
from hetero_replay.extend import check_int, close_when_gone, is_int

#: The fields of a transition that travel to the shards (Tianshou's names). ``info``
#: and ``policy`` stay in the local ring: they are not plain arrays, and the
#: update steps of DQN, DDPG, TD3 and SAC do not read them.
FIELDS = ("obs", "act", "rew", "terminated", "truncated", "obs_next")

#: Dtypes the Collector gives these fields whatever the env (Python floats and bools, stacked).
_FIXED_DTYPES = {"rew": np.dtype(np.float64), "terminated": np.dtype(bool), "truncated": np.dtype(bool)}

#: dtype kinds that store the same kind of number (signed and unsigned integers are both integers).
_KINDS = {"b": "bool", "i": "integer", "u": "integer", "f": "float", "c": "complex"}

#: The algorithm attributes that hold the n-step horizon (DQN family; DDPG, TD3, SAC).
_HORIZON_ATTRIBUTES = ("n_step", "n_step_return_horizon")

#: The fields a replay row holds for each step of its n-step window (the rest: its first step's, or last step's ``obs_next``).
_WINDOW_FIELDS = ("rew", "terminated", "truncated")


def transition_schema(observation_space: Any, action_space: Any, n_step: int = 1) -> Schema:
    """The schema of a Tianshou transition of an env with these gymnasium spaces.

    ``obs`` and ``obs_next`` take the observation space's shape and dtype,
    ``act`` the action space's (``Discrete``: a scalar ``int64``), ``rew`` is
    ``float64`` and ``terminated``/``truncated`` are ``bool``, as the Collector
    stores them. With ``n_step > 1`` the last three hold a window of ``n_step``
    steps (shape ``(n_step,)``; see the module docstring).

    Raises:
        TypeError: a space without a fixed shape and dtype (``Dict``, ``Tuple``,
            ``Text``); flatten it first (``gymnasium.wrappers.FlattenObservation``).
    """
    check_int(n_step, "n_step", low=1)
    obs = _space_field(observation_space, "observation_space")
    act = _space_field(action_space, "action_space")
    fixed = {name: Field((), dtype) for name, dtype in _FIXED_DTYPES.items()}
    return _windowed(Schema({"obs": obs, "act": act, **fixed, "obs_next": obs}), n_step)


def _windowed(schema: Schema, n_step: int) -> Schema:
    """A one-step transition schema with ``rew``, ``terminated`` and ``truncated`` widened to windows of ``n_step``."""
    if n_step == 1:
        return schema
    return Schema({
        name: Field(((n_step, *f.shape) if name in _WINDOW_FIELDS else f.shape), f.dtype) for name, f in schema.items()
    })  # fmt: skip


def _one_step(schema: Schema, n_step: int) -> Schema:
    """The one-step schema a windowed ``schema`` (of :func:`_windowed`) was widened from."""
    if n_step == 1:
        return schema
    return Schema(
        {name: Field((f.shape[1:] if name in _WINDOW_FIELDS else f.shape), f.dtype) for name, f in schema.items()}
    )


def check_sharded_training(algorithm: OffPolicyAlgorithm, staleness: int, n_step: int = 1) -> None:
    """Refuse what training from a sharded replay cannot do; called before anything is sampled.

    Raises:
        ValueError: ``algorithm``'s n-step horizon is not the buffer's ``n_step``: a
            return reads the episode's next rows, and a sampled row holds the window
            of ``n_step`` steps stored with it, no more (the rows themselves live on
            other shards, or were overwritten).
        TypeError: ``staleness >= 1``: it defers priority updates with the write
            tracking of the local buffers; a sharded replay's updates are sent
            without waiting anyway, and its shards drop those whose slot was
            rewritten since the draw.
    """
    # The attributes the algorithm has (none: one-step targets).
    horizons = [(a, getattr(algorithm, a)) for a in _HORIZON_ATTRIBUTES if hasattr(algorithm, a)]
    for attribute, horizon in horizons or [("n_step_return_horizon", 1)]:
        if horizon != n_step:
            raise ValueError(
                f"{type(algorithm).__name__}.{attribute} = {horizon}, but this ShardedVectorReplayBuffer stores "
                f"windows of n_step={n_step}. An n-step return reads the episode's next {horizon - 1} rows, which "
                "live on other shards (or were overwritten): each row carries its window from the write. Build the "
                f"buffer with n_step={horizon} (or the algorithm with n_step_return_horizon={n_step})"
            )
    if staleness:
        raise TypeError(
            f"the wrapper's staleness={staleness} defers updates through a local buffer's write tracking; "
            "with a ShardedVectorReplayBuffer give the replay its staleness instead "
            "(ShardedVectorReplayBuffer(..., staleness=...), ShardedReplay's relaxed schedule) and keep the "
            "wrapper's at 0"
        )


class ShardedVectorReplayBuffer(VectorReplayBuffer):
    """What a Tianshou ``Collector`` writes to when the replay is a :class:`ShardedReplay`.

    A ``VectorReplayBuffer`` of ``buffer_num`` small rings (one per env, for
    the collector's episode bookkeeping) that forwards every added transition
    to :attr:`replay`. Train from it with
    :class:`~hetero_replay.adapters.tianshou.PEROffPolicyWrapper`; its own
    :meth:`sample` refuses, since the local rings hold only recent episodes.

    Args:
        buffer_num: environments (sub-buffers), at least the collector's env count.
        replay: a ready :class:`ShardedReplay` whose schema holds the fields
            :data:`FIELDS` with the shapes the envs give and dtypes their values
            cast to; or ``None`` to build one from ``replay_options``.
        episode_capacity: the longest episode (env steps) the local ring of one
            env holds. The collector reads each finished episode back from it, so
            a longer episode raises ``ValueError`` at the add that exceeds it.
        send_every: transitions staged before they are sent to the replay (one
            :meth:`ShardedReplay.add`); staged rows are also sent before every
            sample (:meth:`draw`), by :meth:`send`, :meth:`reset` and :meth:`close`.
        observation_space, action_space: the env's gymnasium spaces. With both,
            the schema is known now (:func:`transition_schema`): the replay is
            built (or a given one checked) here. Without them, at the first add,
            from that batch's shapes and dtypes.
        n_step: the n-step horizon of the algorithm trained from it (its
            ``n_step_return_horizon``): each row goes to the replay with the window
            of its next ``n_step`` steps, once that window is complete (see the
            module docstring); ``1``: one-step transitions, sent as added.
        replay_options: :class:`ShardedReplay`'s keyword arguments (``num_shards``
            and ``capacity_per_shard`` required; ``alpha``, ``beta``, ``seed``,
            ``address``, ``durable_dir``, ...), when ``replay`` is ``None``.
            The replay built from them is closed by :meth:`close`.

    Raises:
        TypeError: ``replay`` is not a :class:`ShardedReplay`, both ``replay`` and
            ``replay_options`` are given, ``replay_options`` lack a required
            argument or name an unknown one, or an argument has the wrong type.
        ValueError: an argument is out of range, or ``replay``'s schema does not
            match the spaces.

    Limits: observations and actions must be arrays (no ``Dict`` spaces), no
    frame stacking, the algorithm's n-step horizon must be ``n_step`` (see
    :func:`check_sharded_training`); the transitions of an episode still running
    when the buffer is reset or closed are sent with the window they have (their
    return bootstraps from the last step collected, as at a time limit);
    ``reset`` empties the local rings but cannot empty the replay, which other
    writers may share; fields an episode hook adds are refused.
    """

    def __init__(
        self,
        buffer_num: int,
        replay: ShardedReplay | None = None,
        *,
        episode_capacity: int = 1000,
        send_every: int = 256,
        observation_space: Any = None,
        action_space: Any = None,
        n_step: int = 1,
        **replay_options: Any,
    ) -> None:
        check_int(buffer_num, "buffer_num", low=1)
        check_int(episode_capacity, "episode_capacity", low=1)
        check_int(send_every, "send_every", low=1)
        check_int(n_step, "n_step", low=1, high=episode_capacity)
        if (observation_space is None) != (action_space is None):
            raise TypeError("give both observation_space and action_space (or neither: the first add decides)")
        expected = None if observation_space is None else transition_schema(observation_space, action_space, n_step)
        if replay is not None:
            if not isinstance(replay, ShardedReplay):
                raise TypeError(f"replay must be a ShardedReplay (or None), got {type(replay).__name__}")
            if replay_options:
                raise TypeError(
                    f"replay= is a ready ShardedReplay; the ShardedReplay arguments {sorted(replay_options)} "
                    "apply only when this buffer builds the replay (replay=None)"
                )
            if expected is not None:
                check_schema(replay.schema, expected, "the spaces give")
        else:
            _check_replay_options(replay_options)
        # One slot more than the longest episode: the collector reads an episode back as the
        # ring range [start, stop), which is empty when the episode fills its ring exactly.
        super().__init__(total_size=(episode_capacity + 1) * buffer_num, buffer_num=buffer_num)
        self.episode_capacity = int(episode_capacity)
        self.send_every = int(send_every)
        self._replay_options = dict(replay_options)
        self._owns_replay = replay is None
        self._schema_checked = expected is not None  # against the spaces; otherwise at the first add
        #: The n-step horizon each row's window covers (1: one-step transitions).
        self.n_step = int(n_step)
        # Per env, its transitions whose n-step window is not complete yet (one-step rows: {field: row}).
        self._open_windows: list[deque[dict[str, np.ndarray]]] = [deque() for _ in range(buffer_num)]
        self._staged: list[dict[str, np.ndarray]] = []
        self._staged_rows = 0
        #: Transitions sent to the replay so far.
        self.sent = 0
        #: The sharded replay (``None`` until the first add when neither ``replay`` nor the spaces were given).
        self.replay: ShardedReplay | None = replay
        if replay is None and expected is not None:
            self.replay = self._build_replay(expected)
        if self.replay is not None:  # otherwise once the first add builds it: it must exist first (closing.py)
            close_when_gone(self, _unsent)

    # -- what the Collector calls ---------------------------------------------------------

    def add(
        self, batch: RolloutBatchProtocol, buffer_ids: np.ndarray | list[int] | None = None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Add one row per env of ``buffer_ids`` to the local rings and stage it for the replay.

        Returns Tianshou's ``(insertion index, episode return, episode length,
        episode start index)`` of the local rings. With ``n_step > 1`` a row is
        staged once its window is complete. Everything is checked first
        (the fields, their shapes and dtypes against the replay's schema, the
        episode lengths), so a refused batch changes neither the rings nor the replay.
        """
        ids = np.arange(self.buffer_num) if buffer_ids is None else np.asarray(buffer_ids)
        rows = _transition_rows(batch, len(ids))
        if self.replay is None or not self._schema_checked:
            given = _windowed(Schema({name: (arr.shape[1:], arr.dtype) for name, arr in rows.items()}), self.n_step)
            if self.replay is None:
                self.replay = self._build_replay(given)
                close_when_gone(self, _unsent)
            check_schema(self.replay.schema, given, "the collected data gives")
            self._schema_checked = True
        rows = _fit(_one_step(self.replay.schema, self.n_step), rows)
        for b in ids:
            ring = self.buffers[b]
            if ring._ep_len + 1 > self.episode_capacity:
                raise ValueError(
                    f"the episode of env {b} reached {ring._ep_len + 1} steps, more than episode_capacity="
                    f"{self.episode_capacity}: the collector reads each finished episode back from the local "
                    "ring; build the buffer with a larger episode_capacity"
                )
        result = super().add(batch, buffer_ids)
        if self.n_step == 1:
            self._stage(rows)
        else:
            for j, b in enumerate(ids.tolist()):
                window = self._open_windows[b]
                window.append({name: arr[j] for name, arr in rows.items()})
                if rows["terminated"][j] or rows["truncated"][j]:
                    self._close_windows(b)  # the episode ended: every open window is complete
                elif len(window) == self.n_step:
                    self._stage(_window_row(window, self.n_step))
                    window.popleft()
        if self._staged_rows >= self.send_every:
            self.send()
        return result

    def _stage(self, rows: dict[str, np.ndarray]) -> None:
        self._staged.append(rows)
        self._staged_rows += len(rows["obs"])

    def _close_windows(self, env: int) -> None:
        """Stage every open window of ``env`` with the steps it has (the episode ended, or collection stops)."""
        window = self._open_windows[env]
        while window:
            self._stage(_window_row(window, self.n_step))
            window.popleft()

    @property
    def open_windows(self) -> int:
        """Transitions added whose n-step window is not complete yet (sent once it is; 0 with ``n_step=1``)."""
        return sum(len(w) for w in self._open_windows)

    def reset(self, keep_statistics: bool = False) -> None:
        """Send the staged transitions and open windows, then empty the local rings (the replay keeps what it holds)."""
        for env in range(self.buffer_num):
            self._close_windows(env)
        self.send()
        super().reset(keep_statistics=keep_statistics)

    def set_array_at_key(
        self, seq: np.ndarray, key: str, index: Any = None, default_value: float | None = None
    ) -> None:
        """Refused: fields added after the fact (a Collector's episode hook) would never reach the shards."""
        raise NotImplementedError(
            f"cannot set field {key!r} of transitions in a ShardedVectorReplayBuffer: they were sent to the "
            "sharded replay already, whose schema is fixed; an on_episode_done hook may not add fields here"
        )

    def sample(self, batch_size: int | None) -> tuple[RolloutBatchProtocol, np.ndarray]:
        """Refused: the transitions are in the sharded replay; train through ``PEROffPolicyWrapper``."""
        raise TypeError(
            "a ShardedVectorReplayBuffer is not sampled by index: its transitions live in the sharded replay "
            "and its local rings hold recent episodes only. Wrap the algorithm in PEROffPolicyWrapper, which "
            "samples the replay (buffer.draw)"
        )

    # -- the replay side ----------------------------------------------------------------------

    def send(self) -> int:
        """Send the staged transitions to the replay now (one add); returns how many.

        Not a durable point: that is ``replay.flush()``.
        """
        if not self._staged_rows:
            return 0
        assert self.replay is not None  # rows are staged only after the replay exists
        staged, self._staged, n = self._staged, [], self._staged_rows
        self._staged_rows = 0
        self.replay.add({name: np.concatenate([rows[name] for rows in staged]) for name in staged[0]})
        self.sent += n
        return n

    @property
    def staged(self) -> int:
        """Transitions added but not yet sent to the replay."""
        return self._staged_rows

    def draw(self, batch_size: int | None, beta: float | None = None) -> ShardedSampleBuffer:
        """Send the staged transitions, then sample ``batch_size`` from the replay (exact global PER).

        Args:
            batch_size: transitions to draw (Tianshou's ``sample_size``); ``None``
                or 0 ("the whole buffer" in Tianshou) is refused.
            beta: IS-weight exponent of this draw; ``None``: the replay's.

        Raises:
            ValueError: nothing was collected yet, or ``batch_size`` is out of range.
            TypeError: ``batch_size`` is not an integer.
        """
        if batch_size is None or (is_int(batch_size) and batch_size == 0):
            raise ValueError(
                f"sample_size={batch_size!r} asks for the whole buffer; a sharded replay is sampled in "
                "batches: give a positive batch_size"
            )
        if self.replay is None:
            raise ValueError("cannot sample: nothing was collected into this ShardedVectorReplayBuffer yet")
        self.send()
        # ShardedReplay.sample, a public edge, checks batch_size (and beta): not checked twice per step.
        return ShardedSampleBuffer(self.replay, self.replay.sample(batch_size, beta=beta), self.n_step)

    def _build_replay(self, schema: Schema) -> ShardedReplay:
        return ShardedReplay(schema=schema, **self._replay_options)

    def close(self) -> None:
        """Send the staged transitions; close the replay if this buffer built it (a given one stays open).

        A buffer not closed is closed the same way when it is garbage collected or
        the interpreter exits normally (in the process that built it), before the
        replay's own close at exit: a normal exit loses no transition.
        """
        if self.replay is None:
            return
        for env in range(self.buffer_num):
            self._close_windows(env)
        self.send()
        if self._owns_replay:
            self.replay.close()


def _unsent(state: dict[str, Any]) -> bool:
    """Whether a buffer (its attributes) holds transitions not sent yet, or a replay of its own still open."""
    replay = state.get("replay")
    owned_open = state.get("_owns_replay", False) and replay is not None and not replay.closed
    return bool(state.get("_staged")) or any(state.get("_open_windows", ())) or owned_open


class ShardedSampleBuffer(ReplayBuffer):
    """One batch drawn from a :class:`ShardedReplay`, as a Tianshou buffer: transition ``i`` starts at row ``i * n_step``.

    Tianshou's update step samples it (:meth:`sample` returns the transitions, in
    order, with the IS weights in ``batch.weight``), reads it by index for
    its targets, and hands the TD errors to :meth:`update_weight`, which
    sends them to the shards as priorities. With ``n_step > 1``, rows
    ``i * n_step + j`` are step ``j`` of transition ``i``'s window (the module
    docstring): ``buffer.next`` walks it, and its last step (done, or the
    ``n_step``-th) holds the window's ``obs_next``, which is all an n-step return reads.

    Args:
        replay: the replay ``drawn`` came from.
        drawn: :meth:`ShardedReplay.sample`'s result (rows of :data:`FIELDS`).
        n_step: the window each row holds (the replay's rows of ``rew`` have this many steps when > 1).
    """

    def __init__(self, replay: ShardedReplay, drawn: Sample, n_step: int = 1) -> None:
        n = len(drawn.weights) * n_step
        super().__init__(n)
        #: The replay the batch came from, which :meth:`update_weight` updates.
        self.replay = replay
        #: The draw: its rows, replay indices and IS weights.
        self.drawn = drawn
        self.n_step = n_step
        data = drawn.data
        rows = {name: data[name] for name in FIELDS}
        if n_step > 1:  # each window's steps as consecutive rows; a step's obs/act/obs_next are the window's
            rows = {name: (arr.reshape(n, *arr.shape[2:]) if name in _WINDOW_FIELDS else np.repeat(arr, n_step, axis=0))
                    for name, arr in rows.items()}  # fmt: skip
        self.set_batch(Batch(**rows, done=np.logical_or(rows["terminated"], rows["truncated"])))
        self._size = n
        self.last_index = np.array([n - 1])

    def sample(self, batch_size: int | None) -> tuple[RolloutBatchProtocol, np.ndarray]:
        """The drawn transitions in order, IS weights in ``batch.weight``; ``batch_size`` must be the drawn size."""
        n = len(self.drawn.weights)
        if batch_size not in (None, 0, n):
            raise ValueError(f"this batch was drawn with {n} transitions; sample_size={batch_size!r} does not match")
        indices = np.arange(n) * self.n_step
        batch = self[indices]
        batch.weight = self.drawn.weights
        return batch, indices

    def update_weight(self, index: np.ndarray, new_weight: np.ndarray | torch.Tensor) -> None:
        """Send ``|new_weight|`` (the TD errors) as the new priorities of transitions at rows ``index`` to the shards."""
        if isinstance(new_weight, torch.Tensor):
            new_weight = new_weight.detach().cpu().numpy()
        td = np.abs(np.asarray(new_weight, np.float64)).reshape(-1)
        self.replay.update_priorities(self.drawn.indices[np.asarray(index) // self.n_step], td)


def check_schema(schema: Schema, expected: Schema, source: str) -> None:
    """``ValueError`` unless a replay of ``schema`` can store the transitions ``source`` gives (``expected``).

    The fields must be :data:`FIELDS`, with ``expected``'s shapes; each dtype
    must cast to the replay's within its kind (float64 rewards into float32
    storage are fine; integer actions into float storage are not: they would
    come back as floats, which index no Q-value). ``source`` names what gives
    ``expected``, with its verb (``"the spaces give"``).
    """
    if set(schema) != set(FIELDS):
        raise ValueError(
            f"the replay's schema has the fields {sorted(schema)}, but a Tianshou transition has {sorted(FIELDS)}; "
            "build the ShardedReplay with transition_schema(observation_space, action_space)"
        )
    for name in FIELDS:
        have, want = schema[name], expected[name]
        if have.shape != want.shape:
            raise ValueError(f"field {name!r}: the replay stores shape {have.shape}, {source} {want.shape}")
        if _KINDS[have.dtype.kind] != _KINDS[want.dtype.kind] or not np.can_cast(want.dtype, have.dtype, "same_kind"):
            raise ValueError(f"field {name!r}: the replay stores {have.dtype}, {source} {want.dtype}")


def _transition_rows(batch: RolloutBatchProtocol, n: int) -> dict[str, np.ndarray]:
    """The fields of :data:`FIELDS` of a Collector's batch as arrays of ``n`` rows; refuses what a shard cannot hold."""
    keys = set(batch.get_keys())
    missing = [name for name in FIELDS if name not in keys]
    if missing:
        raise ValueError(f"the batch lacks {missing}; a ShardedVectorReplayBuffer stores {list(FIELDS)}")
    rows = {}
    for name in FIELDS:
        value = batch[name]
        if isinstance(value, Batch):
            raise TypeError(
                f"field {name!r} is a Batch (a Dict or Tuple space); a sharded replay stores arrays: flatten the "
                "space (gymnasium.wrappers.FlattenObservation)"
            )
        arr = np.asarray(value)
        if arr.ndim == 0 or arr.shape[0] != n:
            raise ValueError(f"field {name!r} has shape {arr.shape}; expected one row per env added ({n})")
        rows[name] = arr
    return rows


def _window_row(window: deque[dict[str, np.ndarray]], n_step: int) -> dict[str, np.ndarray]:
    """The replay row of ``window[0]``: its obs and act, the window's steps of :data:`_WINDOW_FIELDS` (zeros after
    the last), the last step's ``obs_next``; each a batch of one row.

    A window cut short without the episode's end (collection stops: :meth:`ShardedVectorReplayBuffer.reset`,
    ``close``) has its last step marked truncated, so the return bootstraps from that step's ``obs_next``.
    """
    first, last = window[0], window[-1]
    row = {"obs": first["obs"][None], "act": first["act"][None], "obs_next": last["obs_next"][None]}
    for name in _WINDOW_FIELDS:
        steps = np.zeros((1, n_step, *first[name].shape), first[name].dtype)
        for j, step in enumerate(window):
            steps[0, j] = step[name]
        row[name] = steps
    if len(window) < n_step and not (last["terminated"] or last["truncated"]):
        row["truncated"][0, len(window) - 1] = True
    return row


def _fit(schema: Schema, rows: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """``rows`` checked against ``schema`` and cast to its dtypes, as copies (the caller may reuse its arrays)."""
    out = {}
    for name, field in schema.items():
        arr = rows[name]
        if arr.shape[1:] != field.shape:
            raise ValueError(
                f"field {name!r}: the replay stores shape {field.shape}, got rows of shape {arr.shape[1:]}"
            )
        cast = field.cast(name, arr)
        out[name] = np.array(cast, copy=True) if cast is arr else cast
    return out


def _space_field(space: Any, what: str) -> Field:
    shape, dtype = getattr(space, "shape", None), getattr(space, "dtype", None)
    if shape is None or dtype is None:
        raise TypeError(
            f"{what} {space!r} has no fixed shape and dtype; a sharded replay stores arrays: flatten it "
            "(gymnasium.wrappers.FlattenObservation)"
        )
    return Field(tuple(shape), np.dtype(dtype))


def _check_replay_options(options: dict[str, Any]) -> None:
    """``TypeError`` unless ``options`` are :class:`ShardedReplay` arguments with ``num_shards`` and ``capacity_per_shard``."""
    if "schema" in options:
        raise TypeError("schema= is not an option here: the buffer derives it (pass the spaces, or a ready replay=)")
    try:
        inspect.signature(ShardedReplay).bind(schema=None, **options)
    except TypeError as e:
        raise TypeError(
            f"without replay=, a ShardedVectorReplayBuffer takes ShardedReplay's arguments "
            f"(num_shards= and capacity_per_shard= at least): {e}"
        ) from None


__all__ = [
    "FIELDS",
    "ShardedSampleBuffer",
    "ShardedVectorReplayBuffer",
    "check_schema",
    "check_sharded_training",
    "transition_schema",
]
