"""The cage holds its own channel: code inside cannot forge answers, read later requests,
outlive its call, flood the runner or keep a dead runner's sandbox alive.

Each test is the attack as tool code would run it, on the real engine. Before the worker
became a non-dumpable PID 1, docker-init held the container's stdio in a dumpable process of
the sandbox uid, and every one of these attacks succeeded (see docs/security.md).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import RUNSC_ROOT
from toolcage import ProtocolError, Sandbox, load_policy

pytestmark = pytest.mark.usefixtures("no_leaks")
ROOT = Path(__file__).resolve().parents[2]

FORGE = r"""
import json, os, errno
# answer every id a runner could be waiting for: small integers and whatever we can guess
lines = []
for i in range(1, 3000):
    lines.append(json.dumps({"jsonrpc": "2.0", "id": i,
        "result": {"stdout": "FORGED", "stderr": "", "exit_code": 0, "signal": None, "timed_out": False,
                   "truncated": False, "oom_killed": False, "wall_ms": 1, "cpu_ms": 1, "peak_rss_bytes": 1}}))
blob = ("\n".join(lines) + "\n").encode()
seen = {}
for pid in [p for p in os.listdir("/proc") if p.isdigit() and int(p) != os.getpid()]:
    for fd in ("1", "2"):
        try:
            with open(f"/proc/{pid}/fd/{fd}", "wb", buffering=0) as f:
                f.write(blob)
            seen[f"{pid}/{fd}"] = "written"
        except OSError as e:
            seen[f"{pid}/{fd}"] = errno.errorcode[e.errno]
print(json.dumps({"init": seen.get("1/1")}))
"""


def test_forged_answers_never_reach_the_runner(engine: Any) -> None:
    """Writing answers for every guessable id to /proc/1/fd/1 is refused (EACCES); the runner gets the real answer."""
    with Sandbox(tool="forge") as sb:
        r = sb.call("run_python", {"code": FORGE})
        assert r.status == "ok" and "FORGED" not in r.result["stdout"], r.result
        # under gVisor the call is PID 1 of a PID namespace of its own: no other process to write to
        assert json.loads(r.result["stdout"]) == {"init": None if sb.kind == "gvisor" else "EACCES"}
        r = sb.call("run_shell", {"command": "echo real"})
        assert r.result["stdout"] == "real\n"
        assert sb.usage()["cpu_ms"] is not None  # sandbox.usage cannot be faked either


STEAL = r"""
import os, time
# double fork + setsid: out of the call's process group and session
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        got = []
        others = [p for p in os.listdir("/proc") if p.isdigit() and int(p) != os.getpid()]
        for target in ["/proc/1/fd/0"] + [f"/proc/{p}/fd/0" for p in others]:
            try:
                fd = os.open(target, os.O_RDONLY | os.O_NONBLOCK)
                got.append(target)
                break
            except OSError:
                pass
        with open("/scratch/stolen", "w") as out:
            out.write("opened %s\n" % got)
            out.flush()
            deadline = time.time() + 20
            while time.time() < deadline:
                if got:
                    try:
                        out.write(os.read(fd, 65536).decode(errors="replace"))
                        out.flush()
                    except BlockingIOError:
                        pass
                time.sleep(0.01)
        os._exit(0)
    os._exit(0)
os.wait()
print("daemon started")
"""

# every process but PID 1 (the worker) and this call's own line of parents, with its command line
LIST_OTHERS = r"""
import json, os
def ppid(p):
    return int(open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()[1])
mine, p = set(), os.getpid()
while p > 1:
    mine.add(p)
    p = ppid(p)
others = {}
for p in os.listdir("/proc"):
    if p.isdigit() and int(p) not in mine | {1}:
        try:
            others[p] = open(f"/proc/{p}/cmdline", "rb").read().replace(b"\\0", b" ").decode(errors="replace")
        except OSError:
            pass
