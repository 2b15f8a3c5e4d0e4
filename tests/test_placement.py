"""Placement: validation against this machine, the arguments it produces, and a
training step that, with everything on one device, moves no transition or priority."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from hetero_replay import PrioritizedReplay  # noqa: E402
from hetero_replay.placement import (  # noqa: E402
    PRIMITIVES,
    DeviceUnavailableError,
    Placement,
    Transfer,
    TransferCounter,
    one_policy_placement,
)
from tests.conftest import SCHEMA, make_batch  # noqa: E402

no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the errors of a machine without CUDA")


def test_defaults_are_the_all_host_mapping():
    m = Placement.cpu()
    assert m == Placement() and m.learner_device == m.inference_device == "cpu"
    assert m.replay_kwargs() == {"tree": "native", "tree_device": None, "storage": "host", "device": None}
    assert m.transfers() == ()
    assert type(PrioritizedReplay(10, SCHEMA, **m.replay_kwargs())) is PrioritizedReplay


def test_torch_tree_on_the_cpu():
    m = Placement(storage="cpu", tree="torch")
    assert m.replay_kwargs() == {"tree": "torch", "tree_device": "cpu", "storage": "cpu", "device": "cpu"}
    buf = PrioritizedReplay(10, SCHEMA, **m.replay_kwargs())
    assert buf.device is not None and buf.tree.device == torch.device("cpu")


@no_cuda
@pytest.mark.parametrize(
    "kwargs, primitive",
    [
        (dict(inference="cuda"), "inference"),
        (dict(sample="cuda:1", update="cuda:1"), "sample"),
        (dict(train="cuda"), "train"),
        (dict(storage="cuda"), "storage"),
        (dict(storage="pinned"), "storage"),
        (dict(sample="cuda", update="cuda", tree="cupy"), "sample"),
    ],
)
def test_absent_cuda_is_an_error_naming_the_primitive(kwargs, primitive):
    with pytest.raises(DeviceUnavailableError, match=f"^{primitive}: 'cuda"):
        Placement(**kwargs)
    Placement(**kwargs, check=False)  # describing it for another machine is fine


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(sample="cuda", update="cpu"), "sample and update act on one sum tree"),
        (dict(train="gpu"), "train: device must be 'cpu', 'cuda'.* 'cuda:N'.*, got 'gpu'"),  # + plugins' devices
        (dict(storage="tpu"), "storage: device must be"),
        (dict(tree="asic"), "tree must be one of"),
        (dict(sample="cuda", update="cuda", tree="native"), "runs on the CPU only"),
        (dict(tree="cupy"), "runs on a CUDA device"),
    ],
)
def test_inconsistent_mappings(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Placement(**kwargs, check=False)


def test_device_names_and_backends_come_from_the_registry():
    """A plugin's device type is a device name; its backend a tree; "auto" finds it there (the toy plugin)."""
    m = Placement(sample="toyaccel", update="toyaccel:0", tree="auto")
    assert (m.sample, m.tree_backend) == ("toyaccel:0", "toy")
    assert m.replay_kwargs() == {"tree": "toy", "tree_device": "toyaccel:0", "storage": "host", "device": None}
    assert m.transfers() == (
        Transfer("uniforms", "cpu", "toyaccel:0"),
        Transfer("indices", "toyaccel:0", "cpu"),
        Transfer("weights", "toyaccel:0", "cpu"),
        Transfer("td errors", "cpu", "toyaccel:0"),
        Transfer("tree scalars", "toyaccel:0", "cpu"),
    )
    buf = PrioritizedReplay(10, SCHEMA, **m.replay_kwargs())
    assert type(buf.tree).__name__ == "ToySumTree"
    assert Placement(tree="toy").replay_kwargs()["tree_device"] == "cpu"  # the toy also runs on the CPU
    with pytest.raises(
        ValueError, match="tree backend 'toy' runs on the CPU or a 'toyaccel' device; sample/update are on 'cuda:0'"
    ):
        Placement(sample="cuda", update="cuda", tree="toy", check=False)
    with pytest.raises(
        ValueError, match="tree backend 'native' runs on the CPU only; sample/update are on 'toyaccel:1'"
    ):
        Placement(sample="toyaccel:1", update="toyaccel:1", tree="native")
    with pytest.raises(
        ValueError, match="storage must be 'host', 'pinned', 'shared', 'disk' or a torch device, got 'toyaccel:0'"
    ):
        Placement(storage="toyaccel")  # a device, but no storage keeps rows there


