"""Hindsight experience replay (HER) with prioritized replay, for SB3's ``MultiInputPolicy`` algorithms.

:class:`PrioritizedHerReplayBuffer` keeps SB3's ``HerReplayBuffer`` rules (episode
bookkeeping, the goal-selection strategies ``future``, ``final`` and ``episode``,
goals relabelled when a batch is sampled, rewards from the env's ``compute_reward``)
and draws the transitions by priority, from the core engine, as
:class:`~hetero_replay.adapters.sb3.DictPrioritizedReplayBuffer` does.

What a priority belongs to: the stored transition. A relabelled sample inherits the
priority of the transition it was built from, and its ``|TD error|`` becomes that
transition's priority. See docs/her.md for why, and what it means for the IS weights.
"""

from __future__ import annotations

import copy
import warnings
from typing import Any

import numpy as np
import torch as th
from gymnasium import spaces
from stable_baselines3.common.vec_env import VecEnv, VecNormalize
from stable_baselines3.her import HerReplayBuffer
from stable_baselines3.her.goal_selection_strategy import KEY_TO_GOAL_STRATEGY, GoalSelectionStrategy

from hetero_replay import PrioritizedReplay, Sample
from hetero_replay.adapters.sb3.buffers import DictPrioritizedReplayBuffer, PrioritizedReplayBufferSamples
from hetero_replay.extend import check_bool, check_int

#: The observation keys of a goal-conditioned env (gymnasium-robotics' ``GoalEnv`` layout), as SB3's HER needs.
GOAL_KEYS = ("observation", "achieved_goal", "desired_goal")

#: Arguments of the parent buffer that HER refuses: each moves rows or priorities outside this process's
#: episode bookkeeping (another process, a worker thread behind training, a file to reopen, a device).
_LOCAL_ONLY = {"staleness": 0, "distributed": None, "placement": None, "storage": "host"}


