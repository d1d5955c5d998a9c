"""A live network policy change (issue 39): its cost from the call to its effect, beside a call's round trip.

    python -m bench.live_network [--changes 40] [--sandbox container|gvisor] [--json PATH]

One sandbox (audit off) started with ``network.mode: proxy`` and an empty allow list. Measured on the host:

- ``change``: ``sb.update_network(...)``, alternating two allowlists: the call returns once the egress proxy
  has swapped its policy and confirmed it, and the worker's copy (SafeFetch's) follows;
- ``ping`` (the floor): one call's round trip on the same sandbox.

Printed as JSON: p50 and p90 of each in ms and the ratio of the p50s. No traffic leaves the machine (the
allowlists name hosts nothing asks for); that a cut connection ends within the change is shown by
tests/integration/test_live_network.py::test_a_connection_the_new_policy_refuses_is_cut.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from datetime import UTC, datetime
from typing import Any

import toolcage
from toolcage import Sandbox

POLICY: dict[str, Any] = {
    "name": "bench-live-network",
    "network": {"mode": "proxy", "allow": []},
    "timeouts": {"run_s": 600, "idle_s": 300},
}


def _stats(xs: list[float]) -> dict[str, float]:
    xs = sorted(xs)
    return {"p50": round(statistics.median(xs), 3), "p90": round(xs[int(len(xs) * 0.9) - 1], 3)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.live_network", description=__doc__.split("\n")[0])
    ap.add_argument("--changes", type=int, default=40)
    ap.add_argument("--sandbox", default="container")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    change_ms: list[float] = []
    ping_ms: list[float] = []
    nets = [
        {"mode": "proxy", "allow": [{"host": "pypi.org"}, {"host": "*.pythonhosted.org"}]},
        {"mode": "proxy", "allow": [{"host": "api.github.com"}]},
    ]
    with Sandbox(POLICY, sandbox=args.sandbox, audit=False) as sb:
        sb.update_network(nets[1])  # the first waits for the proxy's start: not a change's cost
        for i in range(args.changes):
            t0 = time.perf_counter()
            sb.update_network(nets[i % 2])
            change_ms.append((time.perf_counter() - t0) * 1000)
            t0 = time.perf_counter()
            sb.call("ping")
            ping_ms.append((time.perf_counter() - t0) * 1000)
    change, ping = _stats(change_ms), _stats(ping_ms)
    out = {
        "bench": "live_network",
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "toolcage": toolcage.__version__,
        "python": platform.python_version(),
        "sandbox": args.sandbox,
        "changes": args.changes,
        "change_ms": change,
        "ping_ms": ping,
        "change_over_ping": round(change["p50"] / ping["p50"], 1),
    }
    text = json.dumps(out, indent=2)
    print(text)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
