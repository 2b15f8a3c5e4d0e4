"""One registry of tree backends and storages, Gymnasium-style.

Each entry maps a name to a factory and says which devices it runs on, whether
it is usable on this machine and, if not, why (and which extra to install).
:func:`~hetero_replay.trees.make_tree`, :func:`~hetero_replay.storage.make_storage`,
:class:`~hetero_replay.placement.Placement` validation and ``hetero-replay info``
all read it (and the tests check ``docs/backends.md`` against it), so the list
of backends exists once.

The built-ins register themselves when :mod:`hetero_replay.trees` and
:mod:`hetero_replay.storage` are imported (which ``import hetero_replay``
does). Third-party packages register theirs in code::

    import hetero_replay

    hetero_replay.register_backend(
        "asic", make_asic_tree, devices=("asic",), check=asic_card_present,
        description="sum tree on an ASIC card",
    )

or through an entry point, loaded on the first lookup (like Gymnasium's plugins)::

    [project.entry-points."hetero_replay.backends"]
    asic = "hetero_replay_asic:register"      # a callable that calls register_backend

A plugin that fails to load is skipped with a ``RuntimeWarning`` naming it.

Devices are named by their *type*, the part of a device name before ``:``
(``"cpu"``, ``"cuda"`` of ``"cuda:1"``, ``"fpga"``); a backend declares its
own, and :data:`ANY_TORCH_DEVICE` stands for every device torch knows.

This module is the bottom layer: it imports nothing of hetero_replay.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import importlib.util
import re
import threading
import warnings
from collections.abc import Callable
from typing import Any, ClassVar, Literal

#: A ``devices`` entry meaning "any device torch knows" (``cpu``, ``cuda``, ``meta``, ``mps``, ...).
ANY_TORCH_DEVICE = "any torch device"

#: Entry-point groups scanned for plugins; each entry point is a callable that registers.
BACKEND_GROUP = "hetero_replay.backends"
STORAGE_GROUP = "hetero_replay.storages"

#: ``check()``: ``None`` when usable here, else a one-line reason (it may instead raise an ImportError).
Check = Callable[[], "str | None"]

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]*")
_DEVICE_TYPE = re.compile(r"[a-z][a-z0-9_]*")
_DEVICE = re.compile(r"([a-z][a-z0-9_]*)(?::(\d+))?")
_EMULATED_DEVICE = re.compile(r"[a-z][a-z0-9_]*:[a-z][a-z0-9_]*")  # a named emulation, e.g. "fpga:emu"
_KNOWN_TORCH = re.compile(r"cpu|cuda(?::\d+)?")  # torch devices recognised without importing torch


def install_hint(extra: str) -> str:
    """How a user installs hetero-replay's extra ``extra``; every "needs X" message ends with it, once.

    hetero-replay is installed from its source, not from PyPI, so ``pip install 'hetero-replay[ray]'``
    would fail: the extras are installed from a checkout, ``pip install '.[ray]'``.
    """
    return f"pip install '.[{extra}]' in a hetero-replay source checkout (the '{extra}' extra)"


class BackendUnavailableError(ImportError):
    """A registered backend or storage cannot run on this machine; the message says why and what to install."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Spec:
    """What backends and storages share: a name, a factory, devices and an availability check."""

    #: Noun in messages ("tree backend", "storage").
    kind: ClassVar[str] = ""

    name: str
    #: Builds the object; see :func:`register_backend` / :func:`register_storage` for its arguments.
    factory: Callable[..., Any]
    #: Device types it runs on (``("cpu",)``, ``("cuda",)``), or :data:`ANY_TORCH_DEVICE`.
    devices: tuple[str, ...]
    #: ``check()``: ``None`` when usable here, else a one-line reason (or it raises an ImportError).
    #: Without a check, always usable.
    check: Check | None = None
    #: The hetero-replay extra that makes it usable (``"cuda"``: :func:`~hetero_replay.registry.install_hint`).
    extra: str | None = None
    #: One line for ``hetero-replay info`` and the docs.
    description: str = ""
    #: Whether it runs on the threads :func:`hetero_replay.set_num_threads` sets (the advisor varies them).
    threaded: bool = False

    @property
    def install_hint(self) -> str:
        """How to install :attr:`extra` (:func:`~hetero_replay.registry.install_hint`), or ``""`` without one."""
        return install_hint(self.extra) if self.extra else ""

    def runs_on(self, device: Any) -> bool:
        """Whether ``device`` (a name such as ``"cuda:1"``, or a ``torch.device``) is one of :attr:`devices`."""
        name = str(device).strip().lower()
        match = _DEVICE.fullmatch(name)
        if match is not None and match.group(1) in self.devices:
            return True
        return ANY_TORCH_DEVICE in self.devices and is_torch_device(name)

    def why_unusable(self) -> str | None:
        """``None`` when usable here, else the reason, ending with the install hint."""
        try:
            reason = self._probe()
        except ImportError as e:
            reason = str(e) or type(e).__name__
        return None if reason is None else _with_hint(reason, self.install_hint)

    def require(self, what: str = "") -> None:
        """Raise an ImportError unless usable here.

        A check that raised an ImportError of its own gets it raised again
        (e.g. :class:`~hetero_replay.trees.cupy_tree.CudaUnavailableError`);
        a reason becomes a :class:`BackendUnavailableError` naming the extra.

        Args:
            what: how the message names it (default: ``"<kind> '<name>'"``).
        """
        reason = self._probe()
        if reason is not None:
            what = what or f"{self.kind} {self.name!r}"
            raise BackendUnavailableError(f"{what} is not usable here: {_with_hint(reason, self.install_hint)}")

    def _probe(self) -> str | None:
        """The check's reason; an ImportError it raises propagates, any other error becomes the reason."""
        if self.check is None:
            return None
        try:
            reason = self.check()
        except ImportError:
            raise
        except Exception as e:  # a broken check must not break listing: report it as the reason
            return f"its availability check raised {type(e).__name__}: {e}"
        return str(reason) if reason else None


