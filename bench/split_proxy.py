"""Where a cold run under a proxy policy spends its time, beside a cold run without network (issue 27).

    python -m bench.split_proxy [--runs 7]

Each round runs, one after the other, a cold ``Sandbox("connector-http")`` (``network.mode: proxy``:
its egress proxy container, its bridge network and its tmpfs volume) and a cold ``Sandbox()`` (the
default policy, ``network: none``), each ``with ... as sb: sb.call("ping")``, as ``python -m bench``
times them. In this process, by monkeypatching (nothing in ``runner/`` changes), it stamps:
  - the run's steps: ``Sandbox()`` made, started, first answer, closed; under the proxy policy also
    ``Egress.prepare`` (the volume; the egress network is made on a thread of its own, which the launch
    waits for: timed as ``POST /networks/create``), ``Egress.launch`` (the network, then the proxy's
    create, attach, start and its ``proxy.listening`` line, on a thread of its own while the sandbox
    starts), the sandbox's own create/attach/start, and ``Egress.down`` (the proxy stopped, drained
    and removed, the sandbox removed, then the volume and the network);
  - every engine API call (``requests.Session.send``: each HTTP request docker-py makes to the
    engine socket), counted and timed by endpoint and by the thread that made it.
Steps that run at the same time overlap: the wall-time table is the caller's view, the engine table
sums each call's own time. Medians over ``--runs`` rounds (one warm-up round discarded).

Containers it makes are named ``toolcage-bench-split-*`` (the tool part of the name) and removed by
the runs themselves.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import statistics
import sys
import threading
import time
from collections import defaultdict
from typing import Any

from toolcage import DEFAULT_IMAGE, Sandbox

TOOL = "bench-split"
PROXY_POLICY = "connector-http"  # the bundled policy with network.mode: proxy
ns = time.perf_counter_ns


class Recorder:
    def __init__(self) -> None:
        self.steps: dict[str, float] = {}  # step -> ms (wall, the first time it runs in the round)
        self.calls: list[tuple[str, float]] = []  # (endpoint [thread], ms)
        self.lock = threading.Lock()

    def reset(self) -> None:
        self.steps, self.calls = {}, []


REC = Recorder()


def _endpoint(req: Any) -> str:
    path = re.sub(r"^http\+docker://[^/]+", "", req.url).split("?")[0]
    path = re.sub(r"/v[0-9.]+/", "/", path)
    path = re.sub(r"/(containers|networks|volumes|images)/(?!create$|json$)[^/]+", r"/\1/{x}", path)
    thread = re.sub(r"[-_]?\d+$", "", threading.current_thread().name)
    return f"{req.method} {path} [{thread}]"


@contextlib.contextmanager
def instrumented() -> Any:
    import requests.sessions

    from toolcage import sandbox as sandbox_mod
    from toolcage.backends import container, egress

    saved: list[tuple[Any, str, Any]] = []

    def patch(owner: Any, name: str, step: str | None) -> None:
        orig = getattr(owner, name)
        saved.append((owner, name, orig))

        def wrapper(*a: Any, **kw: Any) -> Any:
            t = ns()
            try:
                return orig(*a, **kw)
            finally:
                ms = (ns() - t) / 1e6
                if step is None:
                    with REC.lock:
                        REC.calls.append((_endpoint(a[1]), ms))
                else:
                    REC.steps.setdefault(step, ms)

        setattr(owner, name, wrapper)

    patch(requests.sessions.Session, "send", None)
    patch(sandbox_mod.Sandbox, "__init__", "Sandbox() made (policy, options)")
    patch(sandbox_mod.Sandbox, "__enter__", "start: Sandbox.__enter__")
    patch(sandbox_mod.Sandbox, "call", "first answer: call('ping')")
    patch(sandbox_mod.Sandbox, "close", "close: Sandbox.close")
    patch(container.ContainerBackend, "_start_sandbox", "  sandbox: create, attach, start")
    patch(egress.Egress, "prepare", "  egress.prepare: the volume (the network on its own thread)")
    patch(egress.Egress, "launch", "  egress.launch: proxy create/attach/start/ready (thread)")
    patch(egress.Egress, "_wait_ready", "    proxy: start returned to proxy.listening")
    patch(egress.Egress, "down", "  egress.down: proxy stop+drain+remove, sandbox, volume, network")
    patch(egress.Egress, "_end_proxy", "    proxy: SIGTERM to its stream's end")
    try:
        yield
    finally:
        for owner, name, orig in reversed(saved):
            setattr(owner, name, orig)


def cold(policy: str, image: str) -> tuple[float, dict[str, float], list[tuple[str, float]]]:
    from toolcage.lifecycle import removal

    REC.reset()
    t = ns()
    with Sandbox(policy, image=image, tool=TOOL) as sb:
        assert sb.call("ping").ok
    t2 = ns()
    total = (t2 - t) / 1e6
    removal.wait_removed(60)  # the removals close left to its background thread, measured, then counted here
    t3 = ns()
    with REC.lock:
        steps, calls = dict(REC.steps), list(REC.calls)
    steps["start to first answer (caller)"] = (
        (t2 - t) / 1e6 - steps.get("close: Sandbox.close", 0.0) - (steps.get("Sandbox() made (policy, options)", 0.0))
    )
    steps["close returned to removals done (background)"] = (t3 - t2) / 1e6
    return total, steps, calls


def main() -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.split_proxy", description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=7, help="interleaved rounds (medians printed)")
    ap.add_argument("--image", default=os.environ.get("TOOLCAGE_IMAGE", DEFAULT_IMAGE))
    args = ap.parse_args()
    kinds = {"proxy": PROXY_POLICY, "none": "default"}
    totals: dict[str, list[float]] = defaultdict(list)
    steps: dict[str, dict[str, list[float]]] = {k: defaultdict(list) for k in kinds}
    calls: dict[str, dict[str, list[tuple[int, float]]]] = {k: defaultdict(list) for k in kinds}
    all_calls: dict[str, list[tuple[int, float]]] = defaultdict(list)
    with instrumented():
        for i in range(args.runs + 1):
            for kind, policy in kinds.items():
                total, st, cl = cold(policy, args.image)
                if not i:
                    continue  # warm-up
                totals[kind].append(total)
                for k, v in st.items():
                    steps[kind][k].append(v)
                per: dict[str, list[float]] = defaultdict(list)
                for ep, ms in cl:
                    per[ep].append(ms)
                for ep, v in per.items():
                    calls[kind][ep].append((len(v), sum(v)))
                all_calls[kind].append((len(cl), sum(ms for _ep, ms in cl)))
                time.sleep(0.3)  # the last run's background removals are done: each run starts alone
            print(f"\rround {i}/{args.runs}", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)

    tot = {k: statistics.median(v) for k, v in totals.items()}
    print(f"\ncold run, first ping, closed: wall ms (median of {args.runs}); steps nest and overlap;")
    print("the removals run after close, off the caller's path (in the total: no)")
    print(f"  {'step':<66}{'proxy':>8}{'none':>8}{'extra':>8}")
    names = list(dict.fromkeys([*steps["proxy"], *steps["none"]]))
    for k in names:
        p = statistics.median(steps["proxy"][k]) if k in steps["proxy"] else 0.0
        n = statistics.median(steps["none"][k]) if k in steps["none"] else 0.0
        print(f"  {k:<66}{p:>8.1f}{n:>8.1f}{p - n:>+8.1f}")
    print(f"  {'total':<66}{tot['proxy']:>8.1f}{tot['none']:>8.1f}{tot['proxy'] - tot['none']:>+8.1f}")
    print(f"  ratio proxy / none: {tot['proxy'] / tot['none']:.2f}x (goal <= 1.5x)")

    sums: dict[str, tuple[float, float]] = {}
    for kind in kinds:
        print(f"\nengine API calls, {kind} ({kinds[kind]}): count x ms per run (median of the runs making it) [thread]")
        rows = {
            ep: (statistics.median(x[0] for x in v), statistics.median(x[1] for x in v))
            for ep, v in calls[kind].items()
        }
        for ep, (n, ms) in sorted(rows.items(), key=lambda kv: -kv[1][1]):
            print(f"  {ep:<78}{n:>4.0f} x {ms:>7.1f} ms")
        n_all = statistics.median(x[0] for x in all_calls[kind])
        ms_all = statistics.median(x[1] for x in all_calls[kind])
        sums[kind] = (n_all, ms_all)
        print(f"  {'all engine calls':<78}{n_all:>4.0f} x {ms_all:>7.1f} ms")

    sp = {k: statistics.median(v) for k, v in steps["proxy"].items()}
    sn = {k: statistics.median(v) for k, v in steps["none"].items()}

    def call_ms(kind: str, prefix: str, thread: str) -> float:
        got = [
            statistics.median(x[1] for x in v)
            for ep, v in calls[kind].items()
            if ep.startswith(prefix) and thread in ep
        ]
        return sum(got)

    launch = "toolcage-egress-launch"
    path = {
        "egress.prepare: the volume created": sp.get(
            "  egress.prepare: the volume (the network on its own thread)", 0.0
        ),
        "egress network created (on its own thread)": call_ms("proxy", "POST /networks/create", "toolcage-egress"),
        "proxy container created + attached": call_ms("proxy", "POST /containers/create", launch)
        + call_ms("proxy", "POST /containers/{x}/attach", launch),
        "proxy container started (engine, on its bridge network)": call_ms(
            "proxy", "POST /containers/{x}/start", launch
        ),
        "proxy process: started to proxy.listening": sp.get("    proxy: start returned to proxy.listening", 0.0),
    }
    key = "start to first answer (caller)"
    print("\nthe proxy's own path to listening (since issue 27 the first answer does not wait for it: the worker's")
    print("relay holds a connection made before the proxy listens; a code call that connects at once waits for it)")
    for k, v in path.items():
        print(f"  {k:<66}{v:>8.1f}")
    print(f"  {'sum':<66}{sum(path.values()):>8.1f}  (start to first answer: {sp.get(key, 0.0):.1f})")
    none_start = call_ms("none", "POST /containers/{x}/start", "MainThread")
    print(f"  {'beside: the sandbox start call without network':<66}{none_start:>8.1f}")
    print(f"  {'beside: start to first answer without network':<66}{sn.get(key, 0.0):>8.1f}")
    top = sorted(path.items(), key=lambda kv: -kv[1])
    waits = sp.get(key, 0.0) >= 0.9 * sum(path.values())  # the first answer came only once the proxy was up
    print(
        f"\nconclusion: the proxy run is {tot['proxy'] / tot['none']:.2f}x a run without network"
        f" (+{tot['proxy'] - tot['none']:.0f} ms; {sums['proxy'][0]:.0f} engine calls against {sums['none'][0]:.0f});"
        + (
            " its first answer waits on the proxy, in series: "
            if waits
            else " its first answer does not wait on the proxy, which takes meanwhile: "
        )
        + ", ".join(f"{k} {v:.0f} ms" for k, v in top)
        + f"; removals after close take {sp.get('close returned to removals done (background)', 0.0):.0f} ms"
        f" against {sn.get('close returned to removals done (background)', 0.0):.0f} (off the caller's path)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
