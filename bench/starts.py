"""Fresh sandboxes per second on one host, against the engine's own limit, with the CPU split (issue 27).

    python -m bench.starts [--burst 200] [--floor-n 24] [--threads 4,8] [--pool 8:4]

Measures, in one run on the same engine and image:
  1. the engine limit: plain ``docker run --rm --network none --entrypoint true IMAGE`` (the CLI, one
     process per container) and the same through the engine API with docker-py (create, start, wait,
     remove: no CLI process), each at parallelism 1, 2, 4, 8 and 16 (``--floor-n`` containers per
     level); the best method and level is then run again with ``--burst`` containers: that rate is
     the engine limit;
  2. toolcage ``Sandbox`` starts: ``Sandbox(...).start()``, the first ``ping`` and ``close()``, on
     ``--threads`` threads at once, ``--burst`` sandboxes in all; the burst ends when the last one
     is closed and removed (``toolcage.wait_removed()``), as ``docker run --rm`` waits for its removal;
  3. ``Pool(size=K, parallel=P)`` refilling (``--pool K:P``): from an empty pool, one consumer takes
     slots as fast as they come (``with pool.sandbox() as sb: sb.call("ping")``) until ``--burst``
     are used; the rate is sandboxes made ready per second (the last removed, the pool closed).
  Each phase's rate is starts per second and its ratio to the engine limit (goal: >= 0.9x).

CPU split per start: a sampling process (a child, so its own CPU is counted apart) reads every
``--interval`` s ``/proc/<pid>/stat`` (utime+stime; cutime+cstime: reaped children) of dockerd,
containerd, every ``containerd-shim*``, ``runc`` and ``fuse-overlayfs`` process, and the containers'
``cpuacct.usage`` under ``/sys/fs/cgroup/cpuacct/docker/``. The engine has no systemd unit here, so
short-lived processes are caught as follows:
  - runc: each ``runc create/start/kill/delete`` is a child of its shim, which reaps it: its CPU lands
    in the shim's cutime. The container's own processes are reaped by the shim too (it is their
    subreaper), so runc = shims' cutime - the containers' cpuacct. Also shown: runc processes seen
    alive by the sampler (a lower bound: their last ms before exit are missed);
  - the ``containerd-shim-runc-v2 start`` launcher is reaped by containerd (its cutime), the
    fuse-overlayfs launcher by dockerd (its cutime); the daemons themselves are sampled;
  - a process that exits between two samples loses what it used since the last one. The table's
    "machine total" (``/proc/stat``, all CPUs, every process) shows what is left unaccounted
    (missed tails, kernel threads, the sampler, anything else on the machine); the machine's busy
    rate measured idle first (``--idle`` s) is taken off it as "background".
The toolcage side is this process's utime+stime (every thread); the ``docker`` CLI processes of the
CLI floor are its reaped children. CPU times are in 10 ms clock ticks, summed over many processes.

Containers it makes: ``toolcage-bench-starts-*`` (floor, labelled ``toolcage.bench=starts-<pid>``)
and toolcage's own (tool ``bench-starts``), each removed before the phase ends.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from toolcage import DEFAULT_IMAGE

GOAL = 0.9
TICK_MS = 1000 / os.sysconf("SC_CLK_TCK")
LABEL = f"toolcage.bench=starts-{os.getpid()}"

# The sampler: a child process (its CPU is not the toolcage side's). On each line "mark" read on stdin,
# writes one JSON line of cumulative CPU ms per component since it started.
SAMPLER = r"""
import json, os, select, sys, time
TICK = 1000 / os.sysconf("SC_CLK_TCK")
INTERVAL = float(sys.argv[1])
CG = "/sys/fs/cgroup/cpuacct/docker"
procs = {}       # (pid, start) -> [comm, own0, child0, own, child]
cgroups = {}     # id -> [usage0 ns, usage ns]
first = True
runc_seen = set()