@dataclasses.dataclass(frozen=True, kw_only=True)
class BackendSpec(_Spec):
    """A registered sum-tree backend.

    ``factory(capacity, fanout, dtype, device)`` gets arguments already
    checked by :func:`~hetero_replay.trees.base.check_tree_args` (``dtype`` a
    ``numpy.dtype``) and ``device`` ``None`` (the backend's default device)
    or a device it runs on; it returns a :class:`~hetero_replay.trees.SumTree`.
    """

    kind: ClassVar[str] = "tree backend"

    #: Place in ``backend="auto"``'s order for a device, lower first; ``None``: never chosen by "auto".
    auto_rank: int | None = None
    #: Device types where the factory runs an emulation of the backend's kernels (slow; for tests,
    #: e.g. cupy's CPU executor), or full device names of an emulation (``"fpga:emu"``): make_tree
    #: accepts them without the check; "auto" and Placement ignore them. A backend with a full emulated
    #: device name picks its default device itself (its factory gets ``device=None`` unchecked): the
    #: fpga tree runs its emulation without a board.
    emulated_on: tuple[str, ...] = ()

    def emulates(self, device: Any) -> bool:
        """Whether ``device`` is one of :attr:`emulated_on`: by its type, or by its full name."""
        name = str(device).strip().lower()
        return name in self.emulated_on or name.partition(":")[0] in self.emulated_on

    @property
    def emulated_devices(self) -> tuple[str, ...]:
        """The full device names of :attr:`emulated_on` (``("fpga:emu",)``), not the device types."""
        return tuple(d for d in self.emulated_on if ":" in d)


@dataclasses.dataclass(frozen=True, kw_only=True)
class StorageSpec(_Spec):
    """A registered storage.

    ``factory(capacity, schema, placement)`` gets the
    :class:`~hetero_replay.storage.Schema` (or its mapping) and the placement
    it was chosen by; it returns a :class:`~hetero_replay.storage.Storage`.
    """

    kind: ClassVar[str] = "storage"

    #: Chosen by a device name (``storage="cuda:1"`` goes to the storage whose devices include it)
    #: rather than by its own name.
    device_placement: bool = False
    #: Whether a buffer on it can deliver batches to a learner's torch device (``device=``). Storages
    #: that serve only rows checked whole on the host (the rings other processes write) say ``False``,
    #: so the device is refused before the storage is built.
    device_batches: bool = True


