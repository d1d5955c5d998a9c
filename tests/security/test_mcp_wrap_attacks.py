"""A hostile wrapped MCP server (the probe server of tests/fixtures/mcp_wrap, run by `toolcage mcp wrap` on
the real engine and driven by the official MCP client) against the client, the host and its secrets:
each case names the attack and asserts what stops it."""

from __future__ import annotations

import ipaddress
import json
import re
import secrets
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from mcp import ClientSession
from mcp.shared.exceptions import MCPError

from tests.helpers import MCP_FETCH, PROBE, PROBE_DIR, WRAP_LABEL, wrap_image, wrap_session

PROBE_IMAGE = "toolcage-test-mcp-fetch:1"  # mcp-server-fetch's image: it holds the mcp SDK the probe imports


@pytest.fixture(scope="module")
def image(engine: Any) -> str:
    return wrap_image(MCP_FETCH, PROBE_IMAGE)


pytestmark = pytest.mark.usefixtures("no_wrap_leaks")


def text(res: Any) -> str:
    return "\n".join(c.text for c in res.content if c.type == "text")


async def probe(s: ClientSession, tool: str, args: dict[str, Any] | None = None) -> Any:
    res = await s.call_tool(tool, args or {})
    assert not res.is_error, text(res)
    return json.loads(text(res))


def probe_args(image: str, *extra: str) -> list[str]:
    return ["--image", image, "--workspace", str(PROBE_DIR), *extra, "--", *PROBE]


def test_secret_reaches_the_server_process_only(engine: Any, image: str, tmp_path: Path) -> None:
    """--secret API_KEY=env:VAR: the server's environment has it; `docker inspect` of its container, the
    audit log and our stderr never hold the value; the value the server prints or returns reaches the
    client and our stderr as [secret API_KEY]. The server runs as uid 65532 on a read-only root with
    HOME in scratch, and under network none even the host's own bridge address is unreachable."""
    value = "sk-test-" + secrets.token_hex(16)
    log = tmp_path / "audit.jsonl"
    # this machine's own address on Docker's default bridge (its gateway): nothing leaves the machine
    gateway = str(ipaddress.ip_network(engine.network("bridge")["IPAM"]["Config"][0]["Subnet"])[1])
    seen: dict[str, Any] = {}

    async def body(s: ClientSession) -> None:
        await s.initialize()
        assert await probe(s, "has_env", {"name": "API_KEY"}) is True
        res = await s.call_tool("leak_env", {"name": "API_KEY"})
        seen["leaked"] = text(res)
        live = engine.containers(WRAP_LABEL, all=False)
        (running,) = [c for c in live if c["Labels"].get("toolcage.role") == "sandbox"]
        seen["inspect"] = json.dumps(engine.inspect(running["Id"]))
        seen["whoami"] = await probe(s, "whoami")
        seen["raw"] = await probe(s, "raw_connect", {"host": gateway, "port": 2375})

    run = wrap_session(
        probe_args(image, "--secret", "API_KEY=env:WRAP_TEST_KEY", "--audit-log", str(log)),
        body,
        env={"WRAP_TEST_KEY": value},
    )
    assert run.exit_code == 0, run.stderr
    assert seen["leaked"] == "the value is [secret API_KEY]"
    assert "leaking [secret API_KEY]" in run.stderr
    for where in (seen["inspect"], log.read_text(), run.stderr):
        assert value not in where
    assert str(PROBE_DIR) in seen["inspect"] and "mcp_host" in seen["inspect"]  # it was the server's container
    assert seen["whoami"] == {"uid": 65532, "home": "/scratch", "cwd": "/scratch", "root_writable": False}
    assert seen["raw"]["connected"] is False and seen["raw"]["errno"] in ("ENETUNREACH", "EHOSTUNREACH"), seen["raw"]
    started = next(r for r in (json.loads(x) for x in log.read_text().splitlines()) if r["event"] == "run.started")
    assert started["secrets"] == ["API_KEY"] and started["network"] == "none"


def test_forged_answers_never_reach_the_client(image: str) -> None:
    """The server writes answers for request ids the client will use next, before it asks: they answer no
    pending request, so they are dropped (and logged); the later calls get the server's real answers."""

    async def body(s: ClientSession) -> None:
        await s.initialize()
        sent = text(await s.call_tool("forge", {"count": 40}))
        assert sent.startswith("sent on fd") and sent != "sent on fd 1", sent
        for _ in range(3):
            res = await s.call_tool("has_env", {"name": "HOME"})
            assert "FORGED" not in text(res) and json.loads(text(res)) is True

    run = wrap_session(probe_args(image), body)
    assert run.exit_code == 0, run.stderr
    assert "mcp.server_answer_dropped" in run.stderr


@pytest.fixture
def short_calls(tmp_path: Path) -> Path:
    path = tmp_path / "short-calls.yaml"
    path.write_text(yaml.safe_dump({"name": "short-calls", "timeouts": {"call_s": 3, "run_s": 60}}))
    return path


@pytest.mark.parametrize(
    ("tool", "extra", "says"),
    [
        ("crash", [], r"exited with code 3; its stderr ends: .*probe: crashing now"),
        ("hang", [], r"did not answer hang within 3s \(timeouts.call_s\)"),
        (
            "hang",
            ["--policy", "default", "--timeout", "6"],
            r"run deadline of 6s passed",
        ),  # call_s 30: the deadline first
        ("flood_stdout", [], r"a line longer than 16777216 bytes"),
        ("flood_stderr", [], r"over 16 MiB to stderr"),
    ],
    ids=["crash", "hang", "run-deadline", "stdout-flood", "stderr-flood"],
)
def test_a_failing_server_ends_with_a_clear_error(
    image: str, short_calls: Path, tool: str, extra: list[str], says: str
) -> None:
    """A server that exits mid-call, never answers (past timeouts.call_s or the run deadline), sends an
    oversized line or floods stderr: the pending call gets -32004 naming what happened, `mcp wrap` exits 3,
    and nothing of the run is left (container, proxy, network, volume)."""
    failed: dict[str, Any] = {}

    async def body(s: ClientSession) -> None:
        await s.initialize()
        t0 = time.monotonic()
        with pytest.raises(MCPError) as exc:
            await s.call_tool(tool, {})
        failed.update(error=exc.value.error, seconds=time.monotonic() - t0)

    run = wrap_session(probe_args(image, "--policy", str(short_calls), *extra), body)  # a later --policy wins
    err = failed["error"]
    assert err.code == -32004, err
    assert re.search(says, err.message), err.message
    assert run.exit_code == 3, run.stderr[-2000:]
    assert re.search(says, run.stderr)
    assert failed["seconds"] < 30, (err.message, run.stderr[-3000:])
