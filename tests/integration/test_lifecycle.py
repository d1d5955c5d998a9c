"""Crash-proofing and operations on the real engine: ps, doctor, gc after SIGKILL, external kill, a load run."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import run_cli as cli
from toolcage import DEFAULT_IMAGE, Sandbox, WorkerCrashed, wait_removed
from toolcage.engine import sharedfiles
from toolcage.lifecycle.audit import read, verify

ROOT = Path(__file__).resolve().parents[2]
FIX = ROOT / "tests" / "fixtures" / "policies"
pytestmark = [
    pytest.mark.usefixtures("no_leaks"),
    pytest.mark.runc_only(
        "ps, doctor, gc after a killed runner, an external kill, a load run: the engine's objects and the"
        " runner's lifecycle, host-side"
    ),
]


def objects_of(engine: Any, run_id: str) -> list[str]:
    label = f"toolcage.run_id={run_id}"
    return (
        [f"container {c['Names'][0]}" for c in engine.containers(label)]
        + [f"network {n['Name']}" for n in engine.networks(label)]
        + [f"volume {v['Name']}" for v in engine.volumes(label)]
    )


def test_ps_and_docker_ps_agree(engine: Any) -> None:
    """`toolcage ps --json` lists a live run; `docker ps --filter label=toolcage.run_id` shows the same name."""
    with Sandbox(tool="ps-check") as sb:
        rows = json.loads(cli("ps", "--json").stdout)
        mine = [r for r in rows if r["run_id"] == sb.run_id]
        assert len(mine) == 1 and mine[0]["tool"] == "ps-check" and mine[0]["policy"] == "default"
        assert mine[0]["memory_bytes"] and mine[0]["memory_bytes"] > 0
        docker_names = subprocess.run(
            ["docker", "ps", "--filter", "label=toolcage.run_id", "--format", "{{.Names}}"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()
        assert mine[0]["name"] in docker_names


def test_doctor_finds_live_run_as_locked_down(engine: Any) -> None:
    """doctor inspects every live sandbox and reports none weaker than its policy."""
    with Sandbox(tool="doctor-check") as sb:
        report = json.loads(cli("doctor", "--json").stdout)
    mine = [c for c in report["containers"] if c["name"] == sb.name]
    assert mine == [{"name": sb.name, "findings": []}]
    assert report["daemon"]["seccomp"] is True


RUNNER_SCRIPT = """
import sys, time
from toolcage import Sandbox
sb = Sandbox(sys.argv[1], tool="sigkill", audit=False)
sb.start()
print(sb.run_id, flush=True)
sb.call("run_python", {"code": "import time; time.sleep(300)", "timeout_s": 300}, timeout=600)
"""

# The runner and the gc that judges it, in one PID namespace of their own. Any toolcage process that starts a
# sandbox reaps the runs whose owner died (toolcage.lifecycle.reaper), and with the tests in several processes
# (-n) one may do so between the kill and this test's gc. A reaper judges only owners of its own namespace
# (toolcage.engine.ownership), so here no other process can take the run before its deadline.
DRIVER_SCRIPT = """
import signal, subprocess, sys
runner = subprocess.Popen([sys.executable, "-c", sys.argv[1], sys.argv[2]], stdout=subprocess.PIPE, text=True)
print(runner.stdout.readline().strip(), runner.pid, flush=True)
sys.stdin.readline()
runner.send_signal(signal.SIGKILL)
runner.wait(10)
for line in sys.stdin:  # each line a gc command: its output, then a line "--end--"
    out = subprocess.run([sys.executable, "-m", "toolcage.cli", *line.split()], capture_output=True, text=True)
    print(out.stdout + out.stderr + "\\n--end--", flush=True)
"""


def _said(proc: subprocess.Popen[str], command: str) -> str:
    """What the driver's gc printed for ``command`` (up to its line "--end--")."""
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(command + "\n")
    proc.stdin.flush()
    lines = []
    while (line := proc.stdout.readline()) not in ("--end--\n", ""):  # "": the driver ended
        lines.append(line)
    return "".join(lines)


