"""Red-team attacks on the channel and the end-of-call sweep, each run as tool code on the real engine.

The first test is a hole found on 6962ff0 and fixed in the same commit; the others are
attacks that failed there and pin the defence that stopped them.
"""

from __future__ import annotations

import json
import secrets
import subprocess
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.helpers import RUNSC_ROOT
from toolcage import Sandbox, wait_removed

pytestmark = pytest.mark.usefixtures("no_leaks")


def _processes(engine: Any, cid: str, sb: Sandbox | None = None) -> list[str]:
    """The command lines of every process in the container, as the engine sees them from outside;
    with ``sb``, without the worker's own run_python zygote (the pid it reports, matched through
    the host's /proc NSpid: a forked child shows the zygote's command line too, so not by name).
    Under gVisor the processes live in its kernel, not the host's: ``runsc ps`` lists them (pid, name)."""
    before = sb.call("sandbox.usage").result if sb is not None else {}
    zygote, ahead = before.get("zygote_pid"), before.get("ahead_pid")
    if sb is not None and sb.kind == "gvisor":
        out = subprocess.run(
            ["runsc", "--root", RUNSC_ROOT, "ps", cid], capture_output=True, text=True, check=True
        ).stdout.splitlines()[1:]  # UID PID PPID C STIME TIME CMD
        rows = [(int(line.split()[1]), line.split()[-1]) for line in out if line.strip()]
        zygotes = {zygote, ahead}
        # one may have started meanwhile: the zygote, or the next call's process, which it makes ahead while the
        # worker is idle (no call's). The worker names such a process only once it is made: seen in ps with a
        # usage answered just after not naming it yet (1 in 9 runs with three at once). So ask again, a little
        # later, while the listing has a process not named; the listing itself is not taken again
        for _ in range(10):
            after = sb.call("sandbox.usage").result
            zygotes |= {after["zygote_pid"], after["ahead_pid"]}
            if all(pid == 1 or pid in zygotes for pid, _ in rows):
                break
            time.sleep(0.1)
        # runsc ps shows names only (python3): PID 1 is the worker (probe worker_is_init proves it)
        return [f"{pid} {'worker' if pid == 1 else cmd}" for pid, cmd in rows if pid not in zygotes]
    top = engine.api.top(cid, ps_args="-eo pid,args")
    rows = top.get("Processes") or []
    # the worker restarts its zygote when it next idles: one may have started between the ask and the listing
    zygotes = {zygote, sb.call("sandbox.usage").result["zygote_pid"]} if sb is not None else set()

    def inner_pid(host_pid: str) -> int | None:
        try:
            status = Path(f"/proc/{host_pid}/status").read_text()
        except OSError:
            return None
        line = next((x for x in status.splitlines() if x.startswith("NSpid:")), "")
        return int(line.split()[-1]) if line else None

    return [" ".join(row) for row in rows if inner_pid(row[0]) not in zygotes - {None}]


@pytest.fixture
def proxy_policy(engine: Any, tmp_path: Path) -> Iterator[tuple[Path, str]]:
    """A proxy-mode policy and an internal egress network: the relay runs, nothing leaves the machine."""
    tag = secrets.token_hex(3)
    net = f"toolcage-test-redteam-{tag}"
    engine.create_network(net, internal=True, labels={"toolcage.test": tag})
    pol = tmp_path / "redteam.yaml"
    pol.write_text(
        yaml.safe_dump(
            {
                "name": "redteam",
                "network": {"mode": "proxy", "allow": [{"host": "api.allowed.test"}]},
                "timeouts": {"call_s": 40, "run_s": 120},
            }
        )
    )
    try:
        yield pol, net
    finally:
        wait_removed(60)  # the runs that used it are removed in the background
        engine.remove_network(net)


