"""The SB3 buffer's native row stager (``add``'s usual rows in one call) stores exactly what its checks would.

``PrioritizedReplayBuffer.add`` hands each row to ``hetero_replay._native.RowStager`` first; a row
it does not take goes through the checking path, which stores it or raises. So:

* fed the same rows, a buffer with the stager and one without hold the same rows bit for bit and
  sample the same batches, over spaces, dtypes, shapes and buffer options, while the stager took the
  usual rows (a stager that took none would pass that comparison too);
* the stager writes nothing for a row it refuses, whichever value it refuses, so a refused row
  leaves the staging rows as they were.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from gymnasium import spaces

pytest.importorskip("stable_baselines3")
from hetero_replay.adapters.sb3 import PrioritizedReplayBuffer  # noqa: E402


class CountingStager:
    """The buffer's stager, counting the rows it took and refused."""

    def __init__(self, stager: Any) -> None:
        self.stager, self.took, self.refused = stager, 0, 0

    def put(self, row: int, values: tuple[Any, ...]) -> bool:
        took = self.stager.put(row, values)
        self.took += took
        self.refused += not took
        return took


SPACES = {
    "box-discrete": (spaces.Box(-5, 5, (3,), np.float32), spaces.Discrete(3)),
    "image-start": (spaces.Box(0, 255, (4, 4, 2), np.uint8), spaces.Discrete(4, start=-2)),
    "discrete-obs-multidiscrete": (spaces.Discrete(7), spaces.MultiDiscrete([3, 5])),
    "int-obs-multibinary": (spaces.Box(-9, 9, (2,), np.int32), spaces.MultiBinary(3)),
    "box-box": (spaces.Box(-1, 1, (3,), np.float32), spaces.Box(-1, 1, (2,), np.float32)),
}


def random_row(obs_space: spaces.Space, act_space: spaces.Space, n_envs: int, rng: np.random.Generator) -> dict:
    """One valid ``add`` of ``n_envs`` transitions, with the dtypes and shapes varied as callers vary them."""
    obs = np.stack([obs_space.sample() for _ in range(n_envs)])
    next_obs = np.stack([obs_space.sample() for _ in range(n_envs)])
    action = np.stack([np.asarray(act_space.sample()) for _ in range(n_envs)])
    if isinstance(act_space, (spaces.Discrete, spaces.MultiDiscrete, spaces.MultiBinary)):
        action = action.astype(rng.choice([act_space.dtype, "int64", "int32", "int8"]))  # wider ones: the checked cast
    if rng.random() < 0.3:
        obs = obs.astype(np.float64) if obs.dtype == np.float32 else obs  # float64 into float32: the checked cast
    if rng.random() < 0.3 and isinstance(act_space, spaces.Discrete):
        action = action.reshape(n_envs, 1)  # SB3's (n_envs, 1) form besides a VecEnv's (n_envs,)
    reward = rng.standard_normal(n_envs).astype(np.float64 if rng.random() < 0.2 else np.float32)
    done = rng.random(n_envs) < 0.3
    if rng.random() < 0.3:
        done = done.astype(np.float32)
    infos = [{"TimeLimit.truncated": bool(rng.random() < 0.2)} if rng.random() < 0.7 else {} for _ in range(n_envs)]
    return dict(obs=obs, next_obs=next_obs, action=action, reward=reward, done=done, infos=infos)


@pytest.mark.parametrize("spaces_name", list(SPACES))
@pytest.mark.parametrize(
    "options",
    [dict(n_envs=1), dict(n_envs=3), dict(n_envs=2, handle_timeout_termination=False),
     dict(n_envs=2, optimize_memory_usage=True, handle_timeout_termination=False)],
    ids=["1-env", "3-envs", "no-timeouts", "optimize-memory"],
)  # fmt: skip
def test_the_stager_stores_what_the_checks_store(spaces_name: str, options: dict[str, Any]) -> None:
    obs_space, act_space = SPACES[spaces_name]
    obs_space.seed(0)
    act_space.seed(0)
    n_envs = options["n_envs"]
    staged, checked = (PrioritizedReplayBuffer(40, obs_space, act_space, device="cpu", seed=3, **options) for _ in "ab")
    staged._stager = CountingStager(staged._stager)
    checked._stager = None  # every row through the checks
    rng = np.random.default_rng(1)
    for step in range(100):  # the ring wraps twice; STAGE_ROWS commits and samples commit early
        row = random_row(obs_space, act_space, n_envs, rng)
        staged.add(**row)
        checked.add(**row)
        if step % 17 == 16:
            a, b = staged.sample(16), checked.sample(16)
            np.testing.assert_array_equal(a.indices, b.indices)
            for name in ("observations", "next_observations", "actions", "rewards", "dones", "weights"):
                np.testing.assert_array_equal(getattr(a, name).numpy(), getattr(b, name).numpy(), err_msg=name)
    assert staged.pos == checked.pos and staged.full == checked.full and staged.size() == checked.size()
    for name in ("observations", "actions", "rewards", "dones", "timeouts"):
        np.testing.assert_array_equal(getattr(staged, name), getattr(checked, name), err_msg=name)
    if not options.get("optimize_memory_usage"):
        np.testing.assert_array_equal(staged.next_observations, checked.next_observations)
    # The stager took the usual rows; the float64 observations and rewards went to the checks.
    assert staged._stager.took >= 15 and staged._stager.refused >= 10


