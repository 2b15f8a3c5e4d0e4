"""PrioritizedHerReplayBuffer: SB3's HER rules with priorities on the stored transitions.

Semantics are checked against SB3's own ``HerReplayBuffer`` fed the same episodes: the same
episode bookkeeping (which transitions may be sampled, after the ring overwrote old episodes),
and, with uniform priorities, the same distribution of (transition, relabelled goal) pairs for
each goal-selection strategy, the same share of relabelled samples and the same rewards.
Transitions are tagged: the next achieved goal of transition ``k`` encodes ``k`` in binary
(``k >= 1``) and every stored desired goal is 0, a goal no transition achieves, so a sample's
transition and its relabelled goal can be read off the batch.
"""

from __future__ import annotations

import pickle
from collections import Counter

import numpy as np
import pytest
import torch as th

pytest.importorskip("stable_baselines3")

from stable_baselines3 import HerReplayBuffer  # noqa: E402
from stable_baselines3.common.envs import BitFlippingEnv  # noqa: E402
from stable_baselines3.common.vec_env import DummyVecEnv  # noqa: E402

from hetero_replay.adapters.sb3 import PERDQN, PrioritizedHerReplayBuffer  # noqa: E402

N_BITS = 10
BITS = 2 ** np.arange(N_BITS)


def goal_env() -> DummyVecEnv:
    """What SB3's algorithms hand a HER buffer: a VecEnv whose first env has ``compute_reward``."""
    return DummyVecEnv([lambda: BitFlippingEnv(n_bits=N_BITS)])


def code(k: int) -> np.ndarray:
    return ((k >> np.arange(N_BITS)) & 1).astype(np.int8)


def decode(bits: np.ndarray | th.Tensor) -> np.ndarray:
    return (np.asarray(bits).astype(np.int64) * BITS).sum(axis=-1)


def buffers(size: int, strategy: str = "future", **kwargs) -> tuple[HerReplayBuffer, PrioritizedHerReplayBuffer]:
    """SB3's buffer and ours, same arguments."""
    space, action = BitFlippingEnv(n_bits=N_BITS).observation_space, BitFlippingEnv(n_bits=N_BITS).action_space
    args = dict(n_sampled_goal=4, goal_selection_strategy=strategy, device="cpu")
    theirs = HerReplayBuffer(size, space, action, goal_env(), **args)
    ours = PrioritizedHerReplayBuffer(size, space, action, goal_env(), seed=0, **args, **kwargs)
    return theirs, ours


def fill(lengths: list[int], *bufs, first: int = 1, last_done: bool = True) -> int:
    """Add episodes of ``lengths`` (transition ``k`` tagged ``k``, from ``first``); returns the next tag.

    With ``last_done=False`` the last episode is left running.
    """
    k = first
    for e, length in enumerate(lengths):
        for t in range(length):
            obs = {"observation": code(k - 1), "achieved_goal": code(k - 1), "desired_goal": code(0)}
            nxt = {"observation": code(k), "achieved_goal": code(k), "desired_goal": code(0)}
            done = t == length - 1 and (last_done or e < len(lengths) - 1)
            for buf in bufs:
                buf.add(
                    {key: v[None] for key, v in obs.items()}, {key: v[None] for key, v in nxt.items()},
                    np.array([[t % N_BITS]]), np.array([-1.0]), np.array([done]), [{"tag": k}],
                )  # fmt: skip
            k += 1
    return k


def test_episode_bookkeeping_is_sb3s_through_ring_overwrites():
    theirs, ours = buffers(20)
    lengths = [3, 5, 4, 6, 2, 5, 7, 1, 4, 3, 6, 5]  # 51 transitions: the ring wraps twice, episodes across its end
    for n in range(1, len(lengths) + 1):
        ends = lengths[:n]
        t, o = buffers(20)
        fill(ends, t, o)
        np.testing.assert_array_equal(o.ep_length, t.ep_length)
        np.testing.assert_array_equal(o.ep_start, t.ep_start)
        # Sampled: exactly the transitions SB3 may sample (finished episodes, not partly overwritten).
        np.testing.assert_array_equal(o.priorities() > 0, t.ep_length > 0)
    # A running episode is not sampled until it ends.
    fill([4], theirs, ours, last_done=False)
    assert not (ours.priorities() > 0).any() and not (theirs.ep_length > 0).any()