_lock = threading.RLock()
_backends: dict[str, BackendSpec] = {}
_storages: dict[str, StorageSpec] = {}
_plugins_scanned = False
_loaded_entry_points: set[tuple[str, str, str]] = set()  # (group, name, value)


# -- registering -----------------------------------------------------------------------


def register_backend(
    name: str,
    factory: Callable[..., Any],
    *,
    devices: tuple[str, ...] | list[str] | str,
    check: Check | None = None,
    extra: str | None = None,
    description: str = "",
    auto_rank: int | None = None,
    emulated_on: tuple[str, ...] | list[str] = (),
    threaded: bool = False,
    override: bool = False,
) -> BackendSpec:
    """Register a sum-tree backend under ``name``.

    Args:
        name: what ``make_tree(name)``, ``PrioritizedReplay(tree=name)`` and
            ``Placement(tree=name)`` take (not ``"auto"``).
        factory: ``factory(capacity, fanout, dtype, device) -> SumTree`` (see :class:`BackendSpec`).
        devices: the device types it runs on, e.g. ``("cpu",)``, ``("cuda",)``,
            ``("fpga",)``, or ``(ANY_TORCH_DEVICE,)``. They become valid device
            names of a :class:`~hetero_replay.placement.Placement` (``"fpga"``, ``"fpga:1"``).
        check: ``check() -> None`` when usable here, else a one-line reason (or
            it raises an ImportError); called on every lookup, so cache it if
            it is slow. ``None``: always usable.
        extra: the hetero-replay extra that makes it usable (``"cuda"``).
        description: one line for ``hetero-replay info`` and the docs.
        auto_rank: its place in ``backend="auto"``'s order, lower first
            (built-ins: native 0, numpy 10, cupy 20, torch 30); ``None``: "auto"
            never picks it.
        emulated_on: device types where it runs an emulation, for tests, or full device names of an
            emulation (``"fpga:emu"``; see :class:`BackendSpec`).
        threaded: it runs on the threads :func:`hetero_replay.set_num_threads`
            sets (the advisor then tries each thread count).
        override: replace a backend already registered under ``name``.

    Returns:
        The registered :class:`BackendSpec`.

    Raises:
        ValueError: ``name`` is taken (without ``override``) or malformed, or a device type is.
        TypeError: ``factory`` or ``check`` is not callable, ``auto_rank`` not an int.
    """
    if name == "auto":
        raise ValueError("'auto' is not a backend name: make_tree resolves it to a registered backend")
    # The registry imports nothing of ours (tests/test_registry.py), so this one check stays inline.
    if auto_rank is not None and (isinstance(auto_rank, bool) or not isinstance(auto_rank, int)):
        raise TypeError(f"auto_rank must be an int or None, got {auto_rank!r}")
    spec = BackendSpec(
        **_common(name, factory, devices, check, extra, description),
        auto_rank=auto_rank,
        emulated_on=_device_types(emulated_on, "emulated_on", allow_empty=True, allow_named=True),
        threaded=bool(threaded),
    )
    _add(_backends, spec, override)
    return spec


