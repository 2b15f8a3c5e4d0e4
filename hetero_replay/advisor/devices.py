"""Devices that are not here: analytical models whose predicted replay times the advisor ranks next to measured ones.

A *device model* says how long the tree's share of each replay primitive
takes on a device this machine does not have, for the workload's ``B``, ``N``
and rows per insert (``n_envs``, one collect step). The advisor builds each
modelled entry from what it measured here: the C++ tree's entry (one thread,
host storage, the same learner), with the C++ tree's own ``sample``,
``update_td`` and ``update`` (timed here, alone, on a tree of ``N`` leaves)
swapped for the model's::

    X_model = X_native entry - X_native tree + X_device        X = insert, sample, update

so what the host library does around the tree (gathering rows, the batch on
the learner device, its bookkeeping) stays measured. The entries have
``source="model"``: the ranking marks them *predicted only* and never makes
one the advice's choice (this machine cannot run them); they have no relaxed
phase measured, so the model counts a relaxed pipeline on the learner's thread
(strict plus its bookkeeping). A variant that cannot hold ``N`` is listed in
:attr:`Profile.skipped <hetero_replay.advisor.profile.Profile.skipped>` with
the reason.

:func:`~hetero_replay.advisor.advise` adds them to every profile it measures
(and to a cached one that lacks them); a profile loaded from a file is ranked
as it is, since the C++ tree must be timed on the machine the profile is of.
The one model registered: the FPGA RMM's cycle model
(:mod:`hetero_replay.fpga.cycle_model`), one entry per part it fits.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Protocol

import numpy as np

from hetero_replay.advisor.profile import MODELLED, Profile, ReplayEntry, Timing, measure
from hetero_replay.advisor.workload import ReplayConfig
from hetero_replay.placement import HOST

#: The measured entry a modelled one is built on: the C++ tree, one thread, host storage.
BASE_TREE = "native"
#: Replay steps a device model replaces the C++ tree's share of.
STEPS = ("insert", "sample", "update")
#: Repetitions when timing the C++ tree alone (median kept).
TREE_REPEATS = 20


class DeviceModel(Protocol):
    """What the advisor asks of a device model.

    Attributes:
        tree: the tree backend its entries name (``"fpga"``).
        tree_device: the device they name (``"fpga:0"``).
    """

    tree: str
    tree_device: str

    def variants(self) -> list[str]:
        """The modelled devices, by label (e.g. one per FPGA part: ``"KV260 xck26 @ 250 MHz"``)."""
        ...

    def times(self, variant: str, batch_size: int, capacity: int, insert_rows: int) -> dict[str, float]:
        """Seconds of the tree's share of ``insert`` (``insert_rows`` rows), ``sample`` and ``update`` (``batch_size``).

        Raises:
            ValueError: the variant cannot hold ``capacity`` (the message says why).
        """
        ...


class FpgaModel:
    """The FPGA RMM (:mod:`hetero_replay.fpga.cycle_model`): one variant per part, at the part's clock."""

    tree = "fpga"
    tree_device = "fpga:0"

    def variants(self) -> list[str]:
        from hetero_replay.fpga import cycle_model

        return [part.label for part in cycle_model.parts()]

    def times(self, variant: str, batch_size: int, capacity: int, insert_rows: int) -> dict[str, float]:
        from hetero_replay.fpga import cycle_model

        part = next(p for p in cycle_model.parts() if p.label == variant)
        calls = cycle_model.replay_times(part, batch_size, capacity, insert_rows)
        return {step: calls[step].total_s for step in STEPS}


_models: dict[str, DeviceModel] = {"fpga": FpgaModel()}


def register_device_model(name: str, model: DeviceModel, override: bool = False) -> None:
    """Add ``model`` to the devices :func:`add_modelled` predicts (``override``: replace one of that name)."""
    if name in _models and not override:
        raise ValueError(f"a device model named {name!r} is registered already (override=True replaces it)")
    _models[name] = model


def device_models() -> dict[str, DeviceModel]:
    """The registered device models, by name."""
    return dict(_models)


#: ``(batch_size, capacity, insert_rows) -> {step: Timing}``: the C++ tree's own share of each step.
TreeTimer = Callable[[int, int, int], dict[str, Timing]]