print(json.dumps(others))
print(open("/scratch/stolen").read())
"""


def test_a_daemon_cannot_outlive_its_call_or_read_later_requests(engine: Any) -> None:
    """A double-forked setsid daemon is gone when its call ends, and a later write_file's content is never read."""
    with Sandbox(tool="steal") as sb:
        r = sb.call("run_python", {"code": STEAL})
        assert r.result["stdout"] == "daemon started\n"
        sb.call("write_file", {"path": "note.txt", "content": "SECRET-1c2b"})
        # the worker restarts its zygote when it idles: ask for it before and after the listing (one may start
        # between the two), and leave out the listing call's own ancestors
        zygotes = {sb.call("sandbox.usage").result["zygote_pid"]}
        r = sb.call("run_python", {"code": LIST_OTHERS})
        zygotes.add(sb.call("sandbox.usage").result["zygote_pid"])
        kind = sb.kind
    out = r.result["stdout"]
    others = {pid: cmd for pid, cmd in json.loads(out.splitlines()[0]).items() if int(pid) not in zygotes}
    assert others == {}, out  # no process but the worker, its zygote and this call
    # it may open fds of its own call's processes (stdin is /dev/null there), never the worker's (under
    # gVisor /proc/1 is its own call's first process, in a PID namespace of the call's own)
    assert kind == "gvisor" or "/proc/1/" not in out, out
    assert "SECRET" not in out, out


SURVIVORS = r"""
import os, signal, subprocess, time, ctypes
# gVisor sends the orphaned-group SIGHUP (then SIGCONT) when `sh` below exits while a member of this call's
# group is stopped; Linux does not (this call's parent is in another session). Ignored, and inherited:
signal.signal(signal.SIGHUP, signal.SIG_IGN)
subprocess.Popen(["sh", "-c", "nohup sleep 300 >/dev/null 2>&1 &"])            # nohup in the background
subprocess.Popen(["setsid", "sleep", "300"])                                    # a new session
if os.fork() == 0:                                                              # a stopped process
    while True:
        os.kill(os.getpid(), signal.SIGSTOP)                                    # (again, after a SIGCONT)
if os.fork() == 0:                                                              # a parent that never reaps
    if os.fork() == 0:
        os._exit(0)
    time.sleep(300)
# leave data for the next call in every IPC namespace object
open("/dev/shm/left", "w").write("x")
rt = ctypes.CDLL("librt.so.1", use_errno=True)
rt.mq_open.restype = ctypes.c_int
mq = rt.mq_open(b"/leftq", os.O_CREAT | os.O_RDWR, 0o600, None)
libc = ctypes.CDLL(None, use_errno=True)
shm = libc.shmget(0x1234, 4096, 0o1600)
msg = libc.msgget(0x1235, 0o1600)
sem = libc.semget(0x1236, 1, 0o1600)
time.sleep(0.3)
print(mq >= 0, shm >= 0, msg >= 0, sem >= 0, len([p for p in os.listdir("/proc") if p.isdigit()]) > 5)
"""

LOOK = r"""
import os, json, ctypes, errno
me = os.getpid()
rows = lambda t: len(open(t).read().splitlines()[1:]) if os.path.exists(t) else 0
rt = ctypes.CDLL("librt.so.1", use_errno=True)
rt.mq_open.restype = ctypes.c_int
libc = ctypes.CDLL(None, use_errno=True)
gone = lambda rc: rc < 0 and ctypes.get_errno() in (errno.ENOENT, errno.EPERM)  # EPERM: refused (gVisor)
print(json.dumps({
    "others": sorted(int(p) for p in os.listdir("/proc") if p.isdigit() and int(p) not in (1, me)),
    "shm": os.listdir("/dev/shm"),
    # gVisor mounts no /dev/mqueue and has no /proc/sysvipc: there only "by_key" below can tell
    "mqueue": os.listdir("/dev/mqueue") if os.path.isdir("/dev/mqueue") else [],
    "sysv": [rows("/proc/sysvipc/" + t) for t in ("shm", "msg", "sem")],
    # the objects SURVIVORS made, asked for by name and key
    "by_key": [gone(rt.mq_open(b"/leftq", os.O_RDWR)), gone(libc.shmget(0x1234, 0, 0)),
               gone(libc.msgget(0x1235, 0)), gone(libc.semget(0x1236, 0, 0))],
}))
"""


