"""Where a whole ``toolcage run`` process spends its time, beside the ``docker run`` CLI (issue 27).

    python -m bench.split_cli [--runs 7]

Measures, interleaved (``--runs`` rounds, medians printed):
  1. the floor: plain hardened ``docker run --rm ... python3 -c pass`` as a user types it (the same
     command and flags as ``python -m bench``, from ``bench.__main__.docker_run_flags``);
  2. ``toolcage run run_python --params '{"code": "pass"}'`` as a user types it (the console script,
     audit log on; no daemon, then with ``toolcage daemon`` running: ``bench.daemon``), and
     ``python -c pass`` (the interpreter's start and end alone);
  3. the same ``toolcage run`` in a harness process (``python -c HARNESS``, which calls the console
     script's ``toolcage.cli.main:main``) that splits the main thread's time by the innermost thing it
     is doing, every nanosecond counted once:
       - imports: an import hook times each module's ``create_module`` + ``exec_module`` (self time,
         without the modules it imports), grouped by top package;
       - engine API calls: ``requests.Session.send`` (every HTTP request docker-py makes to the engine
         socket), counted and timed per endpoint; calls made on other threads are counted apart;
       - fsyncs: ``os.fsync`` / ``os.fdatasync`` (the audit log), counted and timed;
       - waiting in ``Sandbox.call`` for the worker's answer (the worker's start, its imports and the
         ``run_python`` child: from ``docker start`` to the first answer, printed too);
       - ``Sandbox.close`` (teardown) and the rest of the library's and the CLI's Python;
       - the interpreter's start (spawn to the harness's first line, which also holds ``site``) and
         its end (the last ``atexit`` hook to the process's exit, as the parent sees it).
     The hooks cost a few ms: the table's total is the instrumented process; the uninstrumented one
     is printed beside it, and the ratio to the floor is computed from that.

Containers it makes are named ``toolcage-bench-split-*``; ``toolcage run`` removes its own.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from bench import daemon as bench_daemon
from toolcage import DEFAULT_IMAGE

PARAMS = '{"code": "pass"}'

# Runs in the measured process. Installed before anything else is imported; writes one JSON record.
HARNESS = r"""
import time
T0 = time.time_ns()
import sys, os, atexit, threading
ns = time.perf_counter_ns
P0 = ns()
OUT, PID, MAIN = sys.argv[1], os.getpid(), threading.get_ident()
PRELOADED = sorted(sys.modules)
acc = {}           # category -> ns, main thread, innermost activity only
stack = [["other Python (CLI, policy, sandbox start)", P0]]
events = []        # (kind, label, ms, main?)
marks = {}

def push(cat):
    if threading.get_ident() != MAIN:
        return False
    t = ns()
    top = stack[-1]
    acc[top[0]] = acc.get(top[0], 0) + t - top[1]
    stack.append([cat, t])
    return True

def pop():
    t = ns()
    cat, t0 = stack.pop()
    acc[cat] = acc.get(cat, 0) + t - t0
    stack[-1][1] = t

def timed(kind, cat, label, fn):
    def wrapper(*a, **kw):
        main = push(cat)
        t = ns()
        try:
            return fn(*a, **kw)
        finally:
            events.append((kind, label(a, kw) if callable(label) else label, (ns() - t) / 1e6, main))
            if main:
                pop()
    return wrapper

GROUPS = [
    ("docker-py + requests", ("docker", "requests", "urllib3", "charset_normalizer", "idna", "certifi",
                              "websocket", "chardet", "paramiko")),
    ("pydantic", ("pydantic", "pydantic_core", "annotated_types", "typing_extensions", "typing_inspection")),
    ("click", ("click",)), ("rich", ("rich", "pygments", "markdown_it", "mdurl")),
    ("structlog", ("structlog",)),
    ("jsonrpcclient", ("jsonrpcclient",)),
]

def group(name):
    top = name.split(".")[0]
    for g, tops in GROUPS:
        if top in tops:
            return "import " + g
    if top == "toolcage":
        return "import toolcage: " + ".".join(name.split(".")[1:2])
    return ("import stdlib: " if top in sys.stdlib_module_names else "import other: ") + top

def after_requests(mod):
    def label(a, kw):
        req = a[1]
        path = re.sub(r"^http\+docker://[^/]+", "", req.url).split("?")[0]
        path = re.sub(r"/v[0-9.]+/", "/", path)
        path = re.sub(r"/(containers|networks|volumes|images)/(?!create$|json$)[^/]+", r"/\1/{x}", path)
        return f"{req.method} {path}"
    mod.Session.send = timed("http", "engine API calls", label, mod.Session.send)

def after_sandbox(mod):
    def call(orig):
        def wrapper(*a, **kw):
            marks.setdefault("call0", time.time_ns())
            try:
                return timed("wait", "waiting in Sandbox.call (the worker's answers)", "call", orig)(*a, **kw)
            finally:
                marks.setdefault("call1", time.time_ns())
        return wrapper
    mod.Sandbox.call = call(mod.Sandbox.call)
    mod.Sandbox.close = timed("close", "Sandbox.close (teardown, Python)", "close", mod.Sandbox.close)

