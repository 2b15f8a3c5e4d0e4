"""Placement: which device runs each primitive of a PER learner, and where transitions live.

A learner step has four placeable primitives (the env step always runs on the
CPU): ``inference`` (the policy picks actions), ``sample`` (draw a batch from
the sum tree, gather it, IS weights), ``update`` (write new priorities into the
tree) and ``train`` (the SGD step). ``storage`` says where the transitions are
kept. A :class:`Placement` names a device for each, checks that this machine has
them, and turns into the arguments of the pieces that run them:

>>> m = Placement(sample="cpu", update="cpu", train="cpu", storage="cpu", tree="torch")
>>> m.replay_kwargs()
{'tree': 'torch', 'tree_device': 'cpu', 'storage': 'cpu', 'device': 'cpu'}
>>> m.learner_device
'cpu'

The Stable-Baselines3 and Tianshou adapters take a placement directly
(``PERDQN(..., placement=m)``, ``HeteroPrioritizedVectorReplayBuffer(..., placement=m)``,
``PEROffPolicyWrapper(..., placement=m)``).

``sample`` and ``update`` act on one sum tree, so they name the same device.
:meth:`Placement.transfers` lists what a training step moves between devices
under the placement, and :class:`TransferCounter` counts what it really moves.
"""

from __future__ import annotations

import dataclasses
import importlib.util
from typing import Any, NamedTuple

from hetero_replay import registry

#: The primitives a placement places (the env step is always on the CPU).
PRIMITIVES = ("inference", "sample", "update", "train")
#: Storage placements besides a device: NumPy on the host, page-locked host tensors.
HOST, PINNED = "host", "pinned"


class DeviceUnavailableError(RuntimeError):
    """A placement asks for a device or backend this machine does not have."""


class Transfer(NamedTuple):
    """Data a training step moves from one device to another."""

    what: str
    source: str
    target: str


