"""Attacks through background processes (issue 37): a call's leftover passing as a background process, a
background process reading another's stdin/output/terminal, floods, the 64-process bound, a stdin nobody
reads, a killed runner, connectors beside a background process, and the worker's channel.

Each test is the attack as tool code would run it, on the real engine, under runc and gVisor.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from toolcage import Sandbox, load_policy
from toolcage.errors import ProcessError

pytestmark = pytest.mark.usefixtures("no_leaks")
ROOT = Path(__file__).resolve().parents[2]
HOSTILE = ROOT / "tests" / "fixtures" / "hostile_connectors.py"


@pytest.fixture(scope="module")
def sb(engine: Any) -> Iterator[Sandbox]:
    with Sandbox(tool="bg-attacks", run_s=300) as box:  # shared by the module: 60 s ran out on a slow machine
        yield box


LEFTOVERS = r"""
import os, subprocess, time
def fork():  # the pids limit may be full for a moment (the fork loop's zombies, a loaded host): try again
    for _ in range(2000):
        try:
            return os.fork()
        except BlockingIOError:
            time.sleep(0.01)
    return os.fork()
def ticker(name):
    return f"while :; do date +%s%N > /scratch/{name}.t; mv /scratch/{name}.t /scratch/{name}; sleep 0.1; done"
