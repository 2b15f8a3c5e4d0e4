"""The relaxed pipeline (``staleness=k``) through the adapters and the compare app.

* SB3: ``PERMixin(staleness=k)`` builds a :class:`~hetero_replay.pipeline.RelaxedReplay`
  buffer, logs ``train/per_staleness`` and ``train/per_dropped_updates``, repeats
  exactly under a seed (``k = 0`` is the plain PER model bit for bit), refuses bad
  values, drops late updates of a wrapping buffer, survives
  ``save_replay_buffer``/``load_replay_buffer`` and ``save``/``load``, and stops
  its worker on ``reset``.
* Tianshou: ``PEROffPolicyWrapper(staleness=k)`` needs our buffers, holds each
  priority update back exactly ``k`` learner updates (checked against a strict
  twin), ``flush_priorities`` applies the rest, seeded runs repeat; the buffers'
  ``update_weight_since`` skips rewritten slots and refuses bad input.
* Compare app: ``build_specs(..., staleness=...)`` plans the sweep,
  ``staleness_study`` summarises synthetic results (needs ``rliable``), and
  ``hetero-replay compare --staleness`` refuses bad values before any training.

Training runs are real but tiny (a few hundred steps, small networks, one torch thread).
"""

from __future__ import annotations

import json
import threading
import time
from collections import defaultdict

import numpy as np
import pytest
import torch as th

pytest.importorskip("stable_baselines3")

from gymnasium import spaces  # noqa: E402
from stable_baselines3.common.logger import Logger  # noqa: E402

from hetero_replay.adapters.sb3 import PERDQN, PERSAC, PrioritizedReplayBuffer  # noqa: E402
from hetero_replay.apps.cli import main  # noqa: E402
from hetero_replay.apps.compare import driver  # noqa: E402
from hetero_replay.apps.compare.base import RunResult, RunSpec  # noqa: E402
from hetero_replay.pipeline import RelaxedReplay, _NativePipeline, _Pipeline  # noqa: E402

PIPELINE_THREAD = "hetero-replay-pipeline"


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


# -- SB3 ---------------------------------------------------------------------------------------

OBS = spaces.Box(-np.inf, np.inf, (4,), np.float32)
ACT = spaces.Discrete(2)


class RecordingLogger(Logger):
    """An SB3 logger that keeps every recorded value (``name_to_value`` is cleared at each dump)."""

    def __init__(self) -> None:
        super().__init__(folder=None, output_formats=[])
        self.history: dict[str, list] = defaultdict(list)

    def record(self, key, value, exclude=None) -> None:
        self.history[key].append(value)
        super().record(key, value, exclude)


def dqn(seed: int = 0, **kwargs) -> PERDQN:
    args = dict(learning_starts=50, train_freq=4, gradient_steps=4, batch_size=32, buffer_size=500,
                policy_kwargs=dict(net_arch=[32, 32]), seed=seed, device="cpu")  # fmt: skip
    return PERDQN("MlpPolicy", "CartPole-v1", **(args | kwargs))


def trained(steps: int = 400, **kwargs) -> PERDQN:
    model = dqn(**kwargs)
    model.learn(steps)
    return model


def assert_same_model(a: PERDQN, b: PERDQN) -> None:
    pa, pb = a.q_net.state_dict(), b.q_net.state_dict()
    assert pa.keys() == pb.keys()
    for name in pa:
        assert th.equal(pa[name], pb[name]), name
    np.testing.assert_array_equal(a.replay_buffer.priorities(), b.replay_buffer.priorities())


def test_perdqn_with_staleness_uses_a_relaxed_buffer_and_logs_it() -> None:
    model = dqn(staleness=2)
    logger = RecordingLogger()
    model.set_logger(logger)
    model.learn(400)
    replay = model.replay_buffer.replay
    assert isinstance(replay, RelaxedReplay) and replay.staleness == 2
    assert model.staleness == 2 and model.replay_buffer.staleness == 2
    staleness = logger.history["train/per_staleness"]
    dropped = logger.history["train/per_dropped_updates"]
    assert staleness and set(staleness) == {2}
    assert dropped and all(isinstance(d, int) and d >= 0 for d in dropped)
    assert dropped == sorted(dropped)  # a running count
    leaves = model.replay_buffer.priorities().reshape(-1)[: model.replay_buffer.size()]
    assert np.mean(leaves != 1.0) > 0.5  # the late updates did land


