"""examples/eval_loop runs as written: task images built locally, each task graded by its tests and by the patch
``changes(path="/testbed")`` gives, and the images left as they were (issue 36's "Done means")."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.runc_only(
    "the example's loop, host-side; writable paths and their diff under gVisor: test_writable_image_paths"
)

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "eval_loop" / "eval_loop.py"


def test_the_eval_loop_resolves_every_task_and_grades_by_the_diff(engine: Any) -> None:
    out = subprocess.run([sys.executable, str(EXAMPLE)], capture_output=True, text=True, timeout=600, check=False)
    assert out.returncode == 0, out.stdout + out.stderr[-2000:]
    results = [json.loads(line) for line in out.stdout.splitlines()]
    assert {r["task"] for r in results} == {"calc", "slug", "stats"}
    for r in results:
        assert r["failing_before"] and r["passing_after"] and r["resolved"], r
        fix = json.loads((ROOT / "examples" / "eval_loop" / "tasks" / r["task"] / "fix.json").read_text())
        assert r["changed"] == [fix["file"]]
        assert fix["new"] in r["patch"] and fix["old"] in r["patch"]
        assert f"+++ b/{fix['file']}" in r["patch"]
    # the images are unchanged: a fresh run of one still fails its test
    again = subprocess.run(
        ["docker", "run", "--rm", "--network", "none", "toolcage-example-task-calc:1"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert again.returncode != 0 and "FAIL" in again.stderr
