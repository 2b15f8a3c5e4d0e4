"""Where transitions live. ``HostStorage`` keeps them in NumPy arrays on the host."""

from hetero_replay.storage.host import HostStorage
from hetero_replay.storage.schema import Field, Schema

__all__ = ["Field", "HostStorage", "Schema"]
