"""The examples of README.md and of every page in docs/ run as written (those that need no outside network),
on the real engine.

Python blocks run whole (a block that appears on two pages runs once). Shell blocks run line by line with
`toolcage` meaning this checkout's CLI; a line's trailing comment may say the exit code it documents
(`exit 3`). Skipped, by rule and not by hand: command synopses (lines with `[--`), lines marked
`# needs the internet`, the set-up and test commands (`.ci/run` runs the quick start, the contributor's
set-up, `.ci/docs` and both test commands on a fresh machine), and the benchmark (minutes, and
timing-sensitive: `bench/` is its own harness). Blocks that must not run are written as `text`, `json` or
`yaml`. Python blocks that use `toolcage.ray` need a Ray cluster: test_ray_cluster.py runs them against its
multi-engine one. Worker-side snippets (`from toolcage.worker`) belong in docs/protocol.md only.
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
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
FENCE = re.compile(r"^```(python|sh)\n(.*?)^```", re.S | re.M)
# a set-up, test, docs or benchmark command: .ci/run runs these on a fresh machine, in their own steps
NOT_RUN_HERE = re.compile(
    r"examples/(quickstart|dev-setup)\.sh|^\.ci/|python -m pytest|pip install|-m bench\b|mkdocs|local_cluster\.py"
)
TOOLCAGE = shlex.join([sys.executable, "-m", "toolcage.cli"])


def _blocks() -> tuple[list[tuple[str, str]], list[str]]:
    """Every python and sh block, in page order, each once; and where each first appears (page:line)."""
    blocks: list[tuple[str, str]] = []
    places: list[str] = []
    for page in PAGES:
        text = page.read_text()
        for m in FENCE.finditer(text):
            block = (m.group(1), m.group(2))
            if block not in blocks:
                blocks.append(block)
                places.append(f"{page.relative_to(ROOT).as_posix()}:{text.count(chr(10), 0, m.start()) + 1}")
    return blocks, places


BLOCKS, PLACES = _blocks()
RAY_BLOCKS = [i for i, (lang, body) in enumerate(BLOCKS) if lang == "python" and "toolcage.ray" in body]
PYTHON_BLOCKS = [i for i, (lang, _) in enumerate(BLOCKS) if lang == "python" and i not in RAY_BLOCKS]

pytestmark = [
    pytest.mark.usefixtures("no_leaks"),
    pytest.mark.runc_only(
        "the documentation's examples: the CLI's and library's behaviour, host-side (what the sandbox does is "
        "tested under gVisor by test_exec, test_files_*, test_workspace_copy and tests/security)"
    ),
]


def _shell_lines() -> list[tuple[str, str]]:
    """(where, line) for every shell line this test runs."""
    lines = []
    for (lang, body), place in zip(BLOCKS, PLACES, strict=True):
        if lang != "sh":
            continue
        page, first = place.rsplit(":", 1)
        for n, line in enumerate(body.splitlines(), start=int(first) + 1):
            skip = "[--" in line or "needs the internet" in line or NOT_RUN_HERE.search(line)
            if line.strip() and not skip:
                lines.append((f"{page}:{n}", line))
    return lines


SHELL_LINES = _shell_lines()


def _expected_exit(line: str) -> int:
    m = re.search(r"#.*\bexit (\d)", line)
    return int(m.group(1)) if m else 0


def test_the_docs_have_runnable_examples() -> None:
    """README.md and docs/ keep the examples this test runs (a rename or a new fence style cannot empty it)."""
    readme = [place for place in PLACES if place.startswith("README.md:")]
    assert len(readme) >= 5, readme
    assert len(PYTHON_BLOCKS) >= 15 and len(SHELL_LINES) >= 30 and RAY_BLOCKS
    pages = {place.split(":")[0] for place in PLACES}
    assert {"docs/library.md", "docs/cli.md", "docs/tools.md", "docs/frameworks/langchain.md"} <= pages, pages


def test_worker_side_snippets_stay_in_the_protocol_page() -> None:
    """Only docs/protocol.md shows the worker's own API; a user's page shows the library, the CLI or connectors."""
    worker = [PLACES[i] for i in PYTHON_BLOCKS if "from toolcage.worker" in BLOCKS[i][1]]
    assert all(place.startswith("docs/protocol.md:") for place in worker), worker


def test_the_set_up_commands_the_docs_show_are_what_ci_runs() -> None:
    """The README's quick start, contributor set-up and both test commands are the ones .ci/run runs, verbatim."""
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    for command in (
        "sh examples/quickstart.sh",
        "sh examples/dev-setup.sh",
        ".venv/bin/python -m pytest",
        'TOOLCAGE_SANDBOX=gvisor .venv/bin/python -m pytest tests/integration tests/security -m "not runc_only"',
    ):
        assert command in readme, command
        assert command in ci, command


@pytest.mark.parametrize("index", PYTHON_BLOCKS, ids=[PLACES[i] for i in PYTHON_BLOCKS])
def test_python_example_runs(engine: Any, index: int) -> None:
    """Each Python block runs as written and exits 0."""
    code = BLOCKS[index][1]
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-2000:]


@pytest.mark.parametrize("line", [line for _, line in SHELL_LINES], ids=[where for where, _ in SHELL_LINES])
def test_shell_example_runs(engine: Any, line: str, tmp_path: Path) -> None:
    """Each shell example exits as its comment says (0 unless it says otherwise)."""
    run_id = _a_run_id()
    cmd = re.sub(r"(^|\|\s*)toolcage ", lambda m: m.group(1) + TOOLCAGE + " ", line).replace("<RUN_ID>", run_id)
    # 600 s: docs/harbor.md's build_runner.py bootstraps Debian trixie and pip-installs Harbor (1 min 45 s on a quiet
    # hour; 252 s, then past 300 s, in two loaded full passes)
    proc = subprocess.run(["sh", "-c", cmd], cwd=ROOT, capture_output=True, text=True, timeout=600)
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
