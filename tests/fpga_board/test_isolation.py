"""These tests run alone, in the fpga environment: the main suite's conftest is not loaded, and it skips this folder."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest

HERE = Path(__file__).resolve().parent
MAIN_CONFTEST = HERE.parent / "conftest.py"


def test_the_main_conftest_is_not_loaded(request: pytest.FixtureRequest) -> None:
    loaded = {Path(getattr(p, "__file__", "") or ".").resolve() for p in request.config.pluginmanager.get_plugins()}
    assert MAIN_CONFTEST.resolve() not in loaded
    assert HERE / "conftest.py" in loaded


def test_the_main_suite_does_not_collect_this_folder() -> None:
    tree = ast.parse(MAIN_CONFTEST.read_text())
    ignored = [
        ast.literal_eval(node.value)
        for node in tree.body
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "collect_ignore" for t in node.targets)
    ]
    assert ignored and HERE.name in ignored[0]


def test_this_is_the_fpga_environment() -> None:
    import pynq

    assert pynq.__version__ == "4.0.0" and np.__version__.startswith("1.")