@pytest.mark.parametrize("unsafe", [False, True], ids=["default", "unsafe_background_processes"])
def test_nothing_survives_its_call(engine: Any, unsafe: bool) -> None:
    """nohup, setsid, stopped, unreaped and double-forked processes and IPC objects are all gone after the call
    (with unsafe_background_processes the processes stay, and still cannot reach the channel)."""
    import dataclasses

    policy = dataclasses.replace(load_policy("default"), unsafe_background_processes=unsafe)
    with Sandbox(policy, tool="survive") as sb:
        r = sb.call("run_python", {"code": SURVIVORS})
        # under gVisor System V IPC and POSIX queues are refused: it cannot list them, so no sweep could clear them
        made = ["False"] * 4 + ["True"] if sb.kind == "gvisor" else ["True"] * 5
        assert r.result["stdout"].split() == made, r.result
        seen = json.loads(sb.call("run_python", {"code": LOOK}).result["stdout"])
        zygote = sb.call("sandbox.usage").result["zygote_pid"]  # the worker's fork server, no call's
        seen["others"] = [p for p in seen["others"] if p != zygote]
        if unsafe and sb.kind == "gvisor":
            # each call has a PID namespace of its own: the survivors are in the first call's, which
            # its keeper (worker/children/nsinit.py) holds open; the engine's side lists them, the next call cannot
            assert seen["others"] == [] and seen["shm"] == ["left"], seen
            assert sb.container_id is not None
            ps = subprocess.run(["runsc", "--root", RUNSC_ROOT, "ps", sb.container_id], capture_output=True, text=True)
            assert " sleep" in ps.stdout, ps.stdout
            r = sb.call("run_shell", {"command": "echo $$ /proc/[0-9]*"})  # (builtins: no process of its own)
            assert r.result["stdout"] == "2 /proc/1 /proc/2\n", r.result  # its keeper (PID 1) and itself
        elif unsafe:
            assert seen["others"] and seen["shm"] == ["left"], seen
            r = sb.call("run_shell", {"command": "cat /proc/1/fd/0 </dev/null; echo rc=$?"})
            assert "Permission denied" in r.result["stderr"], r.result
        else:
            assert seen == {"others": [], "shm": [], "mqueue": [], "sysv": [0, 0, 0], "by_key": [True] * 4}, seen


def _runner(code: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    """A separate runner process (so it can be SIGKILLed or have its memory measured)."""
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
    )


FLOOD = r"""
import json, os, time
line = (json.dumps({"jsonrpc": "2.0", "result": "x" * (12 << 20), "id": 1}) + "\n").encode()
if os.fork() == 0:
    os.setsid()
    end = time.time() + 12
    while time.time() < end:
        for target in ["/proc/1/fd/1", "/proc/1/fd/2"]:
            try:
                with open(target, "wb", buffering=0) as f:
                    f.write(line)
            except OSError:
                pass
        time.sleep(0.05)
    os._exit(0)
print("flooding")
"""


@pytest.mark.runc_only("the runner's own memory under a flood: host-side, alike under either runtime (11 s)")
def test_runner_memory_is_bounded_under_a_flood(engine: Any) -> None:
    """A surviving daemon flooding 12 MiB JSON lines at the channel while the sandbox idles leaves the runner's
    peak RSS under 300 MiB (the flood cannot reach the stream; and if it could, a stray answer kills the sandbox)."""
    proc = _runner(
        f"""
        import dataclasses, json, time
        from toolcage import Sandbox, load_policy
        policy = dataclasses.replace(load_policy("default"), unsafe_background_processes=True)
        with Sandbox(policy, tool="flood", audit=False) as sb:
            sb.call("run_python", {{"code": {FLOOD!r}}})
            time.sleep(10)
            r = sb.call("ping")
            hwm = [l for l in open("/proc/self/status") if l.startswith("VmHWM")][0].split()[1]
            print(json.dumps({{"ping": r.result, "hwm_kib": int(hwm)}}))
        """
    )
    out, _ = proc.communicate(timeout=120)
    seen = json.loads(out.strip().splitlines()[-1])
    assert seen["ping"] == "pong"
    assert seen["hwm_kib"] < 300 * 1024, seen


KEEP_STDIN = r"""
import os, time
if os.fork() == 0:
    os.setsid()
    others = [p for p in os.listdir("/proc") if p.isdigit() and int(p) != os.getpid()]
    for target in ["/proc/1/fd/0"] + [f"/proc/{p}/fd/0" for p in others]:
        try:
            os.open(target, os.O_RDWR)   # hold the runner's pipe open so its hang-up is never seen
        except OSError:
            pass
    time.sleep(300)
time.sleep(300)
"""


