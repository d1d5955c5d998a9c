"""The sandbox end to end on the real engine: results, lifecycle, limits, failure reporting."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import run_cli as _cli
from tests.unit._helpers import finish_with_stdin_open
from toolcage import (
    DockerUnavailable,
    ImageMissing,
    Sandbox,
    SandboxOOM,
    SandboxTimeout,
    WorkerCrashed,
    wait_removed,
)
from toolcage.engine.docker_adapter import Engine

ROOT = Path(__file__).resolve().parents[2]
FIX = ROOT / "tests" / "fixtures" / "policies"
pytestmark = pytest.mark.usefixtures("no_leaks")
# left to the runc pass (37 s under gVisor): what a call's OOM, timeout or a killed worker look like under gVisor
# is in test_gvisor.py, this file's library tests and tests/security
CLI_EXITS = "`toolcage run`'s exit codes and partial output: the CLI's, host-side"


def py(sb: Sandbox, code: str, **kw: Any) -> Any:
    return sb.call("run_python", {"code": code, **kw})


def test_result_comes_back(engine: Any) -> None:
    """A tool call returns its result with status ok and timings."""
    with Sandbox() as sb:
        r = py(sb, "print(2+2)")
    assert r.status == "ok" and r.result["stdout"] == "4\n" and r.wall_ms > 0
    assert sb.summary is not None and sb.summary.peak_memory_bytes and sb.summary.cpu_ms


def test_explore_tools_over_workspace(engine: Any, tmp_path: Path) -> None:
    """list_files, read_file and grep see the mounted workspace; write_file lands in scratch."""
    (tmp_path / "notes.md").write_text("alpha\nbeta\n")
    tmp_path.chmod(0o755)  # pytest makes it 0700; the sandbox user is not root
    with Sandbox(workspace=tmp_path) as sb:
        entries = sb.call("list_files", {}).result["entries"]
        assert [e["path"] for e in entries] == ["/workspace/notes.md"]
        assert sb.call("read_file", {"path": "/workspace/notes.md"}).result["content"] == "alpha\nbeta\n"
        assert sb.call("grep", {"pattern": "bet"}).result["matches"][0]["line"] == 2
        w = sb.call("write_file", {"path": "out.txt", "content": "x"})
        assert w.status == "ok" and w.result["path"] == "/scratch/out.txt"
        esc = sb.call("read_file", {"path": "/etc/passwd"})
        assert esc.status == "error" and esc.error is not None and esc.error["code"] == -32002


def test_tools_list(engine: Any) -> None:
    """tools.list gives every built-in tool with a JSON schema."""
    with Sandbox() as sb:
        tools = {t["name"]: t for t in sb.call("tools.list").result}
    assert {"run_python", "run_shell", "list_files", "read_file", "grep", "write_file"} <= set(tools)
    assert tools["run_python"]["params_schema"]["required"] == ["code"]


def test_docker_ps_shows_run_then_nothing_remains(engine: Any) -> None:
    """During a run `docker ps` shows its name and labels; afterwards nothing of it remains."""
    with Sandbox(tool="run_python") as sb:
        out = subprocess.run(
            ["docker", "ps", "--filter", f"label=toolcage.run_id={sb.run_id}", "--format", "{{.Names}}|{{.Labels}}"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        name, labels = out.split("|", 1)
        assert name == f"toolcage-run_python-{sb.run_id}"
        for key in (
            "toolcage.tool=run_python",
            "toolcage.policy=default",
            "toolcage.policy_sha256=",
            "toolcage.owner=",
        ):
            assert key in labels
    assert wait_removed(30)  # removed in the background, off the caller's path
    after = subprocess.run(
        ["docker", "ps", "-a", "--filter", f"label=toolcage.run_id={sb.run_id}", "-q"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert after == ""


def test_memory_bomb_is_oom_killed(engine: Any) -> None:
    """A child that allocates past the limit ends as oom_killed, and the sandbox keeps working."""
    with Sandbox(FIX / "good-small.yaml") as sb:
        r = py(sb, "b = []\nwhile True: b.append(bytearray(16 * 1024 * 1024))", timeout_s=15)
        assert r.status == "oom_killed", r
        assert py(sb, "print('alive')").result["stdout"] == "alive\n"


def test_worker_oom_is_reported(engine: Any) -> None:
    """When the worker itself is the OOM victim, the run ends as oom_killed (read from State.OOMKilled)."""
    # 12 MiB requests: the worker (request line, decoded string, bytes written) overshoots the limit at
    # once; with 4 MiB ones it sometimes settled just under it, thrashing its own pages instead of dying
    chunk = "A" * (12 * 1024 * 1024)
    with Sandbox(FIX / "good-tmpfs-over-memory.yaml") as sb, pytest.raises(SandboxOOM) as info:
        for i in range(22):  # 264 MiB of tmpfs pages against a 48 MiB memory limit
            sb.call("write_file", {"path": f"f{i}", "content": chunk})
    assert info.value.status == "oom_killed"
    assert sb.summary is not None and sb.summary.status == "oom_killed"


def test_endless_loop_times_out_and_leaves_nothing(engine: Any) -> None:
    """An endless loop ends as a timeout (partial output kept) and no container is left."""
    with Sandbox() as sb:
        # 5 s: the first line must come before the timeout, and a child's start under gVisor on a loaded
        # host took up to 0.9 s
        r = py(sb, "print('before', flush=True)\nwhile True: pass", timeout_s=5)
    assert r.status == "timeout" and r.result["timed_out"] and r.result["stdout"] == "before\n"


def test_run_deadline_kills_container(engine: Any) -> None:
    """A child asked to run past the run deadline is cut to the time left (status timeout, its output kept:
    toolcage.timing); then the deadline kills the container and the next call raises SandboxTimeout."""
    # 10 s: the child is cut to the time left less GRACE_S, and must print its first line in it
    with Sandbox(run_timeout=10) as sb:
        t = time.monotonic()  # the deadline was set as the sandbox started, before this
        r = py(sb, "print('partial', flush=True); import time; time.sleep(30)", timeout_s=30)
        assert r.status == "timeout" and r.result["stdout"] == "partial\n", r
        time.sleep(max(0.0, t + 10.5 - time.monotonic()))  # past the deadline, whatever the start took
        with pytest.raises(SandboxTimeout) as info:
            py(sb, "print(1)")
        cid = sb.container_id
    assert time.monotonic() - t < 25  # the deadline ended it, not the call's own 30 s
    assert info.value.status == "timeout" and sb.summary is not None and sb.summary.status == "timeout"
    assert cid is not None and not ((engine.inspect(cid) or {}).get("State") or {}).get("Running")


def test_fork_bomb_stopped_by_pids_limit(engine: Any) -> None:
    """A fork bomb hits the pids limit; the call ends and the host is fine."""
    with Sandbox() as sb:
        r = sb.call("run_shell", {"command": "bomb() { bomb | bomb & }; bomb; sleep 2; echo survived", "timeout_s": 8})
        assert r.status in ("ok", "timeout", "error")
        count = py(sb, "import os; print(len([p for p in os.listdir('/proc') if p.isdigit()]))")
        assert count.status == "ok" and int(count.result["stdout"]) <= 64
    # the host can still start processes
    assert subprocess.run(["true"]).returncode == 0


def test_worker_crash_reports_stderr_tail(engine: Any) -> None:
    """If the worker dies, the call raises WorkerCrashed with the tail of its stderr."""
    with Sandbox() as sb:
        sb.call("ping")
        time.sleep(0.3)  # the worker writes its log lines when idle
        # tool code cannot kill the worker: it is the namespace's init, which ignores signals it has no handler for
        # (under gVisor PID 1 is the call itself, in a PID namespace of its own: nothing names the worker)
        kill_init = (
            "import os, signal\nif os.getpid() != 1:\n"
            "    for s in (signal.SIGKILL, signal.SIGTERM, signal.SIGINT): os.kill(1, s)\n"
        )
        r = py(sb, kill_init + "print('x')")
        assert r.result["stdout"] == "x\n" and sb.call("ping").result == "pong"
        assert sb.container_id is not None
        threading.Timer(0.5, engine.kill, args=(sb.container_id,)).start()  # so the host does, mid-call
        with pytest.raises(WorkerCrashed) as info:
            py(sb, "import time; time.sleep(10)")
    assert info.value.status == "crashed"
    assert "worker.started" in info.value.details["stderr_tail"]


def test_image_missing_is_clear(engine: Any) -> None:
    """A missing image says how to build it."""
    with pytest.raises(ImageMissing, match="toolcage image build"):
        Sandbox(image="toolcage-worker:does-not-exist").start()


# docker-py's UnixHTTPConnection does not close its socket when connect() fails
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.filterwarnings("ignore::ResourceWarning")
def test_docker_unreachable_is_clear(engine: Any) -> None:
    """An unreachable engine gives one clear sentence."""
    unreachable = Engine(base_url="unix:///nonexistent/docker.sock")
    try:
        with pytest.raises(DockerUnavailable, match="Cannot reach the Docker engine"):
            Sandbox(engine=unreachable).start()
    finally:
        unreachable.api.close()
        import gc

        gc.collect()  # collect docker-py's leaked socket here, where its warning is filtered


def test_async_twin(engine: Any) -> None:
    """AsyncSandbox runs the same calls from asyncio."""
    import asyncio

    from toolcage import AsyncSandbox

    async def go() -> str:
        async with AsyncSandbox() as sb:
            r = await sb.call("run_python", {"code": "print('async')"})
            return str(r.result["stdout"])

    assert asyncio.run(go()) == "async\n"


@pytest.mark.runc_only(CLI_EXITS)
def test_cli_run_and_exit_codes(engine: Any) -> None:
    """`toolcage run` prints JSON; exit 0 ok, 1 tool error, 2 usage, 3 sandbox failure."""
    ok = _cli("run", "run_python", "--params", '{"code": "print(2+2)"}')
    assert ok.returncode == 0 and json.loads(ok.stdout)["result"]["stdout"] == "4\n"
    err = _cli("run", "run_shell", "--params", '{"command": "exit 4"}')
    assert err.returncode == 1 and json.loads(err.stdout)["status"] == "error"
    bad = _cli("run", "run_python", "--params", "{nope")
    assert bad.returncode == 2 and "not valid JSON" in bad.stderr and "Traceback" not in bad.stderr
    missing = _cli("run", "run_python", "--params", '{"code": "1"}', "--image", "toolcage-worker:nope")
    assert missing.returncode == 3 and "toolcage image build" in missing.stderr
    assert json.loads(missing.stdout)["status"] == "image_missing"
    timeout = _cli("run", "run_python", "--params", '{"code": "while True: pass", "timeout_s": 1}')
    assert timeout.returncode == 3 and json.loads(timeout.stdout)["status"] == "timeout"
    stdin = _cli("run", "run_python", "--params", "-", stdin='{"code": "print(7)"}')
    assert json.loads(stdin.stdout)["result"]["stdout"] == "7\n"


def test_cli_serve_bridges_jsonrpc(engine: Any) -> None:
    """`toolcage serve` relays JSON-RPC; a malformed line gets -32700 and the next request works."""
    lines = (
        "\n".join(
            [
                '{"jsonrpc": "2.0", "method": "ping", "id": 1}',
                "{garbage",
                '{"jsonrpc": "2.0", "method": "run_python", "params": {"code": "print(5)"}, "id": 2}',
            ]
        )
        + "\n"
    )
    out = _cli("serve", stdin=lines)
    assert out.returncode == 0, out.stderr
    msgs = [json.loads(x) for x in out.stdout.splitlines()]
    assert msgs[0] == {"jsonrpc": "2.0", "result": "pong", "id": 1}
    assert msgs[1]["error"]["code"] == -32700
    assert msgs[2]["result"]["stdout"] == "5\n"


def test_sandbox_none_runs_same_worker_with_warning() -> None:
    """--sandbox none runs the same worker locally and warns loudly on stderr."""
    out = _cli("run", "run_python", "--params", '{"code": "print(1)"}', "--sandbox", "none")
    assert out.returncode == 0 and json.loads(out.stdout)["result"]["stdout"] == "1\n"
    assert "NOTHING IS ISOLATED" in out.stderr


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGINT"])
def test_cli_signal_removes_container(engine: Any, sig: str) -> None:
    """SIGTERM or SIGINT to `toolcage run` mid-call removes the container before it exits."""
    import signal
    import socket

    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "toolcage.cli",
            "run",
            "run_python",
            "--params",
            '{"code": "import time; time.sleep(60)"}',
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    owner = f"{socket.gethostname()}:{proc.pid}"
    try:
        deadline = time.monotonic() + 30
        mine: list[dict[str, Any]] = []
        while time.monotonic() < deadline and not mine:
            mine = [c for c in engine.containers("toolcage.run_id") if c["Labels"].get("toolcage.owner") == owner]
            time.sleep(0.1)
        assert mine, "the run's container never appeared"
        time.sleep(0.5)
        proc.send_signal(getattr(signal, sig))
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()
    left = [c for c in engine.containers("toolcage.run_id") if c["Labels"].get("toolcage.owner") == owner]
    assert left == []
    assert proc.returncode in (130, 143)


def test_cli_serve_audits_calls(engine: Any, tmp_path: Path) -> None:
    """Calls bridged by `toolcage serve` are in the audit log like any other run's."""
    from toolcage.lifecycle.audit import read

    log = tmp_path / "audit.jsonl"
    lines = '{"jsonrpc": "2.0", "method": "run_python", "params": {"code": "print(1)"}, "id": "a"}\n'
    out = subprocess.run(
        [sys.executable, "-m", "toolcage.cli", "serve", "--audit-log", str(log)],
        input=lines,
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert log.exists(), (out.stdout, out.stderr)
    # gc.removed: this process's reaper may remove another test's orphans and audit it here (seen in CI)
    events = [(r["event"], r.get("tool"), r.get("status")) for r in read(log) if r["event"] != "gc.removed"]
    assert events == [("run.started", "serve", None), ("run.call", "run_python", "ok"), ("run.finished", None, "ok")]


def test_cli_run_is_audited(engine: Any, tmp_path: Path) -> None:
    """`toolcage run` writes run.started, run.call and run.finished (at the CLI's default log level)."""
    from toolcage.lifecycle.audit import read, verify

    log = tmp_path / "audit.jsonl"
    out = _cli("run", "run_python", "--params", '{"code": "print(3)"}', "--audit-log", str(log))
    assert out.returncode == 0
    # the CLI's reaper may remove another test's orphans and audit that here too (seen in CI): gc.removed
    assert [r["event"] for r in read(log) if r["event"] != "gc.removed"] == ["run.started", "run.call", "run.finished"]
    assert verify(log) == []


def test_keep_leaves_stopped_container(engine: Any) -> None:
    """--keep leaves the run's container (stopped, inspectable) instead of removing it."""
    out = _cli("run", "run_python", "--params", '{"code": "print(1)"}', "--keep")
    name = json.loads(out.stdout)["name"]
    try:
        deadline = time.monotonic() + 10
        info = engine.inspect(name)
        while info and info["State"]["Running"] and time.monotonic() < deadline:
            time.sleep(0.1)
            info = engine.inspect(name)
        assert info is not None and not info["State"]["Running"]
        assert info["Config"]["Labels"]["toolcage.tool"] == "run_python"
        assert info["Config"]["Labels"]["toolcage.keep"] == "1"
        # its owner (the CLI process) is gone: the reaper and plain gc must still leave it alone
        from toolcage.lifecycle import reaper

        assert name not in [o.name for o in reaper.find_orphans(engine)]
        assert [o.kept for o in reaper.find_orphans(engine, include_kept=True) if o.name == name] == [True]
        dry = json.loads(_cli("gc", "--dry-run", "--json").stdout)
        assert name in [o["name"] for o in dry["kept"]] and name not in [o["name"] for o in dry["would_remove"]]
    finally:  # everything of this run, which this test made (its overlays of the shared files too, where there are)
        run_id = json.loads(out.stdout)["run_id"]
        engine.remove(name)
        for v in engine.volumes(f"toolcage.run_id={run_id}"):
            engine.remove_volume(v["Name"])


def test_cli_serve_child_oom_is_a_call_status_and_run_has_usage(engine: Any, tmp_path: Path) -> None:
    """In serve, a child OOM-killed while the worker lives on is that call's status: run.finished says ok,
    oom_killed false, and carries CPU time and peak memory (it said oom_killed, without usage)."""
    from toolcage.lifecycle.audit import read

    log = tmp_path / "audit.jsonl"
    bomb = {"code": "b = []\nwhile True: b.append(bytearray(16 * 1024 * 1024))", "timeout_s": 15}
    lines = (
        json.dumps({"jsonrpc": "2.0", "method": "run_python", "params": bomb, "id": 1})
        + "\n"
        + json.dumps({"jsonrpc": "2.0", "method": "run_python", "params": {"code": "print('alive')"}, "id": 2})
        + "\n"
    )
    out = _cli("serve", "--policy", str(FIX / "good-small.yaml"), "--audit-log", str(log), stdin=lines)
    assert out.returncode == 0, out.stderr
    answers = {a["id"]: a for a in (json.loads(x) for x in out.stdout.splitlines())}  # as each call ends
    assert answers[1]["result"]["oom_killed"] and answers[2]["result"]["stdout"] == "alive\n"
    records = list(read(log))
    assert sorted(r["status"] for r in records if r["event"] == "run.call") == ["ok", "oom_killed"]
    finished = next(r for r in records if r["event"] == "run.finished")
    assert finished["status"] == "ok" and finished["oom_killed"] is False, finished
    assert finished["cpu_ms"] and finished["peak_memory_bytes"], finished


@pytest.mark.runc_only("serve's answer at the run deadline: the runner's clocks, host-side")
def test_cli_serve_deadline_with_a_pending_request(engine: Any) -> None:
    """At the run deadline, with a request pending and stdin open, serve answers it with -32004 and exits 3
    (it aborted with `Fatal Python error: _enter_buffered_busy`, exit 134). The container is frozen: a
    code-running call is cut to the time left in the run and would answer before the deadline."""
    import secrets

    label = f"freeze{secrets.token_hex(4)}"
    proc = subprocess.Popen(
        [sys.executable, "-m", "toolcage.cli", "serve", "--timeout", "5", "--tool-label", label],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    req = {"jsonrpc": "2.0", "method": "run_python", "params": {"code": "import time; time.sleep(60)"}, "id": 9}
    proc.stdin.write((json.dumps(req) + "\n").encode())
    proc.stdin.flush()
    until = time.monotonic() + 20
    while not (found := engine.api.containers(filters={"name": f"toolcage-{label}-"})):
        assert time.monotonic() < until, "the sandbox never started"
        time.sleep(0.1)
    engine.api.pause(found[0]["Id"])
    out, err = finish_with_stdin_open(proc, timeout=30)
    assert proc.returncode == 3 and b"Fatal Python error" not in err, err.decode()
    answer = json.loads(out)
    assert answer["id"] == 9 and answer["error"]["code"] == -32004 and answer["error"]["data"]["status"] == "timeout"


def test_cli_sigint_mid_call_is_interrupted_within_a_second(engine: Any, tmp_path: Path) -> None:
    """Ctrl-C during a call: the container is removed and the runner exits 130 within a second, and the run is
    recorded as interrupted (it took 5 s asking the busy worker for usage, recorded as timeout)."""
    import signal

    from toolcage.lifecycle.audit import read

    log = tmp_path / "audit.jsonl"
    proc = subprocess.Popen(
        [sys.executable, "-m", "toolcage.cli", "run", "run_python", "--audit-log", str(log), "--params",
         '{"code": "import time; time.sleep(60)", "timeout_s": 60}'],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while not (log.exists() and any(r["event"] == "run.started" for r in read(log))):
            assert time.monotonic() < deadline, "the run never started"
            time.sleep(0.05)
        time.sleep(2.0)  # the container is up and the call in progress
        t = time.monotonic()
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=30)
        took = time.monotonic() - t
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130 and json.loads(out)["status"] == "interrupted"
    assert took < 1.0, f"took {took:.2f}s"
    finished = next(r for r in read(log) if r["event"] == "run.finished")
    assert finished["status"] == "interrupted" and engine.inspect(finished["container_id"]) is None


@pytest.mark.runc_only(CLI_EXITS)
def test_cli_run_deadline_keeps_partial_output(engine: Any) -> None:
    """A run cut by --timeout still prints the output its child wrote before the deadline (status timeout)."""
    code = 'print("partial", flush=True)\nwhile True: pass'
    out = _cli("run", "run_python", "--params", json.dumps({"code": code}), "--timeout", "6")
    assert out.returncode == 3, out.stderr
    doc = json.loads(out.stdout)
    assert doc["status"] == "timeout" and doc["result"]["stdout"] == "partial\n"


def test_the_idle_clock_starts_with_the_sandbox_not_before_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Work a start does before the container exists (writable='s read of the image's trees: a minute for 100,000
    files on a slow host) is not idle time: the sandbox it starts is not killed for it (seen in a full run: a
    100,000-file fill killed by the 60 s idle timeout before its first call)."""
    policy = tmp_path / "idle.yaml"
    policy.write_text("version: 1\nname: idle\ntimeouts: {run_s: 60, idle_s: 2, call_s: 30}\n")
    monkeypatch.setattr(Sandbox, "_read_image_paths", lambda self: time.sleep(3))  # a slow read, nothing to fill
    with Sandbox(policy, writable=("/srv",), audit=False) as sb:
        assert sb.call("ping").ok
