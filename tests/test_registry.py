"""The registry of tree backends and storages: registering, looking up, plugins found by entry point,
what make_tree, make_storage, Placement and ``hetero-replay info`` make of it.

The toy backend comes from a separate package installed for the session (see
``tests/conftest.py``); the reference tests of ``tests/test_trees.py`` run
against it through the ``backend`` fixture.
"""

from __future__ import annotations

import ast
import importlib
import importlib.metadata
import re
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import hetero_replay
from hetero_replay import registry
from hetero_replay.apps import cli
from hetero_replay.placement import DeviceUnavailableError, Placement
from hetero_replay.registry import ANY_TORCH_DEVICE, BackendUnavailableError, install_hint
from hetero_replay.storage import HostStorage, make_storage
from hetero_replay.trees import SumTree, make_tree
from hetero_replay.trees.base import check_tree_args
from tests.conftest import SCHEMA, installed, registry_state

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def fresh():
    """The registry as it is now, restored after the test (whatever the test registers goes away)."""
    with registry_state():
        yield


def numpy_tree(capacity, fanout, dtype, device=None):
    return make_tree("numpy", capacity, fanout, dtype)


def host_storage(capacity, schema, placement):
    return HostStorage(capacity, schema)


def write_plugin(folder: Path, dist: str, module: str, code: str, entry_points: dict[str, dict[str, str]]) -> None:
    """A distribution ``dist`` under ``folder``: module ``module`` and a .dist-info with ``{group: {name: value}}``."""
    (folder / f"{module}.py").write_text(textwrap.dedent(code))
    info = folder / f"{dist.replace('-', '_')}-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.0\n")
    sections = [f"[{group}]\n" + "".join(f"{n} = {v}\n" for n, v in eps.items()) for group, eps in entry_points.items()]
    (info / "entry_points.txt").write_text("\n".join(sections))


# -- the toy plugin, found by its entry point -------------------------------------------------


def test_toy_backend_comes_from_an_installed_distribution():
    dist = importlib.metadata.distribution("hetero-replay-toy")
    (ep,) = [ep for ep in dist.entry_points if ep.group == registry.BACKEND_GROUP]
    assert (ep.name, ep.value) == ("toy", "hetero_replay_toy:register")
    spec = registry.backend_spec("toy")
    assert spec.factory.__module__ == "hetero_replay_toy" and spec.devices == ("cpu", "toyaccel")
    assert "toy" in hetero_replay.backends() and registry.usable("toy") == (True, "")


def test_toy_backend_through_make_tree():
    tree = make_tree("toy", 40, 4, "float64", device="toyaccel:1")
    assert isinstance(tree, SumTree) and type(tree).__name__ == "ToySumTree"
    assert (tree.capacity, tree.fanout, tree.dtype) == (40, 4, np.float64)
    assert type(make_tree("auto", 10, device="toyaccel")).__name__ == "ToySumTree"  # the only one there
    assert type(make_tree("auto", 10)) is type(make_tree("native", 10))  # on the CPU the C++ tree ranks first
    with pytest.raises(
        ValueError, match="tree backend 'toy' runs on the CPU or a 'toyaccel' device; got device 'cuda'"
    ):
        make_tree("toy", 10, device="cuda")


def test_toy_backend_in_a_placement():
    m = Placement(sample="toyaccel:2", update="toyaccel:2", tree="toy")
    assert m.replay_kwargs()["tree"] == "toy" and m.checked() == m
    with pytest.raises(ValueError, match="tree must be one of .*'toy'.*, got 'asic'"):
        Placement(tree="asic")


def test_info_lists_every_backend_and_storage(capsys):
    assert cli.main(["info"]) == 0
    out = capsys.readouterr().out
    lines = {line.split()[0]: line for line in out.splitlines() if line.startswith("  ")}
    assert re.search(r"^  toy +cpu, toyaccel +toy .* usable$", lines["toy"])
    assert re.search(r"^  native +cpu .* usable$", lines["native"])
    for name in registry.backends(usable_only=False) + registry.storages(usable_only=False):
        assert name in lines
    if not registry.usable("cupy")[0]:
        assert "not usable: " in lines["cupy"] and "pip install '.[cuda]'" in lines["cupy"]
    assert f"threads: {hetero_replay.num_threads()}" in out
    ray_line = next(line for line in out.splitlines() if line.startswith("distributed (ShardedReplay): "))
    assert re.search(r"usable, ray \d|not usable: .*hetero-replay\[ray\]", ray_line)