def test_seeded_relaxed_runs_repeat_and_staleness_zero_is_plain_per() -> None:
    # Each model is built and trained before the next: SB3 seeds the global generators at construction.
    a = trained(staleness=2)
    b = trained(staleness=2)
    assert_same_model(a, b)
    assert a.replay_buffer.dropped_updates == b.replay_buffer.dropped_updates

    strict, plain = trained(staleness=0), trained()
    assert not isinstance(strict.replay_buffer.replay, RelaxedReplay)
    assert_same_model(strict, plain)


@pytest.mark.parametrize(
    ("value", "error"),
    [(-1, ValueError), (2000, ValueError), (1.5, TypeError), (True, TypeError), ("1", TypeError)],
)
def test_perdqn_refuses_a_bad_staleness_naming_it(value, error: type) -> None:
    with pytest.raises(error, match="staleness"):
        dqn(staleness=value)
    with pytest.raises(error, match="staleness"):
        dqn(replay_buffer_kwargs=dict(staleness=value))


def test_staleness_in_replay_buffer_kwargs() -> None:
    with pytest.raises(ValueError, match="staleness"):
        dqn(staleness=2, replay_buffer_kwargs=dict(staleness=3))
    model = dqn(replay_buffer_kwargs=dict(staleness=3))
    assert model.staleness == 3
    assert isinstance(model.replay_buffer.replay, RelaxedReplay) and model.replay_buffer.replay.staleness == 3
    same = dqn(staleness=3, replay_buffer_kwargs=dict(staleness=3))  # agreeing twice is fine
    assert same.replay_buffer.replay.staleness == 3


@pytest.mark.parametrize(
    ("prefetch", "error"), [(0, ValueError), (-2, ValueError), (1.0, TypeError), (True, TypeError)]
)
def test_buffer_refuses_a_bad_prefetch_naming_it(prefetch, error: type) -> None:
    with pytest.raises(error, match="prefetch"):
        PrioritizedReplayBuffer(64, OBS, ACT, device="cpu", staleness=1, prefetch=prefetch)


def test_a_wrapping_relaxed_buffer_drops_late_updates() -> None:
    model = dqn(staleness=4, buffer_size=64, learning_starts=20)
    model.learn(400)  # the 64 rows are rewritten ~6 times
    buf = model.replay_buffer
    assert buf.full
    buf.flush()
    assert buf.dropped_updates > 0
    dropped = buf.dropped_updates
    buf.flush()  # nothing left to apply or drop
    assert buf.dropped_updates == dropped


def test_save_and_load_a_relaxed_replay_buffer_and_model(tmp_path) -> None:
    model = dqn(staleness=2)
    model.learn(300)
    model.save_replay_buffer(tmp_path / "buffer")
    saved = model.replay_buffer
    saved.flush()

    other = dqn(seed=1, staleness=2)
    other.load_replay_buffer(tmp_path / "buffer")
    loaded = other.replay_buffer
    assert loaded is not saved
    assert isinstance(loaded.replay, RelaxedReplay) and loaded.replay.staleness == 2
    np.testing.assert_array_equal(loaded.priorities(), saved.priorities())
    assert loaded.max_priority == saved.max_priority and loaded.pos == saved.pos
    other.learn(100, reset_num_timesteps=False)  # the loaded relaxed buffer keeps working
    assert loaded.size() == 400

    model.save(tmp_path / "model")
    restored = PERDQN.load(tmp_path / "model", device="cpu")
    assert restored.staleness == 2
    assert isinstance(restored.replay_buffer.replay, RelaxedReplay) and restored.replay_buffer.replay.staleness == 2