def usual_values(n_envs: int = 2) -> dict[str, Any]:
    """A row the stager of ``buffer()`` takes, as ``put``'s values (obs, next_obs, action, reward, done, flags)."""
    return dict(
        obs=np.ones((n_envs, 3), np.float32), next_obs=np.full((n_envs, 3), 2, np.float32),
        action=np.array([0, 2] * (n_envs // 2)), reward=np.ones(n_envs, np.float32), done=np.zeros(n_envs, bool),
        flags=[False, True] * (n_envs // 2),
    )  # fmt: skip


def buffer() -> PrioritizedReplayBuffer:
    return PrioritizedReplayBuffer(
        32, spaces.Box(-5, 5, (3,), np.float32), spaces.Discrete(3), device="cpu", n_envs=2, seed=0
    )


REFUSED = [
    # (what, the value changed)
    ("action above n", dict(action=np.array([0, 3]))),
    ("negative action", dict(action=np.array([-1, 0]))),
    ("float action", dict(action=np.array([0.0, 1.0]))),
    ("uint64 action", dict(action=np.array([0, 1], np.uint64))),  # no safe cast into int64
    ("obs of one env", dict(obs=np.ones((1, 3), np.float32))),
    ("flat action", dict(action=np.array([[0, 1]]))),
    ("obs not contiguous", dict(obs=np.ones((2, 6), np.float32)[:, ::2])),
    ("obs big-endian", dict(obs=np.ones((2, 3), ">f4"))),
    ("obs float64", dict(obs=np.ones((2, 3), np.float64))),
    ("obs a list", dict(obs=[[1.0, 1.0, 1.0]] * 2)),
    ("obs a 0-d array", dict(obs=np.float32(1.0))),
    ("reward 2-D", dict(reward=np.ones((2, 1), np.float32))),
    ("done strings", dict(done=np.array(["a", "b"]))),
    ("flags numpy bools", dict(flags=[np.True_, False])),
    ("flags of one env", dict(flags=[False])),
    ("flags not a list", dict(flags=(False, False))),
]


@pytest.mark.parametrize("change", [c[1] for c in REFUSED], ids=[c[0] for c in REFUSED])
def test_a_row_the_stager_refuses_writes_nothing(change: dict[str, Any]) -> None:
    buf = buffer()
    stager = buf._stager
    assert stager.put(1, tuple(usual_values().values()))  # the usual row is taken: staging row 1 written
    before = {name: rows.copy() for name, rows in buf._staged.items()}
    assert not stager.put(1, tuple({**usual_values(), **change}.values()))
    assert not stager.put(0, tuple({**usual_values(), **change}.values()))
    for name, rows in buf._staged.items():
        np.testing.assert_array_equal(rows, before[name], err_msg=name)


def test_the_stager_writes_the_row_it_is_given() -> None:
    buf = buffer()
    values = usual_values()
    assert buf._stager.put(3, tuple(values.values()))
    np.testing.assert_array_equal(buf._staged["obs"][6:8], values["obs"])
    np.testing.assert_array_equal(buf._staged["next_obs"][6:8], values["next_obs"])
    np.testing.assert_array_equal(buf._staged["action"][6:8], [[0], [2]])
    np.testing.assert_array_equal(buf._staged["done"][6:8], [0.0, 0.0])
    np.testing.assert_array_equal(buf._staged["timeout"][6:8], [0.0, 1.0])
    assert not buf._staged["obs"][:6].any() and not buf._staged["obs"][8:].any()
    with pytest.raises(IndexError, match="staging row 256 out of range"):
        buf._stager.put(256, tuple(values.values()))
    with pytest.raises(ValueError, match="6 values expected, got 5"):
        buf._stager.put(0, tuple(values.values())[:5])
