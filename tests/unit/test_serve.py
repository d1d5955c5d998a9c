"""`toolcage serve` and run ends (deadline, idle, interrupt) against the local worker (`--sandbox none`, no Docker)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.unit._helpers import finish_with_stdin_open
from toolcage import Sandbox, SandboxTimeout, load_policy
from toolcage.lifecycle.audit import read

ROOT = Path(__file__).resolve().parents[2]
SLEEP = {"jsonrpc": "2.0", "method": "run_python", "params": {"code": "import time; time.sleep(30)", "timeout_s": 30}}


def _serve(tmp_path: Path, *args: str) -> subprocess.Popen[bytes]:
    log = str(tmp_path / "a.jsonl")
    return subprocess.Popen(
        [sys.executable, "-m", "toolcage.cli", "serve", "--sandbox", "none", "--audit-log", log, *args],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def _policy(tmp_path: Path, **timeouts: float) -> Path:
    p = tmp_path / "p.yaml"
    p.write_text(yaml.safe_dump({"name": "t", "timeouts": timeouts}))
    return p


def _freeze_worker(serve_pid: int) -> None:
    """SIGSTOP the worker (its process group: its children too): a hung worker that answers nothing."""
    until = time.monotonic() + 10
    while time.monotonic() < until:
        for child in Path(f"/proc/{serve_pid}/task/{serve_pid}/children").read_text().split():
            if b"toolcage.worker" in Path(f"/proc/{child}/cmdline").read_bytes():
                os.killpg(int(child), signal.SIGSTOP)
                return
        time.sleep(0.05)
    raise AssertionError("no worker process found")


def test_serve_deadline_answers_pending_requests_and_exits_3(tmp_path: Path) -> None:
    """At the run deadline with a request pending and stdin still open, serve answers that id with -32004 and
    exits 3 (it used to abort with `Fatal Python error: _enter_buffered_busy`, exit 134, and answer nothing).
    The worker is frozen: a code-running call is cut to the time left and answers before the deadline."""
    proc = _serve(tmp_path, "--timeout", "2")
    assert proc.stdin is not None
    proc.stdin.write((json.dumps({**SLEEP, "id": "slow"}) + "\n").encode())
    proc.stdin.flush()  # and keep stdin open, as a long-lived client does
    time.sleep(0.3)
    _freeze_worker(proc.pid)
    out, err = finish_with_stdin_open(proc)
    assert proc.returncode == 3, err.decode()
    assert b"Fatal Python error" not in err
    answers = [json.loads(x) for x in out.splitlines()]
    assert [a["id"] for a in answers] == ["slow"]
    assert answers[0]["error"]["code"] == -32004 and "deadline" in answers[0]["error"]["message"]
    assert answers[0]["error"]["data"]["status"] == "timeout"


def test_serve_idle_timeout_is_separate_from_the_run_deadline(tmp_path: Path) -> None:
    """timeouts.idle_s ends a serve session nobody talks to, long before timeouts.run_s; exit 3 saying why."""
    proc = _serve(tmp_path, "--policy", str(_policy(tmp_path, run_s=120, idle_s=1.5)))
    assert proc.stdin is not None
    t = time.monotonic()
    proc.stdin.write(b'{"jsonrpc": "2.0", "method": "ping", "id": 1}\n')
    proc.stdin.flush()
    out, err = finish_with_stdin_open(proc)
    assert proc.returncode == 3 and b"idle" in err, err.decode()
    assert time.monotonic() - t < 10
    assert [json.loads(x) for x in out.splitlines()] == [{"jsonrpc": "2.0", "result": "pong", "id": 1}]


def test_idle_timeout_ends_an_idle_sandbox_but_not_a_busy_one(tmp_path: Path) -> None:
    """A call longer than idle_s is not idle time; idle_s without a call kills the sandbox and the next call
    raises SandboxTimeout naming the idle timeout."""
    policy = load_policy(_policy(tmp_path, run_s=60, idle_s=1))
    with Sandbox(policy, sandbox="none", audit=False) as sb:
        r = sb.call("run_python", {"code": "import time; time.sleep(1.5); print('done')"})
        assert r.result["stdout"] == "done\n"
        time.sleep(0.5)
        assert sb.call("ping").result == "pong"  # activity restarts the idle clock
        time.sleep(1.8)
        with pytest.raises(SandboxTimeout, match="idle"):
            sb.call("ping")
    assert sb.summary is not None and sb.summary.status == "timeout"


def test_idle_s_defaults_and_validates() -> None:
    """timeouts.idle_s exists, defaults to the run deadline's default, and must be positive."""
    from toolcage.policies import PolicyError, validate_policy

    assert load_policy("default").timeouts.idle_s == 60
    with pytest.raises(PolicyError, match=r"timeouts\.idle_s"):
        validate_policy({"timeouts": {"idle_s": 0}})


def _finished(log: Path) -> dict[str, Any]:
    return [r for r in read(log) if r["event"] == "run.finished"][-1]


