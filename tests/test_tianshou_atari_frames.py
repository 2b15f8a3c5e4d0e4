"""Tianshou's own way to store Atari frames compactly, through our buffers (docs/compression.md, "Tianshou").

Our Tianshou buffers keep transitions in Tianshou's ``Batch`` storage, which cannot hold compressed
records; what a user can do instead is Tianshou's Atari setting: ``stack_num=4``,
``ignore_obs_next=True``, ``save_only_last_obs=True`` (one 84x84 frame a row, stacks rebuilt on
read). Checked here on real frames (Pong and Breakout, ``tests/data/atari_frames.npz``), two
environments with episode ends, the ring wrapping: every row reads as Tianshou's own buffer reads it.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("tianshou")

from tianshou.data import Batch, PrioritizedVectorReplayBuffer  # noqa: E402

from hetero_replay.adapters.tianshou import HeteroPrioritizedVectorReplayBuffer  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from atari_frames import TEST_DATA, stacks  # noqa: E402

ATARI = {"stack_num": 4, "ignore_obs_next": True, "save_only_last_obs": True}


@pytest.mark.parametrize("seed", [0, 1])
def test_atari_storage_options_read_as_tianshous_own_buffer(seed):
    data = np.load(TEST_DATA)
    rng = np.random.default_rng(seed)
    games = []
    for game in ("Pong", "Breakout"):
        starts = data[f"{game}/starts"].copy()
        starts[rng.choice(np.arange(5, 90), 4, replace=False)] = True  # episode ends of our own
        games.append((stacks(data[f"{game}/frames"], starts), starts))
    size = 2 * 40  # two sub-buffers of 40 rows: 95 steps each wrap them
    ours = HeteroPrioritizedVectorReplayBuffer(size, 2, alpha=0.6, beta=0.4, random_seed=seed, **ATARI)
    theirs = PrioritizedVectorReplayBuffer(size, 2, alpha=0.6, beta=0.4, **ATARI)
    for t in range(95):
        end = np.array([starts[t + 1] for _, starts in games])
        batch = Batch(
            obs=np.stack([s[t] for s, _ in games]),
            act=np.array([t % 6, (t + 1) % 4]),
            rew=np.array([1.0 * t, -1.0 * t]),
            terminated=end,
            truncated=np.zeros(2, bool),
            obs_next=np.stack([s[t + 1] for s, _ in games]),
            info=Batch(),
        )
        for buf in (ours, theirs):
            buf.add(batch, buffer_ids=[0, 1])
    assert ours._meta.obs.shape == (size, 84, 84) and "obs_next" not in ours._meta.get_keys()  # a frame a row
    stored = theirs.sample_indices(0)
    np.testing.assert_array_equal(np.sort(ours.sample_indices(0)), np.sort(stored))
    want, got = theirs[stored], ours[stored]
    assert got.obs.shape == (len(stored), 4, 84, 84)
    for key in ("obs", "obs_next", "act", "rew", "terminated", "done"):
        np.testing.assert_array_equal(got[key], want[key], err_msg=key)
    drawn, indices = ours.sample(32)
    np.testing.assert_array_equal(drawn.obs, theirs[indices].obs)
    np.testing.assert_array_equal(drawn.obs_next, theirs[indices].obs_next)
    newest = ours.last_index  # where `next` stops, obs_next is the row's own obs (the caveat in the docs)
    np.testing.assert_array_equal(ours[newest].obs_next, ours[newest].obs)
