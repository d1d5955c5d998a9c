"""One timing contract across the doors (--sandbox none): the same call past the run's end gives the same status
and the same partial output through the library, AsyncSandbox, `toolcage run` and `toolcage serve`. Before, the
library raised SandboxTimeout after 3.3 s and lost the output while `toolcage run` returned it."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from toolcage import AsyncSandbox, Sandbox

ROOT = Path(__file__).resolve().parents[2]
CALL = {"command": "echo partial; sleep 10", "timeout_s": 10}


@pytest.fixture
def short(tmp_path: Path) -> Path:
    p = tmp_path / "short.yaml"
    # 5 s: the child is cut to max(left - GRACE_S, left / 2), and what is left after it is the answer's slack; at
    # 3 s a loaded host (a full pass, the sandbox's warning loading structlog in the run's time) ran past the end
    p.write_text("version: 1\nname: short\ntimeouts: {run_s: 5, idle_s: 5, call_s: 30}\n")
    return p


def _same(status: str, result: dict[str, Any]) -> None:
    assert status == "timeout" and result["stdout"] == "partial\n" and result["timed_out"], (status, result)


def _cli(short: Path, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    log = str(short.with_name("audit.jsonl"))
    cmd = [sys.executable, "-m", "toolcage.cli", *args, "--sandbox", "none", "--policy", str(short), "--audit-log", log]
    return subprocess.run(cmd, cwd=ROOT, input=stdin, capture_output=True, text=True, timeout=60)


def test_library(short: Path) -> None:
    """Sandbox.call: status timeout with the partial output, and the sandbox still answers afterwards."""
    with Sandbox(short, sandbox="none", audit=False) as sb:
        r = sb.call("run_shell", dict(CALL))
        _same(r.status, r.result)
        assert sb.call("run_shell", {"command": "echo alive"}).result["stdout"] == "alive\n"


def test_async_sandbox(short: Path) -> None:
    """AsyncSandbox.call: the same."""

    async def body() -> Any:
        async with AsyncSandbox(short, sandbox="none", audit=False) as sb:
            return await sb.call("run_shell", dict(CALL))

    r = asyncio.run(body())
    _same(r.status, r.result)


def test_cli_run(short: Path) -> None:
    """`toolcage run`: the same, exit 3."""
    out = _cli(short, "run", "run_shell", "--params", json.dumps(CALL))
    assert out.returncode == 3, out.stderr
    doc = json.loads(out.stdout)
    _same(doc["status"], doc["result"])


def test_serve(short: Path) -> None:
    """`toolcage serve`: the answer is the worker's own (timed_out: status timeout) with the output."""
    req = {"jsonrpc": "2.0", "method": "run_shell", "params": CALL, "id": 1}
    out = _cli(short, "serve", stdin=json.dumps(req) + "\n")
    answer = json.loads(out.stdout.splitlines()[0])
    assert answer["id"] == 1 and "result" in answer, (answer, out.stderr)
    _same("timeout" if answer["result"]["timed_out"] else "ok", answer["result"])


def test_mcp_serve(short: Path) -> None:
    """`toolcage mcp serve`: an isError result naming status timeout, with the output."""
    import anyio
    from mcp import ClientSession
    from mcp.client.stdio import StdioServerParameters, stdio_client

    log = str(short.with_name("audit.jsonl"))
    args = ["-m", "toolcage.cli", "mcp", "serve", "--sandbox", "none", "--policy", str(short), "--audit-log", log]
    params = StdioServerParameters(command=sys.executable, args=args, cwd=str(ROOT))
    texts: list[str] = []

    async def main() -> None:
        async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            res = await session.call_tool("run_shell", dict(CALL))
            assert res.is_error
            texts.extend(c.text for c in res.content if c.type == "text")

    anyio.run(main)
    text = "\n".join(texts)
    assert "status timeout" in text and '"stdout": "partial\\n"' in text, text