# A daemon fills the worker's descriptor table through the relay (two fds per connection), fixing
# the parity with the stdin pipe the worker still holds, so that the worker is left with none:
# on 6962ff0 the sweep's os.listdir("/proc") raised EMFILE, the call answered -32603 and the
# daemon lived on; the relay thread also died (KeyError: a stale `client` closed, its fd reused).
FD_EXHAUST = r"""
import os, socket, sys, time
r, w = os.pipe()
if os.fork() == 0:
    os.setsid()
    os.close(r)
    devnull = os.open("/dev/null", os.O_RDWR)
    os.dup2(devnull, 1); os.dup2(devnull, 2)
    conns = []
    def closed(c):
        try:
            return c.recv(1) == b""
        except BlockingIOError:
            return False
        except OSError:
            return True
    def new():
        try:
            c = socket.create_connection(("127.0.0.1", 3128), timeout=2)
        except OSError:
            return None
        c.setblocking(False)
        conns.append(c)
        time.sleep(0.03)
        return c
    for _ in range(400):  # until the relay can no longer pair a connection
        c = new()
        if c is None or closed(c) or (len(conns) > 1 and closed(conns[-2])):
            break
    while os.read(0, 1 << 20):  # the worker closes the stdin pipe's write end: one more fd for us
        pass
    time.sleep(0.1)
    new()  # the last pair takes the worker's last two descriptors
    os.write(w, b"x"); os.close(w)
    time.sleep(60)  # alive as long as nobody kills us
    os._exit(0)
os.close(w)
os.read(r, 1)
print("filled", flush=True)
time.sleep(1.5)  # the worker's periodic reap runs while we are alive
"""


def test_fd_exhaustion_through_the_relay_cannot_outlive_the_call(engine: Any, proxy_policy: tuple[Path, str]) -> None:
    """Exhausting the worker's fds through the relay so the sweep cannot list /proc: nothing may outlive the call."""
    pol, net = proxy_policy
    with Sandbox(pol, egress_network=net, tool="redteam") as sb:
        sb.call("run_shell", {"command": "true"})
        time.sleep(0.3)  # the worker idles: its logger is loaded, as in any real session
        sb.call("run_python", {"code": FD_EXHAUST, "stdin": "x" * (1 << 20), "timeout_s": 30})
        assert sb.container_id is not None
        procs = _processes(engine, sb.container_id, sb)
        assert len(procs) == 1 and "worker" in procs[0], procs  # only the worker (PID 1) is left
        # the worker still works: it can start a child, and the relay still reaches the proxy
        probe = textwrap.dedent(
            """
            import socket
            c = socket.create_connection(("127.0.0.1", 3128), timeout=10)
            c.sendall(b"GET http://other.test/ HTTP/1.1\\r\\nHost: other.test\\r\\n\\r\\n")
            print(c.recv(100).split(b"\\r\\n")[0].decode())
            """
        )
        r = sb.call("run_python", {"code": probe})
        assert r.status == "ok" and r.result["stdout"].startswith("HTTP/1.1 403"), r.result


SWEEP_RACE = r"""
import ctypes, os, signal, time
libc = ctypes.CDLL(None, use_errno=True)
PR_SET_CHILD_SUBREAPER = 36
if os.fork() == 0:
    os.setsid()
    libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)  # orphans below us are ours, not init's
    for _ in range(3):  # a stopped child, a vfork-ed one, a child that ignores everything it can
        if os.fork() == 0:
            for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
                signal.signal(s, signal.SIG_IGN)
            while True:
                try:
                    if os.fork() == 0:  # a fork storm racing the sweep, bounded by the pids limit
                        time.sleep(0.05)
                        os._exit(0)
                except OSError:
                    time.sleep(0.001)
    if os.fork() == 0:
        os.kill(os.getpid(), signal.SIGSTOP)
    time.sleep(60)
    os._exit(0)
time.sleep(0.5)
print("storm running", flush=True)
"""