class PrioritizedHerReplayBuffer(DictPrioritizedReplayBuffer):
    """SB3's ``HerReplayBuffer`` with prioritized replay: pass it as ``replay_buffer_class``.

    Transition ``i`` of a finished episode is drawn with probability
    ``p_i^alpha / sum_k p_k^alpha``; then, for a random ``n_sampled_goal /
    (n_sampled_goal + 1)`` share of the batch (``int(her_ratio * batch_size)``
    samples, as in SB3), its desired goal is replaced by an achieved goal of the
    same episode, chosen by ``goal_selection_strategy`` exactly as SB3 chooses it
    (``"future"``: a next achieved goal of this step or a later one, ``"final"``:
    the episode's last, ``"episode"``: any of the episode), and its reward is
    recomputed with the env's ``compute_reward``. Which samples are relabelled is
    drawn uniformly (not the first ones of the batch, as in SB3: with stratified
    sampling the batch is ordered by position in the buffer).

    Priorities belong to stored transitions: a relabelled sample carries the
    priority, index and IS weight ``(p_min / p_i)^beta`` of its transition, and
    :meth:`update_priorities` with its TD error sets that transition's priority.
    The IS weights correct exactly what is prioritized: the choice of the
    transition; the goal is then drawn by the same rule as in uniform HER, so a
    sample's probability is its transition's probability times SB3's goal
    probability, and the weight cancels the first factor.

    Like SB3's buffer, only transitions of finished episodes are sampled: a
    transition has priority 0 until its episode ends, then the largest priority
    seen so far (what new transitions get in PER); when the ring overwrites part
    of an old episode, the rest of that episode goes back to priority 0. Sampling
    before any episode has ended raises ``RuntimeError``, as in SB3.

    SB3's algorithms hand the buffer their env (to call ``compute_reward``) and,
    in ``load_replay_buffer``, call :meth:`set_env` and
    :meth:`truncate_last_trajectory`, for every ``HerReplayBuffer``: this class
    implements that interface and is registered as a virtual subclass of
    ``HerReplayBuffer``, so the stock algorithms and the PER ones treat it alike.

    Args:
        buffer_size, observation_space, action_space, device, n_envs,
        optimize_memory_usage, handle_timeout_termination: as in
            :class:`~hetero_replay.adapters.sb3.DictPrioritizedReplayBuffer`.
            ``observation_space`` must have the keys ``observation``,
            ``achieved_goal`` and ``desired_goal``, the two goals of one shape.
        env: the (vectorised) training env, whose first env's
            ``compute_reward(achieved_goal, desired_goal, infos)`` rewards
            relabelled samples; SB3's algorithms pass it. ``None``: set it with
            :meth:`set_env` before sampling.
        n_sampled_goal: relabelled samples per real one, an integer ``>= 0``
            (``her_ratio = 1 - 1 / (n_sampled_goal + 1)``).
        goal_selection_strategy: ``"future"``, ``"final"`` or ``"episode"``
            (any case), or a ``GoalSelectionStrategy``.
        copy_info_dict: store each transition's ``info`` dict and pass copies of
            them to ``compute_reward`` (slower; for envs whose reward reads it).
        **per_kwargs: the PER options and ``seed``, as in
            :class:`~hetero_replay.adapters.sb3.PrioritizedReplayBuffer`. The
            goals are drawn with a generator seeded from the buffer's, so seeded
            runs repeat exactly. ``staleness``, ``distributed``, ``placement``
            and ``storage`` other than ``"host"`` are refused: the episode
            bookkeeping lives in this process and sets priorities synchronously.

    Raises:
        TypeError: ``env`` without ``env_method`` (not a ``VecEnv``),
            ``n_sampled_goal`` not an integer, ``copy_info_dict`` not a bool,
            ``goal_selection_strategy`` of another type; and the parent's.
        ValueError: an observation space without the goal keys, or goals of
            different shapes, a negative ``n_sampled_goal``, an unknown
            strategy, one of the refused arguments; and the parent's.
        Nothing is built on error.
    """

    env: VecEnv | None

    def __init__(
        self,
        buffer_size: int,
        observation_space: spaces.Dict,
        action_space: spaces.Space,
        env: VecEnv | None = None,
        device: th.device | str = "auto",
        n_envs: int = 1,
        optimize_memory_usage: bool = False,
        handle_timeout_termination: bool = True,
        n_sampled_goal: int = 4,
        goal_selection_strategy: GoalSelectionStrategy | str = "future",
        copy_info_dict: bool = False,
        **per_kwargs: Any,
    ) -> None:
        _check_goal_space(observation_space)
        if env is not None and not callable(getattr(env, "env_method", None)):
            raise TypeError(f"env must be a VecEnv (its env_method calls compute_reward), got {type(env).__name__}")
        check_int(n_sampled_goal, "n_sampled_goal", low=0)
        strategy = _strategy(goal_selection_strategy)
        check_bool(copy_info_dict, "copy_info_dict")
        for name, default in _LOCAL_ONLY.items():
            if name in per_kwargs and per_kwargs[name] != default:
                raise ValueError(
                    f"{type(self).__name__} does not support {name}={per_kwargs[name]!r}: its episode bookkeeping "
                    "lives in this process and sets priorities as episodes end"
                )
        super().__init__(
            buffer_size, observation_space, action_space, device, n_envs,
            optimize_memory_usage, handle_timeout_termination, **per_kwargs,
        )  # fmt: skip
        self.env = env
        self.goal_selection_strategy = strategy
        self.n_sampled_goal = int(n_sampled_goal)
        self.her_ratio = 1 - 1.0 / (self.n_sampled_goal + 1)
        self.copy_info_dict = bool(copy_info_dict)
        assert isinstance(self._replay, PrioritizedReplay)  # _LOCAL_ONLY: a local engine, never relaxed or sharded
        #: Draws goals and which samples are relabelled; seeded from the engine's generator.
        self._goal_rng = np.random.default_rng(int(self._replay.rng.integers(2**63 - 1)))
        self._new_episodes()

    def _new_episodes(self) -> None:
        """Empty episode bookkeeping, SB3's arrays: where each stored transition's episode starts, and its length.

        ``ep_length`` is 0 while the episode runs and after part of it was overwritten: such transitions are
        not sampled (priority 0). ``_touched`` lists the slots whose priority must follow ``ep_length`` at the
        next commit of staged rows. ``infos``: each transition's info dict, kept with ``copy_info_dict`` only
        (one dict per slot).
        """
        self.infos = np.empty((self.buffer_size, self.n_envs), dtype=object) if self.copy_info_dict else None
        self.ep_start = np.zeros((self.buffer_size, self.n_envs), dtype=np.int64)
        self.ep_length = np.zeros((self.buffer_size, self.n_envs), dtype=np.int64)
        self._current_ep_start = np.zeros(self.n_envs, dtype=np.int64)
        self._touched: list[np.ndarray] = []

    # -- episodes ----------------------------------------------------------------------

    def add(  # type: ignore[override]
        self,
        obs: dict[str, np.ndarray],
        next_obs: dict[str, np.ndarray],
        action: np.ndarray,
        reward: np.ndarray,
        done: np.ndarray,
        infos: list[dict[str, Any]],
    ) -> None:
        """Store one row, as :meth:`DictPrioritizedReplayBuffer.add <PrioritizedReplayBuffer.add>`, and
        keep SB3's episode bookkeeping: the row's transitions are sampled once their episode has ended.

        Raises:
            As :meth:`PrioritizedReplayBuffer.add`; nothing is stored on error.
        """
        with self._lock:
            row = self.pos
            super().add(obs, next_obs, action, reward, done, infos)  # type: ignore[arg-type]  # checks it all first
            self._drop_overwritten(row)
            self.ep_start[row] = self._current_ep_start
            self._touched.append(row * self.n_envs + np.arange(self.n_envs))
            if self.infos is not None:
                self.infos[row] = infos
            for env_idx in np.flatnonzero(np.asarray(done)):
                self._end_episode(int(env_idx))
            if not self._staged_rows:  # the row went to the engine in super().add: its priorities follow now
                self._follow_episodes()

    def _drop_overwritten(self, row: int) -> None:
        """Take the rest of each episode that ``row`` starts to overwrite out of sampling, as SB3 does.

        From ``row`` to that episode's end, along the ring.
        """
        for env_idx in range(self.n_envs):
            length = self.ep_length[row, env_idx]
            if length > 0:
                left = length - (row - self.ep_start[row, env_idx]) % self.buffer_size
                rows = (row + np.arange(left)) % self.buffer_size
                self.ep_length[rows, env_idx] = 0
                self._touched.append(rows * self.n_envs + env_idx)

    def _end_episode(self, env_idx: int) -> None:
        """Record the length of ``env_idx``'s episode, which ended at the row just added (SB3's rule)."""
        start = self._current_ep_start[env_idx]
        end = self.pos if self.pos >= start else self.pos + self.buffer_size
        rows = np.arange(start, end) % self.buffer_size
        self.ep_length[rows, env_idx] = end - start
        self._touched.append(rows * self.n_envs + env_idx)
        self._current_ep_start[env_idx] = self.pos

    def _commit(self) -> None:
        super()._commit()
        self._follow_episodes()

    def _follow_episodes(self) -> None:
        """Give the touched slots the priority their episode says: the max priority (what new transitions
        get) in a finished episode, 0 otherwise. After the staged rows reached the engine; hold the lock."""
        if not self._touched:
            return
        slots = np.unique(np.concatenate(self._touched))
        self._touched = []
        sampled = self.ep_length.reshape(-1)[slots] > 0
        assert isinstance(self._replay, PrioritizedReplay)
        self._replay.priorities.assign_new(slots[sampled])
        self._replay.clear_priorities(slots[~sampled])

    def truncate_last_trajectory(self) -> None:
        """End the episodes still running, as if their last stored step was a time limit (SB3's rule).

        SB3's ``load_replay_buffer`` calls it for a buffer saved mid-episode. ``done`` is set on that last
        step, and with ``handle_timeout_termination`` the step is marked a timeout, so targets bootstrap.
        """
        with self._lock:
            running = np.flatnonzero(self._current_ep_start != self.pos)
            if not running.size:
                return
            warnings.warn(
                "The last trajectory in the replay buffer will be truncated.\n"
                "If you are in the same episode as when the replay buffer was saved,\n"
                "you should use `truncate_last_trajectory=False` to avoid that issue.",
                stacklevel=2,
            )
            last = (self.pos - 1) % self.buffer_size
            dones = self.dones
            timeouts = self.timeouts if self.handle_timeout_termination else None
            for env_idx in running:
                dones[last, env_idx] = True
                if timeouts is not None:
                    timeouts[last, env_idx] = True
                self._end_episode(int(env_idx))
            self._follow_episodes()

    def set_env(self, env: VecEnv) -> None:
        """Give a buffer without one (an unpickled buffer) the env that computes rewards.

        Raises:
            ValueError: the buffer has an env already (as in SB3).
            TypeError: ``env`` has no ``env_method``.
        """
        if self.env is not None:
            raise ValueError("Trying to set env of already initialized environment.")
        if not callable(getattr(env, "env_method", None)):
            raise TypeError(f"env must be a VecEnv (its env_method calls compute_reward), got {type(env).__name__}")
        self.env = env

    # -- sampling ------------------------------------------------------------------------

    def sample(self, batch_size: int, env: VecNormalize | None = None) -> PrioritizedReplayBufferSamples:  # type: ignore[override]
        """Draw ``batch_size`` transitions of finished episodes by priority and relabel a share of them.

        Raises:
            ValueError: ``batch_size`` not a positive integer.
            RuntimeError: no episode has ended yet (as in SB3), or goals must be relabelled and the
                buffer has no env (:meth:`set_env`).
            Nothing changes on error (not even the random state).
        """
        check_int(batch_size, "batch_size", low=1)
        with self._lock:
            self._commit()
            assert isinstance(self._replay, PrioritizedReplay)
            if not self._replay.tree.total() > 0:
                raise RuntimeError(
                    "Unable to sample before the end of the first episode. We recommend choosing a value "
                    "for learning_starts that is greater than the maximum number of timesteps in the environment."
                )
            if self.env is None and int(self.her_ratio * batch_size) > 0:
                raise RuntimeError("relabelled goals need the env's compute_reward: call set_env(env) first")
            return super().sample(batch_size, env)

    def _batch_data(self, batch: Sample) -> dict[str, Any]:
        """The batch with ``int(her_ratio * batch_size)`` samples, chosen uniformly, relabelled."""
        data = super()._batch_data(batch)
        n = len(batch.indices)
        virtual = np.sort(self._goal_rng.choice(n, int(self.her_ratio * n), replace=False))
        if not virtual.size:
            return data
        slots = np.asarray(batch.indices)[virtual]
        goals = self._sample_goals(slots)
        if self.infos is not None:
            infos = copy.deepcopy(self.infos.reshape(-1)[slots])
        else:
            infos = [{} for _ in range(len(slots))]
        assert self.env is not None  # sample() checked
        rewards = self.env.env_method(
            "compute_reward", data["next_obs/achieved_goal"][virtual], goals, infos, indices=[0]
        )[0]  # the first env's, as SB3: r_t depends on the next achieved goal and the new desired goal
        # The gathered arrays are this batch's own: relabel in place.
        data["obs/desired_goal"][virtual] = goals
        data["next_obs/desired_goal"][virtual] = goals
        data["reward"][virtual] = np.asarray(rewards, np.float32).reshape(-1)
        return data

    def _sample_goals(self, slots: np.ndarray) -> np.ndarray:
        """New desired goals for the transitions at ``slots``: next achieved goals of their episodes (SB3's rule)."""
        rows, envs = np.divmod(slots, self.n_envs)
        start, length = self.ep_start[rows, envs], self.ep_length[rows, envs]
        if self.goal_selection_strategy == GoalSelectionStrategy.FINAL:
            steps = length - 1
        elif self.goal_selection_strategy == GoalSelectionStrategy.FUTURE:  # this step or a later one
            steps = self._goal_rng.integers((rows - start) % self.buffer_size, length)
        else:  # EPISODE
            steps = self._goal_rng.integers(0, length)
        goal_slots = (start + steps) % self.buffer_size * self.n_envs + envs
        return self._replay.read_rows("next_obs/achieved_goal", goal_slots)

    def update_priorities(self, indices: np.ndarray | th.Tensor, td_errors: th.Tensor | np.ndarray) -> None:
        """As :meth:`PrioritizedReplayBuffer.update_priorities`; a transition whose episode was overwritten since
        it was sampled keeps priority 0."""
        with self._lock:
            super().update_priorities(indices, td_errors)  # checks the indices
            slots = np.asarray(indices)
            gone = slots[self.ep_length.reshape(-1)[slots] == 0]
            if gone.size:
                self._replay.clear_priorities(gone)

    def reset(self) -> None:
        """Empty the buffer and its episode bookkeeping."""
        with self._lock:
            super().reset()
            self._new_episodes()

    # -- pickling --------------------------------------------------------------------------

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        del state["env"]  # envs do not pickle in general; SB3's load_replay_buffer calls set_env
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        self.env = None


