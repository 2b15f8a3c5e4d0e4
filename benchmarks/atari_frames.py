"""Real Atari frames for the compression tests and benchmark: ale-py's games with the standard preprocessing.

84x84 grayscale frames, 4 emulator frames per step (max-pooled), up to 30 no-ops at reset
(gymnasium's ``AtariPreprocessing``), a uniformly random policy. ale-py ships the ROMs, so
nothing is downloaded. ``python benchmarks/atari_frames.py`` rewrites ``tests/data/atari_frames.npz``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np

GAMES = ("Pong", "Breakout", "MsPacman", "Qbert")
TEST_DATA = Path(__file__).resolve().parents[1] / "tests" / "data" / "atari_frames.npz"
#: A DQN/Atari transition of 4-frame 84x84 stacks: what the compression tests and benchmark store.
SCHEMA = {
    "obs": ((4, 84, 84), "uint8"),
    "action": ((), "int64"),
    "reward": ((), "float32"),
    "next_obs": ((4, 84, 84), "uint8"),
    "done": ((), "float32"),
}


def play(game: str, steps: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``(frames, starts)``: ``steps + 1`` frames (uint8, 84x84) of ``game`` under a random policy.

    ``starts[i]`` is True where frame ``i`` is the first of an episode (a reset); an
    episode's last frame is followed by the next episode's first.
    """
    import ale_py
    import gymnasium as gym
    from gymnasium.wrappers import AtariPreprocessing

    gym.register_envs(ale_py)
    env = AtariPreprocessing(
        gym.make(f"ALE/{game}-v5", frameskip=1, repeat_action_probability=0.0), frame_skip=4, screen_size=84
    )
    rng = np.random.default_rng(seed)
    obs, _ = env.reset(seed=seed)
    frames, starts = [obs], [True]
    while len(frames) <= steps:
        obs, _, terminated, truncated, _ = env.step(int(rng.integers(env.action_space.n)))
        if terminated or truncated:
            obs, _ = env.reset()
        frames.append(obs)
        starts.append(bool(terminated or truncated))
    env.close()
    return np.stack(frames), np.array(starts)


def stacks(frames: np.ndarray, starts: np.ndarray, k: int = 4) -> np.ndarray:
    """``k``-frame stacks ``(n, k, 84, 84)`` of consecutive frames, oldest first, as gymnasium's
    ``FrameStackObservation`` builds them: before an episode's first frame, that frame repeated."""
    out = np.empty((len(frames), k, *frames.shape[1:]), frames.dtype)
    begin = 0
    for i in range(len(frames)):
        begin = i if starts[i] else begin
        for j in range(k):
            out[i, j] = frames[max(begin, i - (k - 1 - j))]
    return out


def transition_chunks(game: str, steps: int, seed: int = 0, chunk: int = 1000) -> Iterator[dict[str, np.ndarray]]:
    """``steps`` transitions of ``game`` under a random policy, in :data:`SCHEMA`, ``chunk`` rows at a time.

    Streamed from the emulator, so only one chunk's stacks are ever held (a million transitions' stacks
    would take 56 GB). The preprocessing is :func:`play`'s and the stacks are :func:`stacks`' (an
    episode's first frame repeated before it); ``action`` and ``reward`` are the played ones, ``done``
    is ``terminated or truncated``, and at an episode's end ``next_obs`` holds the real terminal frame
    (the next row's ``obs`` starts the next episode).
    """
    import ale_py
    import gymnasium as gym
    from gymnasium.wrappers import AtariPreprocessing

    gym.register_envs(ale_py)
    env = AtariPreprocessing(
        gym.make(f"ALE/{game}-v5", frameskip=1, repeat_action_probability=0.0), frame_skip=4, screen_size=84
    )
    rng = np.random.default_rng(seed)
    frame, _ = env.reset(seed=seed)
    stack = np.repeat(frame[None], 4, axis=0)
    done = 0
    try:
        while done < steps:
            n = min(chunk, steps - done)
            out = {name: np.empty((n, *shape), dtype) for name, (shape, dtype) in SCHEMA.items()}
            for i in range(n):
                action = int(rng.integers(env.action_space.n))
                frame, reward, terminated, truncated, _ = env.step(action)
                out["obs"][i] = stack
                stack = np.concatenate([stack[1:], frame[None]])
                out["next_obs"][i] = stack
                out["action"][i], out["reward"][i], out["done"][i] = action, reward, terminated or truncated
                if terminated or truncated:
                    frame, _ = env.reset()
                    stack = np.repeat(frame[None], 4, axis=0)
            done += n
            yield out
    finally:
        env.close()


def sample_transitions(games: tuple[str, ...] = ("Pong", "Breakout")) -> dict[str, np.ndarray]:
    """Transitions of ``games`` from the test sample (:data:`TEST_DATA`), back to back, in :data:`SCHEMA`.

    ``obs`` and ``next_obs`` are consecutive stacks; ``action`` is the row's id (its index), so a test
    can tell rows apart; rewards and done flags are random (seeded).
    """
    data = np.load(TEST_DATA)
    obs, nxt = [], []
    for game in games:
        s = stacks(data[f"{game}/frames"], data[f"{game}/starts"])
        obs.append(s[:-1])
        nxt.append(s[1:])
    n = sum(map(len, obs))
    rng = np.random.default_rng(0)
    return {
        "obs": np.concatenate(obs),
        "action": np.arange(n, dtype=np.int64),
        "reward": rng.normal(size=n).astype(np.float32),
        "next_obs": np.concatenate(nxt),
        "done": (rng.random(n) < 0.05).astype(np.float32),
    }


def main() -> None:
    """Write the tests' sample: 96 frames each of Pong and Breakout."""
    data = {}
    for game in ("Pong", "Breakout"):
        frames, starts = play(game, 95, seed=1)
        data[f"{game}/frames"], data[f"{game}/starts"] = frames, starts
    TEST_DATA.parent.mkdir(exist_ok=True)
    np.savez_compressed(TEST_DATA, **data)
    print(f"wrote {TEST_DATA} ({TEST_DATA.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