@pytest.mark.parametrize(("saved_k", "model_k"), [(2, 0), (0, 2)], ids=["relaxed-into-strict", "strict-into-relaxed"])
def test_loading_a_buffer_of_another_staleness_is_refused_or_logged_truthfully(tmp_path, saved_k, model_k) -> None:
    trained(steps=120, staleness=saved_k).save_replay_buffer(tmp_path / "buffer")
    model = dqn(staleness=model_k)
    try:
        model.load_replay_buffer(tmp_path / "buffer")
    except ValueError:
        return  # refused: consistent
    effective = model.replay_buffer.replay.staleness if isinstance(model.replay_buffer.replay, RelaxedReplay) else 0
    assert effective == saved_k
    logger = RecordingLogger()
    model.set_logger(logger)
    model.learn(60, reset_num_timesteps=False)
    assert set(logger.history["train/per_staleness"]) == {effective}


def test_memory_optimised_relaxed_buffer_keeps_the_next_row_unsampleable() -> None:
    model = dqn(staleness=3, buffer_size=64, learning_starts=20, optimize_memory_usage=True,
                replay_buffer_kwargs=dict(handle_timeout_termination=False))  # fmt: skip
    model.learn(300)
    buf = model.replay_buffer
    assert buf.full and isinstance(buf.replay, RelaxedReplay)
    buf.flush()
    leaves = buf.priorities().reshape(-1)
    assert leaves[buf.pos] == 0  # its next observation is not stored: late updates must not revive it
    assert np.count_nonzero(leaves == 0) == 1 and buf.dropped_updates > 0


def add_rows(buf: PrioritizedReplayBuffer, rows: int, start: int = 0) -> None:
    for r in range(start, start + rows):
        obs = np.full((1, 4), r, np.float32)
        buf.add(obs, obs + 1, np.array([r % 2]), np.array([1.0], np.float32), np.array([False]), [{}])


@pytest.mark.parametrize("native", [True, False], ids=["native-executor", "python-thread"])
def test_reset_stops_the_old_buffers_worker_and_leaves_an_empty_usable_buffer(native: bool) -> None:
    buf = PrioritizedReplayBuffer(64, OBS, ACT, device="cpu", seed=0, staleness=2)
    add_rows(buf, 40)
    core = buf.replay._core
    assert isinstance(core, _NativePipeline)  # worker="auto" on the C++ tree and host storage
    if native:
        core.wake = True  # as "auto" decides for jobs worth a hand-over: a running thread for reset to stop
    else:
        core.stop()
        core = buf.replay._core = _Pipeline(buf.replay.replay, buf.replay.schedule_options)
        core.mode, core.threaded = "thread", True  # the Python worker thread
    for _ in range(6):
        s = buf.sample(8)
        buf.update_priorities(s.indices, np.linspace(0.1, 2.0, 8))
    if native:
        assert core.executor.thread_alive

        def alive() -> bool:
            return bool(core.executor.thread_alive)
    else:
        old_thread = core.thread
        assert old_thread is not None and old_thread.name == PIPELINE_THREAD and old_thread.is_alive()

        def alive() -> bool:
            return old_thread.is_alive() or old_thread in threading.enumerate()

    buf.reset()
    deadline = time.monotonic() + 5.0
    while alive() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not alive()
    assert buf.size() == 0 and not buf.full and buf.pos == 0
    assert isinstance(buf.replay, RelaxedReplay) and buf.replay.staleness == 2 and buf.replay._core is not core

    add_rows(buf, 20, start=100)
    for _ in range(5):
        s = buf.sample(8)
        assert np.all(s.observations[:, 0].numpy() >= 100)  # only the new rows
        buf.update_priorities(s.indices, np.full(8, 3.0))
    buf.flush()
    leaves = buf.priorities().reshape(-1)
    assert np.all(leaves[20:] == 0) and np.any(leaves[:20] != 1.0)


