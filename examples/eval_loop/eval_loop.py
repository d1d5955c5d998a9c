"""An eval loop over task images, graded by the diff the agent made (issue 36: your image, our cage).

Each task under ``tasks/`` is what an eval dataset ships: an image holding a repository at ``/testbed``
with a failing test (SWE-bench's shape). For each task the loop

1. builds the task's image if it is missing (``docker build``, FROM the Debian base that
   ``toolcage image build`` bootstrapped; no registry, no network),
2. starts a sandbox of that image, unchanged, with ``/testbed`` writable for this run only,
3. lets an agent work in it (here a scripted one stands in for a model: it reads the file, then writes
   the fix with the sandbox's file tools),
4. grades the run: the task's tests, run in the sandbox, and the patch ``changes(path="/testbed")`` gives
   against the image's own tree, which is what a harness keeps and scores.

Nothing is built per run, the image is never modified (its ``/testbed`` is the same after the loop), and
every sandbox is removed at the end of its ``with`` block.

    python examples/eval_loop/eval_loop.py            # every task; prints one JSON line per task
    python examples/eval_loop/eval_loop.py calc slug  # some of them
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from toolcage import Sandbox

TASKS = Path(__file__).resolve().parent / "tasks"
PREFIX = "toolcage-example-task-"


def ensure_image(task: Path) -> str:
    """The task's image, built from its Dockerfile if this engine does not have it yet."""
    tag = f"{PREFIX}{task.name}:1"
    have = subprocess.run(["docker", "image", "inspect", tag], capture_output=True, check=False)
    if have.returncode != 0:
        subprocess.run(["docker", "build", "-q", "-t", tag, str(task)], check=True, capture_output=True)
    return tag


def agent(sb: Sandbox, fix: dict[str, str]) -> None:
    """A scripted agent: read the file, change one line, write it back (a model would choose the edit)."""
    path = f"/testbed/{fix['file']}"
    text = sb.call("read_file", {"path": path}).result["content"]
    sb.call("write_file", {"path": path, "content": text.replace(fix["old"], fix["new"])})


def run_task(task: Path) -> dict[str, object]:
    image = ensure_image(task)
    fix = json.loads((task / "fix.json").read_text())
    started = time.monotonic()
    with Sandbox(image=image, writable=("/testbed",), writable_size="64m") as sb:
        before = sb.call("exec", {"argv": ["python3", "-m", "unittest", "-q"]}).result["exit_code"]
        agent(sb, fix)
        after = sb.call("exec", {"argv": ["python3", "-m", "unittest", "-q"]}).result["exit_code"]
        patch = sb.changes(path="/testbed")
    return {
        "task": task.name,
        "image": image,
        "failing_before": before != 0,
        "passing_after": after == 0,
        "changed": list(patch.paths),
        "patch": patch.diff,
        "resolved": before != 0 and after == 0,
        "seconds": round(time.monotonic() - started, 2),
    }


def main(names: list[str]) -> int:
    tasks = [TASKS / n for n in names] if names else sorted(p for p in TASKS.iterdir() if p.is_dir())
    results = [run_task(t) for t in tasks]
    for r in results:
        print(json.dumps(r))
    return 0 if all(r["resolved"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