# -- registering ------------------------------------------------------------------------------


def test_register_and_use_a_backend(fresh):
    spec = hetero_replay.register_backend("mine", numpy_tree, devices="cpu", description="a test backend")
    assert registry.backend_spec("mine") is spec and spec.devices == ("cpu",)
    assert "mine" in registry.backends()
    assert isinstance(make_tree("mine", 8), SumTree)


def test_duplicate_names_are_refused_unless_overridden(fresh):
    with pytest.raises(ValueError, match=r"tree backend 'numpy' is already registered \(by hetero_replay.trees\)"):
        registry.register_backend("numpy", numpy_tree, devices=("cpu",))
    with pytest.raises(ValueError, match="storage 'host' is already registered"):
        registry.register_storage("host", host_storage, devices=("cpu",))
    spec = registry.register_backend("numpy", numpy_tree, devices=("cpu",), override=True)
    assert registry.backend_spec("numpy") is spec


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (dict(name="auto"), ValueError, "'auto' is not a backend name"),
        (dict(name=""), ValueError, "a name is letters"),
        (dict(factory=None), TypeError, "factory must be callable"),
        (dict(check="yes"), TypeError, "check must be callable"),
        (dict(devices=()), ValueError, "devices must name at least one device type"),
        (dict(devices=("CUDA",)), ValueError, "a device type is lower-case"),
        (dict(devices=("cuda:0",)), ValueError, "a device type is lower-case"),
        (dict(auto_rank=True), TypeError, "auto_rank must be an int"),
        (dict(extra="cuda gpu"), ValueError, "extra must be the name of an extra"),
    ],
)
def test_malformed_registrations(fresh, kwargs, error, match):
    args = dict(name="mine", factory=numpy_tree, devices=("cpu",)) | kwargs
    with pytest.raises(error, match=match):
        registry.register_backend(args.pop("name"), args.pop("factory"), **args)
    assert "mine" not in registry.backends(usable_only=False)


def test_unknown_names_list_the_registered_ones():
    with pytest.raises(ValueError, match=r"unknown tree backend 'nope'; choose 'auto' or one of \('native', 'numpy'"):
        make_tree("nope", 10)
    with pytest.raises(ValueError, match=r"unknown storage 'nope'; choose one of \('host', 'pinned', 'torch'"):
        registry.storage_spec("nope")
    with pytest.raises(ValueError, match="unknown tree backend"):
        registry.usable("nope")


def test_unusable_backend_names_its_extra(fresh):
    registry.register_backend(
        "card", numpy_tree, devices=("fpgacard",), check=lambda: "no FPGA card found", extra="fpga", auto_rank=0
    )
    assert "card" not in registry.backends() and "card" in registry.backends(usable_only=False)
    assert registry.usable("card") == (False, f"no FPGA card found ({install_hint('fpga')})")
    with pytest.raises(
        BackendUnavailableError,
        match=re.escape(f"tree backend 'card' is not usable here: no FPGA card found ({install_hint('fpga')})"),
    ):
        make_tree("card", 10, device="fpgacard")
    assert isinstance(BackendUnavailableError("x"), ImportError)
    # its device is a valid name, described but absent here; "auto" knows it and says why it cannot build
    assert "fpgacard" in registry.device_types()
    assert Placement(sample="fpgacard", update="fpgacard", check=False).tree_backend == "card"
    with pytest.raises(
        DeviceUnavailableError,
        match=r"^sample: 'fpgacard:0' requested, but nothing usable here runs on it \(.*no FPGA card",
    ):
        Placement(sample="fpgacard", update="fpgacard")
    with pytest.raises(
        ValueError, match=r"no tree backend runs on device 'fpgacard:1' here \(card: no FPGA card found"
    ):
        make_tree("auto", 10, device="fpgacard:1")


def test_a_check_may_raise_its_own_import_error(fresh):
    class NoDriver(ImportError):
        pass

    def check():
        raise NoDriver(f"the driver is missing; {install_hint('drv')}")

    registry.register_backend("drv", numpy_tree, devices=("cpu",), check=check, extra="drv")
    with pytest.raises(NoDriver, match="the driver is missing"):
        make_tree("drv", 10)
    assert registry.usable("drv") == (False, f"the driver is missing; {install_hint('drv')}")  # no hint twice