def test_gpu_mappings_described_without_a_gpu():
    gpu = Placement.gpu("cuda", check=False)
    assert gpu == Placement(**{p: "cuda:0" for p in PRIMITIVES}, storage="cuda:0", check=False)  # normalised
    assert gpu.transfers() == (Transfer("uniforms", "cpu", "cuda:0"), Transfer("tree scalars", "cuda:0", "cpu"))
    kwargs = gpu.replay_kwargs()
    assert kwargs["tree_device"] == kwargs["storage"] == kwargs["device"] == "cuda:0"
    assert kwargs["tree"] in ("cupy", "torch")
    hybrid = Placement.cpu_replay_gpu_learner(check=False)
    assert hybrid.replay_kwargs() == {"tree": "native", "tree_device": None, "storage": "pinned", "device": "cuda:0"}
    assert [t.what for t in hybrid.transfers()] == ["transitions", "weights", "td errors"]


def test_checked_checks_a_described_mapping_now():
    described = Placement(storage="cpu", tree="torch", check=False)
    checked = described.checked()
    assert checked == described and checked.check


@no_cuda
def test_checked_reports_an_absent_device_naming_the_primitive():
    with pytest.raises(DeviceUnavailableError, match="^train: 'cuda:0' requested"):
        Placement(train="cuda", check=False).checked()


def test_one_policy_placement_needs_inference_and_train_on_one_device():
    assert one_policy_placement(Placement(tree="torch", check=False), "SB3").check
    with pytest.raises(TypeError, match="placement must be a hetero_replay.placement.Placement, got dict"):
        one_policy_placement({"train": "cpu"}, "SB3")
    with pytest.raises(
        ValueError, match="^SB3 acts and trains with one policy.*inference on 'cpu' and train on 'cuda:1'"
    ):
        one_policy_placement(Placement(train="cuda:1", check=False), "SB3")


def test_transfer_counter_sees_copies_host_inputs_and_scalar_reads():
    with TransferCounter() as counter:
        torch.arange(3).to("meta")
        torch.zeros(2, device="meta").copy_(torch.ones(2))
        torch.from_numpy(np.zeros(4))
        float(torch.ones(1))
    assert counter.copies == [("cpu", "meta", 24), ("cpu", "meta", 8)]
    assert counter.host_inputs == [(torch.float64, (4,))]
    assert counter.scalar_reads == 1


def q_learning_step(buf, net, opt, batch_size: int = 16) -> None:
    """One prioritized DQN-style step: sample, weighted TD loss, SGD, new priorities."""
    batch = buf.sample(batch_size)
    d = batch.data
    q = net(d["obs"]).gather(1, (d["action"] % 2)[:, None])[:, 0]
    with torch.no_grad():
        target = d["reward"] + 0.99 * (1 - d["done"]) * net(d["next_obs"]).amax(dim=1)
    td = target - q
    loss = (batch.weights * td.pow(2)).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    buf.update_priorities(batch.indices, td.abs().detach())


def test_one_device_training_step_moves_no_transition_or_priority(monkeypatch):
    """Tree, storage and learner on one device: the step's only host input is the
    uniforms of the draws (B float64), nothing crosses devices, no scalar is read,
    and nothing leaves torch for NumPy."""
    m = Placement(storage="cpu", tree="torch")
    buf = PrioritizedReplay(200, SCHEMA, seed=0, **m.replay_kwargs())
    buf.add(make_batch(150))
    net = torch.nn.Linear(3, 2).to(m.learner_device)
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    before = buf.tree.leaves()

    def no_numpy(self):
        raise AssertionError("a training step left torch for NumPy")

    monkeypatch.setattr(torch.Tensor, "numpy", no_numpy)
    with TransferCounter() as counter:
        for _ in range(3):
            q_learning_step(buf, net, opt)
    monkeypatch.undo()
    assert counter.copies == [] and counter.scalar_reads == 0
    assert counter.host_inputs == [(torch.float64, (16,))] * 3
    assert not np.array_equal(buf.tree.leaves(), before)  # the priorities did change


def test_learner_loop_on_every_cpu_mapping():
    """Each CPU placement runs a short learning loop end to end with the same draws."""
    placements = [
        Placement(),
        Placement(storage="cpu"),
        Placement(storage="cpu", tree="torch"),
        Placement(tree="numpy"),
    ]
    first = []
    for m in placements:
        torch.manual_seed(0)
        buf = PrioritizedReplay(200, SCHEMA, seed=1, **m.replay_kwargs())
        buf.add(make_batch(150))
        if buf.device is not None:
            net = torch.nn.Linear(3, 2)
            opt = torch.optim.SGD(net.parameters(), lr=0.01)
            for _ in range(20):
                q_learning_step(buf, net, opt)
        else:  # NumPy batches: the learner wraps them (zero-copy on the CPU)
            for _ in range(20):
                batch = buf.sample(16)
                buf.update_priorities(batch.indices, np.abs(batch.data["reward"] - 1.0))
        assert buf.max_priority > 1.0
        first.append(np.asarray(buf.sample(4).indices).tolist())
    assert len(first) == len(placements)