def test_persac_with_staleness_one_trains() -> None:
    model = PERSAC("MlpPolicy", "Pendulum-v1", staleness=1, learning_starts=50, batch_size=32, buffer_size=1000,
                   policy_kwargs=dict(net_arch=[32, 32]), seed=0, device="cpu")  # fmt: skip
    model.learn(250)
    buf = model.replay_buffer
    assert isinstance(buf.replay, RelaxedReplay) and buf.replay.staleness == 1
    assert model.num_timesteps == 250 and buf.size() == 250
    leaves = buf.priorities().reshape(-1)[:250]
    assert np.mean(leaves != 1.0) > 0.5
    assert buf.dropped_updates == 0  # nothing wraps in 250 steps of a 1000-row buffer


# -- Tianshou ----------------------------------------------------------------------------------

BATCH = 32


def _tianshou():
    return pytest.importorskip("tianshou")


def ts_dqn():
    """A small seeded DQN, as tests/test_tianshou_wrapper.py builds it."""
    _tianshou()
    import gymnasium as gym
    from tianshou.algorithm import DQN
    from tianshou.algorithm.modelfree.dqn import DiscreteQLearningPolicy
    from tianshou.algorithm.optim import AdamOptimizerFactory
    from tianshou.utils.net.common import Net

    th.manual_seed(0)
    env = gym.make("CartPole-v1")
    policy = DiscreteQLearningPolicy(model=Net(state_shape=(4,), action_shape=2, hidden_sizes=[16]),
                                     action_space=env.action_space, eps_training=0.5)  # fmt: skip
    return DQN(policy=policy, optim=AdamOptimizerFactory(lr=1e-3), target_update_freq=10)


def ts_collector(algorithm, buf):
    import gymnasium as gym
    from tianshou.data import Collector
    from tianshou.env import DummyVectorEnv

    envs = DummyVectorEnv([lambda: gym.make("CartPole-v1") for _ in range(2)])
    envs.seed(0)
    collector = Collector(algorithm, envs, buf)
    collector.reset()
    return collector


def ts_filled(algorithm, buf=None, steps: int = 200):
    """``buf`` (default: ours, 2 envs) with random transitions, priorities spread out; and its collector."""
    from hetero_replay.adapters.tianshou import HeteroPrioritizedVectorReplayBuffer

    buf = buf if buf is not None else HeteroPrioritizedVectorReplayBuffer(1000, 2, random_seed=0)
    collector = ts_collector(algorithm, buf)
    collector.collect(n_step=steps, random=True)
    if hasattr(buf, "update_weight"):
        stored = np.sort(buf.sample_indices(0))
        buf.update_weight(stored, np.random.default_rng(0).exponential(1.0, len(stored)))
    return buf, collector


def ts_update(algorithm, buf, torch_seed: int = 7):
    from tianshou.utils.torch_utils import policy_within_training_step

    th.manual_seed(torch_seed)
    with policy_within_training_step(algorithm.policy):
        return algorithm.update(buffer=buf, sample_size=BATCH)


def wrapper(staleness: int = 2):
    from hetero_replay.adapters.tianshou import PEROffPolicyWrapper

    return PEROffPolicyWrapper(wrapped_algorithm=ts_dqn(), beta=0.4, staleness=staleness)


def test_tianshou_staleness_needs_our_buffers_and_a_valid_value() -> None:
    _tianshou()
    from tianshou.data import PrioritizedVectorReplayBuffer

    from hetero_replay.adapters.tianshou import PEROffPolicyWrapper

    algorithm = wrapper(2)
    buf, _ = ts_filled(algorithm, PrioritizedVectorReplayBuffer(1000, 2, alpha=0.6, beta=0.4))
    with pytest.raises(TypeError, match="HeteroPrioritizedReplayBuffer or HeteroPrioritizedVectorReplayBuffer"):
        ts_update(algorithm, buf)
    assert algorithm.num_updates == 0
    with pytest.raises(ValueError, match="staleness"):
        PEROffPolicyWrapper(wrapped_algorithm=ts_dqn(), beta=0.4, staleness=-1)
    with pytest.raises(TypeError, match="staleness"):
        PEROffPolicyWrapper(wrapped_algorithm=ts_dqn(), beta=0.4, staleness=1.5)