def pairs(buf, batches: int, batch_size: int, seed: int) -> tuple[Counter, Counter, list[int]]:
    """(transition, goal) counts of relabelled samples, transition counts of real ones, relabelled per batch."""
    np.random.seed(seed)  # SB3's buffer draws from NumPy's global generator
    virtual, real, shares = Counter(), Counter(), []
    for _ in range(batches):
        s = buf.sample(batch_size)
        tags = decode(s.next_observations["achieved_goal"])
        goals = decode(s.observations["desired_goal"])
        np.testing.assert_array_equal(goals, decode(s.next_observations["desired_goal"]))
        relabelled = goals != 0
        # compute_reward: 0 where the new goal is this transition's own next achieved goal, else -1.
        expected = np.where(relabelled, -(goals != tags).astype(np.float32), -1.0)
        np.testing.assert_array_equal(s.rewards.numpy().reshape(-1), expected)
        virtual.update(zip(tags[relabelled].tolist(), goals[relabelled].tolist()))
        real.update(tags[~relabelled].tolist())
        shares.append(int(relabelled.sum()))
    return virtual, real, shares


def total_variation(a: Counter, b: Counter) -> float:
    na, nb = sum(a.values()), sum(b.values())
    return 0.5 * sum(abs(a[k] / na - b[k] / nb) for k in set(a) | set(b))


@pytest.mark.filterwarnings("ignore:.*without update_priorities")
@pytest.mark.parametrize("strategy", ["future", "final", "episode"])
def test_uniform_priorities_sample_as_sb3(strategy):
    theirs, ours = buffers(16, strategy)
    # Episodes 1-3, 4-8, 9-11, 12-15, 16-21 (it overwrites 1-3 and part of 4-8), a running one (22-23).
    fill([3, 5, 3, 4, 6, 2], theirs, ours, last_done=False)
    episodes = {k: e for e, ks in enumerate([(9, 12), (12, 16), (16, 22)]) for k in range(*ks)}
    last = {e: max(k for k in episodes if episodes[k] == e) for e in set(episodes.values())}
    ours_v, ours_r, ours_shares = pairs(ours, 300, 50, seed=1)
    sb3_v, sb3_r, sb3_shares = pairs(theirs, 300, 50, seed=1)
    # The same share of relabelled samples in every batch: int(her_ratio * batch_size).
    assert set(ours_shares) == set(sb3_shares) == {int((1 - 1 / 5) * 50)}
    # Real samples: only transitions of finished, intact episodes, uniformly.
    assert set(ours_r) == set(sb3_r) == set(episodes)
    for tag, goal in ours_v:
        assert goal in episodes and episodes[goal] == episodes[tag]
        if strategy == "future":
            assert goal >= tag
        elif strategy == "final":
            assert goal == last[episodes[tag]]
    assert set(ours_v) == set(sb3_v)  # the same goals are possible for each transition
    # Same joint distribution of (transition, goal): 12,000 draws each, ~40 pairs; sampling noise is ~0.03.
    assert total_variation(ours_v, sb3_v) < 0.07
    assert total_variation(ours_r, sb3_r) < 0.07


def test_priorities_follow_episodes_and_relabelled_samples_update_their_transition():
    _, buf = buffers(16, alpha=1.0)
    fill([4], buf)
    s = buf.sample(32)
    slots = np.asarray(s.indices)
    buf.update_priorities(slots, np.full(len(slots), 3.0))  # relabelled and real samples alike
    assert buf.max_priority == pytest.approx(3.0 + 1e-6)
    leaves = buf.priorities().reshape(-1)
    np.testing.assert_allclose(leaves[np.unique(slots)], 3.0 + 1e-6, rtol=1e-6)
    fill([3], buf, first=5, last_done=False)
    assert (buf.priorities().reshape(-1)[4:7] == 0).all()  # running: not sampled
    fill([1], buf, first=8)  # ... until it ends: then the max priority, as new transitions in PER
    np.testing.assert_allclose(buf.priorities().reshape(-1)[4:8], 3.0 + 1e-6, rtol=1e-6)
    # IS weights: (p_min / p_i) ** beta over the sampled (finished) transitions.
    buf.update_priorities(np.arange(8), np.arange(1.0, 9.0))
    s = buf.sample(64)
    p = buf.priorities().reshape(-1)
    expected = (p[p > 0].min() / p[np.asarray(s.indices)]) ** buf.beta
    np.testing.assert_allclose(s.weights.numpy().reshape(-1), expected, rtol=1e-5)


