"""The layers of docs/architecture.md, checked from the source.

No import cycle, no import upwards, the applications outside the core package,
and the adapters on the facade. Every ``import`` of a ``hetero_replay`` module
anywhere in a file counts, also one inside a function (a lazy import is still a
dependency).
"""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: Bottom-up. A module may import modules of its own layer or below, never above.
LAYERS = [
    (
        "hetero_replay._native",
        "hetero_replay._rmm_emu",
        "hetero_replay.registry",
        "hetero_replay.forksafe",
        "hetero_replay.closing",  # a buffer left unclosed is closed when collected or at exit (forksafe's order)
        "hetero_replay.checks",  # argument checks: NumPy and the standard library only
    ),
    (
        "hetero_replay.trees",
        "hetero_replay.fpga",
        "hetero_replay.storage",
    ),  # storage includes the file format (storage.checkpoint)
    ("hetero_replay.options", "hetero_replay.protocol"),  # protocol: the Replay contract, types only
    ("hetero_replay.rate_limiter",),  # samples-per-insert: checks and the standard library only
    ("hetero_replay.priorities",),
    ("hetero_replay.replay", "hetero_replay.torch_batches"),
    ("hetero_replay.schedule",),  # the staleness schedule, run by the pipeline, the shards and the adapters
    ("hetero_replay.pipeline", "hetero_replay.distributed"),  # distributed: shards hold engine buffers
    ("hetero_replay.placement",),
    ("hetero_replay.advisor",),  # knows the host libraries only through their workloads (entry-point strings)
    ("hetero_replay", "hetero_replay.extend"),  # the facade (users), and the extension API (adapters, plug-ins)
    ("hetero_replay.adapters",),
    ("hetero_replay.apps",),
]


#: All an adapter may import of the core: the facade and the extension API (besides other adapter modules).
ADAPTER_API = {"hetero_replay", "hetero_replay.extend"}

#: Source folder -> the package it is installed as (pyproject.toml's ``wheel.packages``).
PACKAGES = {
    "hetero_replay": "hetero_replay",
    "adapters": "hetero_replay.adapters",
    "apps": "hetero_replay.apps",
}


def module_files() -> dict[str, Path]:
    """Module name -> file: the core, the adapters and the applications, as installed."""
    out = {}
    for folder, prefix in PACKAGES.items():
        base = ROOT / folder
        for path in base.rglob("*.py"):
            parts = list(path.relative_to(base).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join([prefix, *parts])] = path
    return out


def imports_of(path: Path, name: str, modules: set[str]) -> set[str]:
    """The hetero_replay modules ``path`` (module ``name``) imports."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative import
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                target = f"{base}.{node.module}" if node.module else base
            else:
                target = node.module or ""
            submodules = {f"{target}.{alias.name}" for alias in node.names} & modules
            found.update(submodules)  # `from pkg import submodule` needs the submodule
            if len(submodules) < len(node.names):
                found.add(target)  # and a name defined in `target` itself needs `target`
    return {m for m in found if m in modules and m != name}


def graph() -> dict[str, set[str]]:
    files = module_files()
    names = set(files) | {"hetero_replay._native"}  # the C++ extension imports nothing of ours
    g = {name: imports_of(path, name, names) for name, path in files.items()}
    g["hetero_replay._native"] = set()
    return g


def layer_of(module: str) -> int:
    best, index = "", -1
    for i, layer in enumerate(LAYERS):
        for prefix in layer:
            matches = module == prefix or (module.startswith(prefix + ".") and prefix != "hetero_replay")
            if matches and len(prefix) > len(best):
                best, index = prefix, i
    assert index >= 0, f"{module} is in no layer of LAYERS: place it"
    return index


def test_no_import_cycle_in_the_package():
    g = graph()
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    stack: list[str] = []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for dep in sorted(g[m]):
            if state.get(dep) == 1:
                cycle = stack[stack.index(dep) :] + [dep]
                raise AssertionError("import cycle: " + " -> ".join(cycle))
            if dep not in state:
                visit(dep)
        stack.pop()
        state[m] = 2

    for module in sorted(g):
        if module not in state:
            visit(module)


def test_each_layer_imports_only_layers_below():
    upward = [
        f"{m} (layer {layer_of(m)}) imports {dep} (layer {layer_of(dep)})"
        for m, deps in graph().items()
        for dep in deps
        if layer_of(dep) > layer_of(m)
    ]
    assert not upward, "\n".join(upward)


def test_applications_live_outside_the_core_package():
    """The command and the comparison runs are the top-level apps/, installed as hetero_replay.apps."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    installed = project["tool"]["scikit-build"]["wheel"]["packages"]
    assert {dest.replace("/", "."): src for dest, src in installed.items()} == {v: k for k, v in PACKAGES.items()}
    in_core = sorted(str(path.relative_to(ROOT)) for path in (ROOT / "hetero_replay" / "apps").rglob("*.py"))
    assert not in_core, f"application modules inside the core package: {in_core}"
    scripts = project["project"]["scripts"]
    assert all(target.startswith("hetero_replay.apps.") for target in scripts.values()), scripts


def test_adapters_import_only_the_facade_and_the_extension_api():
    beside = [
        f"{m} imports {dep}"
        for m, deps in graph().items()
        if m.startswith("hetero_replay.adapters")
        for dep in sorted(deps)
        if dep not in ADAPTER_API and not dep.startswith("hetero_replay.adapters")
    ]
    assert not beside, "adapters use hetero_replay and hetero_replay.extend only:\n" + "\n".join(beside)


def test_the_checker_sees_lazy_and_relative_imports(tmp_path):
    # The graph must see an import inside a function, else a lazy import could hide a cycle.
    src = tmp_path / "mod.py"
    src.write_text("def f():\n    from hetero_replay.replay import PrioritizedReplay\n")
    assert imports_of(src, "hetero_replay.trees.x", {"hetero_replay.replay"}) == {"hetero_replay.replay"}