def test_fork_storm_subreaper_and_stopped_processes_do_not_survive_the_sweep(engine: Any) -> None:
    """A subreaper with a fork storm under it and a stopped child, racing the end-of-call sweep, leaves nothing."""
    with Sandbox(tool="redteam") as sb:
        r = sb.call("run_python", {"code": SWEEP_RACE})
        assert r.status == "ok" and r.result["stdout"] == "storm running\n", r.result
        assert sb.container_id is not None
        procs = _processes(engine, sb.container_id, sb)
        # under gVisor the zygote makes the next call's process ahead in two forks while the worker idles: the
        # listing can catch the first of them, which neither usage answer names; a survivor stays, it does not
        for _ in range(10):
            if len(procs) == 1:
                break
            time.sleep(0.3)
            procs = _processes(engine, sb.container_id, sb)
        assert len(procs) == 1 and "worker" in procs[0], procs
        r = sb.call("run_shell", {"command": "echo alive"})
        assert r.result["stdout"] == "alive\n"


# tool code's "did it work": "ok", or the errno's name
ATTEMPT = r"""
import errno
def attempt(f):
    try:
        f()
        return "ok"
    except OSError as e:
        return errno.errorcode[e.errno]
"""

REACH_INIT = (
    ATTEMPT
    + r"""
import glob, json, os, signal
if os.getpid() == 1:  # gVisor: the call is PID 1 of a PID namespace of its own
    print(json.dumps({"worker": "not visible", "pids": sorted(p for p in os.listdir("/proc") if p.isdigit())}))
    raise SystemExit
res = {}
for path in ["/proc/1/fd/0", "/proc/1/fd/1", "/proc/1/environ", "/proc/1/mem", "/proc/1/map_files/",
             "/proc/1/root/", "/proc/1/cwd/", "/proc/1/fdinfo/"] + sorted(glob.glob("/proc/1/task/*/fd/")):
    key = "task/fd" if "/task/" in path else path
    if path.endswith("/"):
        r = attempt(lambda: os.listdir(path))
    else:
        r = attempt(lambda: os.close(os.open(path, os.O_RDONLY | os.O_NONBLOCK)))
    res[key] = r if res.get(key) in (None, r) else "mixed"
# signals PID 1 has no handler for are dropped by the kernel; SIGINT meets a no-op handler
for s in (signal.SIGSTOP, signal.SIGTSTP, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGALRM,
          signal.SIGPIPE, signal.SIGCHLD, signal.SIGSEGV, signal.SIGINT):
    for _ in range(200):
        os.kill(1, s)
res["signals"] = "sent"
print(json.dumps(res))
"""
)


def test_init_cannot_be_opened_or_signalled_from_tool_code(engine: Any) -> None:
    """/proc/1/{fd,task/*/fd,fdinfo,environ,mem,map_files,root,cwd} refuse, and a signal storm on PID 1 does nothing."""
    with Sandbox(tool="redteam") as sb:
        r = sb.call("run_python", {"code": REACH_INIT})
        seen = json.loads(r.result["stdout"])
        if sb.kind == "gvisor":  # gVisor's procfs and signals would reach it: the call has no pid for it
            assert seen == {"worker": "not visible", "pids": ["1"]}, seen
        else:
            for key, value in seen.items():
                if key != "signals":
                    assert value == "EACCES", (key, seen)
            assert "task/fd" in seen
        for _ in range(3):  # not stopped, not interrupted, not dead
            r = sb.call("run_shell", {"command": "echo alive"})
            assert r.status == "ok" and r.result["stdout"] == "alive\n", r.result