def test_tianshou_priority_updates_land_exactly_staleness_updates_late() -> None:
    _tianshou()
    strict = wrapper(0)
    strict_buf, _ = ts_filled(strict)
    ts_update(strict, strict_buf)
    after_one_strict_update = strict_buf.priority_tree.leaves()

    relaxed = wrapper(2)
    buf, _ = ts_filled(relaxed)
    initial = buf.priority_tree.leaves()
    assert not np.array_equal(initial, after_one_strict_update)
    applied = []
    since = buf.update_weight_since

    def spy(index, new_weight, epoch):
        applied.append(np.array(index, copy=True))
        return since(index, new_weight, epoch)

    buf.update_weight_since = spy
    for _ in range(3):  # updates 0, 1, 2 are held back
        ts_update(relaxed, buf)
        np.testing.assert_array_equal(buf.priority_tree.leaves(), initial)
    assert applied == []
    ts_update(relaxed, buf)  # update 3 samples after exactly update 0
    assert len(applied) == 1
    np.testing.assert_array_equal(buf.priority_tree.leaves(), after_one_strict_update)

    relaxed.flush_priorities(buf)  # updates 1, 2, 3
    assert len(applied) == 4
    flushed = buf.priority_tree.leaves()
    assert not np.array_equal(flushed, after_one_strict_update)
    relaxed.flush_priorities(buf)  # nothing left
    assert len(applied) == 4
    np.testing.assert_array_equal(buf.priority_tree.leaves(), flushed)
    assert relaxed.dropped_updates == 0  # no add in between: nothing rewritten


def relaxed_tianshou_run(updates: int = 12):
    """A seeded relaxed run on a small (wrapping) buffer, with collects between updates."""
    from hetero_replay.adapters.tianshou import HeteroPrioritizedVectorReplayBuffer

    algorithm = wrapper(2)
    buf, collector = ts_filled(algorithm, HeteroPrioritizedVectorReplayBuffer(100, 2, random_seed=0), steps=100)
    stats = []
    for _ in range(updates):
        stats.append(ts_update(algorithm, buf))
        collector.collect(n_step=10, random=True)
    algorithm.flush_priorities(buf)
    return algorithm, buf, stats


def test_tianshou_seeded_relaxed_runs_repeat_and_count_drops() -> None:
    _tianshou()
    a, buf_a, stats_a = relaxed_tianshou_run()
    b, buf_b, stats_b = relaxed_tianshou_run()
    np.testing.assert_array_equal(buf_a.priority_tree.leaves(), buf_b.priority_tree.leaves())
    assert buf_a.max_priority == buf_b.max_priority
    for pa, pb in zip(a.parameters(), b.parameters(), strict=True):
        assert th.equal(pa, pb)
    assert a.dropped_updates == b.dropped_updates > 0  # 100 slots, 20 rewritten between updates
    # The staleness and the running count are the wrapper's; the trainer would average every stats field.
    assert a.staleness == 2 and not hasattr(stats_a[-1], "staleness") and not hasattr(stats_a[-1], "dropped_updates")


def wrapped_vector_buffer():
    """20 slots per env, 2 envs, all written once; priorities spread; then tracking; then 3 slots per env rewritten."""
    from tianshou.data import Batch

    from hetero_replay.adapters.tianshou import HeteroPrioritizedVectorReplayBuffer

    buf = HeteroPrioritizedVectorReplayBuffer(40, 2, random_seed=0)

    def add_step(step: int) -> None:
        k = 1000 * np.arange(2) + step
        obs = np.stack([k, k + 0.25, k + 0.5, k + 0.75], axis=-1).astype(np.float32)
        buf.add(Batch(obs=obs, act=k % 2, rew=k.astype(np.float64), terminated=np.zeros(2, bool),
                      truncated=np.zeros(2, bool), obs_next=obs + 0.5, info=Batch(k=k)),
                buffer_ids=np.arange(2))  # fmt: skip

    for step in range(20):
        add_step(step)
    buf.update_weight(np.arange(40), np.linspace(0.1, 3.0, 40))
    epoch = buf.track_writes()
    for step in range(20, 23):
        add_step(step)  # rewrites slots 0, 1, 2 and 20, 21, 22
    return buf, epoch


