"""Placements in the Tianshou adapter: the tree placed by a ``Placement``, the learner moved to its device.

Tianshou keeps transitions in its own NumPy ``Batch``, so a placement places only
the priorities (the sum tree) and the learner; everything here runs on the CPU
with the torch tree standing in for a device tree.
"""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch

pytest.importorskip("tianshou")

import gymnasium as gym  # noqa: E402
from tianshou.data import Batch, Collector, CollectStats  # noqa: E402
from tianshou.env import DummyVectorEnv  # noqa: E402
from tianshou.trainer import OffPolicyTrainerParams  # noqa: E402

from hetero_replay.adapters.tianshou import (  # noqa: E402
    HeteroPrioritizedReplayBuffer,
    HeteroPrioritizedVectorReplayBuffer,
    LinearBetaSchedule,
    PEROffPolicyWrapper,
)
from hetero_replay.apps.compare.tianshou_runs import HYPERPARAMS, make_algorithm  # noqa: E402
from hetero_replay.placement import DeviceUnavailableError, Placement  # noqa: E402
from hetero_replay.trees.native_tree import NativeSumTree  # noqa: E402
from hetero_replay.trees.torch_tree import TorchSumTree  # noqa: E402

#: The torch tree on the CPU; transitions stay in Tianshou's storage on the host.
TORCH_TREE = Placement(tree="torch")


def obs_of(k: np.ndarray) -> np.ndarray:
    return np.stack([k, k + 0.25, k + 0.5, k + 0.75], axis=-1).astype(np.float32)


def filled(envs: int = 2, steps: int = 30, **kwargs) -> HeteroPrioritizedVectorReplayBuffer:
    """A vector buffer holding transitions ``k = 1000 * env + step``."""
    buf = HeteroPrioritizedVectorReplayBuffer(200, envs, random_seed=0, **kwargs)
    for step in range(steps):
        k = 1000 * np.arange(envs) + step
        batch = Batch(obs=obs_of(k), act=k % 2, rew=k.astype(np.float64), terminated=np.zeros(envs, bool),
                      truncated=np.zeros(envs, bool), obs_next=obs_of(k) + 0.5, info=Batch())  # fmt: skip
        buf.add(batch, buffer_ids=np.arange(envs))
    return buf


def test_dqn_run_with_a_torch_tree_mapping() -> None:
    torch.manual_seed(0)
    envs = DummyVectorEnv([lambda: gym.make("CartPole-v1") for _ in range(2)])
    envs.seed(0)
    algorithm = PEROffPolicyWrapper(
        wrapped_algorithm=make_algorithm("dqn", gym.make("CartPole-v1"), HYPERPARAMS["dqn"]),
        beta=LinearBetaSchedule(0.4, 1.0, 100),
        placement=TORCH_TREE,
    )
    buf = HeteroPrioritizedVectorReplayBuffer(5000, 2, random_seed=0, placement=TORCH_TREE)
    assert isinstance(buf.priority_tree, TorchSumTree) and buf.priority_tree.device == torch.device("cpu")
    assert algorithm.placement == buf.placement == TORCH_TREE
    assert all(p.device == torch.device("cpu") for p in algorithm.parameters())
    collector = Collector[CollectStats](algorithm, envs, buf, exploration_noise=True)
    collector.reset()
    collector.collect(n_step=100, random=True)
    algorithm.run_training(
        OffPolicyTrainerParams(
            training_collector=collector,
            test_collector=None,
            max_epochs=1,
            epoch_num_steps=200,
            collection_step_num_env_steps=4,
            update_step_num_gradient_steps_per_sample=0.5,
            batch_size=32,
            verbose=False,
            show_progress=False,
        )  # fmt: skip
    )
    assert algorithm.num_updates == 100
    stored = np.sort(buf.sample_indices(0))
    leaves = buf.priority_tree.leaves()
    assert np.all(leaves[stored] > 0) and len(np.unique(leaves[stored])) > 100  # TD errors were fed back
    loaded = pickle.loads(pickle.dumps(buf))  # keeps its placement
    assert isinstance(loaded.priority_tree, TorchSumTree) and loaded.placement == TORCH_TREE
    np.testing.assert_array_equal(loaded.priority_tree.leaves(), leaves)
    np.testing.assert_array_equal(loaded.sample_indices(16), buf.sample_indices(16))


