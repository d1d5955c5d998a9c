"""grep's speed against GNU ``grep -r`` in the same sandbox (issue 24, item 5: within 2x).

    python -m bench.grep [--files 100000] [--runs 5] [--image IMAGE] [--sandbox gvisor] [--json PATH]

One sandbox: ``run_python`` makes a tree of ``--files`` small files under /scratch/tree (100
directories of 10 of 100 files, 20 short lines each; every 1,000th file holds NEEDLE), then,
interleaved ``--runs`` times, both searches for NEEDLE are timed on the host around the call:

- the ``grep`` tool (``path: /scratch/tree``, the walk, open, read and match in the worker);
- ``run_shell`` ``grep -rn NEEDLE /scratch/tree`` (GNU grep, plus the shell's start, a few ms).

Both answer the same 100 matches (checked). Printed as JSON: p50 and min of each in ms, the
ratio of the p50s and whether it meets the goal (<= 2.0). A figure, not a test.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Any

from toolcage import Sandbox

GOAL = 2.0

MAKE_TREE = """
import os, random
random.seed(1)
words = ["alpha", "beta", "gamma", "delta", "import os", "def f(x):", "return x+1", "# comment", "class Foo:"]
n = 0
for d in range({dirs}):
    for e in range(10):
        p = f"/scratch/tree/d{{d}}/e{{e}}"
        os.makedirs(p, exist_ok=True)
        for f in range(100):
            with open(f"{{p}}/f{{f}}.py", "w") as fh:
                body = "\\n".join(random.choice(words) for _ in range(20))
                fh.write(body + ("\\nNEEDLE here\\n" if n % 1000 == 0 else "\\n"))
            n += 1
print(n)
"""


def _timed(fn: Any) -> tuple[float, Any]:
    t = time.perf_counter()
    out = fn()
    return (time.perf_counter() - t) * 1000, out


def _result(res: Any) -> dict[str, Any]:
    if not res.ok:
        raise SystemExit(f"{res.tool} failed: {res.error}")
    out: dict[str, Any] = res.result
    return out


def measure(
    files: int = 100_000, runs: int = 5, image: str | None = None, sandbox: str | None = None
) -> dict[str, Any]:
    dirs = max(1, files // 1000)
    policy = {
        # tmpfs keeps a page per small file: 100,000 files take about 400 MiB of scratch
        "limits": {"scratch": "1g", "memory": "1g", "output_cap": "4m"},
        "timeouts": {"call_s": 600, "run_s": 1800},
    }
    with Sandbox(policy, image=image, sandbox=sandbox) as sb:
        made = _result(sb.call("run_python", {"code": MAKE_TREE.format(dirs=dirs)}))
        if made.get("exit_code") != 0:
            raise SystemExit(f"making the tree failed: {made.get('stderr', '')[-2000:]}")
        tool_ms: list[float] = []
        gnu_ms: list[float] = []
        gnu_wall: list[float] = []
        for i in range(runs + 1):  # the first round warms the caches and is not counted
            ms_tool, r = _timed(
                lambda: sb.call("grep", {"pattern": "NEEDLE", "path": "/scratch/tree", "max_matches": 100_000})
            )
            ms_gnu, g = _timed(lambda: sb.call("run_shell", {"command": "grep -rn NEEDLE /scratch/tree"}))
            r, g = _result(r), _result(g)
            found_gnu = len(g["stdout"].splitlines())
            if len(r["matches"]) != found_gnu:
                raise SystemExit(f"the tool found {len(r['matches'])} lines, grep -r {found_gnu}")
            if i:
                tool_ms.append(ms_tool)
                gnu_ms.append(ms_gnu)
                gnu_wall.append(float(g.get("wall_ms", 0)))
    tool_p50, gnu_p50 = statistics.median(tool_ms), statistics.median(gnu_ms)
    return {
        "files": dirs * 1000,
        "matches": found_gnu,
        "runs": runs,
        "grep_tool_ms": {"p50": round(tool_p50, 1), "min": round(min(tool_ms), 1)},
        "run_shell_grep_r_ms": {"p50": round(gnu_p50, 1), "min": round(min(gnu_ms), 1)},
        "grep_r_wall_ms_in_sandbox": {"p50": round(statistics.median(gnu_wall), 1)},
        "ratio_p50": round(tool_p50 / gnu_p50, 2),
        "goal": GOAL,
        "meets_goal": tool_p50 / gnu_p50 <= GOAL,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.grep", description=__doc__.split("\n\n")[0])
    ap.add_argument("--files", type=int, default=100_000)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--image", default=None, help="worker image (default $TOOLCAGE_IMAGE, else the release tag)")
    ap.add_argument("--sandbox", default=None, help="sandbox kind, e.g. gvisor")
    ap.add_argument("--json", default=None, help="also write the result here")
    args = ap.parse_args(argv)
    out = measure(args.files, args.runs, args.image, args.sandbox)
    text = json.dumps(out, indent=2)
    print(text)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
