"""The SB3 buffers under stress and misuse: threads, forks, bad input, refused calls.

* Several threads may add, sample, update priorities, read properties and
  pickle one buffer at once: no row is lost or torn, never-written slots are
  never sampled, a pickle is a consistent snapshot, and a fork leaves the child
  a working buffer.
* Bad input is refused, never broadcast or truncated, with an error that
  names the argument, what was expected and what was received.
* A refused call changes nothing: rows, priorities, ``pos``, ``full``,
  ``size()``, the max priority and the random state are as before.
"""

from __future__ import annotations

import os
import pickle
import signal
import sys
import threading
import time
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch as th
from gymnasium import spaces

pytest.importorskip("stable_baselines3")

from hetero_replay.adapters.sb3 import PERDQN, DictPrioritizedReplayBuffer, PrioritizedReplayBuffer  # noqa: E402
from hetero_replay.adapters.sb3.buffers import WARN_AFTER_SAMPLES  # noqa: E402

OBS = spaces.Box(-np.inf, np.inf, (3,), np.float32)
BOX_ACT = spaces.Box(-np.inf, np.inf, (2,), np.float32)


# -- transitions that carry their id in every field ---------------------------------------------


def row_of(ids: np.ndarray) -> tuple[Any, ...]:
    """``add`` arguments for transitions ``ids`` (one per env); every field encodes its id."""
    k = ids.astype(np.float32)
    obs = np.stack([k, k + 0.25, k + 0.5], axis=1)
    infos = [{"TimeLimit.truncated": bool(i // 2 % 2)} for i in ids]
    return obs, -obs, np.stack([k, -k], axis=1), k, ids % 2 == 1, infos


def assert_whole(obs: np.ndarray, next_obs: np.ndarray, actions: np.ndarray, rewards: np.ndarray) -> None:
    """Every transition's fields belong to one id, and that id was written (ids start at 1)."""
    k = rewards.reshape(-1)
    assert k.min() >= 1, "a never-written slot was read"
    np.testing.assert_array_equal(obs.reshape(-1, 3), np.stack([k, k + 0.25, k + 0.5], axis=1))
    np.testing.assert_array_equal(next_obs.reshape(-1, 3), -obs.reshape(-1, 3))
    np.testing.assert_array_equal(actions.reshape(-1, 2), np.stack([k, -k], axis=1))


@pytest.fixture
def fast_thread_switches():
    """Switch threads every 10 us (default 5 ms), so operations interleave as much as possible."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    yield
    sys.setswitchinterval(before)


# -- threads ------------------------------------------------------------------------------------


def test_threads_adding_sampling_updating_and_pickling_at_once_lose_and_tear_nothing(fast_thread_switches) -> None:
    n_envs, adders, seconds = 2, 3, 2.0
    buf = PrioritizedReplayBuffer(2**19, OBS, BOX_ACT, device="cpu", n_envs=n_envs, seed=0)
    max_rows = buf.buffer_size // adders  # no wrap-around: every row added must still be there
    added: list[list[int]] = [[] for _ in range(adders)]
    errors: list[BaseException] = []
    stop = time.monotonic() + seconds
    adding = threading.Event()
    adding.set()

    def add(thread: int) -> None:
        try:
            for seq in range(max_rows):
                if time.monotonic() > stop:
                    break
                ids = (thread << 19) + n_envs * seq + np.arange(n_envs) + 1  # unique, never 0
                buf.add(*row_of(ids))
                added[thread].extend(ids.tolist())
        except BaseException as e:  # reported by the main thread
            errors.append(e)

    def sample_update_and_pickle() -> None:
        rng = np.random.default_rng(0)
        try:
            rounds = 0
            while adding.is_set():
                if buf.size() == 0:
                    continue
                s = buf.sample(64)
                assert_whole(s.observations.numpy(), s.next_observations.numpy(), s.actions.numpy(), s.rewards.numpy())
                k = s.rewards.numpy()[:, 0].astype(np.int64)
                np.testing.assert_array_equal(s.dones.numpy()[:, 0], (k % 2) * (1 - k // 2 % 2))
                buf.update_priorities(s.indices, rng.random(64) + 0.1)
                buf.beta = float(rng.random())
                assert 0 <= buf.beta <= 1 and buf.max_priority >= 1.0 and buf.priorities().shape[1] == n_envs
                rounds += 1
                if rounds % 20 == 0:  # save_replay_buffer's pickle: one consistent snapshot
                    copy = pickle.loads(pickle.dumps(buf))
                    rows = copy.size()
                    assert len(copy.replay) == rows * n_envs
                    assert_whole(
                        copy.observations[:rows], copy.next_observations[:rows], copy.actions[:rows],
                        copy.rewards[:rows],
                    )  # fmt: skip
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=add, args=(t,)) for t in range(adders)]
    sampler = threading.Thread(target=sample_update_and_pickle)
    for t in [*threads, sampler]:
        t.start()
    for t in threads:
        t.join()
    adding.clear()
    sampler.join()
    if errors:
        raise errors[0]

    ids = sorted(i for ids in added for i in ids)
    rows = buf.size()
    assert rows * n_envs == len(ids) > 1000
    stored = buf.rewards[:rows].reshape(-1)
    np.testing.assert_array_equal(np.sort(stored), np.asarray(ids, np.float32))  # none lost, none twice
    assert_whole(buf.observations[:rows], buf.next_observations[:rows], buf.actions[:rows], buf.rewards[:rows])


def test_threads_adding_with_optimize_memory_usage_keep_every_row_whole(fast_thread_switches) -> None:
    # Each thread adds its own chain (next obs of one add = obs of its next add), interleaved
    # with the others: the buffer must store whole rows, in some order, and count every one.
    buf = PrioritizedReplayBuffer(
        4096, OBS, BOX_ACT, device="cpu", optimize_memory_usage=True, handle_timeout_termination=False, seed=0
    )
    errors: list[BaseException] = []

    def add(thread: int) -> None:
        try:
            for seq in range(1000):
                obs, _, action, reward, done, infos = row_of(np.array([(thread << 12) + seq + 1]))
                buf.add(obs, obs, action, reward, done, infos)
                if seq % 50 == 0:
                    buf.sample(16)
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=add, args=(t,)) for t in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    assert buf.size() == 3000
    k = buf.rewards[:3000, 0]
    np.testing.assert_array_equal(np.sort(k), np.sort([(t << 12) + s + 1 for t in range(3) for s in range(1000)]))
    np.testing.assert_array_equal(buf.observations[:3000, 0], np.stack([k, k + 0.25, k + 0.5], axis=1))


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_fork_while_another_thread_holds_the_buffer_leaves_the_child_a_working_buffer() -> None:
    buf = PrioritizedReplayBuffer(64, OBS, BOX_ACT, device="cpu", n_envs=2, seed=0)
    for seq in range(5):
        buf.add(*row_of(2 * seq + np.arange(2) + 1))
    held = threading.Event()

    def hold_the_lock() -> None:
        with buf._lock:  # as an add or sample under way would
            held.set()
            time.sleep(0.3)

    holder = threading.Thread(target=hold_the_lock)
    holder.start()
    assert held.wait(timeout=10), "the buffer has no lock to hold"
    pid = os.fork()
    if pid == 0:  # child: the holder thread does not exist here
        try:
            buf.add(*row_of(np.array([11, 12])))
            s = buf.sample(8)
            buf.update_priorities(s.indices, np.ones(8))
            os._exit(0 if buf.size() == 6 else 1)
        except BaseException:
            os._exit(2)
    holder.join()
    deadline = time.monotonic() + 30
    while (waited := os.waitpid(pid, os.WNOHANG))[0] == 0:
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            pytest.fail("the forked child deadlocked on the buffer's lock")
        time.sleep(0.02)
    assert os.WIFEXITED(waited[1]) and os.WEXITSTATUS(waited[1]) == 0
    buf.add(*row_of(np.array([13, 14])))  # the parent's buffer works on too
    assert buf.size() == 6 and buf.sample(4).indices.max() < 12


def test_pickled_buffers_get_a_lock_of_their_own() -> None:
    buf = PrioritizedReplayBuffer(64, OBS, BOX_ACT, device="cpu", n_envs=2, seed=0)
    buf.add(*row_of(np.array([1, 2])))
    copy = pickle.loads(pickle.dumps(buf))
    assert copy._lock is not buf._lock
    assert copy._lock.acquire(blocking=False)  # free, and reentrant like the original's
    assert copy._lock.acquire(blocking=False)
    copy._lock.release()
    copy._lock.release()
    copy.add(*row_of(np.array([3, 4])))
    assert copy.size() == 2 and buf.size() == 1


# -- bad input: refused, with the argument, the expected and the received value named ---------------


def discrete_buffer(**kwargs: Any) -> PrioritizedReplayBuffer:
    return PrioritizedReplayBuffer(32, OBS, spaces.Discrete(3), device="cpu", n_envs=2, seed=0, **kwargs)


def good(**changes: Any) -> dict[str, Any]:
    """A valid ``add`` of two envs into ``discrete_buffer()``, with ``changes``."""
    obs = np.ones((2, 3), np.float32)
    args = dict(
        obs=obs, next_obs=obs, action=np.array([0, 2]), reward=np.ones(2, np.float32), done=np.zeros(2, bool),
        infos=[{}, {}],
    )  # fmt: skip
    return {**args, **changes}


BAD_ADDS = [
    # (what, add arguments, error, message)
    ("obs of one env for two", good(obs=np.ones((1, 3))), ValueError, r"obs must have shape \(2, 3\).*got \(1, 3\)"),
    ("obs without env axis", good(obs=np.ones(3)), ValueError, r"obs must have shape \(2, 3\).*got \(3,\)"),
    ("next_obs transposed", good(next_obs=np.ones((3, 2))), ValueError, r"next_obs must have shape \(2, 3\).*\(3, 2\)"),
    ("scalar reward", good(reward=1.0), ValueError, r"reward must have shape \(2,\).*got \(\)"),
    ("reward per env, 2-D", good(reward=np.ones((2, 1))), ValueError, r"reward must have shape \(2,\).*got \(2, 1\)"),
    ("done of three envs", good(done=np.zeros(3)), ValueError, r"done must have shape \(2,\).*got \(3,\)"),
    ("one info dict", good(infos={"TimeLimit.truncated": True}), TypeError, r"infos must be a list of 2 dicts.*dict"),
    ("one info for two envs", good(infos=[{}]), ValueError, r"infos must hold 2 dicts.*got 1"),
    ("infos not dicts", good(infos=["a", "b"]), TypeError, r"infos must be dicts, got \['str', 'str'\]"),
    ("float action", good(action=np.array([1.7, 1.0])), ValueError, r"action must hold integers for Discrete\(3\)"),
    ("action above n", good(action=np.array([0, 99])), ValueError, r"action 99 of env 1 is outside Discrete\(3\)"),
    ("negative action", good(action=np.array([-1, 0])), ValueError, r"action -1 of env 0 is outside Discrete\(3\)"),
    ("action of one env", good(action=np.array([1])), ValueError, r"action must have shape \(2,\) or \(2, 1\).*\(1,\)"),
    ("obs as strings", good(obs=np.full((2, 3), "1.5")), ValueError, r"field 'obs': dtype <U3 does not cast to float"),
    ("obs overflowing float32", good(obs=np.full((2, 3), 1e300)), ValueError, r"field 'obs'.*1e\+300.*overflows"),
]


@pytest.mark.parametrize(("args", "error", "match"), [case[1:] for case in BAD_ADDS], ids=[c[0] for c in BAD_ADDS])
def test_bad_adds_are_refused_with_precise_errors(args: dict, error: type, match: str) -> None:
    buf = discrete_buffer()
    with pytest.raises(error, match=match):
        buf.add(**args)
    assert buf.size() == 0 and len(buf.replay) == 0


@pytest.mark.parametrize(
    ("space", "action", "match"),
    [
        (spaces.MultiDiscrete([3, 5]), [[0, 4], [2, 5]], r"action 5 of env 1 is outside MultiDiscrete.*0 to 4"),
        (spaces.MultiDiscrete([3, 5]), [[0, 4], [-1, 0]], r"action -1 of env 1 is outside MultiDiscrete"),
        (spaces.MultiBinary(3), [[0, 1, 1], [0, 2, 0]], r"action 2 of env 1 is outside MultiBinary\(3\).*0 to 1"),
        (spaces.MultiBinary(3), [[0.0, 1.0, 1.0], [0, 0, 0]], r"action must hold integers for MultiBinary"),
        (spaces.Box(-1, 1, (2,), np.float32), [[0.5, 0.5, 0.5], [0, 0, 0]], r"action must have shape \(2, 2\)"),
        (spaces.Box(-1, 1, (2, 3), np.float32), np.zeros((2, 3)), r"action must have shape .*\(2, 2, 3\).*\(2, 3\)"),
        (spaces.Box(-1, 1, (2,), np.float32), np.full((2, 2), 1e300), r"field 'action'.*overflows float32"),
    ],
)
def test_actions_outside_the_action_space_are_refused(space: spaces.Space, action: Any, match: str) -> None:
    buf = PrioritizedReplayBuffer(32, OBS, space, device="cpu", n_envs=2, seed=0)
    with pytest.raises(ValueError, match=match):
        buf.add(**good(action=np.asarray(action)))
    assert buf.size() == 0


def test_integers_that_would_wrap_in_a_narrower_field_are_refused() -> None:
    buf = PrioritizedReplayBuffer(32, spaces.Box(0, 10, (3,), np.int32), BOX_ACT, device="cpu", n_envs=2, seed=0)
    obs = np.zeros((2, 3), np.int64)
    args = good(obs=obs, next_obs=obs.copy(), action=np.zeros((2, 2), np.float32))
    args["next_obs"][1, 2] = 2**40
    with pytest.raises(ValueError, match=r"field 'next_obs': value 1099511627776 in row 1 does not fit int32"):
        buf.add(**args)
    assert buf.size() == 0


def test_dict_observations_must_have_exactly_the_space_keys() -> None:
    space = spaces.Dict({"pos": spaces.Box(-1, 1, (2,), np.float32), "cell": spaces.Discrete(5)})
    buf = DictPrioritizedReplayBuffer(32, space, spaces.Discrete(3), device="cpu", n_envs=2, seed=0)
    obs = {"pos": np.zeros((2, 2), np.float32), "cell": np.array([1, 4])}
    args = good(obs=obs, next_obs=obs)
    buf.add(**args)  # Discrete values as a VecEnv gives them: (n_envs,)
    for bad, error, match in [
        ({"pos": obs["pos"]}, ValueError, r"obs must have the keys \['cell', 'pos'\]: missing \['cell'\], unknown"),
        ({**obs, "extra": obs["cell"]}, ValueError, r"missing \[\], unknown \['extra'\]"),
        (np.zeros((2, 2)), TypeError, r"obs must be a dict with keys \['cell', 'pos'\], got ndarray"),
        ({**obs, "pos": np.zeros((1, 2))}, ValueError, r"obs\['pos'\] must have shape \(2, 2\).*got \(1, 2\)"),
    ]:
        with pytest.raises(error, match=match):
            buf.add(**{**args, "obs": bad})
    assert buf.size() == 1


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda b: b.update_priorities(np.int64(0), np.float32(1.0)), ValueError, r"indices must be 1-D.*shape \(\)"),
        (lambda b: b.update_priorities(np.zeros((2, 1), np.int64), np.ones(2)), ValueError, r"1-D.*\(2, 1\)"),
        (lambda b: b.update_priorities(np.arange(2), np.ones(3)), ValueError, r"2 indices but 3 TD errors"),
        (lambda b: b.update_priorities(np.arange(2), np.array(["a", "b"])), TypeError, r"td_errors must be numbers"),
        (lambda b: b.update_priorities(np.arange(2), np.array([np.nan, 1.0])), ValueError, r"0"),
        (lambda b: b.update_priorities(np.array([0, 6]), np.ones(2)), IndexError, r"6"),
        (lambda b: b.update_priorities(np.arange(2), np.array([1.0, 1e39])), ValueError, r"."),
        (lambda b: b.sample(0), ValueError, r"batch_size"),
        (lambda b: b.sample("4"), TypeError, r"batch_size"),
        (lambda b: setattr(b, "beta", "0.5"), TypeError, r"beta must be a real number, got str '0.5'"),
        (lambda b: setattr(b, "beta", None), TypeError, r"beta must be a real number, got NoneType None"),
        (lambda b: setattr(b, "beta", 1.5), ValueError, r"beta must be in \[0, 1\], got 1.5"),
    ],
)
def test_bad_samples_and_updates_are_refused_with_precise_errors(call: Callable, error: type, match: str) -> None:
    buf = discrete_buffer()
    for _ in range(3):
        buf.add(**good())
    with pytest.raises(error, match=match):
        call(buf)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        (dict(buffer_size=0), ValueError, r"buffer_size must be >= 1, got 0"),
        (dict(buffer_size=-5), ValueError, r"buffer_size must be >= 1, got -5"),
        (dict(buffer_size=100.5), TypeError, r"buffer_size must be an integer, got float 100.5"),
        (dict(buffer_size="64"), TypeError, r"buffer_size must be an integer, got str '64'"),
        (dict(n_envs=0), ValueError, r"n_envs must be >= 1, got 0"),
        (dict(n_envs=1.5), TypeError, r"n_envs must be an integer, got float 1.5"),
        (dict(alpha="0.6"), TypeError, r"alpha must be a real number, got str '0.6'"),
        (dict(alpha=None), TypeError, r"alpha must be a real number, got NoneType None"),
        (dict(alpha=True), TypeError, r"alpha must be a real number, got bool True"),
        (dict(beta=None), TypeError, r"beta must be a real number, got NoneType None"),
        (dict(eps="small"), TypeError, r"eps must be a real number, got str 'small'"),
        (dict(stratified="no"), TypeError, r"stratified must be True or False, got str 'no'"),
        (
            dict(optimize_memory_usage="False"),
            TypeError,
            r"optimize_memory_usage must be True or False, got str 'False'",
        ),
        (dict(handle_timeout_termination=1), TypeError, r"handle_timeout_termination must be True or False, got int 1"),
        (dict(seed="0"), TypeError, r"seed must be an integer or None, got str '0'"),
        (dict(seed=-1), ValueError, r"seed must be >= 0, got -1"),
    ],
)
def test_bad_buffer_arguments_are_refused_with_precise_errors(kwargs: dict, error: type, match: str) -> None:
    args = dict(buffer_size=64, observation_space=OBS, action_space=spaces.Discrete(3), device="cpu")
    with pytest.raises(error, match=match):
        PrioritizedReplayBuffer(**{**args, **kwargs})


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        (dict(replay_buffer_kwargs=dict(alpha="0.6")), TypeError, r"alpha must be a real number, got str '0.6'"),
        (dict(replay_buffer_kwargs=dict(beta=None)), TypeError, r"beta must be a real number, got NoneType None"),
        (dict(replay_buffer_kwargs=dict(eps="1e-6")), TypeError, r"eps must be a real number, got str '1e-6'"),
        (dict(beta_schedule=True), TypeError, r"beta_schedule must be None, a float or a callable, got bool True"),
        (dict(beta_schedule="0.5"), TypeError, r"beta_schedule must be None, a float or a callable, got str '0.5'"),
    ],
)
def test_bad_per_arguments_of_the_algorithms_are_refused_with_precise_errors(
    kwargs: dict, error: type, match: str
) -> None:
    with pytest.raises(error, match=match):
        PERDQN("MlpPolicy", "CartPole-v1", device="cpu", **kwargs)


def test_a_schedule_returning_no_number_is_reported() -> None:
    model = PERDQN(
        "MlpPolicy", "CartPole-v1", learning_starts=10, beta_schedule=lambda p: None, device="cpu",
        policy_kwargs=dict(net_arch=[8]),
    )  # fmt: skip
    with pytest.raises(ValueError, match=r"beta_schedule returned None at progress_remaining=.*a number in \[0, 1\]"):
        model.learn(50)


# -- a refused call changes nothing -----------------------------------------------------------------


def snapshot(buf: PrioritizedReplayBuffer) -> dict[str, Any]:
    """Everything a refused call must leave as it was (reading it hands staged rows to the engine)."""
    replay = buf.replay
    return dict(
        rows={name: np.array(arr) for name, arr in replay.storage.arrays.items()},
        priorities=buf.priorities().copy(),
        pos=buf.pos,
        full=buf.full,
        size=buf.size(),
        engine_size=len(replay),
        max_priority=buf.max_priority,
        beta=buf.beta,
        rng=replay.rng.bit_generator.state,
    )


def assert_same(a: dict[str, Any], b: dict[str, Any]) -> None:
    assert a.keys() == b.keys()
    for key in a:
        if key == "rows":
            for name in a["rows"]:
                np.testing.assert_array_equal(a["rows"][name], b["rows"][name], err_msg=name)
        elif key == "priorities":
            np.testing.assert_array_equal(a[key], b[key])
        else:
            assert a[key] == b[key], key


REFUSED_ADDS = [case[1] for case in BAD_ADDS]
REFUSED_OTHERS: list[tuple[Callable, type]] = [
    (lambda b: b.sample(0), ValueError),
    (lambda b: b.sample(-3), ValueError),
    (lambda b: b.sample("4"), TypeError),
    (lambda b: b.update_priorities(np.arange(4), np.array([1.0, np.nan, 1.0, 1.0])), ValueError),
    (lambda b: b.update_priorities(np.array([0, 10**6]), np.ones(2)), IndexError),
    (lambda b: b.update_priorities(np.arange(4), np.ones(3)), ValueError),
    (lambda b: b.update_priorities(np.int64(0), np.float32(1.0)), ValueError),
    (lambda b: b.update_priorities(np.arange(2), np.array([5.0, 1e39])), ValueError),
    (lambda b: setattr(b, "beta", 1.5), ValueError),
    (lambda b: setattr(b, "beta", "1"), TypeError),
]


@pytest.mark.parametrize(
    "mode",
    [
        dict(),
        dict(optimize_memory_usage=True, handle_timeout_termination=False),
    ],
    ids=["plain", "optimize_memory_usage"],
)
@pytest.mark.parametrize("rows", [5, 20], ids=["filling", "full"])
def test_refused_calls_change_nothing(mode: dict, rows: int) -> None:
    """Two buffers get the same calls; one also gets every refused call. They must stay identical."""
    bufs = [discrete_buffer(**mode) for _ in range(2)]  # 16 rows of 2 envs
    for buf in bufs:
        rng = np.random.default_rng(1)
        for row in range(rows):
            obs = rng.standard_normal((2, 3)).astype(np.float32)
            buf.add(**good(obs=obs, next_obs=obs + 1, action=np.array([row % 3, 2]), reward=np.full(2, row)))
            if row == rows - 3:
                s = buf.sample(8)
                buf.update_priorities(s.indices, rng.random(8) * 5)
        assert buf._staged_rows > 0  # refused adds meet staged rows too
    reference, probed = bufs
    for args in REFUSED_ADDS:
        with pytest.raises((ValueError, TypeError)):
            probed.add(**args)
    before = snapshot(probed)  # from here on, compare with a snapshot too
    for call, error in REFUSED_OTHERS:
        with pytest.raises(error):
            call(probed)
    assert_same(snapshot(probed), before)
    assert_same(snapshot(probed), snapshot(reference))
    a, b = reference.sample(32), probed.sample(32)
    np.testing.assert_array_equal(a.indices, b.indices)
    assert th.equal(a.next_observations, b.next_observations) and th.equal(a.weights, b.weights)


def test_refused_samples_do_not_count_towards_the_no_update_warning() -> None:
    buf = discrete_buffer()
    buf.add(**good())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(WARN_AFTER_SAMPLES - 1):
            buf.sample(2)
        with pytest.raises(ValueError):
            buf.sample(0)
        assert not caught
        buf.sample(2)
    assert len(caught) == 1 and "update_priorities" in str(caught[0].message)
