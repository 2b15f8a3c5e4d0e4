"""The torch tree beyond the shared reference tests: its prefix sums, tensor input,
device-side validation, where results live, and what an update touches and reads.

(tests/test_trees.py runs the reference, sampling and bad-input tests on it too.)
"""

from __future__ import annotations

import pickle

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

from hetero_replay.placement import TransferCounter  # noqa: E402
from hetero_replay.trees import make_tree  # noqa: E402
from hetero_replay.trees.torch_tree import TorchSumTree, column_prefix, sequential_prefix  # noqa: E402
from tests.test_trees import assert_same_tree  # noqa: E402


@pytest.mark.parametrize("prefix", [sequential_prefix, column_prefix])
@pytest.mark.parametrize("k", [2, 16, 64])
def test_prefix_sums_are_left_to_right_like_numpy(prefix, k):
    """Both the CPU path (torch.cumsum) and the path other devices take add left to right."""
    rng = np.random.default_rng(k)
    x = rng.random((500, k)) * rng.choice([1e-9, 1.0, 1e9], (500, k))
    np.testing.assert_array_equal(prefix(torch.from_numpy(x)).numpy(), np.cumsum(x, axis=1))


def filled_pair(capacity: int = 1000, fanout: int = 8):
    rng = np.random.default_rng(1)
    ref, tree = make_tree("numpy", capacity, fanout), make_tree("torch", capacity, fanout)
    idx, val = rng.integers(0, capacity, 600), rng.random(600)
    ref.update(idx, val)
    tree.update(idx, val)
    return ref, tree


def test_tensor_input_matches_numpy_input():
    ref, tree = filled_pair()
    idx = torch.tensor([3, 999, 3, 17], dtype=torch.int32)
    val = torch.tensor([0.5, 2.0, 4.0, 0.0], dtype=torch.float64)
    ref.update(idx.numpy(), val.numpy())
    tree.update(idx, val)
    assert_same_tree(ref, tree, 0)
    td = torch.tensor([0.0, 1.5, 7.25, 2.0])
    expected = ref.update_td(idx.numpy(), td.numpy(), 0.6, 1e-6)
    assert tree.update_td(idx, td.requires_grad_(), 0.6, 1e-6) == expected
    np.testing.assert_allclose(tree.leaves(), ref.leaves(), rtol=1e-6)


T = torch.tensor
NAN = float("nan")


@pytest.mark.parametrize(
    "call, error, match",
    [
        (lambda t: t.update(T([0, 1000, 2]), torch.ones(3)), IndexError, r"position 1 is 1000, outside \[0, 1000\)"),
        (lambda t: t.update(T([0, 1, 2]), T([1.0, 1.0, NAN])), ValueError, "priority at position 2 is nan"),
        (lambda t: t.update(T([0, 1]), T([1e39, 1.0], dtype=torch.float64)), ValueError, "position 0 is inf"),
        (lambda t: t.update_td(T([0, 1]), T([1.0, -1.0]), 0.6, 1e-6), ValueError, "TD error at position 1 is -1.0"),
        (lambda t: t.update_td(T([5, 0]), T([1.0, 1.0]), 0.6, 1e-6, limit=5), IndexError, "position 0 is 5"),
        (lambda t: t.update(T([0.0, 1.0]), torch.ones(2)), TypeError, "integers"),
        (lambda t: t.update(T([0, 1]), torch.ones(3)), ValueError, "2 indices but 3 priorities"),
        (lambda t: t.update(T([[0, 1]]), torch.ones((1, 2))), ValueError, "1-D"),
    ],
)
def test_bad_tensor_input_changes_nothing(call, error, match):
    """Validated on the device: the write is masked, the error names the first bad position."""
    _, tree = filled_pair()
    before, total, minimum = tree.leaves(), tree.total(), tree.min()
    with pytest.raises(error, match=match):
        call(tree)
    np.testing.assert_array_equal(tree.leaves(), before)
    assert (tree.total(), tree.min()) == (total, minimum)
    fresh = make_tree("numpy", 1000, 8)
    fresh.load_leaves(before)
    assert_same_tree(fresh, tree, 1)  # every level, not only the leaves, is as it was