def test_update_weight_since_skips_rewritten_slots() -> None:
    _tianshou()
    buf, epoch = wrapped_vector_buffer()
    assert buf.write_epoch > epoch
    rewritten = np.array([0, 1, 2, 20, 21, 22])
    fresh = buf.priority_tree.get(rewritten).copy()  # what new transitions get
    np.testing.assert_allclose(fresh, fresh[0])
    index = np.array([0, 5, 21, 30, 2, 39])
    td = np.array([0.5, 0.7, -0.2, 1.1, 0.9, -0.3])
    assert buf.update_weight_since(index, td, epoch) == 3
    np.testing.assert_array_equal(buf.priority_tree.get(rewritten), fresh)
    kept = np.array([5, 30, 39])
    np.testing.assert_allclose(buf.priority_tree.get(kept), (np.abs(td[[1, 3, 5]]) + buf.eps) ** buf.alpha, rtol=1e-5)
    # torch TD errors take the same path
    assert buf.update_weight_since(np.array([1, 6]), th.tensor([2.0, 2.5], requires_grad=True), epoch) == 1
    assert buf.priority_tree.get(np.array([1]))[0] == fresh[0]
    # a batch sampled now: nothing was rewritten since, every entry lands
    assert buf.update_weight_since(np.array([0, 1]), np.array([0.4, 0.4]), buf.write_epoch) == 0
    np.testing.assert_allclose(buf.priority_tree.get(np.array([0, 1])), (0.4 + buf.eps) ** buf.alpha, rtol=1e-5)


@pytest.mark.parametrize("current", [False, True], ids=["stale-entries", "none-stale"])
def test_update_weight_since_refuses_bad_input_and_changes_nothing(current: bool) -> None:
    _tianshou()
    buf, epoch = wrapped_vector_buffer()
    at = buf.write_epoch if current else epoch
    before, max_before = buf.priority_tree.leaves(), buf.max_priority
    with pytest.raises(ValueError, match="TD errors"):
        buf.update_weight_since(np.array([0, 5, 21]), np.array([1.0, 2.0]), at)
    with pytest.raises(TypeError, match="1-D"):
        buf.update_weight_since(np.array([[0, 5], [21, 30]]), np.ones(4), at)
    np.testing.assert_array_equal(buf.priority_tree.leaves(), before)
    assert buf.max_priority == max_before


# -- the compare app ---------------------------------------------------------------------------