@dataclasses.dataclass(frozen=True)
class Placement:
    """A device for each primitive, the storage placement and the tree backend.

    Devices are ``"cpu"``, ``"cuda"`` / ``"cuda:N"``, or a device type a
    registered backend or storage declares (``"fpga"`` / ``"fpga:N"``; see
    :func:`hetero_replay.registry.device_types`). Construction checks the
    placement and that this machine can run it; a missing device raises
    :class:`DeviceUnavailableError` naming the primitive that asked for it.

    Args:
        inference: where the policy acts.
        sample: where the sum tree draws batches (and computes IS weights).
        update: where priorities are written; the tree's device, so = ``sample``.
        train: where the network learns; sampled batches are delivered here.
        storage: ``"host"`` (NumPy), ``"pinned"`` (page-locked host memory,
            asynchronous copies to a GPU), another registered storage, or a
            device (:func:`hetero_replay.registry.storages`).
        tree: sum-tree backend, ``"auto"`` or a registered name
            (:func:`hetero_replay.registry.backends`) that runs on the
            ``sample`` device; ``"auto"`` takes the best-ranked one usable here
            (the C++ tree on the CPU; the CUDA kernels (CuPy) on a GPU, or the
            torch tree without CuPy).
        check: ``False`` skips the check that this machine has the devices
            (to describe a placement for another machine, e.g. in a cost model).
    """

    inference: str = "cpu"
    sample: str = "cpu"
    update: str = "cpu"
    train: str = "cpu"
    storage: str = HOST
    tree: str = "auto"
    check: bool = dataclasses.field(default=True, repr=False, compare=False)

    def __post_init__(self) -> None:
        for primitive in PRIMITIVES:
            object.__setattr__(self, primitive, _normalise(primitive, getattr(self, primitive)))
        if self.sample != self.update:
            raise ValueError(
                "sample and update act on one sum tree, so they need the same device; "
                f"got sample={self.sample!r}, update={self.update!r}"
            )
        if not _named_storage(self.storage):
            object.__setattr__(self, "storage", _normalise("storage", self.storage))
            registry.storage_for(self.storage)  # some storage keeps rows there
        if self.tree == "auto":
            if not registry.ranked_backends(self.sample):
                raise ValueError(f"tree='auto' has no backend for {self.sample!r}; name one with tree=")
        else:
            names = registry.backends(usable_only=False)
            if self.tree not in names:
                raise ValueError(f"tree must be one of {('auto', *names)}, got {self.tree!r}")
            spec = registry.backend_spec(self.tree)
            if not spec.runs_on(self.sample):
                raise ValueError(
                    f"tree backend {self.tree!r} runs on {registry.describe_devices(spec.devices)}; "
                    f"sample/update are on {self.sample!r}"
                )
        if self.check:
            self._check_present()

    # -- presets -----------------------------------------------------------------------

    @classmethod
    def cpu(cls) -> Placement:
        """Everything on the CPU: the C++ tree, NumPy storage, a CPU learner."""
        return cls()

    @classmethod
    def gpu(cls, device: str = "cuda", check: bool = True) -> Placement:
        """Everything on one GPU: tree, transitions and learner; no per-step host copies."""
        return cls(inference=device, sample=device, update=device, train=device, storage=device, check=check)

    @classmethod
    def cpu_replay_gpu_learner(cls, device: str = "cuda", check: bool = True) -> Placement:
        """The C++ tree on the CPU, transitions in pinned memory, the network on the GPU."""
        return cls(inference=device, train=device, storage=PINNED, check=check)

    # -- what the pieces need ---------------------------------------------------------

    @property
    def learner_device(self) -> str:
        """The torch device of the training step (the algorithm's ``device=``)."""
        return self.train

    @property
    def inference_device(self) -> str:
        """The torch device the policy acts on."""
        return self.inference

    @property
    def tree_backend(self) -> str:
        """The tree backend ``"auto"`` resolves to on this machine."""
        if self.tree != "auto":
            return self.tree
        ranked = registry.ranked_backends(self.sample)
        usable = [s for s in ranked if s.why_unusable() is None]
        return (usable or ranked)[0].name  # unchecked placements: the best one, wherever it runs

    def replay_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of :class:`~hetero_replay.replay.PrioritizedReplay` for this placement.

        ``device`` is the learner's device, except for the all-host placement
        (NumPy storage, CPU learner) where it is ``None`` and batches stay NumPy
        arrays, which a CPU learner wraps without a copy.
        """
        backend = self.tree_backend
        host_batches = self.storage == HOST and self.train == "cpu"
        cpu_only = registry.backend_spec(backend).devices == ("cpu",)  # takes no device
        return {
            "tree": backend,
            "tree_device": None if cpu_only else self.sample,
            "storage": self.storage,
            "device": None if host_batches else self.train,
        }

    def checked(self) -> Placement:
        """This placement, checked against this machine now.

        Also for a placement built with ``check=False`` or checked on another
        machine (unpickled with a saved model); a missing device raises
        :class:`DeviceUnavailableError` naming the primitive. The adapters call
        this when they build a model or buffer from a placement.
        """
        return dataclasses.replace(self, check=True)

    def transfers(self) -> tuple[Transfer, ...]:
        """What one training step (sample, train, update) moves between devices.

        The buffer's NumPy generator draws the uniforms on the host, and a
        device tree's update ends with one read of a few scalars; the rest
        crosses only where neighbouring primitives sit on different devices.
        """
        tree, learner = self.sample, self.train
        store = _storage_location(self.storage)
        steps = [
            Transfer("uniforms", "cpu", tree),
            Transfer("indices", tree, store),
            Transfer("transitions", store, learner),
            Transfer("weights", tree, learner),
            Transfer("td errors", learner, tree),
            Transfer("tree scalars", tree, "cpu"),
        ]
        return tuple(t for t in steps if t.source != t.target)

    def _check_present(self) -> None:
        wanted = [(p, getattr(self, p)) for p in PRIMITIVES]
        if not _named_storage(self.storage):
            wanted.append(("storage", self.storage))
        for primitive, device in wanted:
            _require_device(primitive, device)
        if self.storage == PINNED:
            _require_cuda("storage", "cuda", why="pinned host memory needs CUDA")
        reason = registry.storage_for(self.storage).why_unusable()
        if reason is not None:
            raise DeviceUnavailableError(f"storage: storage {self.storage!r} is not usable here: {reason}")
        backend = self.tree_backend
        reason = registry.backend_spec(backend).why_unusable()
        if reason is not None:
            raise DeviceUnavailableError(f"sample/update: tree backend {backend!r} is not usable here: {reason}")


def one_policy_placement(placement: Any, library: str) -> Placement:
    """``placement``, checked for a library whose one policy both acts and trains.

    Stable-Baselines3 and Tianshou act with the network they train, so the
    ``inference`` and ``train`` primitives must share a device.

    Args:
        placement: the user's :class:`Placement`.
        library: who asks, for the error messages (e.g. ``"PERDQN"``).

    Raises:
        TypeError: ``placement`` is not a :class:`Placement`.
        ValueError: ``inference`` and ``train`` name different devices.
        DeviceUnavailableError: a device of the placement is missing here.
    """
    if not isinstance(placement, Placement):
        raise TypeError(f"placement must be a hetero_replay.placement.Placement, got {type(placement).__name__}")
    if placement.inference != placement.train:
        raise ValueError(
            f"{library} acts and trains with one policy on one device, but the placement puts "
            f"inference on {placement.inference!r} and train on {placement.train!r}; give both the same device"
        )
    return placement.checked()


def _normalise(what: str, device: Any) -> str:
    """``"cpu"`` or ``"<type>:N"`` for a registered device type, or ``ValueError`` naming ``what``."""
    name = str(device).strip().lower()
    kind, colon, index = name.partition(":")
    types = registry.device_types()
    if name == "cpu":
        return name
    if kind != "cpu" and kind in types and (not colon or index.isdigit()):
        return f"{kind}:{int(index or 0)}"
    choices = ["'cpu'"] + [f"'{t}{n}'" for t in types if t != "cpu" for n in ("", ":N")]
    text = ", ".join(choices[:-1]) + " or " + choices[-1] if len(choices) > 1 else choices[0]
    raise ValueError(f"{what}: device must be {text}, got {device!r}")


def _named_storage(storage: Any) -> bool:
    """Whether ``storage`` is a registered storage's own name (``"host"``, ``"pinned"``), not a device."""
    try:
        return not registry.storage_spec(storage).device_placement
    except ValueError:
        return False


