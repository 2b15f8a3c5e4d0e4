"""SB3's PER algorithms on the storage service: a disk buffer survives kill -9 and training goes on from it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

pytest.importorskip("stable_baselines3")

from hetero_replay.adapters.sb3 import PERDQN, PrioritizedReplayBuffer

# A learner that trains PERDQN on a disk buffer and reports each durable point it made.
LEARNER = textwrap.dedent(
    """
    import json, sys
    from hetero_replay.adapters.sb3 import PERDQN
    from stable_baselines3.common.callbacks import BaseCallback

    class Report(BaseCallback):
        def _on_step(self):
            replay = self.model.replay_buffer._replay
            if self.num_timesteps % 50 == 0:
                replay.flush()
                print(json.dumps({"durable": len(replay)}), flush=True)
            return True

    model = PERDQN("MlpPolicy", "CartPole-v1", buffer_size=2000, learning_starts=100, train_freq=4, seed=0,
                   replay_buffer_kwargs=dict(storage="disk", storage_options=dict(path=sys.argv[1], flush_seconds=3600)))
    model.learn(100_000, callback=Report())
    """
)


def test_perdqn_goes_on_from_a_reopened_disk_buffer_after_kill_9(tmp_path):
    """A learner killed mid-training leaves a buffer that a new PERDQN reopens (reopen=True) and trains on."""
    path = tmp_path / "replay"
    child = subprocess.Popen([sys.executable, "-c", LEARNER, str(path)], stdout=subprocess.PIPE, text=True)
    durable = 0
    try:
        assert child.stdout is not None
        deadline = time.monotonic() + 120
        while durable < 400 and time.monotonic() < deadline:
            line = child.stdout.readline()
            if not line:
                break
            durable = json.loads(line)["durable"]
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
    assert durable >= 400, "the learner made no durable point"

    model = PERDQN(
        "MlpPolicy",
        "CartPole-v1",
        buffer_size=2000,
        learning_starts=0,
        train_freq=4,
        seed=1,
        replay_buffer_kwargs=dict(storage="disk", storage_options=dict(path=str(path), reopen=True)),
    )
    buf = model.replay_buffer
    assert isinstance(buf, PrioritizedReplayBuffer)
    restored = buf.size()
    # Everything up to the last reported durable point is back (later points may have landed too).
    assert restored >= durable and buf.pos == restored % 2000
    assert (buf.priorities().ravel()[:restored] > 0).all()
    model.learn(200)
    assert buf.size() == min(restored + 200, 2000)
    # SB3's array attributes read through the engine for a storage with no live view.
    dones = buf.dones[: buf.size()]
    assert dones.shape == (buf.size(), 1) and set(np.unique(dones)) <= {0.0, 1.0}
    buf.close()


def test_disk_storage_refuses_a_placement_and_a_storage_together(tmp_path):
    """storage= and placement= both place the rows: refused, naming both."""
    from gymnasium import spaces

    from hetero_replay.placement import Placement

    box = spaces.Box(-1, 1, (4,))
    with pytest.raises(ValueError, match="storage='disk' and the placement"):
        PrioritizedReplayBuffer(
            100, box, spaces.Discrete(2), placement=Placement(), storage="disk", storage_options={"path": str(tmp_path)}
        )
    with pytest.raises(TypeError, match="storage must be a storage name"):
        PrioritizedReplayBuffer(100, box, spaces.Discrete(2), storage=3)  # type: ignore[arg-type]
    assert not any(tmp_path.iterdir())
