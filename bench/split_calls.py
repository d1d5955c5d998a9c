"""Where a sequential call's time goes on one warm sandbox (issue 27: "find where each miss goes").

    python -m bench.split_calls [--runs 5] [--calls 2000]

Measures, in the same run and interleaved (``--runs`` rounds, medians printed):
  1. sequential ``ping`` calls/s on one warm ``Sandbox``, with the audit log (the default) and
     without it (``audit=False``), beside the floor: a bare echo loop answering over the same
     attach socket (the hardened configuration of a run, as ``bench/calls.py`` measures it);
  2. the host side of one call, split by a timeline of ``time.perf_counter_ns`` stamps that this
     module adds by monkeypatching (nothing in ``runner/`` changes): the caller's work before the
     request (checks, id, slot), the JSON encoding, the write syscall, the time in flight (the
     engine's attach relay and the worker), the demultiplexing of Docker's frames, the JSON decoding,
     the parser's checks, the routing to the waiting slot, the thread hand-off (reader thread's
     ``Event.set`` to the caller running again) and the caller's work after the answer (the audit
     record queued, the result built). The stamps cost about a microsecond each: the instrumented
     call is slower than an uninstrumented one, so the split is read as shares;
  3. the worker side: the round trip beside the echo floor's (the difference is the worker's
     per-message Python in the container, plus the host's reader thread waking to read it); the same
     worker on the host over plain pipes beside an echo loop over pipes (no toolcage host code: the
     difference is the worker's own Python per ping); and a cProfile of that worker (``--sandbox none``,
     ``python -m toolcage.worker`` under ``-m cProfile``), grouped by package, per ping (two runs of
     different lengths subtracted, so its start-up is left out);
  4. the pipelined calls' CPU: 64 in flight on one ``AsyncSandbox``, the CPU time per call of the runner (this
     process), the worker (the container's PID 1, from ``/proc``) and dockerd (its attach relay), beside the
     wall time: their sum over the cores bounds the rate;
  5. issue 40's call-path goals, each PASS or MISS against its floor from this run: sequential calls/s
     (audit on, the default) >= 0.67x the echo floor; pipelined calls/s (64 in flight on one
     ``AsyncSandbox``) >= 30,000 or >= 0.34x the echo loop's own pipelined rate; warm
     ``run_python pass`` <= 5 ms (median).

Containers it makes are named ``toolcage-bench-split-*`` and removed by it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pstats
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from typing import Any

from bench.calls import ECHO_LINES, REQUEST, bench_container, raw_echo, toolcage_pipelined
from toolcage import DEFAULT_IMAGE, Sandbox
from toolcage.policies import load_policy

TOOL = "bench-split"
ns = time.perf_counter_ns


# -- the floor: a bare echo loop over the same attach socket ---------------------------------------
def echo_floor(image: str, calls: int) -> dict[str, float]:
    """Sequential round trips to a bare echo loop in the run's hardened configuration (as bench.calls.raw_echo)."""
    engine, cid = bench_container(image, ["python3", "-S", "-c", ECHO_LINES])
    try:
        sock, close = engine.attach(cid)
        engine.start(cid)
        rtts = []
        for i in range(calls + 200):
            buf = bytearray()
            t = ns()
            sock.sendall(REQUEST)
            while b"pong" not in buf:
                chunk = sock.recv(1 << 16)
                if not chunk:
                    raise RuntimeError("the echo loop ended")
                buf += chunk
            if i >= 200:
                rtts.append((ns() - t) / 1000)
        close()
        return {"rtt_us": statistics.median(rtts), "per_s": len(rtts) / (sum(rtts) / 1e6)}
    finally:
        with contextlib.suppress(Exception):
            engine.kill(cid)
        engine.remove(cid)


