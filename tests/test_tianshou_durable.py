"""Durable points of the Tianshou buffers: round trips, ``kill -9``, resumed training, bad input.

Transitions encode one id ``k`` in every field (``obs = act = rew = info.k = k``,
``obs_next = k + 0.5``, ``terminated = k % 5 == 0``), as in
``test_tianshou_reliability.py``, so a reopened buffer shows whether a row is
whole and which transitions it holds. Ids start at 1: unwritten storage holds 0.
The ``kill -9`` tests run a real child process that adds transitions with a
durable path, SIGKILL it, and reopen its file in the test's process.
"""

from __future__ import annotations

import copy
import math
import os
import pickle
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("tianshou")

from tianshou.data import Batch  # noqa: E402

from hetero_replay import PEROptions, PrioritizedReplay  # noqa: E402
from hetero_replay.adapters.tianshou import (  # noqa: E402
    HeteroPrioritizedReplayBuffer,
    HeteroPrioritizedVectorReplayBuffer,
)
from hetero_replay.storage import durable  # noqa: E402
from hetero_replay.storage.checkpoint import ReplayFileError, read, write  # noqa: E402

ENVS = 4
Buffer = HeteroPrioritizedReplayBuffer | HeteroPrioritizedVectorReplayBuffer


def rows_of(k: Any) -> Batch:
    """Transitions whose every field encodes its id ``k``."""
    k = np.asarray(k, dtype=np.int64)
    return Batch(obs=np.repeat(k[:, None], 3, axis=1).astype(np.float32), act=k, rew=k.astype(np.float64),
                 terminated=k % 5 == 0, truncated=np.zeros(len(k), bool),
                 obs_next=np.repeat(k[:, None], 3, axis=1) + 0.5, info=Batch(k=k))  # fmt: skip


def whole(batch: Batch) -> np.ndarray:
    """Which rows hold one transition in every field."""
    k = batch.act
    return (
        np.all(batch.obs == k[:, None], axis=1)
        & (batch.rew == k)
        & np.all(batch.obs_next == k[:, None] + 0.5, axis=1)
        & (batch.info.k == k)
        & (batch.done == (k % 5 == 0))
    )


def make(kind: str, capacity: int, path: Path | None, **kwargs: Any) -> Buffer:
    if kind == "single":
        return HeteroPrioritizedReplayBuffer(capacity, random_seed=3, durable_path=path, **kwargs)
    return HeteroPrioritizedVectorReplayBuffer(capacity, ENVS, random_seed=3, durable_path=path, **kwargs)


def add_step(buf: Buffer, step: int) -> None:
    """One step: one transition (single buffer) or one per env, ids ``step * ENVS + env + 1``."""
    k = step * ENVS + np.arange(ENVS) + 1
    if isinstance(buf, HeteroPrioritizedReplayBuffer):
        buf.add(rows_of(k[:1]), buffer_ids=[0])
    else:
        buf.add(rows_of(k))


def header_of(path: Path) -> dict[str, Any]:
    return read(path)[0]


def state_of(buf: Buffer) -> dict[str, Any]:
    """Everything a durable point restores, as plain values."""
    with buf.lock:
        stored = np.sort(buf.sample_indices(0)) if len(buf) else np.array([], np.int64)
        state: dict[str, Any] = {
            "stored": stored,
            "rows": buf._meta[stored] if len(buf) else Batch(),
            "keys": buf._meta.get_keys(),
            "weights": buf.weight[np.arange(buf.maxsize)],
            "len": len(buf),
            "max_priority": buf.max_priority,
            "beta": buf.beta,
            "alpha": buf.alpha,
            "eps": buf.eps,
            "rng": copy.deepcopy(buf._rng.bit_generator.state),
            "legacy_rng": buf._random_state.get_state()[1].copy(),
            "last_index": buf.last_index.copy(),
            # (Tianshou's single buffer raises for an empty storage)
            "unfinished": np.sort(buf.unfinished_index()) if len(buf) else None,
        }
        if isinstance(buf, HeteroPrioritizedVectorReplayBuffer):
            state.update(
                counters=buf._book.counters.copy(), ep_return=buf._book.ep_return.copy(), lengths=buf._lengths.copy()
            )
        else:
            state.update(
                episode=(buf._insertion_idx, buf._size, np.copy(buf._ep_return), buf._ep_len, buf._ep_start_idx)
            )
    return state


