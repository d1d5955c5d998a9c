"""The README's examples run as written (those that need no outside network), on the real engine.

Python blocks run whole. Shell blocks run line by line with `toolcage` meaning this
checkout's CLI; a line's trailing comment may say the exit code it documents (`exit 3`).
Skipped, by rule and not by hand: command synopses (lines with `[--`), lines marked
`# needs the internet`, the set-up block (`.ci/run` runs that one on a fresh machine) and
the benchmark (minutes, and timing-sensitive: `bench/` is its own harness). Python blocks that use
`toolcage.ray` need a Ray cluster: test_ray_cluster.py runs them against its multi-engine one.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
BLOCKS = re.findall(r"```(python|sh)\n(.*?)```", README, re.S)
TOOLCAGE = shlex.join([sys.executable, "-m", "toolcage.cli"])

pytestmark = pytest.mark.usefixtures("no_leaks")


def _shell_lines() -> list[str]:
    lines = []
    for lang, body in BLOCKS:
        if lang != "sh" or "pip install" in body or "python -m pytest" in body or "-m bench" in body:
            continue  # set-up, the test command itself, the benchmark
        for line in body.splitlines():
            if line.strip() and "[--" not in line and "needs the internet" not in line:
                lines.append(line)
    return lines


def _expected_exit(line: str) -> int:
    m = re.search(r"#.*\bexit (\d)", line)
    return int(m.group(1)) if m else 0


def test_readme_has_runnable_examples() -> None:
    """The README keeps Python and shell examples this test runs (a rename cannot silently empty it)."""
    assert [lang for lang, _ in BLOCKS].count("python") >= 1
    assert len(_shell_lines()) >= 10


RAY_BLOCKS = [i for i, (lang, body) in enumerate(BLOCKS) if lang == "python" and "toolcage.ray" in body]


@pytest.mark.parametrize("index", [i for i, (lang, _) in enumerate(BLOCKS) if lang == "python" and i not in RAY_BLOCKS])
def test_python_example_runs(engine: Any, index: int) -> None:
    """Each Python block of the README runs as written and exits 0."""
    code = BLOCKS[index][1]
    if "from toolcage.worker" in code:
        pytest.fail("worker-side snippets belong in docs/protocol.md, not the README")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-2000:]


@pytest.mark.parametrize("line", _shell_lines())
def test_shell_example_runs(engine: Any, line: str, tmp_path: Path) -> None:
    """Each shell example of the README exits as its comment says (0 unless it says otherwise)."""
    run_id = _a_run_id()
    cmd = re.sub(r"(^|\|\s*)toolcage ", lambda m: m.group(1) + TOOLCAGE + " ", line).replace("<RUN_ID>", run_id)
    proc = subprocess.run(["sh", "-c", cmd], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == _expected_exit(line), (cmd, proc.stdout[-1000:], proc.stderr[-1000:])


_RUN: list[str] = []


def _a_run_id() -> str:
    """The id of a run this test made, for examples that name one."""
    if not _RUN:
        import json

        out = subprocess.run(
            [sys.executable, "-m", "toolcage.cli", "run", "run_shell", "--params", '{"command": "true"}'],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )
        _RUN.append(json.loads(out.stdout)["run_id"])
    return _RUN[0]