def audit_paired(image: str, calls: int, blocks: int = 8) -> float:
    """Calls/s with the audit log over calls/s without it, on one warm sandbox, blocks of ``calls // blocks``
    alternating (the sandbox's log swapped between them: the default one, then none): the median of the
    pairs' ratios. Less moved by a shared machine than two sandboxes measured one after the other."""
    ratios = []
    with Sandbox(image=image, tool=TOOL) as sb:
        log = sb.audit
        for _ in range(200):
            sb.call("ping")
        n = max(calls // blocks, 50)
        try:
            for _ in range(blocks):
                rate = {}
                for on in (True, False):
                    sb.audit = log if on else None
                    t0 = ns()
                    for _ in range(n):
                        sb.call("ping")
                    rate[on] = n / ((ns() - t0) / 1e9)
                ratios.append(rate[True] / rate[False])
        finally:
            sb.audit = log
    return statistics.median(ratios)


def warm_run_python(image: str, calls: int) -> float:
    """Median ms of ``run_python`` with ``pass`` on one warm sandbox (audit on, the default)."""
    with Sandbox(image=image, tool=TOOL) as sb:
        for _ in range(10):
            sb.call("run_python", {"code": "pass"})
        out = []
        for _ in range(calls):
            t = ns()
            r = sb.call("run_python", {"code": "pass"})
            out.append((ns() - t) / 1e6)
            assert r.ok, r
        return statistics.median(out)


def calls_per_s(image: str, audit: Any, calls: int) -> float:
    with Sandbox(image=image, tool=TOOL, audit=audit) as sb:
        for _ in range(200):
            sb.call("ping")
        t0 = ns()
        for _ in range(calls):
            sb.call("ping")
        return calls / ((ns() - t0) / 1e9)


# -- the host side: a timeline per call, stamped by monkeypatching ---------------------------------
SEGMENTS = [  # (name, from stamp, to stamp)
    ("caller: checks, id, slot", "call", "enc0"),
    ("caller: JSON encode", "enc0", "enc1"),
    ("caller: expect, lock", "enc1", "send0"),
    ("write + in flight: relay, worker, back", "send0", "recv"),
    ("reader: demux frames", "recv", "out0"),
    ("reader: JSON decode", None, None),  # summed from the loads wrapper
    ("reader: parser checks, redaction", "out0", "route0"),  # minus the decode
    ("reader: route to slot", "route0", "done"),
    ("thread hand-off (Event.set to caller)", "done", "req1"),
    ("caller: after (audit queued, result)", "req1", "ret"),
]


class _SockProxy:
    """The attach socket with its recv stamped (the reader thread looks ``self._sock.recv_into`` up per read)."""

    def __init__(self, sock: Any, stamps: dict[str, int]) -> None:
        self._s, self._st = sock, stamps

    def recv(self, n: int) -> bytes:
        b = self._s.recv(n)
        self._st.setdefault("recv", ns())
        return b

    def recv_into(self, buf: Any, n: int = 0) -> int:  # what the reader uses (one buffer, allocated once)
        got: int = self._s.recv_into(buf, n)
        self._st.setdefault("recv", ns())
        return got

    def __getattr__(self, name: str) -> Any:
        return getattr(self._s, name)


@contextlib.contextmanager
def instrumented() -> Any:
    """Stamp every step of a call; yields the list of per-call stamp dicts and a hook to wrap the socket."""
    from toolcage import sandbox as sandbox_mod
    from toolcage.engine.attach import DockerAttachTransport
    from toolcage.rpc import session as session_mod
    from toolcage.rpc import transport as transport_mod

    cur: dict[str, int] = {}
    done: list[dict[str, int]] = []
    saved: list[tuple[Any, str, Any]] = []

    def patch(owner: Any, name: str, make: Any) -> None:
        orig = getattr(owner, name)
        saved.append((owner, name, orig))
        setattr(owner, name, make(orig))

    def stamp_around(k0: str | None, k1: str | None) -> Any:
        def make(orig: Any) -> Any:
            def wrapper(*a: Any, **kw: Any) -> Any:
                if k0:
                    cur[k0] = ns()
                try:
                    return orig(*a, **kw)
                finally:
                    if k1:
                        cur.setdefault(k1, ns())

            return wrapper

        return make

    def loads_make(orig: Any) -> Any:
        def loads(*a: Any, **kw: Any) -> Any:
            t = ns()
            try:
                return orig(*a, **kw)
            finally:
                cur["loads"] = cur.get("loads", 0) + ns() - t

        return loads

    class _Json:  # the transport module's `json`, with loads stamped
        def __getattr__(self, name: str) -> Any:
            return getattr(json, name)

    shim = _Json()
    shim.loads = loads_make(json.loads)  # type: ignore[attr-defined]

    def call_make(orig: Any) -> Any:
        def call(*a: Any, **kw: Any) -> Any:
            cur.clear()
            cur["call"] = ns()
            try:
                return orig(*a, **kw)
            finally:
                cur["ret"] = ns()
                done.append(dict(cur))

        return call

    def stdout_make(orig: Any) -> Any:
        def stdout(*a: Any, **kw: Any) -> Any:
            cur.setdefault("out0", ns())
            return orig(*a, **kw)

        return stdout

    patch(sandbox_mod.Sandbox, "call", call_make)
    patch(session_mod, "encode_request", stamp_around("enc0", "enc1"))
    patch(DockerAttachTransport, "send", stamp_around("send0", "send1"))
    patch(transport_mod.StreamParser, "stdout", stdout_make)
    patch(transport_mod, "json", lambda _orig: shim)
    patch(session_mod.Session, "_route", stamp_around("route0", None))
    patch(session_mod._Slot, "done", stamp_around("done", None))
    patch(session_mod.Session, "request", stamp_around(None, "req1"))

    def wrap_socket(sb: Sandbox) -> None:
        transport = sb._run.session._transport  # type: ignore[union-attr]
        transport._sock = _SockProxy(transport._sock, cur)  # type: ignore[union-attr]

    try:
        yield done, wrap_socket
    finally:
        for owner, name, orig in reversed(saved):
            setattr(owner, name, orig)


def split_host(image: str, audit: Any, calls: int) -> dict[str, float]:
    """Median µs of each segment over ``calls`` instrumented pings on one warm sandbox."""
    with instrumented() as (done, wrap_socket), Sandbox(image=image, tool=TOOL, audit=audit) as sb:
        wrap_socket(sb)
        for _ in range(200):
            sb.call("ping")
        done.clear()
        for _ in range(calls):
            sb.call("ping")
    per: dict[str, list[float]] = defaultdict(list)
    for st in done:
        if not all(k in st for k in ("call", "enc0", "enc1", "send0", "send1", "recv", "out0", "route0", "done")):
            continue
        for name, a, b in SEGMENTS:
            if a is None:
                per[name].append(st.get("loads", 0) / 1000)
            elif name.startswith("reader: parser"):
                per[name].append((st[b] - st[a] - st.get("loads", 0)) / 1000)
            else:
                per[name].append((st[b] - st[a]) / 1000)
        per["total"].append((st["ret"] - st["call"]) / 1000)
        per["sendall"].append((st["send1"] - st["send0"]) / 1000)
    return {k: statistics.median(v) for k, v in per.items()}


# -- the worker side: the same worker on the host, under cProfile ----------------------------------
GROUPS = [  # (group, substrings of "path:function"), first match wins
    ("select.poll (waits for the next request)", ("method 'poll'",)),
    ("os.write (the answer; the woken reader may take the CPU)", ("posix.write",)),
    ("os.read (the request)", ("posix.read",)),
    ("inspect (jsonrpcserver's signature check)", ("inspect.py",)),
    ("jsonrpcserver + oslash", ("jsonrpcserver", "oslash")),
    ("json (stdlib)", ("/json/", "_json")),
    ("toolcage worker (loop, dispatch, protocol)", ("toolcage/worker", "/worker/")),
    ("typing", ("typing.py", "typing_extensions")),
]


def _profile_worker(calls: int) -> dict[str, float]:
    """Seconds of own time per function group in a host worker that served ``calls`` pings."""
    from toolcage.backends import process

    fd, path = tempfile.mkstemp(prefix="toolcage-bench-split-", suffix=".prof")
    os.close(fd)
    saved = list(process.LOCAL_WORKER_ARGV)
    process.LOCAL_WORKER_ARGV[:] = [sys.executable, "-m", "cProfile", "-o", path, "-m", "toolcage.worker"]
    try:
        with (
            open(os.devnull, "w") as devnull,
            contextlib.redirect_stderr(devnull),  # the not-isolated warning
            Sandbox(sandbox="none", tool=TOOL, audit=False) as sb,
        ):
            for _ in range(calls):
                sb.call("ping")
        for _ in range(50):  # the worker writes its profile once it has read EOF
            if os.path.getsize(path):
                break
            time.sleep(0.1)
        stats = pstats.Stats(path)
    finally:
        process.LOCAL_WORKER_ARGV[:] = saved
        os.unlink(path)
    groups: dict[str, float] = defaultdict(float)
    for (file, _line, func), (_cc, _nc, tt, _ct, _callers) in stats.stats.items():  # type: ignore[attr-defined]
        where = f"{file}:{func}"
        if "cProfile" in file or "lsprof" in func:
            continue
        name = next((g for g, keys in GROUPS if any(k in where for k in keys)), "other (stdlib, threading)")
        groups[name] += tt
    return groups


def worker_profile(calls: int) -> dict[str, float]:
    """µs per ping by group in the worker (host, ``--sandbox none``, under cProfile): two workers, one
    serving ``calls`` pings and one ``3 * calls``; their difference over ``2 * calls`` leaves out the
    start-up (imports) and the end."""
    a, b = _profile_worker(calls), _profile_worker(3 * calls)
    return {k: max(b.get(k, 0.0) - a.get(k, 0.0), 0.0) * 1e6 / (2 * calls) for k in set(a) | set(b)}


def _worker_env(scratch: str) -> dict[str, str]:
    from toolcage.policies import contract

    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        contract.ENV_POLICY: load_policy("default").canonical_json(),
        contract.ENV_RUN_ID: "benchsplit",
        contract.ENV_DEADLINE: f"{time.time() + 600:.3f}",
        contract.ENV_WORKSPACE: "",
        contract.ENV_SCRATCH: scratch,
    }


