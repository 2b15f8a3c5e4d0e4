"""SB3 with compressed image observations: ``PrioritizedReplayBuffer(..., compress=...)``.

Real Atari frames (``tests/data/atari_frames.npz``) through the buffer as SB3 adds them (``n_envs=2``,
episode ends, the ring wrapping), sampled batches equal to the raw buffer's; and a short PERDQN run on
a real ALE env with ``compress="zstd"``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("stable_baselines3")
from gymnasium import spaces  # noqa: E402

from hetero_replay.adapters.sb3 import DictPrioritizedReplayBuffer, PrioritizedReplayBuffer  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from atari_frames import TEST_DATA, stacks  # noqa: E402

OBS = spaces.Box(0, 255, (4, 84, 84), np.uint8)
ACT = spaces.Discrete(6)


def env_stacks(n_envs: int) -> list[np.ndarray]:
    data = np.load(TEST_DATA)
    out = []
    for k in range(n_envs):
        game = ("Pong", "Breakout")[k % 2]
        starts = data[f"{game}/starts"].copy()
        starts[40::37] = True  # more episode ends than a random policy reaches in 96 steps
        out.append(stacks(data[f"{game}/frames"], starts))
    return out


def fill(buf: PrioritizedReplayBuffer, n_envs: int, steps: int) -> None:
    envs = env_stacks(n_envs)
    for t in range(steps):
        obs = np.stack([e[t] for e in envs])
        nxt = np.stack([e[t + 1] for e in envs])
        done = np.array([(t + 1) % 37 == 3 for _ in envs], np.float32)
        buf.add(obs, nxt, np.full((n_envs, 1), t % 6), np.ones(n_envs, np.float32), done, [{}] * n_envs)


@pytest.mark.parametrize(("compress", "storage"), [("zstd", "host"), (("lz4", 1), "host"), ("lz4", "shared")])
def test_batches_equal_the_raw_buffers(compress, storage):
    raw = PrioritizedReplayBuffer(64, OBS, ACT, device="cpu", n_envs=2, seed=4)
    packed = PrioritizedReplayBuffer(64, OBS, ACT, device="cpu", n_envs=2, seed=4, compress=compress, storage=storage)
    for buf in (raw, packed):
        fill(buf, 2, 90)  # 180 rows into 64: wrapped
    a, b = raw.sample(256), packed.sample(256)
    for name in ("observations", "next_observations", "actions", "rewards", "dones", "weights"):
        np.testing.assert_array_equal(getattr(b, name).numpy(), getattr(a, name).numpy(), err_msg=name)
    stored = packed._replay.storage
    held = stored.compressed.bytes_used if storage == "host" else stored.bytes_per_row * 64 * 2
    assert held * 20 < 64 * 2 * OBS.shape[0] * 84 * 84  # > 40x smaller than the raw rows (obs and next_obs)
    np.testing.assert_array_equal(packed.observations[5], raw.observations[5])
    packed.close()


def test_dict_buffer_compresses_its_image_keys_only():
    space = spaces.Dict({"image": OBS, "vector": spaces.Box(-1, 1, (3,), np.float32)})
    buf = DictPrioritizedReplayBuffer(16, space, ACT, device="cpu", compress="zstd")
    assert list(buf._replay.storage.compressed.codecs) == ["obs/image", "next_obs/image"]


def test_bad_compress_is_refused_before_anything_is_built():
    with pytest.raises(ValueError, match=r"compress= keeps rows compressed in memory.*storage='host' or 'shared'"):
        PrioritizedReplayBuffer(16, OBS, ACT, storage="disk", storage_options={"path": "unused"}, compress="zstd")
    with pytest.raises(ValueError, match=r"compress= and storage_options' codec/frames both choose the codec"):
        PrioritizedReplayBuffer(16, OBS, ACT, storage_options={"codec": "lz4"}, compress="zstd")
    with pytest.raises(ValueError, match=r"codec: unknown codec 'brotli'"):
        PrioritizedReplayBuffer(16, OBS, ACT, compress="brotli")
    with pytest.raises(ValueError, match=r"codec='zstd' compresses no field: .* this schema has none"):
        PrioritizedReplayBuffer(16, spaces.Box(-1, 1, (4,), np.float32), ACT, compress="zstd")


@pytest.mark.slow  # a CNN on the CPU: ~30 s of one core
def test_perdqn_trains_from_a_compressed_buffer_on_a_real_atari_env():
    pytest.importorskip("ale_py")
    from stable_baselines3.common.env_util import make_atari_env
    from stable_baselines3.common.vec_env import VecFrameStack

    from hetero_replay.adapters.sb3 import PERDQN

    env = VecFrameStack(make_atari_env("ALE/Pong-v5", n_envs=2, seed=0), 4)
    model = PERDQN(
        "CnnPolicy", env, buffer_size=200, learning_starts=100, batch_size=32, train_freq=8,
        replay_buffer_kwargs=dict(compress="zstd"), seed=0, device="cpu",
    )  # fmt: skip
    model.learn(200)
    buf = model.replay_buffer
    assert buf.size() * 2 >= 200 and buf._replay.storage.compressed.pool.frames > 0
    batch = buf.sample(32)
    assert batch.observations.shape == (32, 4, 84, 84) and batch.observations.float().std() > 0
    env.close()