def test_sample_tensors_live_on_the_tree_device_and_follow_the_rng():
    ref, tree = filled_pair()
    idx, w = tree.sample_tensors(64, np.random.default_rng(5), 0.4)
    assert idx.dtype == torch.int64 and w.dtype == torch.float32 and idx.device == tree.device
    ref_idx, ref_w = ref.sample(64, np.random.default_rng(5), 0.4)
    np.testing.assert_array_equal(idx.numpy(), ref_idx)
    np.testing.assert_allclose(w.numpy(), ref_w, rtol=1e-6)
    # A seeded torch generator draws on the device: reproducible, a different stream.
    a = tree.sample_tensors(64, torch.Generator().manual_seed(3), 0.4)[0]
    b = tree.sample_tensors(64, torch.Generator().manual_seed(3), 0.4)[0]
    assert torch.equal(a, b) and not torch.equal(a, idx)
    with pytest.raises(TypeError, match="numpy.random.Generator or a torch.Generator"):
        tree.sample_tensors(4, 123, 0.4)


class _ElementCounter(TorchDispatchMode):
    """Counts the elements every tensor operation produces or, in place, writes."""

    def __init__(self) -> None:
        super().__init__()
        self.elements = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func.overloadpacket.__name__.endswith("_"):  # in place: returns all of self, writes its inputs' worth
            written = [a for a in args[1:] if isinstance(a, torch.Tensor)]
        else:
            written = [t for t in (out if isinstance(out, (tuple, list)) else [out]) if isinstance(t, torch.Tensor)]
        self.elements += sum(t.numel() for t in written)
        return out


def test_update_work_does_not_grow_with_capacity():
    """Only the touched parents are refreshed: no O(N) rebuild per update."""
    work = {}
    for capacity in (10_000, 1_000_000):
        tree = make_tree("torch", capacity, 16)
        idx = np.random.default_rng(0).integers(0, capacity, 256)
        with _ElementCounter() as counter:
            tree.update(idx, np.ones(256))
        work[capacity] = counter.elements
    # 100x the leaves costs two more levels, not 100x the work.
    assert work[1_000_000] < 2 * work[10_000] and work[1_000_000] < 1_000_000 // 4


def test_one_read_per_update_and_none_per_sample(monkeypatch):
    """An update ends with one device-to-host read (tolist of a few scalars); a draw needs none."""
    _, tree = filled_pair()
    reads = []
    original = torch.Tensor.tolist
    monkeypatch.setattr(torch.Tensor, "tolist", lambda self: reads.append(self.numel()) or original(self))
    with TransferCounter() as counter:
        tree.sample_tensors(32, torch.Generator().manual_seed(0), 0.4)
    assert reads == [] and counter.scalar_reads == 0
    with TransferCounter() as counter:
        tree.update_td(torch.tensor([1, 2, 1]), torch.tensor([0.5, 1.0, 2.0]), 0.6, 1e-6)
    assert reads == [5] and counter.scalar_reads == 0  # total, min, two flags, max(td + eps)


def test_device_option_and_pickling():
    tree = make_tree("torch", 50, 4, "float64", device="cpu")
    assert isinstance(tree, TorchSumTree) and tree.device == torch.device("cpu")
    assert tree.dtype == np.float64 and "device=cpu" in repr(tree)
    tree.update([1, 49], [0.25, 3.0])
    clone = pickle.loads(pickle.dumps(tree))
    assert clone.device == tree.device
    assert_same_tree(tree, clone, 0)


def test_make_tree_device_rules():
    assert isinstance(make_tree("auto", 10, device="meta"), TorchSumTree)  # no other backend runs there
    assert not isinstance(make_tree("auto", 10, device="cpu"), TorchSumTree)  # the C++ tree
    for backend in ("native", "numpy"):
        with pytest.raises(ValueError, match="runs on the CPU only"):
            make_tree(backend, 10, device="cuda")
