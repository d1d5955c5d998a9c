"""`toolcage mcp serve` driven by the official MCP Python client over stdio, on the real engine."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.shared.exceptions import MCPError

pytestmark = [
    pytest.mark.usefixtures("no_leaks"),
    pytest.mark.runc_only(
        "`mcp serve`: the MCP SDK's server around the same calls, host-side (38 s under gVisor; the calls run "
        "under gVisor in test_exec and tests/security)"
    ),
]

CONNECTOR = '''
from toolcage.sdk import tool

@tool
def add(a: int, b: int = 1) -> dict:
    """Add two numbers."""
    return {"sum": a + b}
'''


def _session(args: list[str], body: Callable[[ClientSession], Awaitable[None]]) -> None:
    """Run ``body`` against a `toolcage mcp serve ARGS` session (the server's stderr to ours)."""
    env = {k: v for k, v in os.environ.items() if k.startswith("TOOLCAGE_")}
    params = StdioServerParameters(command=sys.executable, args=["-m", "toolcage.cli", "mcp", "serve", *args], env=env)

    async def main() -> None:
        async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
            await body(session)

    anyio.run(main)


def _text(res: Any) -> str:
    return "\n".join(c.text for c in res.content if c.type == "text")


@pytest.fixture
def connector(tmp_path: Path) -> Path:
    path = tmp_path / "conn.py"
    path.write_text(CONNECTOR)
    path.chmod(0o644)
    tmp_path.chmod(0o755)
    return path


def test_session(engine: Any, connector: Path) -> None:
    """One session: initialize, list (built-ins, a connector), call them, failures as isError, scratch persists."""

    async def body(s: ClientSession) -> None:
        init = await s.initialize()
        assert init.server_info.name == "toolcage"
        await s.send_ping()

        tools = {t.name: t for t in (await s.list_tools()).tools}
        assert "code" in tools["run_python"].input_schema["properties"]
        assert tools["run_python"].description
        assert tools["add"].input_schema["properties"]["a"]["type"] == "integer"

        res = await s.call_tool("run_python", {"code": "print(2+2)"})
        assert not res.is_error and "4" in _text(res)
        assert res.structured_content is not None and res.structured_content["stdout"] == "4\n"

        res = await s.call_tool("add", {"a": 2, "b": 3})
        assert not res.is_error and res.structured_content == {"sum": 5}
        assert json.loads(_text(res)) == {"sum": 5}

        res = await s.call_tool("add", {"a": "two"})
        assert res.is_error and "-32602" in _text(res) and '"a"' in _text(res)

        with pytest.raises(MCPError, match="Unknown tool"):
            await s.call_tool("no_such_tool", {})
        with pytest.raises(MCPError, match="Unknown tool"):
            await s.call_tool("sandbox.usage", {})  # the worker's own methods are not MCP tools

        res = await s.call_tool("run_python", {"code": "import sys; sys.exit(1)"})
        assert res.is_error and "status error" in _text(res)
        assert res.structured_content is not None and res.structured_content["exit_code"] == 1

        await s.call_tool("write_file", {"path": "note.txt", "content": "kept"})
        res = await s.call_tool("read_file", {"path": "note.txt"})
        assert not res.is_error and "kept" in _text(res)

    _session(["--tools", str(connector)], body)


async def scratch_not_kept(s: ClientSession) -> None:
    """A file one tools/call writes is gone for the next: each call had a sandbox of its own."""
    await s.initialize()
    assert "run_python" in {t.name for t in (await s.list_tools()).tools}
    res = await s.call_tool("write_file", {"path": "note.txt", "content": "kept"})
    assert not res.is_error
    res = await s.call_tool("read_file", {"path": "note.txt"})
    assert res.is_error


def test_fresh_per_call(engine: Any) -> None:
    """--fresh-per-call: every tools/call gets a new sandbox, so scratch does not persist."""
    _session(["--fresh-per-call"], scratch_not_kept)


def test_the_session_outlives_its_sandbox(engine: Any, tmp_path: Path) -> None:
    """A call past the run's end is cut to the time left: an isError result naming status timeout, the
    sandbox still there. A sandbox the idle timeout ended is replaced before the call that finds it so."""
    policy = tmp_path / "short.yaml"
    policy.write_text("version: 1\nname: short\ntimeouts: {run_s: 4, idle_s: 2, call_s: 30}\n")

    async def body(s: ClientSession) -> None:
        await s.initialize()
        res = await s.call_tool("run_python", {"code": "import time; time.sleep(30)"})
        assert res.is_error and "status timeout" in _text(res), _text(res)
        res = await s.call_tool("write_file", {"path": "note.txt", "content": "kept"})
        assert not res.is_error, _text(res)
        await anyio.sleep(3)  # idle past idle_s: that sandbox is gone
        res = await s.call_tool("run_python", {"code": "import os; print(os.path.exists('note.txt'))"})
        assert not res.is_error and res.structured_content is not None, _text(res)
        assert res.structured_content["stdout"] == "False\n"  # a new sandbox, its scratch empty

    _session(["--policy", str(policy)], body)


def test_error_before_serving(engine: Any, tmp_path: Path) -> None:
    """Before any MCP is spoken: a bad policy or a missing secret is exit 2, a missing image exit 3; one stderr line."""
    import subprocess

    cmd = [sys.executable, "-m", "toolcage.cli", "mcp", "serve"]
    github = str(Path(__file__).resolve().parents[2] / "examples/connectors/github.yaml")
    proc = subprocess.run([*cmd, "--policy", github], capture_output=True, text=True, stdin=subprocess.DEVNULL)
    assert proc.returncode == 2 and proc.stdout == "" and "GITHUB_TOKEN" in proc.stderr
    proc = subprocess.run(
        [*cmd, "--policy", str(tmp_path / "nope.yaml")], capture_output=True, text=True, stdin=subprocess.DEVNULL
    )
    assert proc.returncode == 2 and proc.stdout == "" and "Traceback" not in proc.stderr
    proc = subprocess.run(
        [*cmd, "--image", "toolcage-worker:no-such-tag"], capture_output=True, text=True, stdin=subprocess.DEVNULL
    )
    assert proc.returncode == 3 and proc.stdout == "" and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("mode", [[], ["--fresh-per-call"]])
def test_sigterm_mid_call(engine: Any, mode: list[str]) -> None:
    """SIGTERM while a call runs: the sandbox is killed and removed at once, exit 143, nothing on stdout after.

    The only test here that writes MCP by hand: it needs the server's pid, which stdio_client keeps to itself."""
    import signal
    import subprocess
    import time

    proc = subprocess.Popen(
        [sys.executable, "-m", "toolcage.cli", "mcp", "serve", *mode],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None

    def send(msg: dict[str, Any]) -> None:
        assert proc.stdin is not None
        proc.stdin.write((json.dumps(msg) + "\n").encode())
        proc.stdin.flush()

    info = {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}
    send({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": info})
    assert json.loads(proc.stdout.readline())["result"]["serverInfo"]["name"] == "toolcage"
    send({"jsonrpc": "2.0", "method": "notifications/initialized"})
    call = {"name": "run_python", "arguments": {"code": "import time; time.sleep(30)"}}
    send({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": call})
    time.sleep(2)
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=15) == 143
    assert time.monotonic() - t0 < 5
    assert "SIGTERM" in proc.stderr.read().decode()
    proc.stdin.close()
    proc.stdout.close()
    proc.stderr.close()


PROGRESS_CONNECTOR = '''
import time
from toolcage.sdk import Context, tool

@tool
def steps(ctx: Context, n: int = 3) -> dict:
    """Report progress n times."""
    for i in range(1, n + 1):
        ctx.progress(i, n, f"step {i}")
        time.sleep(0.2)
    return {"done": n}
'''

SLOW_PRINTS = "import time\nfor i in range(4):\n    print(f'line {i}', flush=True)\n    time.sleep(0.4)\n"


def test_progress_streams_while_the_call_runs(engine: Any, tmp_path: Path) -> None:
    """A call with a progressToken gets run_python's output and a connector's reports as
    notifications/progress before its result, with strictly increasing progress."""
    path = tmp_path / "prog.py"
    path.write_text(PROGRESS_CONNECTOR)
    path.chmod(0o644)
    tmp_path.chmod(0o755)

    async def body(s: ClientSession) -> None:
        await s.initialize()
        seen: list[tuple[float, float | None, str | None, float]] = []

        async def on_progress(progress: float, total: float | None, message: str | None) -> None:
            seen.append((progress, total, message, anyio.current_time()))

        t0 = anyio.current_time()
        res = await s.call_tool("run_python", {"code": SLOW_PRINTS}, progress_callback=on_progress)
        done = anyio.current_time()
        assert not res.is_error, _text(res)
        streamed = "".join(m or "" for _, _, m, _ in seen)
        assert streamed == res.structured_content["stdout"] == "".join(f"line {i}\n" for i in range(4))
        assert len(seen) >= 3, seen  # not one lump at the end
        assert seen[0][3] - t0 < done - t0 - 0.8  # the first line came while the call still ran
        progress = [p for p, _, _, _ in seen]
        assert progress == sorted(set(progress))  # strictly increasing

        seen.clear()
        res = await s.call_tool("steps", {"n": 3}, progress_callback=on_progress)
        assert not res.is_error and res.structured_content == {"done": 3}
        assert [(p, t, m) for p, t, m, _ in seen] == [(1, 3, "step 1"), (2, 3, "step 2"), (3, 3, "step 3")]

        seen.clear()  # no token: no notifications
        res = await s.call_tool("run_python", {"code": "print('quiet')"})
        assert not res.is_error and seen == []

    _session(["--tools", str(path)], body)


HEARTBEAT = (
    "import os, time\n"
    "open('started', 'w').close()\n"
    "while True:\n"
    "    with open('beat', 'a') as f: f.write('x')\n"
    "    time.sleep(0.02)\n"
)
CHECK_BEAT = (
    "import os, time\n"
    "a = os.path.getsize('beat'); time.sleep(0.5); b = os.path.getsize('beat')\n"
    "print(os.path.exists('started'), a == b)\n"
)


@pytest.mark.parametrize("mode", [[], ["--fresh-per-call"]], ids=["session", "fresh"])
def test_cancel_stops_the_call_and_the_session_goes_on(engine: Any, mode: list[str]) -> None:
    """notifications/cancelled (sent by the client when its caller gives up) kills the call's
    processes at once: the next call answers promptly and sees the heartbeat stopped."""

    async def body(s: ClientSession) -> None:
        await s.initialize()
        with anyio.move_on_after(1.5) as scope:
            await s.call_tool("run_python", {"code": HEARTBEAT, "timeout_s": 60})
        assert scope.cancelled_caught
        t0 = anyio.current_time()
        res = await s.call_tool("run_python", {"code": "print('next')"})
        assert not res.is_error and "next" in _text(res)
        assert anyio.current_time() - t0 < 5  # not held behind the 60 s call
        if not mode:  # the session's sandbox: the cancelled call's files are there, its process is not
            res = await s.call_tool("run_python", {"code": CHECK_BEAT})
            assert _text(res).strip().endswith("True True") or "True True" in _text(res), _text(res)

    _session(mode, body)


def test_background_process_tools(engine: Any) -> None:
    """Issue 37: tools/list lists the proc_* tools with their schemas; a process proc_start began in one
    tools/call is read by the next (the session's sandbox keeps it), then killed."""
    procs = {
        "proc_start",
        "proc_read",
        "proc_wait",
        "proc_write",
        "proc_signal",
        "proc_kill",
        "proc_resize",
        "proc_list",
    }

    async def body(s: ClientSession) -> None:
        await s.initialize()
        tools = {t.name: t for t in (await s.list_tools()).tools}
        assert procs <= set(tools), sorted(tools)
        assert {"argv", "command", "pty"} <= set(tools["proc_start"].input_schema["properties"])
        assert tools["proc_read"].input_schema["properties"]["since"]["type"] == "integer"
        res = await s.call_tool("proc_start", {"command": "echo ready; read line; echo got $line; sleep 300"})
        assert not res.is_error and res.structured_content is not None, _text(res)
        pid = res.structured_content["id"]
        res = await s.call_tool("proc_write", {"id": pid, "data": "it\n"})
        assert not res.is_error, _text(res)
        res = await s.call_tool("proc_wait", {"id": pid, "until": "output", "pattern": "got it", "timeout_s": 20})
        assert not res.is_error and res.structured_content == {**res.structured_content, "met": True}, _text(res)
        res = await s.call_tool("proc_read", {"id": pid, "since": 0})
        assert not res.is_error and res.structured_content is not None, _text(res)
        assert res.structured_content["output"] == "ready\ngot it\n" and res.structured_content["state"] == "running"
        res = await s.call_tool("proc_kill", {"id": pid})
        assert not res.is_error and res.structured_content is not None, _text(res)
        assert res.structured_content["state"] == "exited"

    _session([], body)
