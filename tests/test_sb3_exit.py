"""An SB3 PER buffer on disk loses no row on a normal exit, and refuses a reset before changing anything.

Real processes end normally (or fork); the buffer left behind is reopened and counted.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest

pytest.importorskip("stable_baselines3")

from gymnasium import spaces  # noqa: E402

from hetero_replay.adapters.sb3 import PrioritizedReplayBuffer  # noqa: E402

# Trains PERDQN on a disk buffer for 1000 steps; argv[2] says how the script ends.
LEARNER = textwrap.dedent(
    """
    import gc, os, sys
    import numpy as np
    from hetero_replay.adapters.sb3 import PERDQN

    model = PERDQN("MlpPolicy", "CartPole-v1", buffer_size=2000, learning_starts=100, train_freq=4, seed=0,
                   replay_buffer_kwargs=dict(storage="disk", storage_options=dict(path=sys.argv[1])))
    model.learn(1000)
    if sys.argv[2] == "close":
        model.replay_buffer.close()
        model.replay_buffer.close()  # twice: nothing more
    elif sys.argv[2] == "collect":
        del model
        gc.collect()
        print("collected", flush=True)
    elif sys.argv[2] == "fork":
        buf = model.replay_buffer
        buf.flush()
        pid = os.fork()
        if pid == 0:  # the child's copy gets 4 more rows; exiting normally it must not write the owner's files
            for _ in range(4):
                buf.add(np.zeros((1, 4), np.float32), np.zeros((1, 4), np.float32), np.zeros(1, np.int64),
                        np.zeros(1, np.float32), np.zeros(1, np.float32), [{}])
            sys.exit(0)
        os.waitpid(pid, 0)
        os._exit(0)  # the owner writes nothing more: the files show what the child did
    """
)


def reopened_size(path: str) -> int:
    buf = PrioritizedReplayBuffer(
        2000, spaces.Box(-np.inf, np.inf, (4,), np.float32), spaces.Discrete(2),
        storage="disk", storage_options=dict(path=path, reopen=True),
    )  # fmt: skip
    try:
        return buf.size()
    finally:
        buf.close()


@pytest.mark.parametrize("end", ["exit", "close", "collect", "fork"])
def test_a_disk_buffer_keeps_every_row_when_the_script_ends_normally(tmp_path, end: str) -> None:
    path = str(tmp_path / "replay")
    out = subprocess.run(
        [sys.executable, "-c", LEARNER, path, end], capture_output=True, text=True, timeout=600
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    assert "Exception ignored" not in out.stderr, out.stderr[-3000:]
    # Before: 208 of the 1000 rows (the durable point flush_every/flush_seconds last made).
    assert reopened_size(path) == 1000


def test_reset_of_a_disk_buffer_is_refused_before_sb3_counters_change(tmp_path) -> None:
    box = spaces.Box(-1, 1, (4,), np.float32)
    buf = PrioritizedReplayBuffer(
        10, box, spaces.Discrete(2), storage="disk", storage_options=dict(path=str(tmp_path / "r"))
    )
    try:
        for i in range(25):
            buf.add(np.full((1, 4), i % 2, np.float32), np.zeros((1, 4), np.float32), np.array([1]),
                    np.ones(1, np.float32), np.zeros(1, np.float32), [{}])  # fmt: skip
        before = (buf.pos, buf.full, buf.size())
        with pytest.raises(ValueError, match="reset.*path="):
            buf.reset()
        assert (buf.pos, buf.full, buf.size()) == before == (5, True, 10)
        buf.sample(4)  # the buffer goes on
    finally:
        buf.close()


# The Tianshou buffers' durable points follow the same rule: a normal exit (or collection) makes the last one.
TIANSHOU_SCRIPT = textwrap.dedent(
    """
    import gc, os, sys
    import numpy as np
    from tianshou.data import Batch
    from hetero_replay.adapters.tianshou import HeteroPrioritizedReplayBuffer

    buf = HeteroPrioritizedReplayBuffer(100, random_seed=0, durable_path=sys.argv[1], flush_every=10**6,
                                        flush_seconds=3600)
    for k in range(16):
        buf.add(Batch(obs=np.full(3, k, np.float32), act=k, rew=float(k), terminated=False, truncated=False,
                      obs_next=np.full(3, k, np.float32), info={}))
    if sys.argv[2] == "fork":
        buf.flush()
        pid = os.fork()
        if pid == 0:  # the child's copy gets 4 more rows; exiting normally it must not write the owner's file
            for k in range(4):
                buf.add(Batch(obs=np.zeros(3, np.float32), act=0, rew=0.0, terminated=False, truncated=False,
                              obs_next=np.zeros(3, np.float32), info={}))
            sys.exit(0)
        os.waitpid(pid, 0)
        os._exit(0)  # the owner writes nothing more: the file shows what the child did
    elif sys.argv[2] == "collect":
        del buf
        gc.collect()
    """
)


@pytest.mark.parametrize("end", ["exit", "collect", "fork"])
def test_a_durable_tianshou_buffer_keeps_every_transition_when_the_script_ends_normally(tmp_path, end: str) -> None:
    pytest.importorskip("tianshou")
    from hetero_replay.adapters.tianshou import HeteroPrioritizedReplayBuffer

    path = tmp_path / "buf.hr"
    out = subprocess.run([sys.executable, "-c", TIANSHOU_SCRIPT, str(path), end], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-3000:]
    # Before: 0 (only the empty buffer's first durable point was written).
    assert len(HeteroPrioritizedReplayBuffer.reopen(path)) == 16


# Two durable buffers left open; the newer one's last durable point cannot be written (a directory in its way).
TWO_BUFFERS = textwrap.dedent(
    """
    import os, sys
    import numpy as np
    from tianshou.data import Batch
    from hetero_replay.adapters.tianshou import HeteroPrioritizedReplayBuffer

    bufs = [HeteroPrioritizedReplayBuffer(100, random_seed=0, durable_path=path, flush_every=10**6, flush_seconds=3600)
            for path in sys.argv[1:3]]
    for buf in bufs:
        for k in range(16):
            buf.add(Batch(obs=np.full(3, k, np.float32), act=k, rew=float(k), terminated=False, truncated=False,
                          obs_next=np.full(3, k, np.float32), info={}))
    os.remove(sys.argv[2])
    os.makedirs(os.path.join(sys.argv[2], "in-the-way"))
    """
)


def test_at_exit_one_buffer_whose_close_fails_does_not_stop_the_others(tmp_path) -> None:
    pytest.importorskip("tianshou")
    from hetero_replay.adapters.tianshou import HeteroPrioritizedReplayBuffer

    first, second = tmp_path / "first.hr", tmp_path / "second.hr"
    out = subprocess.run([sys.executable, "-c", TWO_BUFFERS, str(first), str(second)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "IsADirectoryError" in out.stderr  # the newer buffer, closed first, is reported
    assert len(HeteroPrioritizedReplayBuffer.reopen(first)) == 16  # ... and the older one still closed


def _add(buf: PrioritizedReplayBuffer, rows: int) -> None:
    for i in range(rows):
        buf.add(np.full((1, 4), i % 2, np.float32), np.zeros((1, 4), np.float32), np.array([1]),
                np.ones(1, np.float32), np.zeros(1, np.float32), [{}])  # fmt: skip


def test_a_buffer_whose_replay_was_closed_through_replay_closes_quietly(tmp_path) -> None:
    box = spaces.Box(-1, 1, (4,), np.float32)
    buf = PrioritizedReplayBuffer(
        10, box, spaces.Discrete(2), storage="disk", storage_options=dict(path=str(tmp_path / "r"))
    )
    _add(buf, 3)
    buf.replay.close()  # the engine replay, closed by hand (as the distributed tests do with their shards)
    buf.close()  # nothing left to write: no error, and none at exit either


def test_reset_of_a_buffer_on_sharded_durable_points_is_refused_before_anything_changes(tmp_path, ray_local) -> None:
    box = spaces.Box(-1, 1, (4,), np.float32)
    where = str(tmp_path / "shards")
    buf = PrioritizedReplayBuffer(10, box, spaces.Discrete(2), distributed=dict(num_shards=1, durable_dir=where))
    try:
        _add(buf, 12)
        before = (buf.pos, buf.full, buf.size())
        with pytest.raises(ValueError, match="reset.*durable_dir="):
            buf.reset()
        assert (buf.pos, buf.full, buf.size()) == before == (2, True, 10)
        buf.sample(4)  # the shards were not killed: the buffer goes on
    finally:
        buf.close()