def test_an_update_after_its_episode_was_overwritten_keeps_it_out():
    _, buf = buffers(8, alpha=1.0)
    fill([4, 4], buf)
    s = buf.sample(16)
    fill([2], buf, first=9, last_done=False)  # overwrites rows 0-1: episode 1-4 leaves sampling
    buf.update_priorities(s.indices, np.ones(16))
    assert (buf.priorities().reshape(-1)[:4] == 0).all()


def test_seeded_buffers_sample_alike_and_pickle():
    a = buffers(32)[1]
    b = buffers(32)[1]
    fill([5, 7, 3], a, b)
    for _ in range(3):
        sa, sb = a.sample(16), b.sample(16)
        np.testing.assert_array_equal(np.asarray(sa.indices), np.asarray(sb.indices))
        np.testing.assert_array_equal(sa.observations["desired_goal"], sb.observations["desired_goal"])
    c = pickle.loads(pickle.dumps(a))
    assert c.env is None
    with pytest.raises(RuntimeError, match="set_env"):
        c.sample(8)
    c.set_env(goal_env())
    np.testing.assert_array_equal(a.sample(16).indices, c.sample(16).indices)
    with pytest.raises(ValueError, match="already"):
        c.set_env(goal_env())


def test_load_replay_buffer_truncates_the_running_episode(tmp_path):
    env = BitFlippingEnv(n_bits=N_BITS)
    kwargs = dict(replay_buffer_class=PrioritizedHerReplayBuffer, learning_starts=30, buffer_size=200, seed=0)
    model = PERDQN("MultiInputPolicy", env, **kwargs)
    model.learn(35)  # stops mid-episode (episodes are 10 steps)
    assert isinstance(model.replay_buffer, HerReplayBuffer)  # SB3 handed it its env
    model.save_replay_buffer(tmp_path / "buffer")
    fresh = PERDQN("MultiInputPolicy", env, **kwargs)
    with pytest.warns(UserWarning, match="truncated"):
        fresh.load_replay_buffer(tmp_path / "buffer")
    buf = fresh.replay_buffer
    assert buf.env is not None
    last = buf.pos - 1
    assert buf.ep_length[last, 0] > 0 and (buf.priorities()[: last + 1] > 0).all()  # the cut episode is sampled now
    assert buf.dones[last, 0] and buf.timeouts[last, 0]
    fresh.learn(20, reset_num_timesteps=False)
    del fresh.replay_buffer  # as SB3's own test_her.py does before loading
    fresh.load_replay_buffer(tmp_path / "buffer", truncate_last_traj=False)
    assert fresh.replay_buffer.ep_length[last, 0] == 0  # the episode runs on


def space():
    return BitFlippingEnv(n_bits=N_BITS).observation_space


@pytest.mark.parametrize(
    ("change", "error", "match"),
    [
        (dict(observation_space=BitFlippingEnv(n_bits=4).observation_space["observation"]), ValueError, "goal-cond"),
        (dict(env=BitFlippingEnv(n_bits=N_BITS)), TypeError, "env must be a VecEnv"),
        (dict(n_sampled_goal=-1), ValueError, "n_sampled_goal"),
        (dict(n_sampled_goal=2.5), TypeError, "n_sampled_goal"),
        (dict(goal_selection_strategy="bogus"), ValueError, "goal_selection_strategy"),
        (dict(goal_selection_strategy=1), TypeError, "goal_selection_strategy"),
        (dict(copy_info_dict="yes"), TypeError, "copy_info_dict"),
        (dict(staleness=1), ValueError, "staleness=1"),
        (dict(storage="disk"), ValueError, "storage='disk'"),
        (dict(distributed=dict(num_shards=2)), ValueError, "distributed"),
    ],
)
def test_bad_arguments_are_refused_before_anything_is_built(change, error, match):
    args = dict(buffer_size=16, observation_space=space(), action_space=BitFlippingEnv(n_bits=N_BITS).action_space)
    args.update({"env": goal_env(), **change})
    with pytest.raises(error, match=match):
        PrioritizedHerReplayBuffer(**args)