PING_LINE = b'{"jsonrpc": "2.0", "method": "ping", "id": "0123456789abcdef"}\n'


def _pings(p: subprocess.Popen[bytes], n: int) -> list[float]:
    """``n`` sequential pings over the process's pipes; µs each."""
    assert p.stdin is not None and p.stdout is not None
    wfd, rfd = p.stdin.fileno(), p.stdout.fileno()
    rtts = []
    for _ in range(n):
        t = ns()
        os.write(wfd, PING_LINE)
        buf = b""
        while not buf.endswith(b"\n"):
            chunk = os.read(rfd, 65536)
            if not chunk:
                raise RuntimeError("the process ended")
            buf += chunk
        rtts.append((ns() - t) / 1000)
    return rtts


def worker_syscalls(calls: int) -> dict[str, float] | None:
    """The worker's syscalls per ping (``strace -f -c``; a run of ``calls`` pings subtracted from one of
    ``3 * calls``, so start-up is left out). None without strace."""
    if shutil.which("strace") is None:
        return None
    counts = []
    with tempfile.TemporaryDirectory(prefix="toolcage-bench-split-") as scratch:
        for n in (calls, 3 * calls):
            out = os.path.join(scratch, f"strace-{n}")
            argv = ["strace", "-f", "-c", "-o", out, sys.executable, "-m", "toolcage.worker"]
            pipe, env = subprocess.PIPE, _worker_env(scratch)
            p = subprocess.Popen(argv, stdin=pipe, stdout=pipe, stderr=subprocess.DEVNULL, env=env, cwd=scratch)
            try:
                _pings(p, n)
            finally:
                assert p.stdin is not None
                p.stdin.close()
                p.wait(30)
            got = {}
            with open(out) as f:
                for row in f.read().splitlines():  # % time, seconds, usecs/call, calls, [errors,] syscall
                    cols = row.split()
                    if len(cols) >= 5 and cols[0][0].isdigit() and cols[-1].isidentifier() and cols[-1] != "total":
                        got[cols[-1]] = int(cols[3])
            counts.append(got)
    a, b = counts
    return {k: (b[k] - a.get(k, 0)) / (2 * calls) for k in b if b[k] - a.get(k, 0) >= calls}