def register_storage(
    name: str,
    factory: Callable[..., Any],
    *,
    devices: tuple[str, ...] | list[str] | str,
    check: Check | None = None,
    extra: str | None = None,
    description: str = "",
    device_placement: bool = False,
    threaded: bool = False,
    device_batches: bool = True,
    override: bool = False,
) -> StorageSpec:
    """Register a storage under ``name``.

    Args:
        name: the placement ``make_storage(name)`` / ``PrioritizedReplay(storage=name)`` /
            ``Placement(storage=name)`` takes, unless ``device_placement``.
        factory: ``factory(capacity, schema, placement) -> Storage`` (see :class:`StorageSpec`).
        devices: the device types its rows live on (``("cpu",)`` for host memory).
        check, extra, description, threaded, override: as for :func:`register_backend`.
        device_placement: chosen by a device name of ``devices`` instead of
            ``name`` (the built-in ``"torch"`` storage takes ``storage="cuda:1"``).
        device_batches: whether its buffers may deliver batches to a learner's
            device (see :attr:`StorageSpec.device_batches`).

    Returns:
        The registered :class:`StorageSpec`.
    """
    spec = StorageSpec(
        **_common(name, factory, devices, check, extra, description),
        device_placement=bool(device_placement),
        threaded=bool(threaded),
        device_batches=bool(device_batches),
    )
    _add(_storages, spec, override)
    return spec