def test_a_torch_tree_samples_what_the_native_tree_samples() -> None:
    native, mapped = filled(), filled(placement=TORCH_TREE)
    assert isinstance(native.priority_tree, NativeSumTree) and isinstance(mapped.priority_tree, TorchSumTree)
    stored = np.sort(native.sample_indices(0))
    td = np.random.default_rng(0).exponential(1.0, len(stored))
    native.update_weight(stored, td)
    mapped.update_weight(stored, torch.from_numpy(td))
    np.testing.assert_allclose(mapped.priority_tree.leaves(), native.priority_tree.leaves(), rtol=1e-6)
    (a, ia), (b, ib) = native.sample(32), mapped.sample(32)
    np.testing.assert_array_equal(ib, ia)
    np.testing.assert_allclose(b.weight, a.weight, rtol=1e-6)
    np.testing.assert_array_equal(b.obs, a.obs)


def test_td_errors_reach_a_device_tree_as_tensors(monkeypatch) -> None:
    buf = filled(placement=TORCH_TREE)
    _, indices = buf.sample(16)
    td = torch.linspace(-2.0, 2.0, 16)
    tree = buf.priority_tree
    received = []

    def spy(idx, td_errors, *args):
        received.append(td_errors)
        return TorchSumTree.update_td(tree, idx, td_errors, *args)

    monkeypatch.setattr(tree, "update_td", spy)
    buf.update_weight(indices, td)
    assert len(received) == 1 and isinstance(received[0], torch.Tensor)  # not converted to NumPy on the way
    last = dict(zip(indices.tolist(), td.abs().tolist(), strict=True))  # repeated indices: last write wins
    for i, v in last.items():
        assert tree.get(np.array([i]))[0] == pytest.approx((v + buf.eps) ** buf.alpha, rel=1e-5)


def test_bad_td_errors_to_a_device_tree_raise_and_change_nothing() -> None:
    buf = filled(placement=TORCH_TREE)
    before = buf.priority_tree.leaves()
    with pytest.raises(ValueError, match="TD error at position 1 is nan"):
        buf.update_weight(np.array([0, 1]), torch.tensor([1.0, float("nan")]))
    with pytest.raises(IndexError, match="holds no stored transition"):
        buf.update_weight(np.array([150]), torch.ones(1))  # an empty slot of the second sub-buffer
    np.testing.assert_array_equal(buf.priority_tree.leaves(), before)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        (dict(placement="torch"), TypeError, "placement must be a hetero_replay.placement.Placement, got str"),
        (dict(placement=TORCH_TREE, backend="numpy"), ValueError, "both choose the tree backend"),
        (dict(placement=Placement(storage="cpu")), ValueError, "storage must be 'host', got 'cpu'"),
    ],
)
def test_bad_buffer_mappings_raise_clear_errors(kwargs: dict, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        HeteroPrioritizedVectorReplayBuffer(100, 2, **kwargs)
    with pytest.raises(error, match=match):
        HeteroPrioritizedReplayBuffer(100, **kwargs)


def test_bad_wrapper_mappings_raise_clear_errors() -> None:
    dqn = make_algorithm("dqn", gym.make("CartPole-v1"), HYPERPARAMS["dqn"])
    with pytest.raises(TypeError, match="placement must be a hetero_replay.placement.Placement"):
        PEROffPolicyWrapper(wrapped_algorithm=dqn, beta=0.4, placement="cuda")
    with pytest.raises(
        ValueError, match="Tianshou acts and trains with one policy.*inference on 'cuda:0' and train on 'cpu'"
    ):
        PEROffPolicyWrapper(wrapped_algorithm=dqn, beta=0.4, placement=Placement(inference="cuda", check=False))


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the errors of a machine without CUDA")
def test_absent_cuda_is_reported_naming_the_primitive() -> None:
    tree_on_gpu = Placement(sample="cuda", update="cuda", check=False)
    with pytest.raises(DeviceUnavailableError, match="^sample: 'cuda:0' requested"):
        HeteroPrioritizedVectorReplayBuffer(100, 2, placement=tree_on_gpu)
    dqn = make_algorithm("dqn", gym.make("CartPole-v1"), HYPERPARAMS["dqn"])
    with pytest.raises(DeviceUnavailableError, match="^inference: 'cuda:0' requested"):
        PEROffPolicyWrapper(wrapped_algorithm=dqn, beta=0.4, placement=Placement.gpu(check=False))