def after_adapter(mod):
    orig = mod.Engine.start
    def start(*a, **kw):
        try:
            return orig(*a, **kw)
        finally:
            marks.setdefault("started", time.time_ns())
    mod.Engine.start = start

AFTER = {"requests.sessions": after_requests, "toolcage.sandbox": after_sandbox,
         "toolcage.engine.docker_adapter": after_adapter}

class Hook:
    def find_spec(self, name, path, target=None):
        main = push(group(name))  # finding it (path scans, stats) counts as its import too
        try:
            for f in sys.meta_path:
                if f is self or not hasattr(f, "find_spec"):
                    continue
                spec = f.find_spec(name, path, target)
                if spec is not None:
                    break
            else:
                return None
        finally:
            if main:
                pop()
        loader = spec.loader
        if loader is None or isinstance(loader, type) or not hasattr(loader, "exec_module"):
            return spec  # builtin and frozen modules (class loaders): not wrapped
        cat = group(name)
        create, execute = getattr(loader, "create_module", None), loader.exec_module
        if create is not None:
            def create_module(spec, create=create, cat=cat):
                main = push(cat)
                try:
                    return create(spec)
                finally:
                    if main:
                        pop()
            loader.create_module = create_module
        def exec_module(module, execute=execute, cat=cat, name=name):
            main = push(cat)
            try:
                execute(module)
            finally:
                if main:
                    pop()
            if name in AFTER:
                AFTER[name](module)
        loader.exec_module = exec_module
        return spec

sys.meta_path.insert(0, Hook())
os.fsync = timed("fsync", "fsyncs", "fsync", os.fsync)
os.fdatasync = timed("fsync", "fsyncs", "fdatasync", os.fdatasync)
import re

def write():
    if os.getpid() != PID:
        return
    while len(stack) > 1:
        pop()
    cat, t0 = stack[0]
    acc[cat] = acc.get(cat, 0) + ns() - t0
    n_mods = len(sys.modules) - len(PRELOADED)
    rec = {"T0": T0, "acc_ms": {k: v / 1e6 for k, v in acc.items()}, "events": events, "marks": marks,
           "modules_imported": n_mods, "atexit": time.time_ns()}
    with open(OUT, "w") as f:
        json.dump(rec, f)