def _common(name: Any, factory: Any, devices: Any, check: Any, extra: Any, description: Any) -> dict[str, Any]:
    """The checked fields every spec has."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ValueError(f"a name is letters, digits, '_', '.' and '-', got {name!r}")
    if not callable(factory):
        raise TypeError(f"factory must be callable, got {type(factory).__name__}")
    if check is not None and not callable(check):
        raise TypeError(f"check must be callable or None, got {type(check).__name__}")
    if extra is not None and (not isinstance(extra, str) or not _NAME.fullmatch(extra)):
        raise ValueError(f"extra must be the name of an extra (e.g. 'cuda') or None, got {extra!r}")
    return {
        "name": name,
        "factory": factory,
        "devices": _device_types(devices, "devices"),
        "check": check,
        "extra": extra,
        "description": str(description),
    }


def _device_types(devices: Any, what: str, allow_empty: bool = False, allow_named: bool = False) -> tuple[str, ...]:
    """``devices`` as a tuple of device types (a single string is one type).

    ``allow_named``: also full device names of an emulation, ``"<type>:<name>"`` (``"fpga:emu"``).
    """
    types = (devices,) if isinstance(devices, str) else tuple(devices)
    if not types and not allow_empty:
        raise ValueError(f"{what} must name at least one device type")
    for t in types:
        named = allow_named and isinstance(t, str) and _EMULATED_DEVICE.fullmatch(t)
        if t != ANY_TORCH_DEVICE and not named and not (isinstance(t, str) and _DEVICE_TYPE.fullmatch(t)):
            also = ", a device name such as 'fpga:emu'" if allow_named else ""
            raise ValueError(
                f"{what}: a device type is lower-case letters, digits and '_' (e.g. 'cuda', 'fpga'){also}, "
                f"or ANY_TORCH_DEVICE; got {t!r}"
            )
    return types


def _add(table: dict[str, Any], spec: _Spec, override: bool) -> None:
    with _lock:
        old = table.get(spec.name)
        if old is not None and not override:
            raise ValueError(
                f"{spec.kind} {spec.name!r} is already registered (by {_origin(old)}); pass override=True to replace it"
            )
        table[spec.name] = spec


def _origin(spec: _Spec) -> str:
    return getattr(spec.factory, "__module__", None) or repr(spec.factory)


# -- plugins ----------------------------------------------------------------------------


def load_plugins() -> None:
    """Load the entry points of :data:`BACKEND_GROUP` and :data:`STORAGE_GROUP` not loaded yet.

    Lookups call this once, on first use; call it again after installing a
    plugin into a running interpreter. Each entry point is loaded and called
    once; one that fails is skipped with a ``RuntimeWarning`` naming it.
    """
    global _plugins_scanned
    with _lock:
        _plugins_scanned = True
        for group in (BACKEND_GROUP, STORAGE_GROUP):
            for ep in importlib.metadata.entry_points(group=group):
                key = (group, ep.name, ep.value)
                if key in _loaded_entry_points:
                    continue
                _loaded_entry_points.add(key)  # once, even if it fails
                try:
                    ep.load()()
                except Exception as e:
                    dist = f" of {ep.dist.name}" if ep.dist is not None else ""
                    warnings.warn(
                        f"hetero-replay: skipping plugin {ep.name!r} ({ep.value}){dist} in entry-point group "
                        f"{group!r}: {type(e).__name__}: {e}",
                        RuntimeWarning,
                        stacklevel=2,
                    )


def _ensure_plugins() -> None:
    if not _plugins_scanned:
        load_plugins()


# -- looking up -------------------------------------------------------------------------


def backends(usable_only: bool = True) -> tuple[str, ...]:
    """Registered tree-backend names in registration order; by default only those usable here."""
    _ensure_plugins()
    return tuple(n for n, s in list(_backends.items()) if not usable_only or s.why_unusable() is None)


def storages(usable_only: bool = True) -> tuple[str, ...]:
    """Registered storage names in registration order; by default only those usable here."""
    _ensure_plugins()
    return tuple(n for n, s in list(_storages.items()) if not usable_only or s.why_unusable() is None)


def backend_spec(name: str) -> BackendSpec:
    """The :class:`BackendSpec` of ``name``; ``ValueError`` listing the registered names if unknown."""
    return _lookup(_backends, name, "tree backend", "'auto' or one of ")


def storage_spec(name: str) -> StorageSpec:
    """The :class:`StorageSpec` registered as ``name``; ``ValueError`` listing the registered names if unknown."""
    return _lookup(_storages, name, "storage", "one of ")


def _lookup(table: dict[str, Any], name: Any, what: str, choose: str) -> Any:
    _ensure_plugins()
    spec = table.get(name) if isinstance(name, str) else None
    if spec is None:
        raise ValueError(f"unknown {what} {name!r}; choose {choose}{tuple(table)}")
    return spec


def storage_for(placement: Any) -> StorageSpec:
    """The storage a placement names: a storage's own name, else a device a storage takes.

    For a device name, a storage declaring its device type explicitly wins
    over one taking :data:`ANY_TORCH_DEVICE`.

    Raises:
        ValueError: no storage takes ``placement`` (the message lists what does).
    """
    _ensure_plugins()
    specs = list(_storages.values())
    for spec in specs:
        if not spec.device_placement and spec.name == placement:
            return spec
    by_device = [s for s in specs if s.device_placement]
    name = str(placement).strip().lower()
    match = _DEVICE.fullmatch(name)
    for spec in by_device:
        if match is not None and match.group(1) in spec.devices:
            return spec
    for spec in by_device:
        if ANY_TORCH_DEVICE in spec.devices and is_torch_device(name):
            return spec
    choices = [repr(s.name) for s in specs if not s.device_placement]
    choices += [_device_phrase(d, article="a") for s in by_device for d in s.devices]
    raise ValueError(f"storage must be {_either(choices)}, got {placement!r}")


def usable(name: str, kind: Literal["backend", "storage"] = "backend") -> tuple[bool, str]:
    """``(True, "")`` if the backend (or storage) ``name`` runs here, else ``(False, reason)``.

    The reason ends with the install hint, e.g. ``"CuPy is not installed
    (pip install '.[cuda]' ...)"``. Unknown names raise ``ValueError``.
    """
    spec: _Spec = backend_spec(name) if kind == "backend" else storage_spec(name)
    reason = spec.why_unusable()
    return (True, "") if reason is None else (False, reason)


def ranked_backends(device: Any = None) -> tuple[BackendSpec, ...]:
    """The backends ``backend="auto"`` considers for ``device`` (``None``: the CPU), best first.

    Those with an ``auto_rank`` that run on the device, usable here or not.
    """
    _ensure_plugins()
    device = "cpu" if device is None else device
    ranked = [(s.auto_rank, i, s) for i, s in enumerate(list(_backends.values())) if s.auto_rank is not None]
    return tuple(s for _, _, s in sorted(ranked) if s.runs_on(device))


def device_types() -> tuple[str, ...]:
    """Every device type a registered backend or storage names explicitly, ``"cpu"`` first.

    These are the valid device names of a :class:`~hetero_replay.placement.Placement`
    (with ``:N`` for all but the CPU).
    """
    _ensure_plugins()
    types = {"cpu": None}
    for spec in [*_backends.values(), *_storages.values()]:
        types.update(dict.fromkeys(d for d in spec.devices if d != ANY_TORCH_DEVICE))
    return tuple(types)


def device_available(device_type: str) -> tuple[bool, str]:
    """Whether a registered backend or storage declaring ``device_type`` is usable here.

    Returns ``(True, "")``, or ``(False, reason)`` with each declaring entry's
    reason. It is how a :class:`~hetero_replay.placement.Placement` knows that a
    device type it has no probe for (one a plugin added) is present.
    """
    _ensure_plugins()
    reasons = []
    for spec in [*_backends.values(), *_storages.values()]:
        if device_type in spec.devices:
            reason = spec.why_unusable()
            if reason is None:
                return True, ""
            reasons.append(f"{spec.kind} {spec.name!r}: {reason}")
    return False, "; ".join(reasons) or f"no registered backend or storage runs on {device_type!r}"


def describe_devices(devices: tuple[str, ...]) -> str:
    """Devices for messages: ``("cpu",)`` is "the CPU only", ``("cuda",)`` "a CUDA device"."""
    if tuple(devices) == ("cpu",):
        return "the CPU only"
    return " or ".join(_device_phrase(d) for d in devices)


def is_torch_device(name: str) -> bool:
    """Whether torch takes ``name`` as a device (``"cpu"``, ``"cuda:1"``, ``"meta"``); False without torch.

    ``cpu`` and ``cuda[:N]`` are recognised without importing torch.
    """
    if _KNOWN_TORCH.fullmatch(name):
        return True
    if importlib.util.find_spec("torch") is None:
        return False
    import torch

    try:
        torch.device(name)
    except (RuntimeError, TypeError, ValueError):
        return False
    return True


def describe() -> str:
    """Every registered backend and storage: name, devices, description, usable here or why not.

    What ``hetero-replay info`` prints, one aligned line per entry.
    """
    _ensure_plugins()
    sections: list[tuple[str, list[_Spec]]] = [
        ('tree backends (tree=...; "auto": the best-ranked usable one for the device)', list(_backends.values())),
        ("storages (storage=...)", list(_storages.values())),
    ]
    rows = {id(s): (s.name, _devices_column(s), s.description) for _, specs in sections for s in specs}
    widths = [max((len(r[i]) for r in rows.values()), default=0) for i in range(3)]
    lines = []
    for title, specs in sections:
        lines.append(title)
        for spec in specs:
            reason = spec.why_unusable()
            status = "usable" if reason is None else f"not usable: {reason}"
            cells = "  ".join(c.ljust(w) for c, w in zip(rows[id(spec)], widths))
            lines.append(f"  {cells}  {status}")
    return "\n".join(lines)


# -- helpers ----------------------------------------------------------------------------


def _devices_column(spec: _Spec) -> str:
    text = ", ".join(spec.devices)
    if isinstance(spec, BackendSpec) and spec.emulated_on:
        text += f" (emulated on {', '.join(spec.emulated_on)})"
    return text


def _device_phrase(device_type: str, article: str = "any") -> str:
    if device_type == ANY_TORCH_DEVICE:
        return f"{article} torch device"
    return {"cpu": "the CPU", "cuda": "a CUDA device"}.get(device_type, f"a {device_type!r} device")


def _either(choices: list[str]) -> str:
    """``"a, b or c"``."""
    return choices[0] if len(choices) == 1 else ", ".join(choices[:-1]) + " or " + choices[-1]


def _with_hint(reason: str, hint: str) -> str:
    return reason if not hint or hint in reason else f"{reason} ({hint})"


__all__ = [
    "ANY_TORCH_DEVICE",
    "BACKEND_GROUP",
    "STORAGE_GROUP",
    "BackendSpec",
    "BackendUnavailableError",
    "StorageSpec",
    "backend_spec",
    "backends",
    "describe",
    "describe_devices",
    "device_available",
    "device_types",
    "is_torch_device",
    "load_plugins",
    "ranked_backends",
    "register_backend",
    "register_storage",
    "storage_for",
    "storage_spec",
    "storages",
    "usable",
]
