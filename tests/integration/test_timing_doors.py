"""One timing contract across the doors, in a real container: a call past the run's end gives status timeout with
its partial output through the library, AsyncSandbox, `toolcage run` and `toolcage serve` alike
(tests/unit/test_timing_doors.py is the same under --sandbox none)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import run_cli
from toolcage import AsyncSandbox, Sandbox

pytestmark = pytest.mark.runc_only(
    "the timing contract at each door: the runner's clocks, host-side (24 s under gVisor)"
)

# The run's clock starts before its container does (toolcage.run.Run.start_clock), so run_s leaves room for a
# start on a loaded host (3 s was once used up by the start alone under CI, and the call was refused before it began).
CALL = {"command": "echo partial; sleep 40", "timeout_s": 40}


@pytest.fixture
def short(tmp_path: Path) -> Path:
    p = tmp_path / "short.yaml"
    p.write_text("version: 1\nname: short\ntimeouts: {run_s: 8, idle_s: 8, call_s: 60}\n")
    return p


def _same(status: str, result: dict[str, Any]) -> None:
    assert status == "timeout" and result["stdout"] == "partial\n" and result["timed_out"], (status, result)


def test_library_and_async(engine: Any, short: Path) -> None:
    """Sandbox.call and AsyncSandbox.call: status timeout with the output (was SandboxTimeout, output lost)."""
    with Sandbox(short, audit=False) as sb:
        r = sb.call("run_shell", dict(CALL))
    _same(r.status, r.result)

    async def body() -> Any:
        async with AsyncSandbox(short, audit=False) as asb:
            return await asb.call("run_shell", dict(CALL))

    r = asyncio.run(body())
    _same(r.status, r.result)


def test_cli_run_and_serve(engine: Any, short: Path) -> None:
    """`toolcage run` (exit 3) and `toolcage serve` (the worker's own answer, timed_out): the same."""
    log = str(short.with_name("audit.jsonl"))
    out = run_cli("run", "run_shell", "--policy", str(short), "--audit-log", log, "--params", json.dumps(CALL))
    assert out.returncode == 3, out.stderr
    doc = json.loads(out.stdout)
    _same(doc["status"], doc["result"])
    req = {"jsonrpc": "2.0", "method": "run_shell", "params": CALL, "id": 1}
    out = run_cli("serve", "--policy", str(short), "--audit-log", log, stdin=json.dumps(req) + "\n")
    answer = json.loads(out.stdout.splitlines()[0])
    assert "result" in answer, (answer, out.stderr)
    _same("timeout" if answer["result"]["timed_out"] else "ok", answer["result"])