def test_goals_of_different_shapes_are_refused():
    from gymnasium import spaces

    odd = spaces.Dict({"observation": spaces.MultiBinary(3), "achieved_goal": spaces.MultiBinary(3),
                       "desired_goal": spaces.MultiBinary(4)})  # fmt: skip
    with pytest.raises(ValueError, match="one shape"):
        PrioritizedHerReplayBuffer(16, odd, spaces.Discrete(3), goal_env())


def test_bad_add_and_early_sample_change_nothing():
    _, buf = buffers(16)
    fill([3], buf, last_done=False)
    goal_state, draw_state = buf._goal_rng.bit_generator.state, buf.replay.rng.bit_generator.state
    before = (buf.pos, buf.ep_length.copy(), buf.ep_start.copy(), buf.priorities().copy(), buf._current_ep_start.copy())
    with pytest.raises(RuntimeError, match="end of the first episode"):
        buf.sample(8)
    obs = {"observation": code(0)[None], "achieved_goal": code(0)[None], "desired_goal": code(0)[None]}
    with pytest.raises(ValueError, match="done"):
        buf.add(obs, obs, np.array([[0]]), np.array([0.0]), np.array([True, True]), [{}])
    with pytest.raises(ValueError, match="batch_size"):
        buf.sample(0)
    after = (buf.pos, buf.ep_length, buf.ep_start, buf.priorities(), buf._current_ep_start)
    for x, y in zip(before, after):
        np.testing.assert_array_equal(x, y)
    assert buf._goal_rng.bit_generator.state == goal_state
    assert buf.replay.rng.bit_generator.state == draw_state


def test_episode_bookkeeping_with_several_envs_is_sb3s():
    space, action = BitFlippingEnv(n_bits=N_BITS).observation_space, BitFlippingEnv(n_bits=N_BITS).action_space
    theirs = HerReplayBuffer(12, space, action, goal_env(), device="cpu", n_envs=2)
    ours = PrioritizedHerReplayBuffer(12, space, action, goal_env(), device="cpu", n_envs=2, seed=0)
    rng = np.random.default_rng(0)
    for k in range(40):  # the ring wraps three times; each env ends its episodes at its own steps
        obs = {key: np.stack([code(2 * k), code(2 * k + 1)]) for key in space.spaces}
        done = rng.random(2) < 0.3
        for buf in (theirs, ours):
            buf.add(obs, obs, np.array([[0], [1]]), np.zeros(2), done, [{}, {}])
        np.testing.assert_array_equal(ours.ep_length, theirs.ep_length)
        np.testing.assert_array_equal(ours.priorities() > 0, theirs.ep_length > 0)


# -- learning ------------------------------------------------------------------------------------------

#: PERDQN + HER on BitFlippingEnv(n_bits=10): a goal of 10 random bits, 10 steps, reward -1 until it is
#: reached. A random policy succeeds in ~0.1% of episodes; DQN without HER does not learn it in this budget.
#: With HER, seeds 0-3 first evaluated at a success rate >= 0.6 after 1,750-2,250 steps (and uniform HER,
#: SB3's buffer, after 1,250-2,000): the threshold 0.5 within 5,000 steps leaves a margin of 2x.
HER_KWARGS = dict(
    learning_starts=200, buffer_size=100_000, learning_rate=1e-3, batch_size=64, train_freq=1, gradient_steps=1,
    exploration_fraction=0.2, exploration_final_eps=0.05, target_update_interval=250, gamma=0.95,
    policy_kwargs=dict(net_arch=[64, 64]),
)  # fmt: skip
HER_SEEDS, HER_NEEDED, HER_THRESHOLD, HER_BUDGET, HER_EVAL_EVERY = (0, 1, 2), 2, 0.5, 5000, 500