def _storage_location(storage: str) -> str:
    """The device a storage's rows live on: a named storage's first device type (``"cpu"`` for host memory)."""
    if not _named_storage(storage):
        return storage
    kind = registry.storage_spec(storage).devices[0]
    return "cpu" if kind in ("cpu", registry.ANY_TORCH_DEVICE) else f"{kind}:0"


def _require_device(what: str, device: str) -> None:
    """Raise :class:`DeviceUnavailableError` naming ``what`` unless ``device`` is present here.

    The CPU always is; CUDA devices are counted by torch; another device type
    is present when a registered backend or storage declaring it is usable.
    """
    kind = device.partition(":")[0]
    if kind == "cpu":
        return
    if kind == "cuda":
        _require_cuda(what, device)
        return
    present, reason = registry.device_available(kind)
    if not present:
        raise DeviceUnavailableError(f"{what}: {device!r} requested, but nothing usable here runs on it ({reason})")


def _require_cuda(what: str, device: str, why: str = "") -> None:
    """Raise :class:`DeviceUnavailableError` naming ``what`` unless ``device`` exists here."""
    reason = f" ({why})" if why else ""
    if importlib.util.find_spec("torch") is None:
        raise DeviceUnavailableError(f"{what}: {device!r} requested{reason}, but torch is not installed")
    import torch

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    index = int(device.partition(":")[2] or 0)
    if index >= count:
        have = f"{count} CUDA device(s)" if count else "no CUDA device"
        raise DeviceUnavailableError(f"{what}: {device!r} requested{reason}, but this machine has {have}")


class TransferCounter:
    """Counts what torch moves between devices while it is active.

    A context manager over a torch dispatch mode that sees every tensor
    operation: cross-device copies (``.to``, ``.cuda``, ``.cpu``, ``copy_``),
    host data entering torch (``from_numpy``, ``as_tensor`` of host arrays)
    and scalar reads (``.item()``, ``bool(tensor)``). ``tolist()`` and
    ``numpy()`` bypass the dispatcher and are not seen.

    Attributes:
        copies: ``(source device, target device, bytes)`` per cross-device copy.
        host_inputs: ``(dtype, shape)`` of each host array that became a tensor.
        scalar_reads: number of scalar reads.
    """

    def __init__(self) -> None:
        self.copies: list[tuple[str, str, int]] = []
        self.host_inputs: list[tuple[Any, tuple[int, ...]]] = []
        self.scalar_reads = 0
        self._mode: Any = None

    def __enter__(self) -> TransferCounter:
        from torch.utils._python_dispatch import TorchDispatchMode

        counter = self

        class _Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
                counter._observe(func, args, kwargs or {})
                return func(*args, **(kwargs or {}))

        self._mode = _Mode()
        self._mode.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._mode.__exit__(*exc)

    def _observe(self, func: Any, args: tuple, kwargs: dict) -> None:
        import torch

        name = func.overloadpacket.__name__
        if name == "_to_copy":
            src, dst = args[0].device, kwargs.get("device") or args[0].device
            if torch.device(dst) != src:
                self.copies.append((str(src), str(dst), args[0].numel() * args[0].element_size()))
        elif name in ("copy_", "_copy_from"):
            dst, src = (args[0], args[1]) if name == "copy_" else (args[1], args[0])
            if dst.device != src.device:
                self.copies.append((str(src.device), str(dst.device), src.numel() * src.element_size()))
        elif name == "lift_fresh":
            self.host_inputs.append((args[0].dtype, tuple(args[0].shape)))
        elif name == "_local_scalar_dense":
            self.scalar_reads += 1


__all__ = [
    "HOST",
    "PINNED",
    "PRIMITIVES",
    "DeviceUnavailableError",
    "Placement",
    "Transfer",
    "TransferCounter",
    "one_policy_placement",
]