def test_build_specs_sweeps_the_staleness_of_the_per_variant_only() -> None:
    specs = driver.build_specs("sb3", "dqn", "CartPole-v1", 1000, seeds=[0, 1], variants=["uniform", "per"],
                               staleness=[0, 2])  # fmt: skip
    assert len(specs) == 6
    for seed in (0, 1):
        runs = [s for s in specs if s.seed == seed]
        assert [(s.variant, s.staleness) for s in runs if s.variant == "uniform"] == [("uniform", None)]
        assert sorted(s.staleness for s in runs if s.variant == "per") == [0, 2]
    assert {s.label for s in specs} == {"uniform", "per k=0", "per k=2"}
    assert [s.label for s in specs[:3]] == ["uniform", "per k=0", "per k=2"]
    assert [s.label for s in specs[3:]] == ["per k=2", "per k=0", "uniform"]  # alternating order
    twice = driver.build_specs("sb3", "dqn", "CartPole-v1", 1000, seeds=[0], variants=["per"], staleness=[2, 2])
    assert [s.label for s in twice] == ["per k=2"]


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        (dict(staleness=[-1]), ValueError, "staleness"),
        (dict(staleness=[2000]), ValueError, "staleness"),
        (dict(staleness=[1.5]), TypeError, "staleness"),
        (dict(staleness=[2], variants=["uniform"]), ValueError, "--staleness"),
        (dict(staleness=[]), ValueError, "--staleness"),
    ],
)
def test_build_specs_refuses_a_bad_sweep(kwargs: dict, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        driver.build_specs("sb3", "dqn", "CartPole-v1", 1000, seeds=[0], **kwargs)


def study_results(low_k: int = 4) -> list[RunResult]:
    """Runs of k in {0, 1, 4} (5 seeds each) and one uniform baseline: k = 1 equals k = 0, ``low_k`` is far worse."""
    rng = np.random.default_rng(0)
    steps = [0, 500, 1000]
    good = [[10.0, 100.0 + 10 * rng.standard_normal(), 200.0 + 10 * rng.standard_normal()] for _ in range(5)]
    results = []
    for k in (0, 1, 4):
        for seed, curve in enumerate(good):
            returns = [r / 20 for r in curve] if k == low_k else curve
            spec = RunSpec("sb3", "dqn", "CartPole-v1", "per", seed, steps=1000, eval_every=500, staleness=k)
            results.append(RunResult(spec, wall_s=2.0, train_s=1.0, eval_steps=steps, eval_returns=list(returns)))
    uniform = RunSpec("sb3", "dqn", "CartPole-v1", "uniform", 0, steps=1000, eval_every=500)
    results.append(RunResult(uniform, wall_s=2.0, train_s=1.0, eval_steps=steps, eval_returns=[0.0, 0.0, 0.0]))
    return results


def test_staleness_study_summarises_and_writes(tmp_path) -> None:
    pytest.importorskip("rliable")
    pytest.importorskip("matplotlib")
    from hetero_replay.apps.compare import staleness_study

    results = study_results()
    rows = staleness_study.summarize(results)
    assert [r.staleness for r in rows] == [0, 1, 4]  # the uniform run is left out
    for r in rows:
        assert r.seeds == (0, 1, 2, 3, 4)
        for est in (r.auc, r.final_return):
            assert est.low <= est.iqm <= est.high
    by_k = {r.staleness: r for r in rows}
    assert by_k[0].within_noise_of_k0 and by_k[1].within_noise_of_k0
    assert by_k[1].auc.iqm == pytest.approx(by_k[0].auc.iqm)
    assert not by_k[4].within_noise_of_k0
    assert by_k[4].final_return.high < by_k[0].final_return.low
    assert staleness_study.summarize(results) == rows  # the bootstrap is seeded

    table = staleness_study.format_table(rows)
    body = table.splitlines()[2:]
    assert [line.split()[0] for line in body] == ["0", "1", "4"]
    assert body[2].split()[-1] == "no" and body[1].split()[-1] == "yes"

    paths = staleness_study.write(rows, results, str(tmp_path))
    assert sorted(p.rsplit("/", 1)[-1] for p in paths) == ["staleness.json", "staleness.png"]
    assert (tmp_path / "staleness.png").stat().st_size > 0
    saved = json.loads((tmp_path / "staleness.json").read_text())
    assert [row["staleness"] for row in saved] == [0, 1, 4]
    assert [row["within_noise_of_k0"] for row in saved] == [True, True, False]

    with pytest.raises(ValueError, match="no run has a staleness"):
        staleness_study.summarize([r for r in results if r.spec.staleness is None])


@pytest.mark.parametrize(
    "extra",
    [["--staleness", "x,1"], ["--staleness=-1"], ["--staleness", "1.5"], ["--staleness", "2", "--variants", "uniform"]],
    ids=["not-a-number", "negative", "fraction", "no-relaxable-variant"],
)
def test_cli_refuses_a_bad_staleness_without_training(monkeypatch, capsys, extra: list[str]) -> None:
    def no_training(*args, **kwargs):
        raise AssertionError("compare trained despite a bad --staleness")

    monkeypatch.setattr(driver, "run_specs", no_training)
    argv = ["compare", "--lib", "sb3", "--steps", "100", "--seeds", "1", "--no-progress", *extra]
    assert main(argv) == 2
    assert "hetero-replay compare:" in capsys.readouterr().err
