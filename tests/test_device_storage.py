"""Torch storage (any device, pinned host) and the buffers that serve torch batches."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from hetero_replay import PrioritizedReplay  # noqa: E402
from hetero_replay.placement import TransferCounter  # noqa: E402
from hetero_replay.storage import HostStorage, make_storage  # noqa: E402
from hetero_replay.storage.torch_storage import TorchStorage  # noqa: E402
from tests.conftest import SCHEMA, make_batch  # noqa: E402

#: Every tree a torch-batch buffer can use here: the CPU backends, the torch
#: tree and the CUDA kernels run by their CPU executor.
TREES = [("numpy", None), ("native", None), ("torch", "cpu"), ("cupy", "cpu")]


def test_ring_write_and_gather_match_host_storage():
    host, dev = HostStorage(10, SCHEMA), TorchStorage(10, SCHEMA, "cpu")
    for store in (host, dev):
        for start, batch in ((0, make_batch(7)), (7, make_batch(5, start=7))):
            store.write(start, store.validate(batch)[1])
    idx = np.array([0, 1, 9, 4, 4])
    got, want = dev.gather(torch.from_numpy(idx)), host.gather(idx)
    for name in SCHEMA:
        assert got[name].dtype == torch.from_numpy(want[name]).dtype
        np.testing.assert_array_equal(got[name].numpy(), want[name])
    assert int(dev.arrays["action"][0]) == 10  # the ring wrapped over the oldest rows


def test_tensor_batches_are_accepted_and_cast():
    store = TorchStorage(8, SCHEMA, "cpu")
    batch = {k: torch.from_numpy(v) for k, v in make_batch(3).items()}
    batch["reward"] = batch["reward"].double()  # float64 -> float32 is the same kind
    rows, arrays = store.validate(batch)
    store.write(2, arrays)
    assert rows == 3 and store.arrays["reward"].dtype == torch.float32
    np.testing.assert_array_equal(store.export_rows(5)["action"], [0, 0, 0, 1, 2])


BAD_BATCHES = [
    (lambda b: b.pop("reward"), r"missing \['reward'\]"),
    (lambda b: b.update(extra=np.zeros(4)), r"unknown \['extra'\]"),
    (lambda b: b.update(obs=np.zeros((4, 5), np.float32)), r"field 'obs': expected shape \(n, 3\), got \(4, 5\)"),
    (lambda b: b.update(action=np.zeros(4, np.float32)), r"field 'action': dtype float32 does not cast to int64"),
    (lambda b: b.update(action=torch.zeros(4)), r"field 'action': dtype float32 does not cast to int64"),
    (lambda b: b.update(done=np.zeros(3, np.float32)), "field 'done' has 3 rows but 'obs' has 4"),
]


@pytest.mark.parametrize("mutate, match", BAD_BATCHES)
def test_bad_batches_give_the_host_storage_errors(mutate, match):
    batch = make_batch(4)
    mutate(batch)
    store = TorchStorage(10, SCHEMA, "cpu")
    with pytest.raises(ValueError, match=match):
        store.validate(batch)
    if not any(isinstance(v, torch.Tensor) for v in batch.values()):
        with pytest.raises(ValueError, match=match):
            HostStorage(10, SCHEMA).validate(batch)


def test_meta_device_storage_moves_nothing_when_indices_are_there():
    """On a device, a gather by indices that live there copies nothing between devices."""
    store = TorchStorage(1000, SCHEMA, "meta")
    with TransferCounter() as counter:
        rows = store.gather(torch.arange(32, device="meta"))
    assert counter.copies == [] and all(r.device.type == "meta" and r.shape[0] == 32 for r in rows.values())
    with TransferCounter() as counter:
        store.gather(torch.arange(32))
    assert counter.copies == [("cpu", "meta", 32 * 8)]  # indices from a host tree: one copy, the indices


def test_placements_and_their_errors():
    assert isinstance(make_storage("host", 4, SCHEMA), HostStorage)
    assert make_storage("cpu", 4, SCHEMA).device == torch.device("cpu")
    with pytest.raises(
        ValueError, match="storage must be 'host', 'pinned', 'shared', 'disk' or a torch device, got 'gpu'"
    ):
        make_storage("gpu", 4, SCHEMA)
    with pytest.raises(ValueError, match="pin_memory is for host storage"):
        TorchStorage(4, SCHEMA, "meta", pin_memory=True)
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="pinned host storage needs CUDA"):
            make_storage("pinned", 4, SCHEMA)


@pytest.mark.parametrize("tree, tree_device", TREES)
def test_torch_batches_equal_host_batches(tree, tree_device):
    """Any tree behind a torch-batch buffer: the same draws, rows and weights as the host buffer."""
    host = PrioritizedReplay(64, SCHEMA, tree="numpy", seed=9)
    dev = PrioritizedReplay(64, SCHEMA, tree=tree, seed=9, tree_device=tree_device, storage="cpu", device="cpu")
    assert dev.device is not None and host.device is None
    rng = np.random.default_rng(0)
    for buf in (host, dev):
        buf.add(make_batch(50))
    for _ in range(3):
        want, got = host.sample(16), dev.sample(16)
        assert isinstance(got.indices, torch.Tensor) and got.weights.device == dev.device
        np.testing.assert_array_equal(got.indices.numpy(), want.indices)
        np.testing.assert_allclose(got.weights.numpy(), want.weights, rtol=1e-6)
        for name in SCHEMA:
            np.testing.assert_array_equal(got.data[name].numpy(), want.data[name])
        td = rng.random(16)
        host.update_priorities(want.indices, td)
        dev.update_priorities(got.indices, torch.from_numpy(td))
    np.testing.assert_allclose(dev.tree.leaves(), host.tree.leaves(), rtol=1e-6)
    assert dev.max_priority == host.max_priority


@pytest.mark.parametrize("tree, tree_device", [("torch", "cpu"), ("native", None)])
def test_bad_tensor_td_errors_change_nothing(tree, tree_device):
    buf = PrioritizedReplay(20, SCHEMA, tree=tree, tree_device=tree_device, storage="cpu", seed=0)
    buf.add(make_batch(10))
    before, max_before = buf.tree.leaves(), buf.max_priority
    with pytest.raises(ValueError, match="TD error at position 1"):
        buf.update_priorities(torch.tensor([1, 2]), torch.tensor([1.0, float("nan")]))
    with pytest.raises(IndexError, match="position 0 is 10"):
        buf.update_priorities(torch.tensor([10, 2]), torch.tensor([1.0, 1.0]))
    np.testing.assert_array_equal(buf.tree.leaves(), before)
    assert buf.max_priority == max_before


def test_host_storage_with_a_device_learner_copies_the_batch_once():
    """Host tree and storage, learner elsewhere (meta here): each field and the weights cross once."""
    buf = PrioritizedReplay(50, SCHEMA, seed=0, device="meta")
    buf.add(make_batch(30))
    with TransferCounter() as counter:
        batch = buf.sample(8)
    assert all(t.device.type == "meta" for t in [*batch.data.values(), batch.weights])
    assert batch.indices.device.type == "cpu"  # indices stay with the tree, for update_priorities
    assert sorted(dst for _, dst, _ in counter.copies) == ["meta"] * (len(SCHEMA) + 1)


def test_state_and_pickle_keep_data_and_placement(tmp_path):
    import pickle

    buf = PrioritizedReplay(30, SCHEMA, tree="torch", tree_device="cpu", storage="cpu", seed=4)
    buf.add(make_batch(25))
    buf.update_priorities(torch.arange(5), torch.linspace(0, 2, 5))
    clone = pickle.loads(pickle.dumps(buf))
    assert clone.device is not None and isinstance(clone.storage, TorchStorage)
    path = tmp_path / "buf.hrz"
    buf.save(path)
    loaded = PrioritizedReplay.load(path, tree="torch", tree_device="cpu", storage="cpu")
    for other in (clone, loaded):
        np.testing.assert_array_equal(other.tree.leaves(), buf.tree.leaves())
        np.testing.assert_array_equal(other.storage.export_rows(25)["obs"], buf.storage.export_rows(25)["obs"])
    a, b = buf.sample(8), clone.sample(8)
    assert torch.equal(a.indices, b.indices)  # the generator state came along
    fresh = PrioritizedReplay(30, SCHEMA, storage="cpu")
    fresh.load_state_dict(buf.state_dict())
    assert fresh.device is not None and len(fresh) == 25