def time_native_tree(
    batch_size: int, capacity: int, insert_rows: int, repeats: int = TREE_REPEATS
) -> dict[str, Timing]:
    """Time the C++ tree alone, one thread, full of random priorities, as the replay calls it.

    ``sample``: ``tree.sample(B, rng, beta=0.4)`` (stratified, IS weights);
    ``update``: ``tree.update_td`` of ``B`` sampled leaves; ``insert``:
    ``tree.update`` of ``insert_rows`` consecutive leaves to one value.
    """
    from hetero_replay import _native
    from hetero_replay.trees import make_tree

    rng = np.random.default_rng(0)
    tree = make_tree(BASE_TREE, capacity)
    tree.load_leaves((rng.random(capacity) + 1e-3).astype(tree.dtype))
    indices = rng.integers(0, capacity, batch_size)
    td = rng.random(batch_size)
    rows = np.arange(min(insert_rows, capacity))
    value = np.full(len(rows), 1.0, tree.dtype)
    threads = _native.num_threads()
    _native.set_num_threads(1)
    try:
        return {
            "sample": measure(lambda: tree.sample(batch_size, rng, 0.4), repeats),
            "update": measure(lambda: tree.update_td(indices, td, 0.6, 1e-6), repeats),
            "insert": measure(lambda: tree.update(rows, value), repeats),
        }
    finally:
        _native.set_num_threads(threads)


def modelled_configs(profile: Profile) -> list[tuple[str, DeviceModel, ReplayConfig]]:
    """Every ``(model name, model, configuration)`` a profile gets: per learner, per model, per variant."""
    found = []
    for learner in profile.host:
        for name, model in _models.items():
            for variant in model.variants():
                config = ReplayConfig(model.tree, 1, HOST, model.tree_device, learner, label=variant)
                found.append((name, model, config))
    return found


def add_modelled(profile: Profile, tree_times: TreeTimer | None = None) -> list[ReplayEntry]:
    """Add the predicted-only entries of every registered device model to ``profile`` (in place); return them.

    Configurations the profile holds already, or lists as skipped, are left
    alone, so this is idempotent. A variant that cannot hold the workload's
    ``N``, or a learner without a measured C++-tree entry to build on, is
    listed in ``profile.skipped`` with the reason.

    Args:
        profile: a profile measured on this machine.
        tree_times: times the C++ tree's share of each step (default:
            :func:`time_native_tree`, timed here once per call of this function).
    """
    spec = profile.workload
    known = {e.config for e in profile.replay} | {ReplayConfig.from_dict(s["config"]) for s in profile.skipped}
    wanted = [item for item in modelled_configs(profile) if item[2] not in known]
    if not wanted:
        return []
    native: dict[str, Timing] | None = None
    added = []
    for _, model, config in wanted:
        base_config = ReplayConfig(BASE_TREE, 1, HOST, "cpu", config.learner)
        try:
            base = profile.entry(base_config)
        except KeyError:
            reason = f"no measured entry of {base_config.key} to build the model's entry on"
            profile.skipped.append({"config": config.to_dict(), "reason": reason})
            continue
        try:
            device = model.times(config.label, spec.batch_size, spec.buffer_size, spec.n_envs)
        except ValueError as e:
            profile.skipped.append({"config": config.to_dict(), "reason": f"{type(e).__name__}: {e}"})
            continue
        if native is None:
            native = (tree_times or time_native_tree)(spec.batch_size, spec.buffer_size, spec.n_envs)
        times: dict[str, Timing | None] = {step: swap(base.times[step], native[step], device[step]) for step in STEPS}
        times["phase_relaxed"] = None
        entry = ReplayEntry(config, times, source=MODELLED)
        profile.replay.append(entry)
        added.append(entry)
    return added


def swap(measured: Timing | None, tree: Timing, device_s: float) -> Timing:
    """``measured`` with the tree's share ``tree`` replaced by ``device_s`` seconds (the host's share kept, at least 0).

    Quartiles move with the median (the spread is the measured host share's);
    ``n`` is the fewer repetitions of the two measurements.
    """
    if measured is None:
        return Timing.of(device_s)

    def host(seconds: float, share: float) -> float:
        return max(0.0, seconds - share) + device_s

    return dataclasses.replace(
        measured,
        median=host(measured.median, tree.median),
        q1=host(measured.q1, tree.median),
        q3=host(measured.q3, tree.median),
        n=min(measured.n, tree.n),
        mean=None if measured.mean is None else host(measured.mean, tree.expected),
    )


__all__ = [
    "BASE_TREE",
    "DeviceModel",
    "FpgaModel",
    "STEPS",
    "add_modelled",
    "device_models",
    "modelled_configs",
    "register_device_model",
    "swap",
    "time_native_tree",
]