subprocess.Popen(["setsid", "sh", "-c", ticker("setsid")], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
subprocess.Popen(["nohup", "sh", "-c", ticker("nohup")], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
if fork() == 0:                         # double fork into a new session, parent gone: ppid becomes 0/1
    os.setsid()
    if fork() == 0:
        os.execvp("sh", ["sh", "-c", ticker("double")])
    os._exit(0)
if fork() == 0:                         # a fork loop racing the sweep: always a fresh pid somewhere
    os.setsid()
    while True:
        if fork() != 0:
            os._exit(0)
        time.sleep(0.001)  # (its zombies, reaped by the sandbox's init, must not fill the pids limit for the rest)
        try:
            with open("/scratch/race.t", "w") as f:
                f.write(str(time.time_ns()))
            os.replace("/scratch/race.t", "/scratch/race")
        except OSError:
            pass
until = time.time() + 20  # every leftover has ticked once (under gVisor on a loaded machine a start takes long)
while time.time() < until and not all(os.path.exists(f"/scratch/{n}") for n in ("setsid", "nohup", "double", "race")):
    time.sleep(0.05)
time.sleep(0.2)
missing = [n for n in ("setsid", "nohup", "double", "race") if not os.path.exists(f"/scratch/{n}")]
print("planted" if not missing else f"not planted: {missing}")
"""
NAMES = ["setsid", "nohup", "double", "race"]


def test_a_calls_leftovers_cannot_pass_as_background_processes(sb: Sandbox) -> None:
    keeper = sb.spawn("sleep 600")  # a real background process: the sweep has something to keep
    assert sb.call("run_python", {"code": LEFTOVERS}).result["stdout"] == "planted\n"
    look = "cat " + " ".join(f"/scratch/{n}" for n in NAMES) + " 2>/dev/null; echo"
    before = sb.call("run_shell", {"command": look}).result["stdout"].split()
    time.sleep(1)
    after = sb.call("run_shell", {"command": look}).result["stdout"].split()
    assert len(before) == len(NAMES) and before == after, (before, after)  # nothing ticks any more
    assert [p["id"] for p in sb.processes() if p["state"] == "running"] == [keeper.id]
    assert keeper.read().running
    keeper.kill()


PROBE = r"""
import json, os, sys
me = os.getpid()
seen, opened = [], []
for pid in [p for p in os.listdir("/proc") if p.isdigit() and int(p) != me]:
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        continue
    for fd in fds:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        seen.append(target)
        if "pipe:" in target or "/dev/pts" in target or "ptmx" in target:
            try:
                w = os.open(f"/proc/{pid}/fd/{fd}", os.O_WRONLY | os.O_NONBLOCK)
                opened.append(f"{pid}:{fd}:{target}")
                try:
                    os.write(w, b"PWNED\n")
                finally:
                    os.close(w)
            except OSError:
                pass
print("PROBE" + json.dumps({"opened": opened}), flush=True)
"""


def test_a_background_process_and_another_ones_stdin_output_and_terminal(sb: Sandbox) -> None:
    """Under gVisor each background process has a PID namespace of its own: it sees no other one's pipes or
    terminal. Under runc it does not hold: every process of the sandbox runs as one uid, so a background
    process opens another's stdin, output or terminal through /proc/PID/fd (calls in one run must trust each
    other there; README and docs/security.md say so). The runc branch pins the known behaviour."""
    victim = sb.spawn("cat")  # a pipe stdin and output
    term = sb.spawn("sh -i", pty=True)  # a terminal
    assert victim.write("hello\n") == 6 and victim.wait(output="hello", timeout=10)
    sb.write_files({"/scratch/probe.py": PROBE})
    probe = sb.spawn(argv=["python3", "/scratch/probe.py"])
    assert probe.wait(timeout=20)
    got = json.loads(probe.read(since=0).text.split("PROBE", 1)[1].splitlines()[0])
    time.sleep(0.3)
    hit = [p.id for p in (victim, term) if "PWNED" in p.read(since=0).text]
    if sb.kind == "gvisor":
        # the only pipe it can open is its own keeper's (PID 1 of its namespace: its own exit status)
        assert hit == [] and all(o.startswith("1:") for o in got["opened"]), (hit, got)
    else:
        assert hit, f"the runc premise changed (a background process reached no other one): {got}"
    victim.kill()
    term.kill()


def _rss_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def test_a_flood_grows_neither_the_runner_nor_the_worker_past_its_window(sb: Sandbox) -> None:
    flood = sb.spawn("head -c 209715200 /dev/zero")  # 200 MiB
    before = _rss_kib()
    reads = 0
    while reads < 200:
        out = flood.read(max_bytes=65536, timeout=1)
        assert len(out.data) <= 65536
        reads += 1
        if not out.running and not out.data:
            break
    assert flood.wait(timeout=60)
    last = flood.read(since=0, max_bytes=1 << 20)
    assert last.dropped >= (200 << 20) - (1 << 20) and len(last.data) <= 1 << 20, (last.dropped, len(last.data))
    entry = next(e for e in sb.processes() if e["id"] == flood.id)
    assert entry["output_bytes"] >= 200 << 20, entry
    assert _rss_kib() - before < 64 * 1024, "the runner grew with the sandbox's output"


def _spawn_until_refused(box: Sandbox, started: list[Any]) -> ProcessError:
    with pytest.raises(ProcessError) as err:
        for _ in range(80):
            started.append(box.spawn("sleep 600", stdin=False))
    return err.value


def test_at_most_64_running(sb: Sandbox, engine: Any) -> None:
    """MAX_LIVE (64) refuses the 65th with a clear error; the default policy's pids limit (64) comes first,
    and says so (it was a bare "cannot start '/bin/sh': Resource temporarily unavailable")."""
    started: list[Any] = []
    try:
        err = _spawn_until_refused(sb, started)
        assert "limits.pids: 64" in str(err) or "limits.memory" in str(err), err
    finally:
        for p in started:
            p.kill()
    policy = dataclasses.replace(
        load_policy("default"), limits=dataclasses.replace(load_policy("default").limits, pids=512)
    )
    with Sandbox(policy, tool="bg-max-live") as box:
        started = []
        err = _spawn_until_refused(box, started)
        assert len(started) <= 64
        if box.kind == "gvisor":  # each costs a launcher and keeper there: the memory guard may refuse first
            assert "at most 64" in str(err) or "limits.memory" in str(err), err
        else:
            assert len(started) == 64 and "at most 64" in str(err), (len(started), err)


def test_a_stdin_nobody_reads_does_not_hang_the_worker(sb: Sandbox) -> None:
    deaf = sb.spawn("sleep 600")
    other: list[Any] = []

    def beside() -> None:
        time.sleep(0.5)
        other.append(sb.call("run_python", {"code": "print('served')"}))

    t = threading.Thread(target=beside)
    t.start()
    started = time.monotonic()
    with pytest.raises(ProcessError, match=r"reads no input|takes no more input"):
        deaf.write(b"x" * (4 << 20))
    took = time.monotonic() - started
    t.join(30)
    assert took < 10, took
    assert other and other[0].result["stdout"] == "served\n", other
    deaf.kill()


def test_a_background_process_cannot_reach_the_channel(sb: Sandbox) -> None:
    code = textwrap.dedent("""
        import os
        out = []
        for fd in ("0", "1", "2"):
            for mode in (os.O_RDONLY, os.O_WRONLY):
                try:
                    os.close(os.open("/proc/1/fd/" + fd, mode | os.O_NONBLOCK))
                    out.append("OPENED " + fd)
                except OSError as exc:
                    out.append(exc.__class__.__name__)
        print(" ".join(out))
    """)
    sb.write_files({"/scratch/chan.py": code})
    p = sb.spawn(argv=["python3", "/scratch/chan.py"])
    assert p.wait(timeout=15)
    text = p.read(since=0).text
    if sb.kind == "gvisor":  # its PID 1 is its own keeper, in its own namespace: never the worker
        assert sb.call("run_shell", {"command": "echo ok"}).result["stdout"] == "ok\n"
    else:
        assert "OPENED" not in text, text


def test_a_connector_waits_for_no_background_process(engine: Any) -> None:
    with Sandbox(tool="bg-conn", tools=[HOSTILE]) as box:
        assert box.call("hello").ok
        p = box.spawn("sleep 600")
        refused = box.call("hello")
        if box.kind == "gvisor":  # its own PID namespace: it cannot name the handler
            assert refused.ok, refused
        else:
            assert not refused.ok and "runs alone" in str(refused.error), refused
        p.kill()
        assert box.call("hello").ok


RUNNER = r"""
import sys, time
from toolcage import Sandbox, load_policy
sb = Sandbox(tool="bg-sigkill")
sb.__enter__()
p = sb.spawn("exec python3 -m http.server 8000 --bind 127.0.0.1")
assert p.wait(port=8000, timeout=20)
print(sb.container_id, flush=True)
time.sleep(600)
"""


def test_sigkill_of_the_runner_leaves_no_running_container(engine: Any) -> None:
    """SIGKILL the runner while a spawned server runs in its sandbox: the container stops within 2 s (as without
    background processes: test_channel.py). It stays listed by `docker ps -a` as exited until `toolcage gc`
    removes it (the runner that would remove it is dead); no process of it runs on."""
    child = subprocess.Popen(
        [sys.executable, "-c", RUNNER], stdout=subprocess.PIPE, text=True, cwd=ROOT, env=dict(os.environ)
    )
    cid = ""
    try:
        assert child.stdout is not None
        cid = child.stdout.readline().strip()
        assert cid, "the child sandbox did not start"
        assert engine.inspect(cid)["State"]["Running"]
        child.kill()  # SIGKILL: no cleanup of its own runs
        child.wait(10)
        killed = time.monotonic()
        while engine.inspect(cid)["State"]["Running"] and time.monotonic() - killed < 10:
            time.sleep(0.05)
        took = time.monotonic() - killed
        assert took < 2.0, f"the sandbox ran on for {took:.1f}s after its runner died"
        running = subprocess.run(
            ["docker", "ps", "-q", "--no-trunc", "--filter", "name=toolcage-bg-sigkill"], capture_output=True, text=True
        ).stdout
        assert cid not in running
    finally:
        child.kill()
        child.wait(10)
        if child.stdout is not None:
            child.stdout.close()
        if cid:
            engine.remove(cid)