@pytest.mark.runc_only("gc after a killed runner: the engine's objects, alike under either runtime (15 s)")
def test_sigkill_runner_then_gc_leaves_nothing(engine: Any, tmp_path: Path) -> None:
    """A runner killed with SIGKILL mid-call: gc sees the owner is gone; the sandbox stops at once (the worker
    sees its stdin hang up and kills the call), the proxy by its deadline; gc then removes the container, the
    proxy, the network and the volume."""
    policy = tmp_path / "p.yaml"
    policy.write_text("network:\n  mode: proxy\n  allow:\n    - host: api.example.com\ntimeouts:\n  run_s: 12\n")
    proc = subprocess.Popen(
        ["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-c", DRIVER_SCRIPT, RUNNER_SCRIPT, str(policy)],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdin is not None and proc.stdout is not None
    try:
        run_id, _, runner_pid = proc.stdout.readline().strip().partition(" ")
        started = time.monotonic()
        # sandbox, proxy, egress network, socket volume, and the run's two overlays of the shared files where the
        # engine copies the image per container (toolcage.engine.sharedfiles)
        shared = 2 if sharedfiles.layers(engine, engine.image(DEFAULT_IMAGE)["Id"]) else 0
        # the proxy starts beside the sandbox (the first answer does not wait for it): on a loaded machine it may not
        # exist yet when the runner has printed its run id (seen in a full pass: 5 objects of 6)
        while run_id and len(objects_of(engine, run_id)) < 4 + shared and time.monotonic() - started < 10:
            time.sleep(0.1)
        assert run_id and len(objects_of(engine, run_id)) == 4 + shared, objects_of(engine, run_id)
        time.sleep(0.5)
        proc.stdin.write("kill\n")
        out = _said(proc, "gc --dry-run")
        assert f"(run {run_id}): owner process {runner_pid} is gone" in out, out
        killed = time.monotonic()

        def running(role: str) -> bool:
            live = engine.containers(f"toolcage.run_id={run_id}", all=False)
            return any(c["Labels"].get("toolcage.role") == role for c in live)

        while running("sandbox") and time.monotonic() - killed < 5:
            time.sleep(0.1)
        assert not running("sandbox"), "the orphaned sandbox kept running after its runner died"
        assert time.monotonic() - started < 12, "it stopped at once, not at the deadline"
        while running("egress-proxy") and time.monotonic() - started < 12 + 2 + 10:
            time.sleep(0.2)
        assert not running("egress-proxy"), "the orphaned proxy outlived its deadline"
        _said(proc, "gc")
        proc.stdin.close()
        proc.wait(30)
        proc.stdout.close()
        assert objects_of(engine, run_id) == []
    finally:  # a failure above must not leave the driver and its pipes to the next test (ResourceWarning)
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
        for pipe in (proc.stdin, proc.stdout):
            with contextlib.suppress(OSError):
                pipe.close()


def test_external_kill_mid_call(engine: Any) -> None:
    """A container killed from outside mid-call ends the call with a clear sandbox error within a second."""
    with Sandbox() as sb:
        killed_at: list[float] = []

        def kill() -> None:
            time.sleep(1.0)
            killed_at.append(time.monotonic())
            subprocess.run(["docker", "kill", sb.name], capture_output=True, check=True)

        t = threading.Thread(target=kill)
        t.start()
        with pytest.raises(WorkerCrashed) as info:
            sb.call("run_python", {"code": "import time; time.sleep(60)", "timeout_s": 60})
        ended = time.monotonic()
        t.join()
    assert ended - killed_at[0] < 1.0
    assert info.value.status == "crashed" and "exit code 137" in info.value.message


def test_the_engine_tells_a_kill_someone_asked_for(engine: Any) -> None:
    """The engine's events say whether someone asked it to kill a container (what tells a `docker kill`, reported
    as a crash at once, from the kernel's OOM kill, whose flag may come late: backends.container.exit_status)."""
    since = time.time() - 60
    with Sandbox() as sb:
        assert sb.container_id is not None
        assert engine.kill_requested(sb.container_id, since) is False
        subprocess.run(["docker", "kill", sb.name], capture_output=True, check=True)
        assert engine.kill_requested(sb.container_id, since) is True
        with pytest.raises(WorkerCrashed):
            sb.call("ping")


@pytest.mark.runc_only("100 runs, 10 at a time: the runner's lifecycle under load, host-side")
def test_load_100_runs(engine: Any, tmp_path: Path) -> None:
    """100 runs, 10 at a time, a few calls each: all succeed, one start and one finish each, nothing left over."""
    log = tmp_path / "audit.jsonl"

    def one(i: int) -> str:
        with Sandbox(tool="load", audit=log) as sb:
            assert sb.call("ping").result == "pong"
            assert sb.call("run_python", {"code": f"print({i})"}).result["stdout"] == f"{i}\n"
            assert sb.call("list_files", {"path": "/scratch"}).ok
            return sb.run_id

    with ThreadPoolExecutor(10) as pool:
        run_ids = list(pool.map(one, range(100)))
    assert len(set(run_ids)) == 100
    records = list(read(log))
    started = [r["run_id"] for r in records if r["event"] == "run.started"]
    finished = [r["run_id"] for r in records if r["event"] == "run.finished"]
    assert sorted(started) == sorted(run_ids) == sorted(finished)
    assert all(r["status"] == "ok" for r in records if r["event"] == "run.finished")
    assert sum(1 for r in records if r["event"] == "run.call") == 300
    assert verify(log) == []
    assert wait_removed(120)  # closed sandboxes are removed in the background
    leftover = [c for c in engine.containers("toolcage.tool=load")]
    assert leftover == [] and engine.networks("toolcage.tool=load") == []