def pipe_floor(calls: int) -> dict[str, float]:
    """Sequential ping round trips (µs, median) over plain pipes on the host, with no toolcage host code:
    to the worker (``python -m toolcage.worker`` as ``--sandbox none`` starts it) and to a bare echo loop, each
    on the same one CPU as this process. Their difference is the worker's own per-message Python, uninstrumented."""
    out: dict[str, float] = {}
    # both ends on one CPU (the child inherits this process's affinity): a round trip across two cores costs a
    # wake-up that comes and goes with where the scheduler puts the two, and the difference read here is the
    # worker's Python only when both pay the same (across cores the echo loop measured 5 to 95 µs)
    cpus = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(cpus)})
    with contextlib.ExitStack() as stack:
        stack.callback(os.sched_setaffinity, 0, cpus)
        scratch = stack.enter_context(tempfile.TemporaryDirectory(prefix="toolcage-bench-split-"))
        for name, argv in (
            ("worker", [sys.executable, "-m", "toolcage.worker"]),
            ("echo loop", [sys.executable, "-S", "-c", ECHO_LINES]),
        ):
            pipe, env = subprocess.PIPE, _worker_env(scratch)
            p = subprocess.Popen(argv, stdin=pipe, stdout=pipe, stderr=subprocess.DEVNULL, env=env, cwd=scratch)
            try:
                out[name] = statistics.median(_pings(p, calls + 200)[200:])
            finally:
                assert p.stdin is not None
                p.stdin.close()
                p.wait(10)
    return out