# SB3 hands its env to every HerReplayBuffer it builds, and set_env / truncate_last_trajectory on load:
# this class implements that interface (see the class docstring).
HerReplayBuffer.register(PrioritizedHerReplayBuffer)


def _check_goal_space(space: Any) -> None:
    """A Dict space with the goal-env keys, the two goals of one shape (``ValueError`` otherwise)."""
    if not isinstance(space, spaces.Dict) or not set(GOAL_KEYS) <= set(space.spaces):
        raise ValueError(
            f"PrioritizedHerReplayBuffer needs a Dict observation space with the keys {list(GOAL_KEYS)} "
            f"(a goal-conditioned env), got {space}"
        )
    if space["achieved_goal"].shape != space["desired_goal"].shape:
        raise ValueError(
            f"achieved_goal and desired_goal must have one shape, got {space['achieved_goal'].shape} "
            f"and {space['desired_goal'].shape}"
        )


def _strategy(value: Any) -> GoalSelectionStrategy:
    """``value`` as a ``GoalSelectionStrategy`` (a name in any case, or a member)."""
    if isinstance(value, GoalSelectionStrategy):
        return value
    if not isinstance(value, str):
        raise TypeError(
            f"goal_selection_strategy must be one of {list(KEY_TO_GOAL_STRATEGY)} or a GoalSelectionStrategy, "
            f"got {type(value).__name__}"
        )
    if value.lower() not in KEY_TO_GOAL_STRATEGY:
        raise ValueError(f"goal_selection_strategy must be one of {list(KEY_TO_GOAL_STRATEGY)}, got {value!r}")
    return KEY_TO_GOAL_STRATEGY[value.lower()]