# Same-uid process controls aimed at the worker (PID 1) and every other process of the sandbox
# that is not the caller's own: the kernel allows each to any process of the same uid. On 5874f7d
# prlimit(1, RLIMIT_NPROC, (1, 1)) left the worker unable to start a child, and every later call of
# the run answered -32603; a nice of 19 or SCHED_IDLE starves it. The profile now limits these
# calls to the caller itself (pid/who 0), and prlimit on others to reading.
STEER_OTHERS = (
    ATTEMPT
    + r"""
import ctypes, json, os, platform, resource
libc = ctypes.CDLL(None, use_errno=True)
IOPRIO_SET = {"x86_64": 251, "aarch64": 30}[platform.machine()]  # another machine: a KeyError, the test fails
def raw(nr, *args):
    if libc.syscall(nr, *args) == -1:
        raise OSError(ctypes.get_errno(), "")
res = {}
# the caller's own limits, priority and affinity stay its to change
res["self"] = [attempt(lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))),
               attempt(lambda: resource.prlimit(0, resource.RLIMIT_NOFILE, (32, 32))),
               attempt(lambda: os.nice(1)),
               attempt(lambda: os.setpriority(os.PRIO_PROCESS, 0, 5)),
               attempt(lambda: os.sched_setaffinity(0, os.sched_getaffinity(0))),
               attempt(lambda: raw(IOPRIO_SET, 1, 0, (2 << 13) | 4))]
others = [int(p) for p in os.listdir("/proc") if p.isdigit() and int(p) != os.getpid()]
for pid in others:
    for name, f in {
        "prlimit NPROC": lambda: resource.prlimit(pid, resource.RLIMIT_NPROC, (1, 1)),
        "prlimit NOFILE": lambda: resource.prlimit(pid, resource.RLIMIT_NOFILE, (4, 4)),
        "prlimit CPU": lambda: resource.prlimit(pid, resource.RLIMIT_CPU, (1, 1)),
        "prlimit read": lambda: resource.prlimit(pid, resource.RLIMIT_NOFILE),
        "setpriority": lambda: os.setpriority(os.PRIO_PROCESS, pid, 19),
        "setpriority pgrp": lambda: os.setpriority(os.PRIO_PGRP, os.getpgid(pid), 19),
        "setpriority user": lambda: os.setpriority(os.PRIO_USER, os.getuid(), 19),
        "sched_setaffinity": lambda: os.sched_setaffinity(pid, {0}),
        "sched_setscheduler": lambda: os.sched_setscheduler(pid, os.SCHED_IDLE, os.sched_param(0)),
        "sched_setparam": lambda: os.sched_setparam(pid, os.sched_param(0)),
        "ioprio_set": lambda: raw(IOPRIO_SET, 1, pid, (3 << 13)),  # IOPRIO_WHO_PROCESS, IDLE class
        "ioprio_set user": lambda: raw(IOPRIO_SET, 3, os.getuid(), (3 << 13)),
    }.items():
        r = attempt(f)
        res[name] = r if res.get(name) in (None, r) else "mixed"
print(json.dumps(res))
"""
)


def test_worker_limits_priority_and_scheduling_cannot_be_set_from_tool_code() -> None:
    """prlimit/setpriority/sched_*/ioprio_set on any other process are refused; the caller's own still work."""
    with Sandbox(tool="redteam") as sb:
        sb.call("run_python", {"code": "pass"})  # the zygote is up: one more process to aim at
        time.sleep(0.3)
        r = sb.call("run_python", {"code": STEER_OTHERS})
        assert r.status == "ok" and r.result["exit_code"] == 0, r.result
        seen = json.loads(r.result["stdout"])
        own = seen.pop("self")
        if sb.kind == "gvisor":
            # gVisor implements no ioprio_set (EPERM, or ENOSYS in a user namespace) even on the caller
            # itself; and the call, PID 1 of a PID namespace of its own, has no other process to aim at
            assert own[:5] == ["ok"] * 5 and own[5] in ("EPERM", "ENOSYS") and seen == {}, (own, seen)
        else:
            assert own == ["ok"] * 6, own
            assert seen.pop("prlimit read") == "ok", seen  # reading stays allowed (the zygote check needs it)
            assert seen == dict.fromkeys(seen, "EPERM"), seen
        for _ in range(2):  # the worker is untouched: it still starts children, at its own priority
            r = sb.call("run_shell", {"command": "echo alive; cut -d' ' -f19 /proc/1/stat"})
            assert r.status == "ok" and r.result["stdout"] == "alive\n0\n", r.result
            r = sb.call("run_python", {"code": "print('alive')"})
            assert r.status == "ok" and r.result["stdout"] == "alive\n", r.result
