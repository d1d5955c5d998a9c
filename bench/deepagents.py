"""The Deep Agents backend's cost on one machine, in one run, beside toolcage's raw ``Sandbox`` exec.

    .venv/bin/python -m bench.deepagents [--runs 5] [--commands 50] [--files 200]

- **first answer**: from constructing the backend (``ToolcageSandbox(workspace)``: the container started and the
  workspace copied in) to the answer of its first ``execute("true")``; the raw row is ``Sandbox(workspace=...,
  workspace_mode="copy")`` started and its first ``exec`` answered; the same small workspace (a checkout of 20
  files) for both;
- **per command (warm)**: ``backend.execute("true")`` (``/bin/sh -c`` with the backend's preamble) beside
  ``sb.call("exec", {"command": "true"})``, and deepagents' own ``read`` (a ``python3 -c`` script through
  ``execute``: what the agent's ``read_file`` costs) and ``ls``;
- **files**: ``upload_files`` and ``download_files`` of ``--files`` small files (one round trip each way).

Prints a table (median, p90 and minimum; first answers over ``--runs`` sessions, commands over all of them).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from typing import Any

from toolcage import Sandbox, wait_removed

GOAL_MS = 20.0


def _ms(fn: Callable[[], Any]) -> tuple[float, Any]:
    t = time.perf_counter()
    out = fn()
    return (time.perf_counter() - t) * 1000, out


def _workspace() -> str:
    top = tempfile.mkdtemp(prefix="toolcage-bench-deepagents-")
    os.chmod(top, 0o755)
    for i in range(20):
        os.makedirs(os.path.join(top, f"pkg{i % 4}"), exist_ok=True)
        with open(os.path.join(top, f"pkg{i % 4}", f"m{i}.py"), "w") as f:
            f.write(f"def f{i}() -> int:\n    return {i}\n" * 20)
    return top


def bench(runs: int, commands: int, files: int) -> dict[str, list[float]]:
    from toolcage.integrations.deepagents import ToolcageSandbox

    ws = _workspace()
    out: dict[str, list[float]] = {k: [] for k in ("first", "raw_first", "execute", "raw", "read", "ls", "up", "down")}
    batch = [(f"/scratch/in/{i}.txt", f"row {i}\n".encode()) for i in range(files)]
    for _ in range(runs):
        t = time.perf_counter()
        with ToolcageSandbox(ws) as backend:
            r = backend.execute("true")
            out["first"].append((time.perf_counter() - t) * 1000)
            assert r.exit_code == 0, r
            for _ in range(commands):
                out["execute"].append(_ms(lambda b=backend: b.execute("true"))[0])
                out["read"].append(_ms(lambda b=backend: b.read("/workspace/pkg0/m0.py"))[0])
                out["ls"].append(_ms(lambda b=backend: b.ls("/workspace/pkg0"))[0])
            ms, got = _ms(lambda b=backend: b.upload_files(batch))
            assert all(g.error is None for g in got)
            out["up"].append(ms)
            ms, got = _ms(lambda b=backend: b.download_files([p for p, _ in batch]))
            assert all(g.content is not None for g in got)
            out["down"].append(ms)
        t = time.perf_counter()
        with Sandbox(session_policy(), workspace=ws, workspace_mode="copy") as sb:
            res = sb.call("exec", {"command": "true"})
            out["raw_first"].append((time.perf_counter() - t) * 1000)
            assert res.result["exit_code"] == 0
            for _ in range(commands):
                out["raw"].append(_ms(lambda s=sb: s.call("exec", {"command": "true"}))[0])
        wait_removed(60)
    return out


def session_policy() -> dict[str, Any]:
    """What ToolcageSandbox runs by default: the default policy for an hour's session."""
    return {"extends": "default", "timeouts": {"run_s": 3600, "idle_s": 600}}


def _row(name: str, xs: list[float]) -> str:
    xs = sorted(xs)
    p90 = xs[min(len(xs) - 1, int(len(xs) * 0.9))]
    return f"| {name} | {statistics.median(xs):.1f} | {p90:.1f} | {xs[0]:.1f} | {len(xs)} |"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--commands", type=int, default=50)
    ap.add_argument("--files", type=int, default=200)
    args = ap.parse_args(argv)
    out = bench(args.runs, args.commands, args.files)
    kind = os.environ.get("TOOLCAGE_SANDBOX", "container")
    print(f"Deep Agents backend vs toolcage's Sandbox, sandbox {kind}, {args.runs} sessions (ms)\n")
    print("| measure | median | p90 | min | n |\n|---|---|---|---|---|")
    rows = [
        ("first answer: ToolcageSandbox(ws) -> first execute", "first"),
        ("first answer: Sandbox(ws, copy) -> first exec", "raw_first"),
        ("warm: backend.execute('true')", "execute"),
        ("warm: Sandbox.call('exec', 'true')", "raw"),
        ("warm: backend.read(file) (deepagents' read_file)", "read"),
        ("warm: backend.ls(dir) (deepagents' ls)", "ls"),
        (f"upload_files: {args.files} files", "up"),
        (f"download_files: {args.files} files", "down"),
    ]
    for name, key in rows:
        print(_row(name, out[key]))
    warm = statistics.median(out["execute"])
    verdict = "met" if warm < GOAL_MS else "NOT met"
    print(f"\nwarm execute median {warm:.1f} ms: goal under {GOAL_MS:.0f} ms {verdict}; ", end="")
    print(f"overhead over the raw exec {warm - statistics.median(out['raw']):+.1f} ms")


if __name__ == "__main__":
    main()