def stat(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            s = f.read()
    except OSError:
        return None
    comm = s[s.index("(") + 1 : s.rindex(")")]
    rest = s[s.rindex(")") + 2 :].split()
    # rest[0] is field 3 (state): utime is field 14, stime 15, cutime 16, cstime 17, starttime 22
    return comm, int(rest[11]) + int(rest[12]), int(rest[13]) + int(rest[14]), rest[19]

def kind(comm):
    if comm == "dockerd" or comm == "containerd":
        return comm
    if comm.startswith("containerd-shim"):
        return "shim"
    if comm == "runc":
        return "runc"
    if comm.startswith("fuse-overlayfs"):
        return "fuse-overlayfs"
    return None

known = set()  # pids whose comm is not ours: not read again

def scan():
    global first
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        pid = int(name)
        if pid in known:  # not ours (pid reuse within a run is not expected: pid_max is large)
            continue
        st = stat(pid)
        if st is None:
            continue
        comm, own, child, start = st
        key = (pid, start)
        rec = procs.get(key)
        if rec is not None:
            rec[3], rec[4] = own, child
            continue
        k = kind(comm)
        if k is None:
            known.add(pid)
            continue
        procs[key] = [k, own if first else 0, child if first else 0, own, child]
    try:
        ids = os.listdir(CG)
    except OSError:
        ids = []
    for cid in ids:
        if len(cid) != 64:
            continue
        try:
            with open(f"{CG}/{cid}/cpuacct.usage") as f:
                u = int(f.read())
        except (OSError, ValueError):
            continue
        rec = cgroups.get(cid)
        if rec is None:
            cgroups[cid] = [u if first else 0, u]
        else:
            rec[1] = u
    first = False

def totals():
    out = {"containers_seen": sum(1 for r in cgroups.values() if r[0] == 0)}
    for k, own0, child0, own, child in procs.values():
        out[k] = out.get(k, 0.0) + (own - own0) * TICK
        out[k + " children"] = out.get(k + " children", 0.0) + (child - child0) * TICK
    out["containers"] = sum(u - u0 for u0, u in cgroups.values()) / 1e6
    with open("/proc/stat") as f:
        cpu = [int(x) for x in f.readline().split()[1:]]
    out["machine busy"] = (sum(cpu[:8]) - cpu[3] - cpu[4]) * TICK
    out["sampler"] = sum(os.times()[:2]) * 1000
    return out

scan()
while True:
    r, _, _ = select.select([sys.stdin], [], [], INTERVAL)
    scan()
    if r:
        line = sys.stdin.readline()
        if not line or line.strip() == "quit":
            break
        sys.stdout.write(json.dumps(totals()) + "\n")
        sys.stdout.flush()
"""


class Sampler:
    def __init__(self, interval: float) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", SAMPLER, str(interval)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )

    def mark(self) -> dict[str, float]:
        assert self.proc.stdin and self.proc.stdout
        self.proc.stdin.write("mark\n")
        self.proc.stdin.flush()
        out = json.loads(self.proc.stdout.readline())
        out["secs"] = time.perf_counter()
        t = os.times()  # this process (toolcage / the client) and its reaped children (the docker CLI)
        out["toolcage (this process)"] = (t.user + t.system) * 1000
        out["docker CLI processes"] = (t.children_user + t.children_system) * 1000
        return out

    def close(self) -> None:
        assert self.proc.stdin
        self.proc.stdin.write("quit\n")
        self.proc.stdin.flush()
        self.proc.wait(10)


def split(before: dict[str, float], after: dict[str, float], starts: int, background: float) -> dict[str, float]:
    """CPU ms per start by component, from two marks; ``background``: the machine's busy ms per second
    measured idle before the phases (other tenants, kernel threads), taken off the unaccounted part."""
    d = {k: after[k] - before.get(k, 0.0) for k in after}
    shim_children = d.get("shim children", 0.0)
    out = {
        "toolcage (this process)": d["toolcage (this process)"],
        "docker CLI processes": d["docker CLI processes"],
        "dockerd": d.get("dockerd", 0.0),
        "containerd": d.get("containerd", 0.0),
        "shim (daemons + launchers)": d.get("shim", 0.0) + d.get("containerd children", 0.0),
        "runc (shims' reaped children - containers)": max(shim_children - d["containers"], 0.0),
        "fuse-overlayfs (daemons + launchers)": d.get("fuse-overlayfs", 0.0) + d.get("dockerd children", 0.0),
        "containers (their own processes)": d["containers"],
    }
    listed = sum(out.values())
    out["machine total (all CPUs)"] = d["machine busy"]
    out["background (idle rate x phase time)"] = background * d["secs"]
    out["unaccounted (machine - listed - sampler - bg)"] = (
        d["machine busy"] - listed - d["sampler"] - out["background (idle rate x phase time)"]
    )
    per = {k: v / starts for k, v in out.items()}
    per["runc seen alive (lower bound)"] = d.get("runc", 0.0) / starts
    per["containers seen / starts"] = d["containers_seen"] / starts
    return per


# the phases -------------------------------------------------------------------------------------
def burst(n: int, threads: int, one: Callable[[int], None], done: Callable[[], None] | None = None) -> float:
    """``n`` calls of ``one(i)`` on ``threads`` threads, as fast as they go; seconds until all (and
    ``done()``) returned."""
    lock, nxt, errors = threading.Lock(), [0], []

    def work() -> None:
        while True:
            with lock:
                i = nxt[0]
                nxt[0] += 1
            if i >= n or errors:
                return
            try:
                one(i)
            except Exception as exc:  # stops the burst: a failed start is not a measured start
                errors.append(exc)

    t0 = time.perf_counter()
    ts = [threading.Thread(target=work) for _ in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    if done is not None:
        done()
    if errors:
        raise errors[0]
    return time.perf_counter() - t0


def floor_cli(image: str, tag: str) -> Callable[[int], None]:
    def one(i: int) -> None:
        name = f"toolcage-bench-starts-{os.getpid()}-{tag}-{i}"
        cmd = ["docker", "run", "--rm", "--name", name, "--label", LABEL, "--network", "none"]
        subprocess.run([*cmd, "--entrypoint", "true", image], check=True, stdout=subprocess.DEVNULL)

    return one


def floor_api(image: str, tag: str, threads: int) -> Callable[[int], None]:
    import docker

    local = threading.local()

    def one(i: int) -> None:
        api = getattr(local, "api", None)
        if api is None:
            api = local.api = docker.APIClient(version="auto")
        hc = api.create_host_config(network_mode="none")
        name = f"toolcage-bench-starts-{os.getpid()}-{tag}-{i}"
        cid = api.create_container(
            image, entrypoint=["true"], host_config=hc, name=name, labels={LABEL.split("=")[0]: LABEL.split("=")[1]}
        )["Id"]
        try:
            api.start(cid)
            api.wait(cid)
        finally:
            api.remove_container(cid, force=True)

    return one


def sandbox_start(image: str) -> Callable[[int], None]:
    from toolcage import Sandbox

    def one(i: int) -> None:
        sb = Sandbox(image=image, tool="bench-starts", audit=False).start()
        try:
            assert sb.call("ping").ok
        finally:
            sb.close()

    return one


def pool_refill(image: str, n: int, size: int, parallel: int) -> float:
    """From an empty pool, one consumer takes ``n`` slots as fast as they come; seconds until the
    last is used and removed and the pool closed."""
    import toolcage
    from toolcage.pool import Pool

    t0 = time.perf_counter()
    with Pool("default", size=size, parallel=parallel, image=image, tool="bench-starts", audit=None) as pool:
        for _ in range(n):
            with pool.sandbox() as sb:
                assert sb.call("ping").ok
    toolcage.wait_removed()
    return time.perf_counter() - t0


def cleanup() -> None:
    """Our floor containers, if a failure left any (toolcage removes its own)."""
    out = subprocess.run(["docker", "ps", "-aq", "--filter", f"label={LABEL}"], capture_output=True, text=True)
    ids = out.stdout.split()
    if ids:
        subprocess.run(["docker", "rm", "-f", *ids], capture_output=True)


def main() -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.starts", description=__doc__.split("\n\n")[0])
    ap.add_argument("--burst", type=int, default=200, help="sandboxes per toolcage phase, and the limit's burst")
    ap.add_argument("--floor-n", type=int, default=24, help="containers per floor level (the scan)")
    ap.add_argument("--levels", default="1,2,4,8,16", help="parallelism of the floor scan")
    ap.add_argument("--threads", default="4,8", help="threads starting Sandboxes at once (each a burst)")
    ap.add_argument("--pool", default="8:4", help="Pool size:parallel pairs (each a burst)")
    ap.add_argument("--idle", type=float, default=5.0, help="seconds measuring the machine's background load")
    ap.add_argument("--interval", type=float, default=0.02, help="the CPU sampler's period, seconds")
    ap.add_argument("--image", default=os.environ.get("TOOLCAGE_IMAGE", DEFAULT_IMAGE))
    args = ap.parse_args()
    levels = [int(x) for x in args.levels.split(",")]

    sampler = Sampler(args.interval)
    rows: list[dict[str, Any]] = []

    def phase(label: str, n: int, run: Callable[[], float]) -> dict[str, Any]:
        before = sampler.mark()
        secs = run()
        after = sampler.mark()
        row = {"phase": label, "n": n, "s": secs, "rate": n / secs, "cpu": split(before, after, n, background)}
        rows.append(row)
        print(f"  {label:<40} {n:>4} in {secs:6.1f} s = {n / secs:5.2f}/s", file=sys.stderr, flush=True)
        return row

    idle0 = sampler.mark()
    time.sleep(args.idle)
    idle1 = sampler.mark()
    background = (idle1["machine busy"] - idle0["machine busy"] - idle1["sampler"] + idle0["sampler"]) / (
        idle1["secs"] - idle0["secs"]
    )
    print(f"  machine busy while this run idles: {background:.0f} ms/s (of {os.cpu_count()} CPUs)", file=sys.stderr)
    try:
        # warm up: the image's layers, docker-py's and toolcage's imports, the engine's caches
        burst(4, 2, floor_api(args.image, "warm", 2))
        burst(2, 1, floor_cli(args.image, "warm"))
        burst(4, 2, sandbox_start(args.image), lambda: __import__("toolcage").wait_removed())

        scan: dict[tuple[str, int], float] = {}
        for p in levels:
            for method, make in (("api", lambda p, m: floor_api(args.image, m, p)), ("cli", None)):
                fn = make(p, f"{method}{p}") if make else floor_cli(args.image, f"{method}{p}")
                r = phase(f"floor {method} x{p}", args.floor_n, lambda fn=fn, p=p: burst(args.floor_n, p, fn))
                scan[(method, p)] = r["rate"]
        best_method, best_p = max(scan, key=lambda k: scan[k])
        fn = (floor_api if best_method == "api" else lambda i, t, p: floor_cli(i, t))(args.image, "limit", best_p)
        limit_row = phase(f"ENGINE LIMIT: {best_method} x{best_p}", args.burst, lambda: burst(args.burst, best_p, fn))
        limit = limit_row["rate"]

        import toolcage

        for th in [int(x) for x in args.threads.split(",")]:
            fn = sandbox_start(args.image)
            phase(
                f"toolcage Sandbox start+ping+close x{th}",
                args.burst,
                lambda fn=fn, th=th: burst(args.burst, th, fn, toolcage.wait_removed),
            )
        for pair in args.pool.split(","):
            k, p = (int(x) for x in pair.split(":"))
            phase(
                f"toolcage Pool(size={k}, parallel={p}) refill",
                args.burst,
                lambda k=k, p=p: pool_refill(args.image, args.burst, k, p),
            )
    finally:
        sampler.close()
        cleanup()

    print(f"\nFresh sandboxes per second on one host ({args.image}; {os.cpu_count()} CPUs)")
    print(f"  {'phase':<44}{'n':>5}{'s':>7}{'/s':>7}{'x limit':>9}  goal >= {GOAL}x")
    for r in rows:
        toolcage_row = r["phase"].startswith("toolcage")
        verdict = ("PASS" if r["rate"] >= GOAL * limit else "MISS") if toolcage_row else ""
        print(f"  {r['phase']:<44}{r['n']:>5}{r['s']:>7.1f}{r['rate']:>7.2f}{r['rate'] / limit:>9.2f}  {verdict}")

    shown = [r for r in rows if r is limit_row or r["phase"].startswith("toolcage")]
    cols = ["limit" if r is limit_row else r["phase"].replace("toolcage ", "").split(" start")[0][:14] for r in shown]
    print("\nCPU ms per start by component (sampled /proc and cpuacct; see the docstring for what is caught)")
    print(f"  {'component':<46}" + "".join(f"{c:>15}" for c in cols))
    for k in shown[0]["cpu"]:
        fmt = "{:>15.2f}" if k.startswith("containers seen") else "{:>15.1f}"
        print(f"  {k:<46}" + "".join(fmt.format(r["cpu"][k]) for r in shown))
    for r in rows:
        if not (r is limit_row or r["phase"].startswith("toolcage")):
            c = r["cpu"]
            engine = c["dockerd"] + c["containerd"] + c["shim (daemons + launchers)"]
            engine += c["runc (shims' reaped children - containers)"] + c["fuse-overlayfs (daemons + launchers)"]
            print(
                f"  ({r['phase']}: engine {engine:.1f} ms/start, client {c['toolcage (this process)']:.1f},"
                f" CLI {c['docker CLI processes']:.1f}, containers {c['containers (their own processes)']:.1f})"
            )

    tc = [r for r in rows if r["phase"].startswith("toolcage")]
    best = max(tc, key=lambda r: r["rate"])
    engine_keys = ["dockerd", "containerd", "shim (daemons + launchers)", "runc (shims' reaped children - containers)",
                   "fuse-overlayfs (daemons + launchers)"]  # fmt: skip
    c = best["cpu"]
    parts = sorted(
        [(k, c[k]) for k in [*engine_keys, "toolcage (this process)", "containers (their own processes)"]],
        key=lambda kv: -kv[1],
    )
    engine = sum(c[k] for k in engine_keys)
    unacc = statistics.median([r["cpu"]["unaccounted (machine - listed - sampler - bg)"] for r in rows])
    print(
        f"\nconclusion: the engine limit here is {limit:.2f} starts/s ({best_method} at parallelism {best_p});"
        f" toolcage's best is {best['rate']:.2f}/s ({best['phase']}), {best['rate'] / limit:.2f}x:"
        f" {'PASS' if best['rate'] >= GOAL * limit else 'MISS'}. Per start there: engine {engine:.0f} ms CPU,"
        f" toolcage {c['toolcage (this process)']:.0f} ms, the container's own processes"
        f" {c['containers (their own processes)']:.0f} ms; background {background:.0f} ms/s. Largest parts: "
        + ", ".join(f"{k} {v:.0f} ms" for k, v in parts[:3])
        + f"; {unacc:.0f} ms per start unaccounted (median over phases)"
        + (
            ": negative, the machine was busier idle than during the phases (other tenants yield to a"
            " saturated machine), so the background estimate and that row are not reliable."
            if unacc < 0
            else "."
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