def success_rate(model, seed: int, episodes: int = 20) -> float:
    env = BitFlippingEnv(n_bits=N_BITS)
    env.reset(seed=seed)
    wins = 0
    for _ in range(episodes):
        obs, _ = env.reset()
        done = False
        while not done:
            action, _ = model.predict(obs, deterministic=True)
            obs, _, terminated, truncated, info = env.step(action)
            done = terminated or truncated
        wins += bool(info["is_success"])
    return wins / episodes


@pytest.mark.learning
def test_perdqn_with_her_learns_bit_flipping():
    from stable_baselines3.common.callbacks import BaseCallback

    class StopAtThreshold(BaseCallback):
        reached: int | None = None

        def _on_step(self) -> bool:
            if self.num_timesteps % HER_EVAL_EVERY:
                return True
            if success_rate(self.model, seed=10_000 + self.num_timesteps) >= HER_THRESHOLD:
                self.reached = self.num_timesteps
            return self.reached is None

    th.set_num_threads(1)
    reached = {}
    for seed in HER_SEEDS:
        model = PERDQN(
            "MultiInputPolicy", BitFlippingEnv(n_bits=N_BITS), replay_buffer_class=PrioritizedHerReplayBuffer,
            replay_buffer_kwargs=dict(n_sampled_goal=4, goal_selection_strategy="future"), seed=seed, **HER_KWARGS,
        )  # fmt: skip
        stop = StopAtThreshold()
        model.learn(HER_BUDGET, callback=stop)
        reached[seed] = stop.reached
        # PER was live: beta annealed from its start, TD errors fed back as priorities.
        assert model.replay_buffer.beta > 0.4
        priorities = model.replay_buffer.priorities()
        assert len(np.unique(priorities[priorities > 0])) > 10
        if sum(r is not None for r in reached.values()) == HER_NEEDED:
            break
    assert sum(r is not None for r in reached.values()) >= HER_NEEDED, reached


@pytest.mark.filterwarnings("ignore:.*render_mode")  # make_vec_env asks BitFlippingEnv for rgb_array frames
def test_compare_runs_her_on_goal_envs():
    from hetero_replay.apps.compare import sb3_runs
    from hetero_replay.apps.compare.base import RunSpec

    for variant, buffer_class in [("uniform", HerReplayBuffer), ("per", PrioritizedHerReplayBuffer)]:
        model = sb3_runs._make_model(RunSpec("sb3", "dqn", "BitFlipping-v0", variant, 0, 1000, 500, 5, 1, 1))
        assert type(model.replay_buffer) is buffer_class
        assert model.replay_buffer.n_sampled_goal == 4


class InfoRewardEnv(BitFlippingEnv):
    """A goal env whose reward reads the info dicts: SB3's reward plus the transition's tag."""

    def compute_reward(self, achieved_goal, desired_goal, infos):
        return super().compute_reward(achieved_goal, desired_goal, infos) + np.array([i["tag"] for i in infos])


def test_copy_info_dict_hands_each_transition_its_info():
    space, action = BitFlippingEnv(n_bits=N_BITS).observation_space, BitFlippingEnv(n_bits=N_BITS).action_space
    env = DummyVecEnv([lambda: InfoRewardEnv(n_bits=N_BITS)])
    buf = PrioritizedHerReplayBuffer(32, space, action, env, device="cpu", copy_info_dict=True, seed=0)
    fill([5, 6], buf)
    s = buf.sample(64)
    tags, goals = decode(s.next_observations["achieved_goal"]), decode(s.observations["desired_goal"])
    relabelled = goals != 0
    expected = tags - (goals != tags)
    np.testing.assert_array_equal(s.rewards.numpy().reshape(-1)[relabelled], expected[relabelled])
    assert PrioritizedHerReplayBuffer(32, space, action, env, device="cpu").infos is None  # kept only when asked
