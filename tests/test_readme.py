"""Every ```python block of README.md runs as written, each in a fresh interpreter in an empty directory.

Only the training lengths are shortened, so the file stays the documentation and the test takes seconds:
``.learn(N)``, ``steps = N`` and ``buffer_size=N`` become small numbers (SHORTER), and the advisor's profile
is taken with one repetition per primitive instead of 20 (QUICK_PROFILE): still a real profile of this machine,
ranked as a user's is, in seconds instead of the ~12 minutes a first ``advise`` takes on 2 cores. Its cache is
the test's own folder, so every run measures. The FPGA block needs the emulation module.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"

#: pattern -> replacement: the training lengths a test shortens, nothing else.
SHORTER = {
    r"\.learn\([\d_]+": ".learn(300",
    r"^steps = [\d_]+": "steps = 400",
    r"buffer_size=[\d_]+": "buffer_size=2_000",
}

#: Run before an advisor block: ``advise``'s own ``repeats`` option, 1 by default for every call in the block
#: (the snippet's and the one ``placement="auto"`` makes), the smallest setting the profiler accepts.
QUICK_PROFILE = 'import hetero_replay.advisor.advice as _quick\n_quick.advise.__kwdefaults__["repeats"] = 1\n'


def python_blocks(text: str) -> list[tuple[int, str]]:
    """``(line, code)`` of each ```python block of ``text``, in order (line: the block's first line)."""
    return [(text[: m.start()].count("\n") + 2, m.group(1)) for m in re.finditer(r"```python\n(.*?)```", text, re.S)]


def _shortened(code: str) -> str:
    for pattern, replacement in SHORTER.items():
        code = re.sub(pattern, replacement, code, flags=re.M)
    return code


def _cases() -> list:
    cases = []
    for line, code in python_blocks(README.read_text()):
        marks = []
        if "ShardedReplay" in code or "distributed=dict(" in code:
            marks.append(pytest.mark.slow)
        cases.append(pytest.param(code, id=f"README.md:{line}", marks=marks))
    return cases


def test_the_readme_has_its_snippets() -> None:
    codes = [code for _, code in python_blocks(README.read_text())]
    assert len(codes) >= 8
    assert any("HeteroPrioritizedVectorReplayBuffer" in c for c in codes)
    assert any('storage="disk"' in c for c in codes) and any("ShardedReplay(" in c for c in codes)


def test_the_docs_index_links_every_doc() -> None:
    """docs/README.md says what each page covers: every docs/*.md is linked from it, and every link resolves."""
    index = (ROOT / "docs" / "README.md").read_text()
    linked = set(re.findall(r"\]\(([^)#]+)\)", index))
    pages = {p.name for p in (ROOT / "docs").glob("*.md")} - {"README.md"}
    assert pages <= linked, pages - linked
    assert all((ROOT / "docs" / link).resolve().exists() for link in linked), linked


@pytest.mark.parametrize("code", _cases())
def test_readme_snippet_runs(code: str, tmp_path: Path) -> None:
    if 'tree="fpga"' in code:
        pytest.importorskip("hetero_replay._rmm_emu")
    if "ale_py" in code:
        pytest.importorskip("ale_py")
        pytest.importorskip("cv2")  # SB3's Atari wrappers
    if "ShardedReplay" in code:
        pytest.importorskip("ray")
    env = {**os.environ, "PYTHONHASHSEED": "0", "OMP_NUM_THREADS": "1", "RAY_DISABLE_DOCKER_CPU_WARNING": "1"}
    env["HETERO_REPLAY_CACHE"] = str(tmp_path / "cache")  # the advisor's: measured here, not read from the user's
    prelude = "import torch; torch.set_num_threads(1)\n" + (QUICK_PROFILE if "advise(" in code else "")
    proc = subprocess.run(
        [sys.executable, "-c", prelude + _shortened(code)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
