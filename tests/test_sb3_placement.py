"""Placements in the SB3 adapter: PER algorithms and buffers placed by a ``Placement``.

Everything runs on the CPU: the torch tree with torch storage stands in for
"tree, transitions and learner on one device". A training step must then hand
the core engine's tensors to the network untouched and the TD-error tensor to
the tree without leaving torch; the default placement must be today's buffer.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch as th
from gymnasium import spaces

pytest.importorskip("stable_baselines3")

from stable_baselines3 import DQN  # noqa: E402
from stable_baselines3.common.env_util import make_vec_env  # noqa: E402
from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize  # noqa: E402

from hetero_replay import PrioritizedReplay  # noqa: E402
from hetero_replay.adapters.sb3 import (  # noqa: E402
    PERDDPG,
    PERDQN,
    PERSAC,
    PERTD3,
    DictPrioritizedReplayBuffer,
    PrioritizedReplayBuffer,
)
from hetero_replay.placement import DeviceUnavailableError, Placement, TransferCounter  # noqa: E402
from hetero_replay.storage import HostStorage  # noqa: E402
from hetero_replay.storage.torch_storage import TorchStorage  # noqa: E402
from hetero_replay.trees.native_tree import NativeSumTree  # noqa: E402
from hetero_replay.trees.torch_tree import TorchSumTree  # noqa: E402

#: Tree, transitions and learner on one device (the CPU here).
ONE_DEVICE = Placement(storage="cpu", tree="torch")

OBS = spaces.Box(-np.inf, np.inf, (4,), np.float32)
ACT = spaces.Discrete(2)


def small(**kwargs) -> dict:
    """Small networks and a fixed seed; a fresh dict each time (SB3 edits policy_kwargs in place)."""
    return dict(policy_kwargs=dict(net_arch=[32, 32]), seed=0, **kwargs)


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


def assert_one_device_placement(model) -> None:
    """The model and its buffer are placed as ``ONE_DEVICE`` says."""
    buf = model.replay_buffer
    assert model.placement == buf.placement == ONE_DEVICE and model.device == th.device("cpu")
    core = buf.replay
    assert core.device is not None and core.device == th.device("cpu")
    assert isinstance(core.tree, TorchSumTree) and core.tree.device == th.device("cpu")
    assert isinstance(core.storage, TorchStorage) and core.storage.device == th.device("cpu")


def assert_prioritized(model) -> None:
    buf = model.replay_buffer
    filled = buf.priorities().reshape(-1)[: buf.size() * buf.n_envs]
    assert filled.std() > 0 and np.mean(filled != 1.0) > 0.5  # most priorities moved off 1
    assert buf.max_priority > 0


# -- the PER algorithms with a placement ------------------------------------------------------------


def test_perdqn_with_a_torch_tree_mapping_trains_and_prioritizes() -> None:
    model = PERDQN("MlpPolicy", "CartPole-v1", placement=ONE_DEVICE, learning_starts=50, batch_size=32, **small())
    assert_one_device_placement(model)
    model.learn(300)
    assert_prioritized(model)
    assert 0.9 < model.replay_buffer.beta <= 1.0  # annealed as without a placement


@pytest.mark.parametrize("algo", [PERDDPG, PERTD3, PERSAC])
def test_continuous_algorithms_take_a_mapping(algo) -> None:
    model = algo("MlpPolicy", "Pendulum-v1", placement=ONE_DEVICE, learning_starts=50, batch_size=32, **small())
    assert_one_device_placement(model)
    model.learn(150)
    assert_prioritized(model)


def test_a_training_step_moves_nothing_the_mapping_does_not_declare(monkeypatch) -> None:
    """Tree, storage and learner on one device: no transition or priority is copied.

    The batch the network reads is the core engine's own tensors (no ``to_torch``
    copy), the TD errors reach the tree without leaving torch (``Tensor.numpy``
    is never called), nothing crosses devices (``transfers()`` declares nothing
    for this placement), and the only host data entering torch are the uniforms
    of the draws, drawn by the buffer's seeded NumPy generator.
    """
    model = PERDQN("MlpPolicy", "CartPole-v1", placement=ONE_DEVICE, learning_starts=50, batch_size=16, **small())
    model.learn(200)
    buf = model.replay_buffer
    core = buf.replay  # also commits the rows staged by the last collection
    handed_out = []

    def record(batch_size: int, beta: float | None = None):
        batch = PrioritizedReplay.sample(core, batch_size, beta)
        handed_out.append(batch)
        return batch

    received = []

    def spy(batch_size: int, env=None):
        samples = PrioritizedReplayBuffer.sample(buf, batch_size, env)
        received.append(samples)
        return samples

    monkeypatch.setattr(core, "sample", record)
    monkeypatch.setattr(buf, "sample", spy)
    before = buf.priorities().copy()

    def no_numpy(self):
        raise AssertionError("a training step left torch for NumPy")

    monkeypatch.setattr(th.Tensor, "numpy", no_numpy)
    with TransferCounter() as moved:
        model.train(gradient_steps=3, batch_size=16)
    monkeypatch.undo()

    assert ONE_DEVICE.transfers() == () and moved.copies == []
    assert moved.host_inputs == [(th.float64, (16,))] * 3  # the uniforms, nothing else
    assert len(handed_out) == len(received) == 3
    for core_batch, samples in zip(handed_out, received, strict=True):
        assert samples.observations is core_batch.data["obs"]
        assert samples.next_observations is core_batch.data["next_obs"]
        assert samples.actions is core_batch.data["action"]
        assert samples.indices is core_batch.indices
        assert samples.weights.data_ptr() == core_batch.weights.data_ptr()  # a view, not a copy
    assert not np.array_equal(buf.priorities(), before)


def test_the_default_mapping_feeds_host_batches_to_torch() -> None:
    """The counter above would see copies: with host storage, sampled transitions enter torch each step."""
    model = PERDQN("MlpPolicy", "CartPole-v1", placement=Placement.cpu(), learning_starts=50, batch_size=16, **small())
    model.learn(200)
    core = model.replay_buffer.replay  # also commits the staged rows
    assert type(core) is PrioritizedReplay
    with TransferCounter() as moved:
        model.train(gradient_steps=1, batch_size=16)
    assert (th.float32, (16, 4)) in moved.host_inputs  # observations, from NumPy


def test_the_default_mapping_is_the_buffer_without_one() -> None:
    runs = []
    for kwargs in (dict(), dict(placement=Placement.cpu())):
        model = PERDQN("MlpPolicy", "CartPole-v1", learning_starts=50, batch_size=16, **small(**kwargs))
        core = model.replay_buffer.replay
        assert type(core) is PrioritizedReplay
        assert isinstance(core.tree, NativeSumTree) and isinstance(core.storage, HostStorage)
        model.learn(200)
        runs.append(model)
    plain, mapped = runs
    np.testing.assert_array_equal(mapped.replay_buffer.priorities(), plain.replay_buffer.priorities())
    a, b = plain.replay_buffer.sample(32), mapped.replay_buffer.sample(32)
    assert isinstance(b.indices, np.ndarray)
    np.testing.assert_array_equal(b.indices, a.indices)
    np.testing.assert_array_equal(b.observations.numpy(), a.observations.numpy())


def test_a_mapping_in_replay_buffer_kwargs_means_the_same() -> None:
    model = PERDQN("MlpPolicy", "CartPole-v1", replay_buffer_kwargs=dict(placement=ONE_DEVICE, alpha=0.5), **small())
    assert_one_device_placement(model)
    assert model.replay_buffer.alpha == 0.5


def test_stock_dqn_takes_a_mapping_through_the_buffer_kwargs() -> None:
    model = DQN(
        "MlpPolicy", "CartPole-v1", learning_starts=50, replay_buffer_class=PrioritizedReplayBuffer,
        replay_buffer_kwargs=dict(placement=ONE_DEVICE), device="cpu", **small(),
    )  # fmt: skip
    model.learn(150)  # stock train(): no priority updates, but it samples from the mapped buffer
    assert model.replay_buffer.replay.device is not None
    assert model.replay_buffer.sample(8).observations.device == model.device


# -- bad placements -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        (
            dict(placement="cpu"),
            TypeError,
            "placement must be a hetero_replay.placement.Placement, 'auto' or None, got str",
        ),
        (
            dict(placement=Placement(inference="cuda", check=False)),
            ValueError,
            (
                "PERDQN acts and trains with one policy on one device, but the placement puts inference on "
                "'cuda:0' and train on 'cpu'"
            ),
        ),
        (dict(placement=ONE_DEVICE, device="meta"), ValueError, "device='meta' contradicts the placement"),
        (
            dict(placement=ONE_DEVICE, replay_buffer_kwargs=dict(placement=Placement.cpu())),
            ValueError,
            r"replay_buffer_kwargs\['placement'\].* differ",
        ),
        (dict(placement=ONE_DEVICE, replay_buffer_kwargs=dict(tree="numpy")), ValueError, "both choose the tree"),
    ],
)
def test_bad_mappings_raise_clear_errors(kwargs: dict, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        PERDQN("MlpPolicy", "CartPole-v1", **small(**kwargs))


@pytest.mark.skipif(th.cuda.is_available(), reason="checks the error of a machine without CUDA")
def test_absent_cuda_is_reported_at_model_construction_naming_the_primitive() -> None:
    # described, unchecked
    placement = Placement(sample="cuda", update="cuda", storage="cuda", tree="torch", check=False)
    with pytest.raises(DeviceUnavailableError, match="^sample: 'cuda:0' requested, but this machine has no CUDA"):
        PERDQN("MlpPolicy", "CartPole-v1", placement=placement, **small())
    with pytest.raises(DeviceUnavailableError, match="^sample: 'cuda:0' requested"):
        PrioritizedReplayBuffer(64, OBS, ACT, placement=placement)


@pytest.mark.skipif(th.cuda.is_available(), reason="checks the error of a machine without CUDA")
def test_absent_cuda_is_reported_when_loading_a_model_onto_a_gpu_mapping(tmp_path) -> None:
    PERDQN("MlpPolicy", "CartPole-v1", placement=ONE_DEVICE, **small()).save(tmp_path / "model")
    with pytest.raises(DeviceUnavailableError, match="^inference: 'cuda:0' requested"):
        PERDQN.load(tmp_path / "model", placement=Placement.gpu(check=False))


def test_the_buffer_rejects_a_device_other_than_the_learners() -> None:
    with pytest.raises(ValueError, match="device 'meta' is not the placement's learner device 'cpu'"):
        PrioritizedReplayBuffer(64, OBS, ACT, device="meta", placement=ONE_DEVICE)
    assert PrioritizedReplayBuffer(64, OBS, ACT, placement=ONE_DEVICE).device == th.device("cpu")  # "auto"


# -- save and load ------------------------------------------------------------------------------------


def test_save_and_load_model_keep_the_mapping(tmp_path) -> None:
    model = PERDQN("MlpPolicy", "CartPole-v1", placement=ONE_DEVICE, learning_starts=50, **small())
    model.learn(200)
    model.save(tmp_path / "model")
    loaded = PERDQN.load(tmp_path / "model", env=make_vec_env("CartPole-v1", seed=1))
    assert_one_device_placement(loaded)
    obs = np.random.default_rng(0).standard_normal((8, 4)).astype(np.float32)
    np.testing.assert_array_equal(loaded.predict(obs, deterministic=True)[0], model.predict(obs, deterministic=True)[0])
    loaded.learn(200)
    assert_prioritized(loaded)
    # load places a model anew when given another placement
    host = PERDQN.load(tmp_path / "model", env=make_vec_env("CartPole-v1", seed=1), placement=Placement.cpu())
    assert host.placement == Placement.cpu() and type(host.replay_buffer.replay) is PrioritizedReplay


def test_save_and_load_replay_buffer_keep_the_placement(tmp_path) -> None:
    model = PERDQN("MlpPolicy", "CartPole-v1", placement=ONE_DEVICE, learning_starts=50, **small())
    model.learn(200)
    model.save_replay_buffer(tmp_path / "buffer")
    other = PERDQN("MlpPolicy", "CartPole-v1", placement=ONE_DEVICE, learning_starts=50, **small())
    other.load_replay_buffer(tmp_path / "buffer")
    assert_one_device_placement(other)
    a, b = model.replay_buffer, other.replay_buffer
    np.testing.assert_array_equal(b.priorities(), a.priorities())
    assert th.equal(b.observations, a.observations) and b.max_priority == a.max_priority
    sa, sb = a.sample(16), b.sample(16)  # the same random state too
    assert th.equal(sa.indices, sb.indices) and th.equal(sa.observations, sb.observations)
    other.learn(100, reset_num_timesteps=False)
    assert other.replay_buffer.size() == 300


def test_a_buffer_delivering_to_another_device_is_refused_and_the_current_one_kept(tmp_path) -> None:
    model = PERDQN("MlpPolicy", "CartPole-v1", placement=ONE_DEVICE, learning_starts=50, **small())
    model.learn(60)
    buf = model.replay_buffer  # re-placed by hand: its batches would go to the "meta" device
    buf._replay = PrioritizedReplay.from_state_dict(
        buf.replay.state_dict(), tree="torch", tree_device="cpu", storage="cpu", device="meta"
    )
    model.save_replay_buffer(tmp_path / "buffer")
    other = PERDQN("MlpPolicy", "CartPole-v1", placement=ONE_DEVICE, **small())
    current = other.replay_buffer
    with pytest.raises(ValueError, match="the loaded buffer delivers batches to 'meta', but PERDQN trains on 'cpu'"):
        other.load_replay_buffer(tmp_path / "buffer")
    assert other.replay_buffer is current


# -- the buffer under a placement: the same batches as without one ------------------------------------------


def obs_of(k: np.ndarray) -> np.ndarray:
    return np.stack([k, k + 0.25, k + 0.5, k + 0.75], axis=-1).astype(np.float32)


def fill(buf: PrioritizedReplayBuffer, rows: int) -> None:
    """Rows of transitions k = row * n_envs + env (next obs = obs(k) + 1000, or obs(k + n_envs))."""
    for row in range(rows):
        k = row * buf.n_envs + np.arange(buf.n_envs)
        nxt = obs_of(k + buf.n_envs) if buf.optimize_memory_usage else obs_of(k) + 1000
        infos = [{"TimeLimit.truncated": bool(t)} for t in k % 5 == 0]
        buf.add(obs_of(k), nxt, k % 2, k.astype(np.float32), k % 3 == 0, infos)


def twins(**kwargs) -> tuple[PrioritizedReplayBuffer, PrioritizedReplayBuffer]:
    """The same buffer without a placement and under ``ONE_DEVICE``, same seed."""
    return (
        PrioritizedReplayBuffer(64, OBS, ACT, device="cpu", seed=0, **kwargs),
        PrioritizedReplayBuffer(64, OBS, ACT, seed=0, placement=ONE_DEVICE, **kwargs),
    )


def assert_same_samples(host, mapped, env=None) -> None:
    a, b = host.sample(32, env=env), mapped.sample(32, env=env)
    assert isinstance(b.indices, th.Tensor)
    np.testing.assert_array_equal(b.indices.numpy(), a.indices)
    for name in ("observations", "actions", "next_observations", "dones", "rewards", "weights"):
        x, y = getattr(a, name), getattr(b, name)
        assert y.device == mapped.device and y.dtype == x.dtype and y.shape == x.shape, name
        np.testing.assert_allclose(y.numpy(), x.numpy(), rtol=1e-6, err_msg=name)


@pytest.mark.parametrize("kwargs", [dict(), dict(n_envs=2), dict(handle_timeout_termination=False)])
def test_a_mapped_buffer_samples_what_the_host_buffer_samples(kwargs: dict) -> None:
    host, mapped = twins(**kwargs)
    fill(host, 20), fill(mapped, 20)
    assert_same_samples(host, mapped)
    n = 20 * host.n_envs
    td = np.linspace(0.1, 5.0, n)
    host.update_priorities(np.arange(n), td)
    mapped.update_priorities(th.arange(n), th.from_numpy(td))
    np.testing.assert_allclose(mapped.priorities(), host.priorities(), rtol=1e-6)
    assert_same_samples(host, mapped)


def test_a_mapped_buffer_normalises_with_vec_normalize() -> None:
    import gymnasium as gym

    venv = VecNormalize(DummyVecEnv([lambda: gym.make("CartPole-v1")]), gamma=0.9)
    venv.obs_rms.mean[:] = 1.0
    venv.ret_rms.var = np.float64(4.0)
    host, mapped = twins()
    fill(host, 10), fill(mapped, 10)
    assert_same_samples(host, mapped, env=venv)


def test_a_mapped_buffer_with_optimize_memory_usage() -> None:
    host, mapped = twins(optimize_memory_usage=True, handle_timeout_termination=False)
    fill(host, 70), fill(mapped, 70)  # wraps around: the row at pos has no next observation yet
    assert mapped.full and mapped.pos == host.pos == 6
    assert_same_samples(host, mapped)
    s = mapped.sample(64)
    slot = s.indices.numpy()
    k = np.where(slot < mapped.pos, slot + 64, slot)  # rows 64..69 overwrote slots 0..5
    np.testing.assert_array_equal(s.observations.numpy(), obs_of(k))
    np.testing.assert_array_equal(s.next_observations.numpy(), obs_of(k + 1))
    mapped.update_priorities(th.arange(64), th.ones(64))  # slot pos stays unsampleable
    assert mapped.priorities()[mapped.pos, 0] == 0.0 and mapped.priorities()[mapped.pos - 1, 0] > 0


def test_a_mapped_dict_buffer() -> None:
    obs_space = spaces.Dict({"pos": spaces.Box(-1, 1, (2,), np.float32), "cell": spaces.Discrete(5)})
    buf = DictPrioritizedReplayBuffer(32, obs_space, spaces.Discrete(3), n_envs=2, seed=0, placement=ONE_DEVICE)
    for row in range(4):
        k = row * 2 + np.arange(2)
        obs = {"pos": np.stack([k, -k], 1) / 10, "cell": k % 5}
        buf.add(
            obs, {"pos": obs["pos"] + 0.05, "cell": (k + 1) % 5}, k % 3, k.astype(np.float32), np.zeros(2), [{}, {}]
        )
    s = buf.sample(16)
    k = s.indices.numpy()
    assert buf.replay.device is not None
    np.testing.assert_array_equal(s.next_observations["cell"].numpy()[:, 0], (k + 1) % 5)
    np.testing.assert_allclose(s.observations["pos"].numpy(), np.stack([k, -k], 1) / 10, rtol=1e-6)


def test_bad_updates_to_a_mapped_buffer_raise_and_change_nothing() -> None:
    buf = PrioritizedReplayBuffer(64, OBS, ACT, seed=0, placement=ONE_DEVICE)
    fill(buf, 10)
    before = buf.priorities().copy()
    with pytest.raises(ValueError, match="TD error at position 1 is nan"):
        buf.update_priorities(th.arange(3), th.tensor([1.0, float("nan"), 2.0]))
    with pytest.raises(IndexError, match="index at position 0 is 10"):
        buf.update_priorities(th.tensor([10]), th.ones(1))
    with pytest.raises(ValueError, match="3 indices but 2 TD errors"):
        buf.update_priorities(th.arange(3), th.ones(2))
    np.testing.assert_array_equal(buf.priorities(), before)
