"""A learner that exits without closing its ShardedReplay loses no row, and its exit prints no error.

Real processes start their own local Ray instance and end normally; the durable
points they leave are reopened and counted. Before, Ray's exit handler ended the
shards first: every row since the last periodic point was lost, and the SB3
buffer's own close at exit started a second Ray instance and failed on the first
one's actor handles.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest

pytest.importorskip("ray")

from hetero_replay import PrioritizedReplay  # noqa: E402
from hetero_replay.distributed import ShardedReplay  # noqa: E402

SCHEMA = {"id": ((), np.int64)}

# Adds 10 rows to a 2-shard replay whose periodic durable points never come; argv[3] says how the script ends.
LEARNER = textwrap.dedent(
    """
    import sys
    import numpy as np
    import ray
    from hetero_replay.distributed import ShardedReplay

    never = dict(flush_every=10**9, flush_seconds=3600)
    replay = ShardedReplay(2, 64, {"id": ((), np.int64)}, seed=0, storage=sys.argv[2], durable_dir=sys.argv[1], **never)
    replay.add({"id": np.arange(10)})
    print("added", len(replay), flush=True)
    if sys.argv[3] == "shutdown":  # the user ends Ray first: the shards are gone with it, nothing to close
        ray.shutdown()
    elif sys.argv[3] == "restart":  # ... and starts another instance: the replay's handles are void there
        ray.shutdown()
        ray.init(address="local", num_cpus=1, include_dashboard=False)
    """
)

SB3_LEARNER = textwrap.dedent(
    """
    import sys
    import numpy as np
    from gymnasium import spaces
    from hetero_replay.adapters.sb3 import PrioritizedReplayBuffer

    box = spaces.Box(-np.inf, np.inf, (4,), np.float32)
    never = dict(flush_every=10**9, flush_seconds=3600)
    buf = PrioritizedReplayBuffer(400, box, spaces.Discrete(2), n_envs=2,
                                  distributed=dict(num_shards=2, durable_dir=sys.argv[1], **never))
    for r in range(10):  # staged in the buffer until its next sample: its close at exit hands them down
        obs = np.full((2, 4), r, np.float32)
        buf.add(obs, obs + 1, np.array([0, 1]), np.ones(2, np.float32), np.zeros(2, np.float32), [{}, {}])
    print("added", flush=True)
    """
)

TIANSHOU_LEARNER = textwrap.dedent(
    """
    import sys
    import gymnasium as gym
    import numpy as np
    from tianshou.data import Batch
    from hetero_replay.adapters.tianshou import ShardedVectorReplayBuffer

    env = gym.make("CartPole-v1")
    # Without the spaces the first add builds the replay (and registers its own close at exit then).
    spaces = dict(observation_space=env.observation_space, action_space=env.action_space) if sys.argv[2] == "spaces" else {}
    buf = ShardedVectorReplayBuffer(2, num_shards=2, capacity_per_shard=64, send_every=1000, n_step=3, **spaces,
                                    durable_dir=sys.argv[1], flush_every=10**9, flush_seconds=3600)
    for t in range(10):  # 20 transitions: staged, or waiting in their 3-step windows
        obs = np.full((2, 4), t, np.float32)
        buf.add(Batch(obs=obs, act=np.zeros(2, np.int64), rew=np.ones(2), terminated=np.array([t == 4, False]),
                      truncated=np.zeros(2, bool), obs_next=obs + 1, info=Batch()))
    print("added", buf.sent, flush=True)
    """
)


def run(script: str, *args: str) -> subprocess.CompletedProcess[str]:
    out = subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "Traceback" not in out.stderr and "Exception ignored" not in out.stderr, out.stderr[-3000:]
    return out


@pytest.mark.parametrize("storage", ["host", "disk"])
def test_a_replay_left_open_makes_its_last_durable_point_at_exit(tmp_path, ray_local, storage: str) -> None:
    where = str(tmp_path / "replay")
    assert "added 10" in run(LEARNER, where, storage, "exit").stdout
    replay = ShardedReplay(2, 64, SCHEMA, seed=0, storage=storage, durable_dir=where, reopen=True)
    try:
        assert len(replay) == 10
        assert set(replay.sample(256).data["id"].tolist()) == set(range(10))  # each row ~1/10: all are drawn
    finally:
        replay.close()


@pytest.mark.parametrize("end", ["shutdown", "restart"])
def test_exit_after_the_user_ended_ray_is_quiet_and_writes_nothing(tmp_path, end: str) -> None:
    where = tmp_path / "replay"
    run(LEARNER, str(where), "host", end)
    assert not any(where.iterdir())  # no durable point was due: the rows went with the shards


def test_an_sb3_buffer_over_shards_hands_down_its_staged_rows_at_exit(tmp_path) -> None:
    where = tmp_path / "replay"
    run(SB3_LEARNER, str(where))
    # Before: no file at all (the shards were gone before the buffer's close ran).
    assert sum(len(PrioritizedReplay.load(where / f"shard-{k}.hrp")) for k in range(2)) == 20


@pytest.mark.parametrize("schema_from", ["spaces", "first add"])
def test_a_tianshou_buffer_over_shards_sends_its_staged_rows_and_windows_at_exit(tmp_path, schema_from: str) -> None:
    pytest.importorskip("tianshou")
    where = tmp_path / "replay"
    assert "added 0" in run(TIANSHOU_LEARNER, str(where), schema_from).stdout
    assert sum(len(PrioritizedReplay.load(where / f"shard-{k}.hrp")) for k in range(2)) == 20