atexit.register(write)   # registered first: runs last of the atexit hooks
import json
sys.argv = ["toolcage"] + sys.argv[2:]
from toolcage.cli.main import main
sys.exit(main())
"""


def floor_cmd(image: str, i: int) -> list[str]:
    from bench.__main__ import docker_run_flags

    name = f"toolcage-bench-split-floor-{os.getpid()}-{i}"
    flags = docker_run_flags(image)
    return ["docker", "run", "--rm", "--name", name, *flags, "--entrypoint", "python3", image, "-c", "pass"]


def wall(cmd: list[str], env: dict[str, str] | None = None) -> float:
    t = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    return (time.perf_counter() - t) * 1000


def harness_run(image: str) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="toolcage-bench-split-") as d:
        out = Path(d, "rec.json")
        # the container's name: toolcage-<tool>-<run id>; --name is not a flag of `toolcage run`
        cmd = [sys.executable, "-c", HARNESS, str(out), "run", "run_python", "--params", PARAMS, "--image", image]
        t_spawn = time.time_ns()
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        t_exit = time.time_ns()
        rec = json.loads(out.read_text())
    rec["python_start_ms"] = (rec["T0"] - t_spawn) / 1e6
    rec["teardown_ms"] = (t_exit - rec["atexit"]) / 1e6
    rec["total_ms"] = (t_exit - t_spawn) / 1e6
    m = rec["marks"]
    rec["start_to_answer_ms"] = (m["call1"] - m["started"]) / 1e6 if "call1" in m and "started" in m else 0.0
    return rec


def main() -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.split_cli", description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=7, help="interleaved rounds (medians printed)")
    ap.add_argument("--image", default=os.environ.get("TOOLCAGE_IMAGE", DEFAULT_IMAGE))
    args = ap.parse_args()
    toolcage_cli = shutil.which("toolcage", path=os.path.dirname(sys.executable)) or "toolcage"
    plain_cli = [toolcage_cli, "run", "run_python", "--params", PARAMS, "--image", args.image]

    with bench_daemon.running() as daemon_env:
        return _rounds(args, plain_cli, daemon_env)


def _rounds(args: argparse.Namespace, plain_cli: list[str], daemon_env: dict[str, str]) -> int:
    samples: dict[str, list[float]] = defaultdict(list)
    phases: dict[str, list[float]] = defaultdict(list)
    http_main: dict[str, list[tuple[int, float]]] = defaultdict(list)
    other: dict[str, list[float]] = defaultdict(list)
    others: dict[str, list[float]] = defaultdict(list)  # third-party packages outside the named groups
    for i in range(args.runs + 1):  # the first round warms up, discarded
        got = {
            "docker run CLI (floor)": wall(floor_cmd(args.image, i)),
            "python -c pass": wall([sys.executable, "-c", "pass"]),
            "toolcage run (plain)": wall(plain_cli, bench_daemon.COLD),
            "toolcage run (toolcage daemon running)": wall(plain_cli, daemon_env),
        }
        rec = harness_run(args.image)
        if not i:
            continue
        for k, v in got.items():
            samples[k].append(v)
        samples["toolcage run (harness)"].append(rec["total_ms"])
        split = ("import other: ", "import stdlib: ", "import toolcage: ")
        row = {k: v for k, v in rec["acc_ms"].items() if not k.startswith(split)}
        for kind, label in (
            ("other", "import other third-party"),
            ("stdlib", "import stdlib"),
            ("toolcage", "import toolcage.*"),
        ):
            prefix = f"import {kind}: "
            row[label] = sum(v for k, v in rec["acc_ms"].items() if k.startswith(prefix))
            for k, v in rec["acc_ms"].items():
                if k.startswith(prefix):
                    others[f"{kind} {k[len(prefix) :]}"].append(v)
        row["Python start (spawn to first line, site)"] = rec["python_start_ms"]
        row["interpreter end (last atexit to exit)"] = rec["teardown_ms"]
        for k in set(phases) | set(row):
            phases[k].append(row.get(k, 0.0))
        per: dict[str, list[float]] = defaultdict(list)
        for kind, label, ms, main in rec["events"]:
            if kind == "http":
                per[("main " if main else "other threads ") + label].append(ms)
            elif not main:
                other[f"{kind} (other threads)"].append(ms)
        for k, v in per.items():
            http_main[k].append((len(v), sum(v)))
        other["fsync count"].append(sum(1 for e in rec["events"] if e[0] == "fsync"))
        other["engine calls (all threads)"].append(sum(1 for e in rec["events"] if e[0] == "http"))
        other["modules imported after start"].append(rec["modules_imported"])
        other["docker start to first answer (ms)"].append(rec["start_to_answer_ms"])
        print(f"\rround {i}/{args.runs}", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)

    med = {k: statistics.median(v) for k, v in samples.items()}
    ph = {k: statistics.median(v) for k, v in phases.items()}
    total = med["toolcage run (harness)"]
    floor = med["docker run CLI (floor)"]
    print(f"\n`toolcage run run_python` as a whole process: split of the main thread (median of {args.runs} runs)")
    print(f"  {'phase':<52}{'ms':>8}{'share':>8}")
    order = sorted(ph, key=lambda k: -ph[k])
    for k in order:
        print(f"  {k:<52}{ph[k]:>8.1f}{ph[k] / total:>8.0%}")
    for kind in ("toolcage", "stdlib", "other"):
        heavy = sorted((kv for kv in others.items() if kv[0].startswith(kind + " ")), key=lambda kv: -sum(kv[1]))[:8]
        listed = ", ".join(f"{k.split(' ', 1)[1] or '(package)'} {sum(v) / args.runs:.1f}" for k, v in heavy)
        print(f"    ({kind}, mean ms per run: {listed})")
    print(f"  {'sum of the phases (medians)':<52}{sum(ph.values()):>8.1f}")
    print(f"  {'total, instrumented process':<52}{total:>8.1f}{'':>8}")
    imports = sum(v for k, v in ph.items() if k.startswith("import "))
    print(f"  {'  of which imports, all groups':<52}{imports:>8.1f}{imports / total:>8.0%}")

    print("\nengine API calls (count and ms per run, median)")
    for k, v in sorted(http_main.items(), key=lambda kv: -statistics.median(x[1] for x in kv[1])):
        n = statistics.median(x[0] for x in v)
        print(f"  {k:<52}{n:>4.0f} x {statistics.median(x[1] for x in v):>7.1f} ms")
    for k, v in other.items():
        print(f"  {k:<52}{statistics.median(v):>8.1f}")

    print("\nwhole processes (median ms)")
    for k, v in med.items():
        print(f"  {k:<52}{v:>8.1f}{v / floor:>8.2f}x the floor")
    print(f"  the harness's own cost ~ {total - med['toolcage run (plain)']:.1f} ms")

    top = [k for k in order if k != "sum"][:3]
    print(
        f"\nconclusion: `toolcage run` is {med['toolcage run (plain)'] / floor:.2f}x the `docker run` CLI"
        f" ({med['toolcage run (plain)']:.0f} vs {floor:.0f} ms); imports are {imports / total:.0%} of it;"
        " the largest parts: " + ", ".join(f"{k} ({ph[k]:.0f} ms)" for k in top)
    )
    resident = med["toolcage run (toolcage daemon running)"]
    print(f"with `toolcage daemon` running: {resident / floor:.2f}x ({resident:.0f} ms)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