def assert_same_state(a: Buffer, b: Buffer) -> None:
    assert_states_equal(state_of(a), state_of(b))


def assert_states_equal(sa: dict[str, Any], sb: dict[str, Any]) -> None:
    assert sa.keys() == sb.keys()
    for key in sa:
        if key == "rows":
            assert sa[key] == sb[key], "stored rows differ"
        elif key in ("rng", "keys"):
            assert sa[key] == sb[key], key
        else:
            np.testing.assert_equal(sa[key], sb[key], err_msg=key)


def files_in(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


# -- round trips ------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["single", "vector"])
def test_reopen_gives_the_buffer_of_the_last_durable_point(kind: str, tmp_path: Path) -> None:
    path = tmp_path / "buf.hr"
    buf = make(kind, 24, path, alpha=0.7, beta=0.5, flush_every=10**6)  # wraps: 6 slots per env
    for step in range(9):
        add_step(buf, step)
        stored = buf.sample_indices(0)
        buf.update_weight(stored, (stored % 7) * 0.5 + 0.1)
    buf.sample(5)  # moves the sampling generator
    buf.sample_indices(None)  # the single buffer: Tianshou's legacy RandomState
    buf.set_beta(0.8)
    buf.flush()
    reopened = type(buf).reopen(path)
    assert_same_state(buf, reopened)
    assert reopened.durable_path == path
    assert whole(reopened[reopened.sample_indices(0)]).all()
    # The same draws from here on, and the same results of the same calls.
    for _ in range(3):
        (b1, i1), (b2, i2) = buf.sample(7), reopened.sample(7)
        np.testing.assert_array_equal(i1, i2)
        np.testing.assert_array_equal(b1.weight, b2.weight)
        assert b1 == b2
    np.testing.assert_array_equal(buf.sample_indices(None), reopened.sample_indices(None))
    for target in (buf, reopened):  # both go on alike (flush_every=10**6: neither writes)
        add_step(target, 9)
        target.update_weight(np.sort(target.sample_indices(0))[:3], [1.0, 2.0, 3.0])
    assert_same_state(buf, reopened)
    assert files_in(tmp_path) == ["buf.hr"]


def test_reopened_buffer_goes_on_writing_durable_points_to_the_same_file(tmp_path: Path) -> None:
    path = tmp_path / "buf.hr"
    buf = make("vector", 400, path, flush_every=8)  # a point every second step of 4 envs
    for step in range(5):  # points at 8 and 16 transitions; the fifth step is lost
        add_step(buf, step)
    assert header_of(path)["durable"] == dict(flush_every=8, flush_seconds=60.0, points=3, added=16)
    reopened = HeteroPrioritizedVectorReplayBuffer.reopen(path)
    assert len(reopened) == 16 and reopened.durable_path == path
    assert sorted(reopened[reopened.sample_indices(0)].act) == list(range(1, 17))
    for step in range(4, 6):
        add_step(reopened, step)
    assert header_of(path)["durable"]["added"] == 24
    again = HeteroPrioritizedVectorReplayBuffer.reopen(path, flush_every=4)
    assert_same_state(reopened, again)
    assert again._durable.schedule.flush_every == 4
    assert files_in(tmp_path) == ["buf.hr"]


def test_construction_writes_the_empty_buffer_and_reopen_gives_it_back(tmp_path: Path) -> None:
    path = tmp_path / "buf.hr"
    buf = make("single", 10, path)
    assert path.exists()
    reopened = HeteroPrioritizedReplayBuffer.reopen(path)
    assert len(reopened) == 0 and not reopened._meta.get_keys()
    assert_same_state(buf, reopened)
    add_step(reopened, 0)  # builds its storage as a new buffer does
    add_step(buf, 0)
    assert_same_state(buf, reopened)


def test_flush_every_counts_transitions_and_flush_seconds_is_checked_on_add(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    now = [1000.0]
    monkeypatch.setattr(durable, "_clock", lambda: now[0])  # a clock the test moves: no real waiting
    path = tmp_path / "buf.hr"
    buf = make("vector", 400, path, flush_every=6, flush_seconds=30.0)
    add_step(buf, 0)  # 4 transitions: not yet
    assert header_of(path)["durable"]["added"] == 0
    add_step(buf, 1)  # 8 >= 6
    assert header_of(path)["durable"]["added"] == 8
    now[0] += 29.0
    add_step(buf, 2)
    assert header_of(path)["durable"]["added"] == 8
    now[0] += 1.0  # 30 s since the last point, 4 transitions since
    add_step(buf, 3)
    assert header_of(path)["durable"] == dict(flush_every=6, flush_seconds=30.0, points=3, added=16)
    now[0] += 100.0  # time alone writes nothing: an idle buffer has nothing new to lose
    assert header_of(path)["durable"]["points"] == 3


def test_nested_observations_vector_rewards_and_storage_options_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "buf.hr"
    buf = HeteroPrioritizedVectorReplayBuffer(
        12, 2, random_seed=0, durable_path=path, flush_every=10**6, ignore_obs_next=True, weight_norm=True,
        backend="numpy", options=PEROptions(priority_dtype="float64"),
    )  # fmt: skip
    for step in range(8):
        k = np.array([2 * step + 1, 2 * step + 2])
        buf.add(
            Batch(obs=Batch(pos=np.stack([k, -k], 1).astype(np.float32), img=np.full((2, 2, 2), k[:, None, None], np.uint8)),
                  act=np.stack([k, k], 1).astype(np.float32), rew=np.stack([k, 2 * k], 1).astype(np.float64),
                  terminated=k % 3 == 0, truncated=np.zeros(2, bool), info=Batch(), policy=Batch(h=k * 1.5))
        )  # fmt: skip
    buf.flush()
    reopened = HeteroPrioritizedVectorReplayBuffer.reopen(path)
    assert_same_state(buf, reopened)
    assert reopened._meta.obs.img.dtype == np.uint8 and not reopened._meta.info.get_keys()
    assert reopened._book.ep_return.shape == (2, 2)  # per-component returns of vector rewards
    assert reopened.options["ignore_obs_next"] and reopened._weight_norm
    assert reopened.priority_tree.dtype == np.float64 and type(reopened.priority_tree) is type(buf.priority_tree)
    np.testing.assert_array_equal(buf.sample(6)[1], reopened.sample(6)[1])
    assert HeteroPrioritizedVectorReplayBuffer.reopen(path, backend="native").sample(6)[1].shape == (6,)


def test_a_placement_is_given_again_at_reopen(tmp_path: Path) -> None:
    from hetero_replay.placement import Placement

    path = tmp_path / "buf.hr"
    buf = make("vector", 40, path, flush_every=10**6, placement=Placement(tree="torch"))
    for step in range(4):
        add_step(buf, step)
    buf.update_weight(np.arange(4), [0.5, 1.0, 2.0, 4.0])
    buf.flush()
    assert header_of(path)["tianshou"]["backend"] == "auto"  # the placement chose the tree, not the user
    placed = HeteroPrioritizedVectorReplayBuffer.reopen(path, placement=Placement(tree="torch"))
    plain = HeteroPrioritizedVectorReplayBuffer.reopen(path)
    assert type(placed.priority_tree) is type(buf.priority_tree) is not type(plain.priority_tree)
    assert_same_state(buf, placed)
    np.testing.assert_allclose(plain.weight[np.arange(40)], buf.weight[np.arange(40)], rtol=1e-6)


# -- kill -9 ----------------------------------------------------------------------------------

#: The learner that dies: adds steps of ids, feeds back TD errors of each new step, prints each durable point.
CHILD = textwrap.dedent(
    """
    import sys, time
    import numpy as np
    from tianshou.data import Batch
    from hetero_replay.storage import checkpoint
    from hetero_replay.adapters.tianshou import HeteroPrioritizedVectorReplayBuffer

    path, hang_after = sys.argv[1], int(sys.argv[2])
    if hang_after >= 0:  # from that point on, a write stops half-way, with its temporary open
        real = checkpoint.np.lib.format.write_array
        def write_array(f, arr, **kw):
            if "buf" in globals() and buf._durable.schedule.points >= hang_after:
                print("hanging", buf._durable.schedule.points, flush=True)
                time.sleep(120)
            real(f, arr, **kw)
        checkpoint.np.lib.format.write_array = write_array
    buf = HeteroPrioritizedVectorReplayBuffer(100, 4, alpha=0.6, random_seed=0, durable_path=path,
                                              flush_every=12, flush_seconds=1e6)
    points, deadline = 0, time.monotonic() + 60
    for step in range(10**6):
        k = step * 4 + np.arange(4) + 1
        ptr = buf.add(Batch(obs=np.repeat(k[:, None], 3, 1).astype(np.float32), act=k, rew=k.astype(float),
                            terminated=k % 5 == 0, truncated=np.zeros(4, bool),
                            obs_next=np.repeat(k[:, None], 3, 1) + 0.5, info=Batch(k=k)))[0]
        buf.update_weight(ptr, k % 7 + 0.25)
        if buf._durable.schedule.points != points:
            points = buf._durable.schedule.points
            print("point", points, buf._durable.schedule.added, flush=True)
        if time.monotonic() > deadline:
            sys.exit(3)
    """
)


def run_and_kill(path: Path, hang_after: int, kill_after_points: int) -> int:
    """Run :data:`CHILD`, SIGKILL it once it reported ``kill_after_points`` points (or hangs); its last reported."""
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(path), str(hang_after)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    last = 0
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            word, number, *_ = line.split()
            if word == "hanging":
                break
            last = int(number)
            if hang_after < 0 and last >= kill_after_points:
                break
        else:
            pytest.fail(f"the child ended early (rc {proc.wait()}): {proc.stderr.read() if proc.stderr else ''}")
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    return last


def assert_a_durable_point(buf: HeteroPrioritizedVectorReplayBuffer) -> int:
    """The reopened state is one the child's schedule wrote; returns the transitions added by then."""
    added = buf._durable.schedule.added
    assert added % 12 == 0 and added > 0, "a durable point is written every 12 transitions"
    steps = added // ENVS
    kept = min(steps, 25)  # 25 slots per env
    assert len(buf) == kept * ENVS
    batch = buf[np.sort(buf.sample_indices(0))]
    assert whole(batch).all(), "a row mixes fields of two transitions"
    expected = {s * ENVS + e + 1 for s in range(steps - kept, steps) for e in range(ENVS)}
    assert set(batch.act.tolist()) == expected, "rows beyond (or missing from) the durable point"
    # Priorities: each step's TD errors were fed back after its add, so all but the newest step's rows
    # hold (k % 7 + 0.25 + eps) ** alpha; the newest step's rows hold the max priority then.
    stored = np.sort(buf.sample_indices(0))
    k = buf[stored].act
    older = k <= (steps - 1) * ENVS
    expected_p = np.float32((k % 7 + 0.25 + buf.eps) ** buf.alpha)
    np.testing.assert_allclose(buf.weight[stored][older], expected_p[older], rtol=1e-6)
    assert buf.max_priority == pytest.approx(6.25 + buf.eps)  # id 6 (6 % 7 = 6) was fed back at step 1
    np.testing.assert_allclose(buf.weight[stored][~older], np.float32(buf.max_priority**buf.alpha), rtol=1e-6)
    return added


def test_kill_9_mid_run_reopens_the_last_durable_point(tmp_path: Path) -> None:
    path = tmp_path / "buf.hr"
    seen = run_and_kill(path, hang_after=-1, kill_after_points=30)  # wraps the 100 slots several times
    reopened = HeteroPrioritizedVectorReplayBuffer.reopen(path)
    added = assert_a_durable_point(reopened)
    assert added >= 12 * (seen - 1)  # the last point reported (the first one holds the empty buffer)
    assert files_in(tmp_path) == ["buf.hr"], "reopen leaves no temporary of the killed write"
    add_step(reopened, added // ENVS)  # and the learner goes on from there
    assert len(reopened) == min(added // ENVS + 1, 25) * ENVS


def test_kill_9_during_a_write_keeps_the_previous_point_and_reopen_removes_the_temporary(tmp_path: Path) -> None:
    path = tmp_path / "buf.hr"
    run_and_kill(path, hang_after=4, kill_after_points=0)  # killed inside the fifth point's write
    leftovers = [name for name in files_in(tmp_path) if name != "buf.hr"]
    assert len(leftovers) == 1 and leftovers[0].startswith(".buf.hr.") and leftovers[0].endswith(".tmp")
    reopened = HeteroPrioritizedVectorReplayBuffer.reopen(path)
    assert assert_a_durable_point(reopened) == 36  # points 2, 3, 4 at 12, 24, 36 transitions
    assert files_in(tmp_path) == ["buf.hr"]


# -- training goes on -------------------------------------------------------------------------


@pytest.mark.slow  # ~1 s of training, but gymnasium's and Tianshou's algorithm imports take 5-15 s alone
def test_dqn_cartpole_training_resumes_from_a_reopened_buffer(tmp_path: Path) -> None:
    import gymnasium as gym
    import torch
    from tianshou.data import Collector, CollectStats
    from tianshou.env import DummyVectorEnv
    from tianshou.trainer import OffPolicyTrainerParams

    from hetero_replay.adapters.tianshou import PEROffPolicyWrapper
    from hetero_replay.adapters.tianshou.workload import STANDARD_HYPERPARAMS, standard_algorithm

    def train(buf: HeteroPrioritizedVectorReplayBuffer, steps: int) -> PEROffPolicyWrapper:
        """A fresh DQN trained ``steps`` env steps on 2 CartPole envs, filling ``buf``."""
        torch.manual_seed(0)
        envs = DummyVectorEnv([lambda: gym.make("CartPole-v1") for _ in range(2)])
        envs.seed(0)
        algorithm = PEROffPolicyWrapper(
            wrapped_algorithm=standard_algorithm("dqn", gym.make("CartPole-v1"), STANDARD_HYPERPARAMS["dqn"]),
            beta=0.4,
        )
        collector = Collector[CollectStats](algorithm, envs, buf, exploration_noise=True)
        collector.reset(reset_buffer=False)  # keep what the reopened buffer holds
        if len(buf) == 0:
            collector.collect(n_step=100, random=True)
        algorithm.run_training(
            OffPolicyTrainerParams(
                training_collector=collector,
                test_collector=None,
                max_epochs=1,
                epoch_num_steps=steps,
                collection_step_num_env_steps=4,
                update_step_num_gradient_steps_per_sample=0.5,
                batch_size=32,
                verbose=False,
                show_progress=False,
            )  # fmt: skip
        )
        return algorithm

    path = tmp_path / "buf.hr"
    first = HeteroPrioritizedVectorReplayBuffer(4000, 2, random_seed=0, durable_path=path, flush_every=32)
    train(first, 300)
    assert header_of(path)["durable"]["points"] > 1
    added = first._durable.schedule.added
    del first  # the learner is gone (collected, it writes its last durable point)
    point = header_of(path)["durable"]["added"]
    assert 0 < point <= added

    reopened = HeteroPrioritizedVectorReplayBuffer.reopen(path)
    at_point = len(reopened)
    assert at_point == point  # nothing wrapped: 2000 slots per env
    stored_at_point = np.sort(reopened.sample_indices(0))
    rows_at_point = copy.deepcopy(reopened._meta[stored_at_point])
    algorithm = train(reopened, 100)
    assert algorithm.num_updates > 0
    assert len(reopened) > at_point
    # The rows of the durable point are still there (nothing wrapped), new ones after them in each sub-buffer.
    assert reopened._meta[stored_at_point] == rows_at_point
    stored = np.sort(reopened.sample_indices(0))
    for env in range(2):
        lo = env * 2000
        mine = stored[(stored >= lo) & (stored < lo + 2000)]
        np.testing.assert_array_equal(mine, np.arange(lo, lo + len(mine)))
    leaves = reopened.priority_tree.leaves()
    assert np.count_nonzero(leaves) == len(reopened) and len(np.unique(leaves[stored])) > 2  # TD errors fed back
    assert header_of(path)["durable"]["added"] > point  # and it keeps writing durable points
    assert files_in(tmp_path) == ["buf.hr"]


# -- bad input --------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["single", "vector"])
@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        (dict(durable_path=123), TypeError, "durable_path must be a str or os.PathLike"),
        (dict(durable_path=b"buf.hr"), TypeError, "durable_path"),
        (dict(durable_path=Path("")), ValueError, "durable_path"),  # Path("") is "."
        (dict(durable_path=""), ValueError, "durable_path must not be empty"),
        (dict(flush_every=0), ValueError, r"flush_every must be >= 1"),
        (dict(flush_every=-5), ValueError, "flush_every"),
        (dict(flush_every=1.5), TypeError, "flush_every must be an integer"),
        (dict(flush_every=True), TypeError, "flush_every"),
        (dict(flush_seconds=-1), ValueError, "flush_seconds must be > 0"),
        (dict(flush_seconds=0), ValueError, "flush_seconds"),
        (dict(flush_seconds=math.nan), ValueError, "flush_seconds"),
        (dict(flush_seconds=math.inf), ValueError, "flush_seconds"),
        (dict(flush_seconds="60"), TypeError, "flush_seconds must be a real number"),
    ],
)
def test_bad_durable_arguments_are_refused_naming_them(
    kind: str, kwargs: dict, error: type, match: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # Path("") would name the working folder
    kwargs = dict(kwargs)  # the parameter's dict is shared by both kinds
    path = kwargs.pop("durable_path", tmp_path / "buf.hr")
    with pytest.raises(error, match=match):
        make(kind, 8, path, **kwargs)
    assert files_in(tmp_path) == []


def test_flush_arguments_are_checked_without_a_durable_path() -> None:
    with pytest.raises(ValueError, match="flush_every"):
        make("vector", 8, None, flush_every=0)


@pytest.mark.parametrize("kind", ["single", "vector"])
def test_an_existing_path_is_never_overwritten(kind: str, tmp_path: Path) -> None:
    path = tmp_path / "buf.hr"
    first = make(kind, 8, path, flush_every=1)
    add_step(first, 0)
    before = path.read_bytes()
    with pytest.raises(ValueError, match=r"already exists.*reopen\(.*choose another path"):
        make(kind, 8, path)
    with pytest.raises(ValueError, match="already exists"):
        make(kind, 8, str(path))
    assert path.read_bytes() == before
    with pytest.raises(ValueError, match="is a directory"):
        make(kind, 8, tmp_path)
    with pytest.raises(ValueError, match="does not exist"):
        make(kind, 8, tmp_path / "missing" / "buf.hr")
    assert files_in(tmp_path) == ["buf.hr"]


def test_refused_add_neither_counts_nor_writes(tmp_path: Path) -> None:
    path = tmp_path / "buf.hr"
    buf = make("vector", 40, path, flush_every=8)
    add_step(buf, 0)  # 4 pending
    before_file, before = path.read_bytes(), state_of(buf)
    bad = rows_of(np.arange(5, 9))
    bad.rew = np.zeros((ENVS, 2))  # the wrong shape: refused before anything is written
    for _ in range(3):
        with pytest.raises(ValueError, match="rew"):
            buf.add(bad)
    assert path.read_bytes() == before_file and buf._durable.schedule.pending == 4
    assert_same_state(HeteroPrioritizedVectorReplayBuffer.reopen(path), make("vector", 40, None))
    assert_states_equal(before, state_of(buf))
    add_step(buf, 1)  # 8 transitions: the first point since the empty one
    assert header_of(path)["durable"]["added"] == 8


def test_values_a_durable_point_cannot_hold_are_refused_at_the_add(tmp_path: Path) -> None:
    path = tmp_path / "buf.hr"
    buf = make("vector", 40, path, flush_every=1)
    before_file = path.read_bytes()
    step = rows_of(np.arange(1, 5))
    step.info = Batch(name=np.array(["a", "b", "c", "d"]))  # text
    with pytest.raises(TypeError, match=r"info\.name: a buffer with durable_path stores NumPy arrays"):
        buf.add(step)
    assert len(buf) == 0 and not buf._meta.get_keys() and buf._durable.schedule.pending == 0
    assert path.read_bytes() == before_file
    add_step(buf, 0)
    step = rows_of(np.arange(5, 9))
    step.policy = Batch(obj=np.array([None, 1, 2, 3], dtype=object))  # a new key of objects
    with pytest.raises(TypeError, match="policy.obj"):
        buf.add(step)
    assert len(buf) == 4
    make("vector", 40, None).add(step)  # without durable_path, Tianshou's storage takes them


def test_copies_write_no_durable_points(tmp_path: Path) -> None:
    path = tmp_path / "buf.hr"
    buf = make("vector", 40, path, flush_every=1)
    add_step(buf, 0)
    for clone in (pickle.loads(pickle.dumps(buf)), copy.deepcopy(buf)):
        assert clone.durable_path is None
        add_step(clone, 1)
        with pytest.raises(RuntimeError, match="no durable_path"):
            clone.flush()
    assert header_of(path)["durable"]["added"] == 4
    with pytest.raises(RuntimeError, match="no durable_path"):
        make("single", 4, None).flush()


def test_reopen_refuses_bad_arguments(tmp_path: Path) -> None:
    path = tmp_path / "buf.hr"
    make("vector", 8, path)
    with pytest.raises(TypeError, match=r"reopen\(\) takes the overrides.*'alpha'"):
        HeteroPrioritizedVectorReplayBuffer.reopen(path, alpha=0.5)
    with pytest.raises(ValueError, match="flush_every"):
        HeteroPrioritizedVectorReplayBuffer.reopen(path, flush_every=0)
    with pytest.raises(TypeError, match="path must be a str"):
        HeteroPrioritizedVectorReplayBuffer.reopen(3)
    with pytest.raises(FileNotFoundError):
        HeteroPrioritizedVectorReplayBuffer.reopen(tmp_path / "missing.hr")


def rewritten(path: Path, target: Path, change: Any) -> Path:
    """A copy of the durable file at ``path`` whose header and arrays ``change`` edited, written as a valid file."""
    header, arrays = read(path)
    header = copy.deepcopy(header)
    for key in ("format", "version", "arrays"):  # write() adds them
        header.pop(key)
    change(header, arrays)
    write(target, header, arrays)
    return target


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (lambda h, a: h.pop("tianshou"), "not a durable Tianshou buffer"),
        (lambda h, a: h["tianshou"].update(layout_version=2), "layout version 2"),
        (lambda h, a: h["tianshou"].update(buffer="single"), "HeteroPrioritizedReplayBuffer.reopen"),
        (lambda h, a: h["tianshou"].update(buffer_num=3), "buffer_num"),
        (lambda h, a: h["tianshou"]["counters"][0].__setitem__(1, 99), "more stored rows|slots beyond|insertion"),
        (lambda h, a: h["tianshou"]["counters"][1].__setitem__(0, 0), "insertion slot"),
        (lambda h, a: h["tianshou"]["counters"][2].__setitem__(4, 9), "episode starting"),
        (lambda h, a: h["tianshou"]["counters"].pop(), "counters"),
        (lambda h, a: a["storage/slot"].__setitem__(0, 5), "storage/slot"),
        (lambda h, a: a["priorities"].__setitem__(1, 0.0), "positive priority"),
        (lambda h, a: a["priorities"].__setitem__(1, np.inf), "positive priority"),
        (lambda h, a: h["tianshou"]["layout"].__setitem__("act", "field0"), "twice or not at all"),
        (lambda h, a: h["tianshou"]["layout"].pop("act"), "in no key of the layout"),
        (lambda h, a: h["tianshou"]["legacy_rng"]["state"].__setitem__("key", [1, 2]), "legacy_rng"),
        (lambda h, a: h["tianshou"].update(weight_norm="yes"), "weight_norm"),
        (lambda h, a: h["tianshou"]["storage_options"].update(stack_num=0), "stack_num"),
        (lambda h, a: h["config"].update(eps=0.0), "eps"),
        (lambda h, a: h.update(max_priority=1e300), "inconsistent"),
        (lambda h, a: h["durable"].update(flush_every=0), "flush_every"),
        (lambda h, a: h.pop("durable"), "not a durable point"),
    ],
)
def test_reopen_refuses_inconsistent_files_naming_them(change: Any, match: str, tmp_path: Path) -> None:
    path = tmp_path / "buf.hr"
    buf = make("vector", 40, path, flush_every=10**6)
    for step in range(3):
        add_step(buf, step)
    buf.flush()
    bad = rewritten(path, tmp_path / "bad.hr", change)
    with pytest.raises(ReplayFileError, match=match) as info:
        HeteroPrioritizedVectorReplayBuffer.reopen(bad)
    assert str(bad) in str(info.value)


def test_reopen_refuses_damaged_and_foreign_files(tmp_path: Path) -> None:
    path = tmp_path / "buf.hr"
    buf = make("vector", 40, path, flush_every=1)
    add_step(buf, 0)
    data = path.read_bytes()
    cases = {
        "truncated.hr": data[: len(data) // 2],
        "garbage.hr": b"not a zip file at all",
        "empty.hr": b"",
        "flipped.hr": data[:200] + bytes([data[200] ^ 0xFF]) + data[201:],
    }
    for name, content in cases.items():
        (tmp_path / name).write_bytes(content)
        with pytest.raises(ReplayFileError) as info:
            HeteroPrioritizedVectorReplayBuffer.reopen(tmp_path / name)
        assert str(tmp_path / name) in str(info.value)
    core = PrioritizedReplay(8, {"x": ((), np.float32)}, options=PEROptions())
    core.add({"x": np.ones(2, np.float32)})
    core.save(tmp_path / "core.hr")
    with pytest.raises(ReplayFileError, match="not a durable Tianshou buffer"):
        HeteroPrioritizedVectorReplayBuffer.reopen(tmp_path / "core.hr")
    with pytest.raises(ReplayFileError, match="HeteroPrioritizedVectorReplayBuffer.reopen"):
        HeteroPrioritizedReplayBuffer.reopen(path)
