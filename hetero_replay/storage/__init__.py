"""Where transitions live.

``HostStorage`` keeps them in NumPy arrays on the host; ``TorchStorage``
(imported lazily: it needs torch) keeps them in torch tensors on any device or
in pinned host memory. :func:`make_storage` picks one from a placement name,
through the storages registered in :mod:`hetero_replay.registry`:

=========  ================  =============================================
placement  rows live on      storage
=========  ================  =============================================
host       cpu               :class:`HostStorage`, NumPy arrays
shared     cpu               ``SharedStorage``: a file mapping actor processes add to
                             (``CompressedSharedStorage`` with a ``codec``: a shared record log)
disk       cpu               ``DiskStorage``: a ring file, parallel reads, durable points
                             (with a ``codec``: a record log file, ``records.log``)
pinned     cpu               ``TorchStorage`` in page-locked host memory
a device   any torch device  ``TorchStorage`` there (``"cpu"``, ``"cuda:1"``, ``"meta"``);
                             registered as ``"torch"``, chosen by the device name
=========  ================  =============================================

Other packages add storages with :func:`hetero_replay.registry.register_storage`
(see ``docs/backends.md``). What a storage can do beyond storing (writer
processes, durable points, rows on a device) its protocols in
:mod:`~hetero_replay.storage.base` say; :func:`durable_point` finds the storage
a durable buffer at a path was written by.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Mapping
from typing import Any

from hetero_replay import registry
from hetero_replay.registry import ANY_TORCH_DEVICE, register_storage
from hetero_replay.storage.base import DeviceStorage, DurableStorage, RecordRing, RingStorage, Storage
from hetero_replay.storage.host import HostStorage
from hetero_replay.storage.schema import Field, Schema

#: Placement names besides device names ("cpu", "cuda", "cuda:1", "meta", ...).
HOST, PINNED, SHARED, DISK = "host", "pinned", "shared", "disk"
#: Where a buffer's transitions live unless it is told otherwise.
DEFAULT_STORAGE = HOST


def _torch_check() -> str | None:
    """Found without importing torch."""
    return None if importlib.util.find_spec("torch") is not None else "torch is not installed"


def _host(
    capacity: int,
    schema: Schema | Mapping[str, Any],
    placement: Any,
    codec: Any = None,
    byte_budget: int | None = None,
    frames: Any = None,
) -> Storage:
    return HostStorage(capacity, schema, codec=codec, byte_budget=byte_budget, frames=frames)


def _pinned(capacity: int, schema: Schema | Mapping[str, Any], placement: Any) -> Storage:
    from hetero_replay.storage.torch_storage import TorchStorage

    return TorchStorage(capacity, schema, "cpu", pin_memory=True)


def _torch(capacity: int, schema: Schema | Mapping[str, Any], placement: Any) -> Storage:
    import torch

    from hetero_replay.storage.torch_storage import TorchStorage

    return TorchStorage(capacity, schema, torch.device(placement))


register_storage(
    HOST,
    _host,
    devices=("cpu",),
    threaded=True,  # large gathers run on the native thread pool
    description="NumPy arrays in host memory; image fields compressed with storage_options={'codec': 'zstd'}",
)
register_storage(
    PINNED,
    _pinned,
    devices=("cpu",),
    check=_torch_check,
    description="page-locked host tensors, async copies to a GPU (needs CUDA)",
)
register_storage(
    "torch",
    _torch,
    devices=(ANY_TORCH_DEVICE,),
    check=_torch_check,
    device_placement=True,
    description="torch tensors on the named device ('cpu', 'cuda:1', ...)",
)


def _shared(capacity: int, schema: Schema | Mapping[str, Any], placement: Any, **options: Any) -> Storage:
    if options.get("codec") is not None or {"byte_budget", "frames"} & options.keys():
        from hetero_replay.storage.shared_compressed import CompressedSharedStorage

        return CompressedSharedStorage(capacity, schema, **options)
    from hetero_replay.storage.shared import SharedStorage

    return SharedStorage(capacity, schema, **options)


def _disk(capacity: int, schema: Schema | Mapping[str, Any], placement: Any, **options: Any) -> Storage:
    from hetero_replay.storage.disk import DiskStorage

    if "path" not in options:
        raise ValueError("storage='disk' needs storage_options={'path': <a directory for the buffer's files>}")
    return DiskStorage(capacity, schema, **options)


register_storage(
    SHARED,
    _shared,
    devices=("cpu",),
    threaded=True,
    device_batches=False,
    description="a file mapping actor processes add rows to (writer()); /dev/shm by default; "
    "image fields compressed with storage_options={'codec': 'lz4', 'byte_budget': ...}",
)
register_storage(
    DISK,
    _disk,
    devices=("cpu",),
    device_batches=False,
    description="a ring file on local disk, parallel reads, the newest rows in RAM, durable points; "
    "image fields compressed with storage_options={'codec': 'lz4', 'byte_budget': ...}",
)


def make_storage(
    placement: str,
    capacity: int,
    schema: Schema | Mapping[str, Any],
    options: Mapping[str, Any] | None = None,
    device: Any = None,
) -> Any:
    """Storage for ``capacity`` transitions of ``schema``, placed by name.

    Args:
        placement: the name of a registered storage (``"host"``: NumPy arrays,
            :class:`HostStorage`; ``"pinned"``: page-locked host tensors for
            asynchronous copies to a GPU), or a device name, which goes to the
            storage registered for that device (``"cpu"``, ``"cuda"``,
            ``"cuda:1"``, ...: :class:`~hetero_replay.storage.torch_storage.TorchStorage` there).
        options: the storage's keyword arguments (``storage_options``).
        device: the learner's device its buffer delivers batches to, if any;
            refused by storages that serve host batches only, before they are built.

    Raises:
        ValueError: no registered storage takes ``placement``, or it does not deliver batches to ``device``.
        ImportError: the storage is not usable here (e.g. torch is not installed).
    """
    spec = registry.storage_for(placement)
    spec.require(f"storage {placement!r}")
    if device is not None and not spec.device_batches:
        raise ValueError(f"storage={placement!r} serves NumPy batches; device= is not supported with it")
    if not options:
        return spec.factory(capacity, schema, placement)
    if not isinstance(options, Mapping):
        raise TypeError(f"storage_options must be a mapping, got {type(options).__name__}")
    try:
        return spec.factory(capacity, schema, placement, **options)
    except TypeError as e:
        if "unexpected keyword" in str(e) or "positional argument" in str(e):
            raise TypeError(f"storage {placement!r} does not take storage_options {dict(options)!r}: {e}") from e
        raise


def durable_point(path: str | os.PathLike[str]) -> tuple[str, dict[str, Any]]:
    """What holds the durable buffer at ``path``: the storage's name and the header of its last durable point.

    The header's ``config`` gives the buffer's capacity, schema and PER
    options; the storage, built with ``storage_options={"path": path, "reopen": True}``,
    restores the rest (:class:`~hetero_replay.storage.base.DurableStorage`).

    Raises:
        ValueError: ``path`` holds no durable point.
        ReplayFileError: its durable point is damaged.
    """
    from hetero_replay.storage.disk import last_durable_header

    return DISK, last_durable_header(path)


__all__ = [
    "DEFAULT_STORAGE",
    "DISK",
    "HOST",
    "PINNED",
    "SHARED",
    "DeviceStorage",
    "DurableStorage",
    "Field",
    "HostStorage",
    "RecordRing",
    "RingStorage",
    "Schema",
    "Storage",
    "durable_point",
    "make_storage",
]