# -- pipelined: where each call's CPU goes, on the three processes it crosses -------------------------
def _cpu_s(pid: int) -> float:
    """utime + stime of one process (seconds), from /proc/<pid>/stat."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def pipelined_cpu(image: str, calls: int) -> dict[str, float]:
    """``calls`` pings with 64 in flight on one AsyncSandbox (audit off): µs of CPU per call of the runner (this
    process, every thread), the worker (the container's PID 1) and dockerd (its attach relay), and the wall time."""
    import asyncio

    from bench.calls import WINDOW
    from toolcage import AsyncSandbox

    dockerds = [
        int(p) for p in subprocess.run(["pgrep", "-x", "dockerd"], capture_output=True, text=True).stdout.split()
    ]

    async def go() -> dict[str, float]:
        async with AsyncSandbox(image=image, tool=TOOL, audit=False) as sb:
            await asyncio.gather(*(sb.call("ping") for _ in range(WINDOW)))
            from toolcage.engine.docker_adapter import Engine

            info = Engine.default().inspect(sb.container_id or "") or {}
            worker = int(info.get("State", {}).get("Pid") or 0)
            sem = asyncio.Semaphore(WINDOW)

            async def one() -> None:
                async with sem:
                    await sb.call("ping")

            def sample() -> tuple[float, float, float, float]:
                t = os.times()
                return time.perf_counter(), t.user + t.system, _cpu_s(worker), sum(_cpu_s(p) for p in dockerds)

            a = sample()
            await asyncio.gather(*(one() for _ in range(calls)))
            b = sample()
        names = ("wall", "runner", "worker", "dockerd")
        return {k: (y - x) * 1e6 / calls for k, x, y in zip(names, a, b, strict=True)}

    return asyncio.run(go())


def main() -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.split_calls", description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=5, help="interleaved rounds (medians printed)")
    ap.add_argument("--calls", type=int, default=2000, help="sequential calls per measure")
    ap.add_argument("--image", default=os.environ.get("TOOLCAGE_IMAGE", DEFAULT_IMAGE))
    args = ap.parse_args()

    rates: dict[str, list[float]] = defaultdict(list)
    paired: list[float] = []
    splits: dict[str, dict[str, list[float]]] = {"default": defaultdict(list), "off": defaultdict(list)}
    floor_rtt: list[float] = []
    pipes: dict[str, list[float]] = defaultdict(list)
    for r in range(args.runs):
        rates["audit on (default)"].append(calls_per_s(args.image, None, args.calls))
        rates["audit off"].append(calls_per_s(args.image, False, args.calls))
        paired.append(audit_paired(args.image, args.calls))
        f = echo_floor(args.image, args.calls)
        rates["raw echo floor"].append(f["per_s"])
        floor_rtt.append(f["rtt_us"])
        for k, v in pipe_floor(args.calls).items():
            pipes[k].append(v)
        for label, audit in (("default", None), ("off", False)):
            for k, v in split_host(args.image, audit, args.calls).items():
                splits[label][k].append(v)
        print(f"\rround {r + 1}/{args.runs}", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    wprof = worker_profile(args.calls)
    wsys = worker_syscalls(args.calls)
    floor_piped = raw_echo(args.image, args.calls)["pipelined_per_s"]
    piped = toolcage_pipelined(args.image, 4 * args.calls)
    piped_cpu = pipelined_cpu(args.image, 4 * args.calls)
    warm_py = warm_run_python(args.image, 100)

    med = {k: statistics.median(v) for k, v in rates.items()}
    print(f"\nsequential ping calls/s on one warm sandbox (median of {args.runs} rounds, {args.calls} calls each)")
    for k, v in med.items():
        print(f"  {k:<22}{v:>9,.0f}/s  {1e6 / v:>7.1f} µs/call  {v / med['raw echo floor']:.2f}x the floor")
    audit_cost = 1e6 / med["audit on (default)"] - 1e6 / med["audit off"]
    lost = 1 - med["audit on (default)"] / med["audit off"]
    print(f"  the audit log costs {audit_cost:.1f} µs/call ({lost:.0%} of throughput)")
    print(
        f"  paired on one sandbox (blocks with and without the log, alternating): {statistics.median(paired):.2f}x"
        " the calls/s without it"
    )

    d = {k: statistics.median(v) for k, v in splits["default"].items()}
    o = {k: statistics.median(v) for k, v in splits["off"].items()}
    floor = statistics.median(floor_rtt)
    print("\nper-call split, host side (instrumented: µs, median per segment; shares of the instrumented total)")
    print(f"  {'segment':<40}{'audit on':>10}{'share':>8}{'audit off':>11}{'share':>8}")
    for name, _a, _b in SEGMENTS:
        print(f"  {name:<40}{d[name]:>10.1f}{d[name] / d['total']:>8.0%}{o[name]:>11.1f}{o[name] / o['total']:>8.0%}")
    print(f"  {'total (instrumented call)':<40}{d['total']:>10.1f}{'':>8}{o['total']:>11.1f}")
    fl = "write + in flight: relay, worker, back"
    host_d, host_o = d["total"] - d[fl], o["total"] - o[fl]
    print(f"  {'= host Python, outside the round trip':<40}{host_d:>10.1f}{host_d / d['total']:>8.0%}"
          f"{host_o:>11.1f}{host_o / o['total']:>8.0%}")  # fmt: skip
    print(f"  (sendall itself returns after {d['sendall']:.1f} / {o['sendall']:.1f} µs: after the reader thread has"
          " the answer when the GIL goes to it first)")  # fmt: skip
    flight = o[fl]
    print(f"\nthe round trip vs the raw echo floor's ({floor:.1f} µs, sendall to the answer's bytes, same socket):")
    print(
        f"  {flight - floor:.1f} µs more ({(flight - floor) / o['total']:.0%} of an audit-off call): the worker's"
        " per-message Python in the container, and the host's reader thread getting the GIL to read it"
    )
    pw, pe = statistics.median(pipes["worker"]), statistics.median(pipes["echo loop"])
    print(
        f"  on the host over plain pipes, no toolcage host code: worker {pw:.1f} µs, echo loop {pe:.1f} µs a round"
        f" trip: the worker's own Python is {pw - pe:.1f} µs a ping"
    )
    if wsys:
        print(
            f"  its syscalls per ping (strace -c): {sum(wsys.values()):.1f}: "
            + ", ".join(f"{k} {v:.1f}" for k, v in sorted(wsys.items(), key=lambda kv: -kv[1]))
            + " (an echo loop: read 1, write 1; os.read of 256 KiB maps and unmaps a buffer per request)"
        )
    idle = GROUPS[0][0]
    wtotal = sum(v for k, v in wprof.items() if k != idle)
    print(f"\nthe worker on the host, per ping (cProfile, --sandbox none; start-up left out): {wtotal:.1f} µs of work")
    for k, v in sorted(wprof.items(), key=lambda kv: -kv[1]):
        share = "" if k == idle else f"{v / wtotal:>8.0%}"
        print(f"  {k:<44}{v:>8.1f} µs{share}")

    parts = {
        "the round trip beyond the echo floor (worker, reader wake-up)": flight - floor,
        "host Python outside the round trip": host_o,
        "audit record": audit_cost,
        "thread hand-off": o["thread hand-off (Event.set to caller)"],
    }
    top = sorted(parts.items(), key=lambda kv: -kv[1])[:3]
    on = med["audit on (default)"]
    print(
        f"\nconclusion: {on:,.0f} calls/s is {on / med['raw echo floor']:.2f}x the echo floor; of a call's"
        f" {1e6 / on - floor:.0f} µs beyond the floor's round trip the largest parts are "
        + ", ".join(f"{k} ({v:.0f} µs)" for k, v in top)
    )

    cpu, cores = sum(v for k, v in piped_cpu.items() if k != "wall"), os.cpu_count() or 1
    print(
        f"\npipelined (64 in flight), CPU per call: runner {piped_cpu['runner']:.0f} µs, worker"
        f" {piped_cpu['worker']:.0f} µs, dockerd {piped_cpu['dockerd']:.0f} µs ({cpu:.0f} µs in all, against"
        f" {piped_cpu['wall']:.0f} µs of wall time a call): at most {cores * 1e6 / cpu:,.0f} calls/s on {cores}"
        " busy cores"
    )

    def verdict(ok: bool) -> str:
        return "PASS" if ok else "MISS"

    seq = on / med["raw echo floor"]
    piped_ok = piped >= 30_000 or piped >= 0.34 * floor_piped
    print("\ngoals (issue 40, the call path; floors from this run)")
    print(
        f"  {'sequential calls/s, audit on':<34}{on:>9,.0f}/s  {seq:.2f}x the echo floor (goal >= 0.67x)"
        f"  {verdict(seq >= 0.67)}"
    )
    print(
        f"  {'pipelined calls/s (64 in flight)':<34}{piped:>9,.0f}/s  {piped / floor_piped:.2f}x the echo loop's"
        f" {floor_piped:,.0f}/s (goal >= 30,000/s or >= 0.34x)  {verdict(piped_ok)}"
    )
    print(f"  {'warm run_python pass':<34}{warm_py:>9.2f} ms (median; goal <= 5 ms)  {verdict(warm_py <= 5.0)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