def test_a_broken_check_makes_the_backend_unusable_not_the_registry(fresh):
    registry.register_backend("broken", numpy_tree, devices=("cpu",), check=lambda: 1 / 0)
    assert "broken" not in registry.backends()
    assert registry.usable("broken") == (False, "its availability check raised ZeroDivisionError: division by zero")
    assert "not usable: its availability check raised" in registry.describe()


def test_emulated_devices_skip_the_check(fresh):
    """cupy's CPU executor: make_tree takes the emulated device; Placement and "auto" do not."""
    seen = []

    def factory(capacity, fanout, dtype, device):
        seen.append(device)
        return numpy_tree(capacity, fanout, dtype)

    registry.register_backend(
        "emu", factory, devices=("fpgacard",), check=lambda: "no card", emulated_on=("cpu",), auto_rank=0
    )
    make_tree("emu", 10, device="cpu")
    assert seen == ["cpu"]
    with pytest.raises(ValueError, match="tree backend 'emu' runs on a 'fpgacard' device; sample/update are on 'cpu'"):
        Placement(tree="emu")
    assert type(make_tree("auto", 10)) is type(make_tree("native", 10))


def test_auto_ranks(fresh):
    registry.register_backend("first", numpy_tree, devices=("cpu",), auto_rank=-1)
    assert registry.ranked_backends()[0].name == "first" and Placement().tree_backend == "first"
    names = [s.name for s in registry.ranked_backends("cuda:0")]
    assert names[:2] == ["cupy", "torch"]  # CuPy's kernels first on CUDA, usable here or not
    assert [s.name for s in registry.ranked_backends("meta")] == ["torch"]


def test_register_and_use_a_storage(fresh):
    made = []

    def shm(capacity, schema, placement):
        made.append(placement)
        return HostStorage(capacity, schema)

    hetero_replay.register_storage("shm", shm, devices=("cpu",), description="shared memory")
    assert "shm" in hetero_replay.storages()
    assert isinstance(make_storage("shm", 4, SCHEMA), HostStorage) and made == ["shm"]
    m = Placement(storage="shm", train="cpu")
    assert m.storage == "shm" and m.transfers() == ()
    buf = hetero_replay.PrioritizedReplay(8, SCHEMA, storage="shm")
    assert isinstance(buf.storage, HostStorage)


def test_a_device_placement_storage_takes_its_devices_names(fresh):
    registry.register_storage("card-rows", host_storage, devices=("toyaccel",), device_placement=True)
    assert registry.storage_for("toyaccel:3").name == "card-rows"
    assert registry.storage_for("cuda:1").name == "torch" and registry.storage_for("host").name == "host"
    with pytest.raises(
        ValueError, match="storage must be 'host', 'pinned', 'shared', 'disk', a torch device or a 'toyaccel' device"
    ):
        registry.storage_for("gpu")
    m = Placement(storage="toyaccel", check=False)
    assert m.storage == "toyaccel:0"


def test_unusable_storage(fresh):
    registry.register_storage("far", host_storage, devices=("cpu",), check=lambda: "no server", extra="remote")
    with pytest.raises(
        ImportError, match=re.escape(f"storage 'far' is not usable here: no server ({install_hint('remote')})")
    ):
        make_storage("far", 4, SCHEMA)
    with pytest.raises(DeviceUnavailableError, match="^storage: storage 'far' is not usable here: no server"):
        Placement(storage="far")
    assert registry.usable("far", kind="storage") == (False, f"no server ({install_hint('remote')})")


def test_placement_device_names_without_plugins(fresh):
    del registry._backends["toy"]
    assert registry.device_types() == ("cpu", "cuda", "fpga")  # the built-ins' (fpga: the RMM's board)
    with pytest.raises(
        ValueError, match=r"^train: device must be 'cpu', 'cuda', 'cuda:N', 'fpga' or 'fpga:N', got 'toyaccel'$"
    ):
        Placement(train="toyaccel")


