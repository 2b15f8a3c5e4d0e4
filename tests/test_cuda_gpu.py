"""On a CUDA GPU: the cupy and torch backends against the NumPy reference, the fused
sample's distribution, device-resident input, pinned storage, and the all-GPU
training step. Every test skips cleanly where there is no GPU."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from hetero_replay.trees import make_tree
from hetero_replay.trees.cupy_tree import cuda_available
from tests.conftest import SCHEMA, make_batch
from tests.test_trees import assert_same_tree

pytestmark = pytest.mark.gpu

try:
    import torch

    TORCH_CUDA = torch.cuda.is_available()
except ImportError:  # torch is optional for the core
    TORCH_CUDA = False

needs_cupy = pytest.mark.skipif(not cuda_available(), reason="needs CuPy and a CUDA device (the 'cuda' extra)")
needs_torch_cuda = pytest.mark.skipif(not TORCH_CUDA, reason="needs a CUDA build of torch and a CUDA device")


def random_ops(capacity: int, seed: int):
    rng = np.random.default_rng(seed)
    for size in (1, 7, 300, 5000):
        idx = rng.integers(0, capacity, size)
        yield idx, rng.random(size) * rng.choice([0.0, 1e-3, 1.0, 1e4], size)


@needs_cupy
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("capacity, fanout", [(1, 2), (17, 16), (3000, 4), (100_003, 16), (100_003, 64)])
def test_cupy_backend_matches_reference(dtype, capacity, fanout):
    ref = make_tree("numpy", capacity, fanout, dtype)
    tree = make_tree("cupy", capacity, fanout, dtype, device="cuda")
    for step, (idx, val) in enumerate(random_ops(capacity, capacity)):
        ref.update(idx, val)
        tree.update(idx, val)
        if ref.total() > 0:
            assert_same_tree(ref, tree, step)
    leaves = np.random.default_rng(1).random(capacity)
    ref.load_leaves(leaves)
    tree.load_leaves(leaves)
    assert_same_tree(ref, tree, 9)


@needs_torch_cuda
@pytest.mark.parametrize("capacity, fanout", [(17, 16), (100_003, 16)])
def test_torch_backend_on_cuda_matches_reference(capacity, fanout):
    ref = make_tree("numpy", capacity, fanout)
    tree = make_tree("torch", capacity, fanout, device="cuda")
    for step, (idx, val) in enumerate(random_ops(capacity, 3)):
        ref.update(idx, val)
        tree.update(torch.from_numpy(idx).cuda(), torch.from_numpy(val).cuda())
        if ref.total() > 0:
            assert_same_tree(ref, tree, step)


@needs_cupy
def test_device_input_is_validated_on_the_device():
    import cupy

    tree = make_tree("cupy", 100, 16, device="cuda")
    tree.update(cupy.arange(100), cupy.ones(100))
    before = tree.leaves()
    with pytest.raises(IndexError, match="position 1 is 100"):
        tree.update(cupy.asarray([3, 100]), cupy.ones(2))
    with pytest.raises(ValueError, match="TD error at position 0 is nan"):
        tree.update_td(cupy.asarray([3, 4]), cupy.asarray([np.nan, 1.0]), 0.6, 1e-6)
    np.testing.assert_array_equal(tree.leaves(), before)
    assert tree.total() == 100.0
    assert tree.update_td(cupy.asarray([3, 3]), cupy.asarray([1.0, 2.0]), 1.0, 0.0) == 2.0
    assert tree.get([3])[0] == 2.0  # last write wins


@needs_cupy
@needs_torch_cuda
@pytest.mark.parametrize("stratified", [True, False])
def test_fused_sample_follows_the_priorities_and_gathers_the_rows(stratified):
    rng = np.random.default_rng(42)
    p = rng.random(60) ** 3
    p[[3, 17, 41]] = 0.0
    tree = make_tree("cupy", 60, 4, device="cuda")
    tree.update(np.arange(60), p)
    sources = {
        "obs": torch.randn(60, 5, device="cuda"),
        "tag": torch.randint(0, 9, (60, 3), dtype=torch.int8, device="cuda"),
    }
    counts = np.zeros(60)
    draws = np.random.default_rng(7)
    for _ in range(100):
        idx, w, rows = tree.sample_rows(1000, draws, 0.0, sources, stratified)
        for name, src in sources.items():
            assert torch.equal(rows[name], src[idx])
        counts += np.bincount(idx.cpu().numpy(), minlength=60)
    assert counts[[3, 17, 41]].sum() == 0
    keep = p > 0
    expected = p / p.sum() * counts.sum()
    assert stats.chisquare(counts[keep], expected[keep]).pvalue > 1e-3


@needs_torch_cuda
def test_pinned_storage_copies_to_the_gpu():
    from hetero_replay.storage import make_storage

    store = make_storage("pinned", 20, SCHEMA)
    store.write(0, store.validate(make_batch(20))[1])
    assert store.arrays["obs"].is_pinned()
    rows = store.gather(np.array([3, 1, 19]), device="cuda")
    torch.cuda.synchronize()
    assert rows["action"].device.type == "cuda" and rows["action"].tolist() == [3, 1, 19]


@needs_torch_cuda
@pytest.mark.parametrize("tree", ["torch", "cupy"])
def test_all_gpu_training_step_moves_only_the_uniforms(tree):
    if tree == "cupy" and not cuda_available():
        pytest.skip("needs CuPy")
    from hetero_replay import PrioritizedReplay
    from hetero_replay.placement import Placement, TransferCounter

    m = Placement(**{p: "cuda" for p in ("inference", "sample", "update", "train")}, storage="cuda", tree=tree)
    buf = PrioritizedReplay(1000, SCHEMA, seed=0, **m.replay_kwargs())
    buf.add(make_batch(800))
    net = torch.nn.Linear(3, 2).cuda()
    with TransferCounter() as counter:
        for _ in range(3):
            batch = buf.sample(64)
            assert all(t.is_cuda for t in [*batch.data.values(), batch.weights, batch.indices])
            q = net(batch.data["obs"]).gather(1, (batch.data["action"] % 2)[:, None])[:, 0]
            td = batch.data["reward"] - q
            (batch.weights * td.pow(2)).mean().backward()
            buf.update_priorities(batch.indices, td.abs().detach())
    # Host to device: only the uniforms (64 float64 per draw); device to host: only
    # the update's one read of the tree's scalars (the cupy tree does both outside torch).
    h2d = [size for src, _, size in counter.copies if src == "cpu"]
    d2h = [size for _, dst, size in counter.copies if dst == "cpu"]
    assert len(h2d) + len(d2h) == len(counter.copies)
    assert all(size == 64 * 8 for size in h2d) and all(size <= 5 * 8 for size in d2h)
    assert counter.scalar_reads == 0


@needs_torch_cuda
@pytest.mark.parametrize("placement", ["host-tree", "device-tree"])
def test_relaxed_pipeline_on_a_side_stream_serves_the_inline_batches(placement):
    """A CUDA learner: the worker draws and copies on a side stream; batches equal the inline schedule's."""
    from hetero_replay import PrioritizedReplay, RelaxedReplay

    kwargs = dict(device="cuda") if placement == "host-tree" else dict(tree="torch", tree_device="cuda", storage="cuda")

    def run(worker: str) -> list:
        buf = RelaxedReplay(PrioritizedReplay(4096, SCHEMA, seed=0, **kwargs), staleness=2, prefetch=2, worker=worker)
        buf.add(make_batch(3000))
        out = []
        for t in range(40):
            b = buf.sample(256, beta=0.5)
            assert b.weights.is_cuda and all(v.is_cuda for v in b.data.values())
            td = (b.weights * 0 + 1 + (t % 5)).float()  # computed on the learner's stream
            buf.update_priorities(b.indices, td)
            out.append((b.indices.cpu().numpy().copy(), b.weights.cpu().numpy().copy()))
        buf.flush()
        out.append((buf.priorities.leaves(), None))
        buf.close()
        return out

    inline = run("inline")
    # The native executor serves a host tree: pinned slots, copies on the side stream, TD errors copied back there.
    for worker in ("thread", "native") if placement == "host-tree" else ("thread",):
        for (i1, w1), (i2, w2) in zip(run(worker), inline, strict=True):
            np.testing.assert_array_equal(i1, i2)
            if w1 is not None:
                np.testing.assert_array_equal(w1, w2)