@pytest.mark.parametrize("command", ["run", "serve"])
def test_sigint_mid_call_ends_within_a_second_as_interrupted(tmp_path: Path, command: str) -> None:
    """Ctrl-C during a call ends the runner within a second, exit 130, recorded as `interrupted` (it used to
    take 5 s asking the busy worker for usage, and was recorded as `timeout`)."""
    log = tmp_path / "a.jsonl"
    args = ["run", "run_python", "--params", json.dumps(SLEEP["params"])] if command == "run" else ["serve"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "toolcage.cli", *args, "--sandbox", "none", "--audit-log", str(log)],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdin is not None
    if command == "serve":
        proc.stdin.write((json.dumps({**SLEEP, "id": 7}) + "\n").encode())
        proc.stdin.flush()
    deadline = time.monotonic() + 20
    while not any(r["event"] == "run.started" for r in (read(log) if log.exists() else [])):
        assert time.monotonic() < deadline, "the run never started"
        time.sleep(0.05)
    time.sleep(1.0)  # the call is in progress
    t = time.monotonic()
    os.kill(proc.pid, signal.SIGINT)
    out, err = finish_with_stdin_open(proc)
    took = time.monotonic() - t
    assert proc.returncode == 130, err.decode()
    assert took < 1.0, f"took {took:.2f}s"
    assert _finished(log)["status"] == "interrupted"
    if command == "serve":
        answer = json.loads(out.splitlines()[-1])
        assert answer["id"] == 7 and answer["error"]["code"] == -32004
        assert answer["error"]["data"]["status"] == "interrupted"
    else:
        assert json.loads(out)["status"] == "interrupted"


def test_interrupted_is_a_status() -> None:
    """`interrupted` is one of the statuses every result and run carries."""
    from toolcage import STATUSES

    assert "interrupted" in STATUSES


def test_serve_streams_progress_and_cancels(tmp_path: Path) -> None:
    """A client of `toolcage serve` asks for progress with MCP's _meta.progressToken and cancels with
    notifications/cancelled: the notifications come before the answer, the cancelled call is answered
    -32800 at once, and the session goes on."""
    proc = _serve(tmp_path)
    assert proc.stdin is not None and proc.stdout is not None

    def send(msg: dict[str, Any]) -> None:
        assert proc.stdin is not None
        proc.stdin.write((json.dumps(msg) + "\n").encode())
        proc.stdin.flush()

    def read() -> dict[str, Any]:
        assert proc.stdout is not None
        return json.loads(proc.stdout.readline())

    code = "import time\nfor i in range(3):\n    print(i, flush=True); time.sleep(0.3)"
    send({"jsonrpc": "2.0", "method": "run_python", "params": {"code": code, "_meta": {"progressToken": "p"}}, "id": 1})
    got: list[dict[str, Any]] = []
    while True:
        msg = read()
        got.append(msg)
        if msg.get("id") == 1:
            break
    notes = [m for m in got if m.get("method") == "notifications/progress"]
    assert notes and all(m["params"]["progressToken"] == "p" for m in notes)
    assert "".join(m["params"]["message"] for m in notes) == "0\n1\n2\n" == got[-1]["result"]["stdout"]

    send({**SLEEP, "id": 2})
    time.sleep(0.5)
    t0 = time.monotonic()
    send({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 2}})
    answer = read()
    assert answer["id"] == 2 and answer["error"]["code"] == -32800 and time.monotonic() - t0 < 2
    send({"jsonrpc": "2.0", "method": "ping", "id": 3})
    assert read()["result"] == "pong"
    proc.stdin.close()
    assert proc.wait(20) == 0
    proc.stdout.close()
    if proc.stderr is not None:
        proc.stderr.close()


def test_serve_refuses_a_progress_token_still_in_use() -> None:
    """toolcage serve's bookkeeping: a request reusing an in-flight request's progress token gets -32602 (not
    sent), the token is free again once that request is answered, and a batch registers no token."""
    from toolcage.servers.serve import _Pending

    def req(rid: Any, token: Any) -> bytes:
        params = {"code": "", "_meta": {"progressToken": token}}
        return json.dumps({"jsonrpc": "2.0", "id": rid, "method": "run_python", "params": params}).encode()

    class Fw:
        def record(self, *args: Any) -> None:
            pass

    p = _Pending()
    assert p.saw_request(req(1, "t")) is None
    refused = p.saw_request(req(2, "t"))
    assert refused is not None and refused["id"] == 2 and refused["error"]["code"] == -32602
    assert "'t'" in refused["error"]["message"] and "2" not in p.calls
    assert p.saw_request(req(3, 1)) is None and p.saw_request(req(4, "1")) is None  # 1 and "1" differ
    p.answered(Fw(), {"jsonrpc": "2.0", "id": 1, "result": {}})  # type: ignore[arg-type]
    assert p.saw_request(req(5, "t")) is None
    assert p.saw_request(b"[" + req(6, "b") + b"," + req(7, "b") + b"]") is None