def test_device_descriptions():
    assert registry.describe_devices(("cpu",)) == "the CPU only"
    assert registry.describe_devices(("cuda",)) == "a CUDA device"
    assert registry.describe_devices((ANY_TORCH_DEVICE,)) == "any torch device"
    assert registry.describe_devices(("cpu", "fpga")) == "the CPU or a 'fpga' device"
    assert registry.is_torch_device("cuda:3") and registry.is_torch_device("meta")
    assert not registry.is_torch_device("gpu") and not registry.is_torch_device("toyaccel")


# -- plugins ------------------------------------------------------------------------------------


PLUGIN = """
    import hetero_replay
    from hetero_replay.storage import HostStorage

    CALLS = []

    def backends():
        CALLS.append("backends")
        hetero_replay.register_backend(
            "plug", lambda c, f, d, device: hetero_replay.make_tree("numpy", c, f, d), devices=("cpu",)
        )

    def storages():
        CALLS.append("storages")
        hetero_replay.register_storage("plugstore", lambda c, s, p: HostStorage(c, s), devices=("cpu",))

    def replace_numpy():
        CALLS.append("numpy")
        hetero_replay.register_backend("numpy", lambda c, f, d, device: None, devices=("cpu",))

    def broken():
        raise RuntimeError("cannot find the card driver")
"""


def test_plugins_load_once_and_a_broken_one_only_warns(tmp_path):
    backend_eps = {
        "plug": "hr_plug:backends",
        "bad": "hr_plug:broken",
        "gone": "hr_plug_missing:register",
        "numpy": "hr_plug:replace_numpy",
    }
    entry_points = {registry.BACKEND_GROUP: backend_eps, registry.STORAGE_GROUP: {"plugstore": "hr_plug:storages"}}
    write_plugin(tmp_path, "hr-plug", "hr_plug", PLUGIN, entry_points)
    with pytest.warns(RuntimeWarning) as caught, installed(tmp_path, "hr_plug"):
        import hr_plug

        assert "plug" in registry.backends() and "plugstore" in registry.storages()
        assert isinstance(make_tree("plug", 10), SumTree)
        registry.load_plugins()  # a second scan loads nothing again
        registry.backends()
        assert sorted(hr_plug.CALLS) == ["backends", "numpy", "storages"]  # each hook once
    messages = [str(w.message) for w in caught]
    assert any("'bad' (hr_plug:broken) of hr-plug" in m and "cannot find the card driver" in m for m in messages)
    assert any("'gone' (hr_plug_missing:register)" in m and "ModuleNotFoundError" in m for m in messages)
    assert any("'numpy'" in m and "already registered" in m for m in messages)  # a plugin cannot replace a built-in
    assert registry.backend_spec("numpy").factory.__module__ == "hetero_replay.trees"
    assert "plug" not in registry.backends(usable_only=False)  # uninstalled again


def test_plugins_load_lazily_on_the_first_lookup(fresh, tmp_path):
    code = """
        import hetero_replay

        def register():
            hetero_replay.register_backend("lazy", lambda c, f, d, device: None, devices=("cpu",))
    """
    write_plugin(tmp_path, "hr-lazy", "hr_lazy", code, {registry.BACKEND_GROUP: {"lazy": "hr_lazy:register"}})
    sys.path.insert(0, str(tmp_path))
    importlib.invalidate_caches()
    try:
        registry._plugins_scanned = False  # as in a fresh interpreter
        assert "lazy" not in registry._backends  # nothing loaded before a lookup
        assert "lazy" in registry.backends(usable_only=False)
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("hr_lazy", None)


# -- one list, everywhere -----------------------------------------------------------------------


def test_registry_imports_nothing_of_hetero_replay():
    tree = ast.parse((ROOT / "hetero_replay" / "registry.py").read_text())
    imported = [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    imported += [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    assert not [m for m in imported if m and m.startswith("hetero_replay")]


def test_docs_list_every_built_in():
    docs = (ROOT / "docs" / "backends.md").read_text()
    for name in registry.backends(usable_only=False):
        spec = registry.backend_spec(name)
        if spec.factory.__module__.startswith("hetero_replay."):
            assert f"| `{name}` |" in docs, name
    for name in registry.storages(usable_only=False):
        assert f"| `{name}` |" in docs, name


def test_make_tree_still_checks_its_arguments_first():
    with pytest.raises(ValueError, match="fanout must be one of"):
        make_tree("toy", 10, fanout=3)
    assert check_tree_args(10, 4, "float32")[0] == 10