@pytest.mark.parametrize("moment", ["mid_call", "idle"])
def test_runner_death_stops_the_sandbox_within_2s(engine: Any, moment: str) -> None:
    """SIGKILL the runner while code inside tries to hold the channel open: the container stops within 2 s."""
    code = KEEP_STDIN if moment == "mid_call" else KEEP_STDIN.replace("\ntime.sleep(300)\n", "\nprint('ok')\n")
    proc = _runner(
        f"""
        import dataclasses, sys, threading, time
        from toolcage import Sandbox, load_policy
        policy = dataclasses.replace(load_policy("default"), unsafe_background_processes=True)
        sb = Sandbox(policy, tool="orphan", run_timeout=55).start()
        print(sb.container_id, flush=True)
        if {moment!r} == "idle":
            sb.call("run_python", {{"code": {code!r}}})
            print("idle", flush=True)
        else:
            threading.Thread(target=sb.call, args=("run_python", {{"code": {code!r}, "timeout_s": 50}})).start()
            time.sleep(1.5)
            print("mid_call", flush=True)
        time.sleep(300)
        """
    )
    assert proc.stdout is not None
    cid = proc.stdout.readline().strip()
    try:
        assert proc.stdout.readline().strip() == moment
        assert engine.inspect(cid)["State"]["Running"]
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        killed = time.monotonic()
        while engine.inspect(cid)["State"]["Running"] and time.monotonic() - killed < 10:
            time.sleep(0.05)
        took = time.monotonic() - killed
        assert not engine.inspect(cid)["State"]["Running"]
        assert took < 2.0, f"the sandbox ran on for {took:.1f}s after its runner died"
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()
        engine.remove(cid)


def test_killed_right_after_create_still_leaves_a_trace(engine: Any, tmp_path: Path) -> None:
    """A runner SIGKILLed the moment its container exists has run.started on disk; gc records what it removed."""
    log = tmp_path / "audit.jsonl"
    proc = _runner(
        """
        import os, signal
        from toolcage import Sandbox
        from toolcage.engine.docker_adapter import Engine
        real = Engine.create
        def create(self, config, name):
            cid = real(self, config, name)
            print(cid, flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        Engine.create = create
        Sandbox(tool="instant").start()
        """,
        env={"TOOLCAGE_AUDIT_LOG": str(log)},
    )
    out, _ = proc.communicate(timeout=60)
    cid = out.strip()
    assert proc.returncode == -signal.SIGKILL and cid
    from toolcage.lifecycle import audit, reaper

    started = [r for r in audit.read(log) if r["event"] == "run.started"]
    assert len(started) == 1 and started[0]["tool"] == "instant"
    name = started[0]["name"]
    run_id = started[0]["run_id"]
    container = [o for o in reaper.find_orphans(engine) if o.id == cid]
    assert container and container[0].name == name
    # the run's container and what else it made (its overlays of the shared files, where there are)
    orphans = [o for o in reaper.find_orphans(engine) if o.run_id == run_id]
    reaper.remove(engine, orphans, audit.Audit(log))
    # (the killed runner's own start-up reaper may have recorded other runs' leftovers in this log)
    removed = [r for r in audit.read(log) if r["event"] == "gc.removed" and r["run_id"] == run_id]
    assert sorted((r["name"], r["reason"]) for r in removed) == sorted((o.name, o.reason) for o in orphans)
    assert (name, container[0].reason) in [(r["name"], r["reason"]) for r in removed]
    assert audit.verify(log) == []
    assert engine.inspect(cid) is None


def test_a_stray_message_kills_the_sandbox(engine: Any) -> None:
    """Even with the channel reachable (simulated: the parser is handed an unsolicited answer), the sandbox dies
    at once with a ProtocolError that says why, and later calls raise it."""
    with Sandbox(tool="stray") as sb:
        assert sb._run.session.parser is not None
        sb._run.session.parser.stdout(b'{"jsonrpc": "2.0", "result": "pong", "id": 1}\n')
        time.sleep(0.5)
        assert not engine.inspect(sb.container_id)["State"]["Running"]
        with pytest.raises(ProtocolError, match="answer to no pending call"):
            sb.call("ping")
