"""Background processes and terminals (issue 37): a keystroke's echo on a terminal, and a background process's
first output byte, each beside a floor measured in the same run, in the same sandbox.

    python -m bench.processes [--keys 300] [--starts 60] [--runs 3] [--sandbox container|gvisor] [--json PATH]

One sandbox (audit off). Measured on the host around the calls, interleaved ``--runs`` times:

- ``pty_echo``: a keystroke on a terminal to its echo: ``cat`` started with ``pty=True``, one character
  written (``proc_write``), then ``proc_read`` with a timeout until it comes back (the terminal echoes it);
  every 64 keystrokes a CR ends the line, drained untimed (a terminal's line holds at most 4,095);
- ``pipe_echo`` (the floor): the same calls on a ``cat`` started on pipes, in the same container (``cat``
  writes back what it reads);
- ``ping``: one call's round trip on the same sandbox, for scale (a keystroke's echo is two calls);
- ``spawn_first_byte``: ``spawn("echo hi")`` then ``read(timeout=)`` until ``hi`` comes (two calls); of
  which ``spawn_answer``, until ``spawn`` returned (``proc_start``'s answer: the process has started);
- ``run_shell`` (the floor): a ``run_shell`` ``echo hi`` call with its output (one call).

Printed as JSON: p50 and p90 of each in ms, and the ratios of the p50s to their floors. Reported, no goal.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from datetime import UTC, datetime
from typing import Any

import toolcage
from toolcage import Sandbox
from toolcage.processes import Process

POLICY: dict[str, Any] = {"extends": "default", "timeouts": {"run_s": 1800, "idle_s": 600, "call_s": 60}}
LINE = 64  # keystrokes per terminal line before a CR drains it


def _ms(t: float) -> float:
    return (time.perf_counter() - t) * 1000


def echo_rtt(proc: Process, key: str = "a") -> float:
    """One keystroke written, read back (ms). The echo is the first byte past the handle's cursor."""
    t = time.perf_counter()
    proc.write(key)
    while True:
        out = proc.read(timeout=5)
        if key in out.text:
            return _ms(t)
        if not out.running:
            raise RuntimeError(f"process {proc.id} ended: {out}")


def drain_line(proc: Process) -> None:
    """End the terminal's line (CR) and read until cat wrote it back: the echo's CRLF, then the line's."""
    proc.write("\r")
    seen = ""
    while seen.count("\r\n") < 2:
        out = proc.read(timeout=5)
        seen += out.text
        if not out.data and not out.running:
            raise RuntimeError(f"process {proc.id} ended: {out}")


def keystrokes(sb: Sandbox, pty: Process, pipe: Process, n: int) -> dict[str, list[float]]:
    got: dict[str, list[float]] = {"pty_echo": [], "pipe_echo": [], "ping": []}
    for i in range(n):
        got["pty_echo"].append(echo_rtt(pty))
        got["pipe_echo"].append(echo_rtt(pipe))
        t = time.perf_counter()
        assert sb.call("ping").ok
        got["ping"].append(_ms(t))
        if (i + 1) % LINE == 0:
            drain_line(pty)
    drain_line(pty)
    return got


def first_bytes(sb: Sandbox, n: int) -> dict[str, list[float]]:
    got: dict[str, list[float]] = {"spawn_answer": [], "spawn_first_byte": [], "run_shell": []}
    for _ in range(n):
        t = time.perf_counter()
        proc = sb.spawn("echo hi", stdin=False)
        got["spawn_answer"].append(_ms(t))
        while "hi" not in proc.read(timeout=5).text:
            pass
        got["spawn_first_byte"].append(_ms(t))
        t = time.perf_counter()
        r = sb.call("run_shell", {"command": "echo hi"})
        got["run_shell"].append(_ms(t))
        assert r.ok and r.result["stdout"] == "hi\n", r
    return got


def _p(values: list[float], q: float) -> float:
    s = sorted(values)
    return round(s[min(len(s) - 1, int(q * len(s)))], 3)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(prog="python -m bench.processes")
    ap.add_argument("--keys", type=int, default=300, help="keystrokes per run")
    ap.add_argument("--starts", type=int, default=60, help="background starts per run")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--sandbox", default="container")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    series: dict[str, list[float]] = {
        k: [] for k in ("pty_echo", "pipe_echo", "ping", "spawn_answer", "spawn_first_byte", "run_shell")
    }
    load = os.getloadavg()
    with Sandbox(POLICY, sandbox=args.sandbox, audit=False) as sb:
        pty = sb.spawn("cat", pty=True, name="bench-pty")
        pipe = sb.spawn("cat", name="bench-pipe")
        keystrokes(sb, pty, pipe, 20)  # warm
        first_bytes(sb, 5)
        for _ in range(args.runs):
            for k, v in keystrokes(sb, pty, pipe, args.keys).items():
                series[k] += v
            for k, v in first_bytes(sb, args.starts).items():
                series[k] += v
        pty.kill()
        pipe.kill()
    p50 = {k: statistics.median(v) for k, v in series.items()}
    result = {
        "bench": "processes",
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "toolcage": toolcage.__version__,
        "python": platform.python_version(),
        "sandbox": args.sandbox,
        "load_average": [round(x, 2) for x in (*load, *os.getloadavg())],  # before (1, 5, 15 min), after
        "keys": args.keys,
        "starts": args.starts,
        "runs": args.runs,
        "p50_ms": {k: round(v, 3) for k, v in p50.items()},
        "p90_ms": {k: _p(v, 0.9) for k, v in series.items()},
        "ratios": {
            "pty_echo / pipe_echo": round(p50["pty_echo"] / p50["pipe_echo"], 2),
            "pipe_echo / ping": round(p50["pipe_echo"] / p50["ping"], 2),
            "spawn_first_byte / run_shell": round(p50["spawn_first_byte"] / p50["run_shell"], 2),
        },
    }
    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            f.write(text + "\n")
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
