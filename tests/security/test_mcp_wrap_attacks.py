"""A hostile wrapped MCP server (the probe server of tests/fixtures/mcp_wrap, run by `toolcage mcp wrap` on
the real engine and driven by the official MCP client) against the client, the host and its secrets:
each case names the attack and asserts what stops it."""

from __future__ import annotations

import ipaddress
import json
import re
import secrets
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from mcp import ClientSession
from mcp.shared.exceptions import MCPError

from tests.helpers import MCP_FETCH, PROBE, PROBE_DIR, wrap_image, wrap_session
from toolcage.lifecycle import audit as audit_mod

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
        # this run's container, by the name its audit record gives (on disk before the container existed):
        # another runner on the engine may have a wrapped server running too
        (started,) = [r for r in audit_mod.read(log) if r["event"] == "run.started"]
        seen["inspect"] = json.dumps(engine.inspect(started["name"]))
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


def calls_policy(tmp_path: Path, call_s: float) -> Path:
    path = tmp_path / "calls.yaml"
    path.write_text(yaml.safe_dump({"name": "calls", "timeouts": {"call_s": call_s, "run_s": 60}}))
    return path


# Each case's timeouts.call_s: the server's start-up (interpreter, the MCP SDK's import) is inside its first
# answer, initialize, which call_s times too, and under gVisor on a loaded host it took over 3 s + GRACE_S.
# So call_s is generous (60 s) where the case does not end at it, and 20 s for the hung call, which does;
# 10 s for the oversized line, which under gVisor is not seen (GVISOR_KNOWN) and so ends at call_s there.
@pytest.mark.runc_only("a failing wrapped server's deadlines and messages are the runner's (58 s under gVisor)")
@pytest.mark.parametrize(
    ("tool", "call_s", "extra", "says"),
    [
        ("crash", 60, [], r"exited with code 3; its stderr ends: .*probe: crashing now"),
        ("hang", 20, [], r"did not answer hang within 20s \(timeouts.call_s\)"),
        ("hang", 60, ["--timeout", "20"], r"run deadline of 20s passed"),  # the deadline first
        ("flood_stdout", 10, [], r"a line longer than 16777216 bytes"),
        ("flood_stderr", 60, [], r"over 16 MiB to stderr"),
    ],
    ids=["crash", "hang", "run-deadline", "stdout-flood", "stderr-flood"],
)
def test_a_failing_server_ends_with_a_clear_error(
    image: str, tmp_path: Path, tool: str, call_s: float, extra: list[str], says: str
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

    run = wrap_session(probe_args(image, "--policy", str(calls_policy(tmp_path, call_s)), *extra), body)
    err = failed["error"]
    assert err.code == -32004, err
    assert re.search(says, err.message), err.message
    assert run.exit_code == 3, run.stderr[-2000:]
    assert re.search(says, run.stderr)
    # the hung call at 20 s + GRACE_S; the others at once, by what happened, not at their call_s
    assert failed["seconds"] < 30, (err.message, run.stderr[-3000:])


RAW = ["python3", "/workspace/raw_server.py"]  # tests/fixtures/mcp_wrap/raw_server.py: runs on the worker image
INIT = {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "raw-test", "version": "1"}}


class RawWrap:
    """`toolcage mcp wrap ARGS` driven by hand, line by line: for messages the official client will not send."""

    def __init__(self, args: list[str]) -> None:
        import queue
        import sys
        import threading

        from tests.helpers import ROOT

        self.proc = subprocess.Popen(
            [sys.executable, "-m", "toolcage.cli", "mcp", "wrap", *args],
            cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )  # fmt: skip
        self.lines: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self.err = bytearray()
        threading.Thread(target=self._read, daemon=True).start()
        threading.Thread(target=self._read_err, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(json.loads(line))
        self.lines.put(None)

    def _read_err(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.err += line

    def send(self, msg: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write((json.dumps(msg) + "\n").encode())
        self.proc.stdin.flush()

    def answer(self, req_id: Any, timeout: float = 60) -> dict[str, Any]:
        """The answer to ``req_id`` (messages before it are skipped); fails on EOF or after ``timeout``."""
        end = time.monotonic() + timeout
        while True:
            msg = self.lines.get(timeout=max(0.01, end - time.monotonic()))
            assert msg is not None, f"mcp wrap ended before answering {req_id}: {self.stderr[-3000:]}"
            if msg.get("id") == req_id and "method" not in msg:
                return msg

    def request(self, req_id: Any, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        self.send({"jsonrpc": "2.0", "id": req_id, "method": method, **({"params": params} if params else {})})
        return self.answer(req_id)

    def initialize(self) -> None:
        assert "result" in self.request(0, "initialize", INIT), self.stderr
        self.send({"jsonrpc": "2.0", "method": "notifications/initialized"})

    @property
    def stderr(self) -> str:
        return self.err.decode("utf-8", "replace")

    def close(self, timeout: float = 30) -> int:
        """Close its stdin and wait for it to exit (SIGTERM after ``timeout``, so it still removes its run)."""
        assert self.proc.stdin is not None and self.proc.stdout is not None and self.proc.stderr is not None
        if not self.proc.stdin.closed:
            self.proc.stdin.close()
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.terminate()
            code = self.proc.wait(30)
        time.sleep(0.2)  # the readers take the last lines
        self.proc.stdout.close()
        self.proc.stderr.close()
        return code


def raw_args(*extra: str) -> list[str]:
    return ["--workspace", str(PROBE_DIR), *extra, "--", *RAW]


def test_a_denied_tool_sent_as_a_notification_never_reaches_the_server(tmp_path: Path) -> None:
    """--deny-tool mark, and the client sends `tools/call mark` as a notification (no id), which a lax
    server runs: the relay drops it (a client notification whose method is a request method), logs and
    audits it; the server never ran it, and the session goes on."""
    log = tmp_path / "audit.jsonl"
    w = RawWrap(raw_args("--audit-log", str(log), "--deny-tool", "mark"))
    try:
        w.initialize()
        call = {"name": "mark", "arguments": {"by": "notification"}}
        w.send({"jsonrpc": "2.0", "method": "tools/call", "params": call})
        w.send({"jsonrpc": "2.0", "method": "tools/call", "params": {**call, "name": "marked"}})  # any request method
        listed = w.request(1, "tools/list")
        assert {t["name"] for t in listed["result"]["tools"]} == {"marked", "ask_roots"}
        marked = w.request(2, "tools/call", {"name": "marked", "arguments": {}})
        assert json.loads(marked["result"]["content"][0]["text"]) == [], (marked, w.stderr[-2000:])
    finally:
        code = w.close()
    assert code == 0, w.stderr[-3000:]
    assert "raw: ran mark\n" not in w.stderr and w.stderr.count("raw: ran marked\n") == 1, w.stderr[-3000:]
    assert "mcp.client_notification_dropped" in w.stderr, w.stderr[-3000:]
    records = list(audit_mod.read(log))
    dropped = [r for r in records if r["event"] == "mcp.notification_dropped"]
    assert [(r["method"], r.get("tool")) for r in dropped] == [("tools/call", "mark"), ("tools/call", "marked")]
    assert audit_mod.verify(log) == []


@pytest.fixture
def idle_policy(tmp_path: Path) -> Path:
    path = tmp_path / "idle.yaml"
    path.write_text(yaml.safe_dump({"name": "idle", "timeouts": {"idle_s": 3, "call_s": 20, "run_s": 60}}))
    return path


def test_a_chatty_server_does_not_keep_the_run_alive(idle_policy: Path) -> None:
    """A wrapped server that sends a notification every 0.3 s: only the client's requests (and its answers to
    the server's requests) count as activity, so timeouts.idle_s (3 s) still ends the run once the client
    is silent; an answer to the server's roots/list in between counts as activity."""
    w = RawWrap(["--policy", str(idle_policy), "--workspace", str(PROBE_DIR), "--", *RAW, "--chatty", "0.3"])
    try:
        w.initialize()
        w.send({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "ask_roots", "arguments": {}}})
        end = time.monotonic() + 30
        while True:  # the server's roots/list, among its chatter
            msg = w.lines.get(timeout=max(0.01, end - time.monotonic()))
            assert msg is not None, w.stderr[-3000:]
            if msg.get("method") == "roots/list":
                break
        time.sleep(2)  # the client thinks (the server's request is pending: nothing owed by the server)
        t_answer = time.monotonic()
        w.send({"jsonrpc": "2.0", "id": msg["id"], "result": {"roots": []}})
        assert "result" in w.answer(1), w.stderr[-3000:]
        try:
            code: int | None = w.proc.wait(60)  # the client says nothing more, the server chatters on
        except subprocess.TimeoutExpired:
            code = None
        waited = time.monotonic() - t_answer
    finally:
        w.close()
    assert code == 3, w.stderr[-3000:]
    assert "no request for 3s (timeouts.idle_s)" in w.stderr, w.stderr[-3000:]
    # idle_s ended it (the message), not before its 3 s; when after is the host's: the container is removed
    # before `mcp wrap` exits, which under gVisor on a loaded host takes seconds
    assert waited > 2.5, waited


def test_idle_starts_when_the_client_can_be_read(tmp_path: Path) -> None:
    """A timeouts.idle_s shorter than the run's start-up (the egress proxy's start takes about 0.6 s here,
    more on a loaded host): the idle clock starts once the client's stdin is being read, so the initialize
    request sent at once is answered, and so is the next."""
    policy = tmp_path / "short-idle.yaml"
    network = {"mode": "proxy", "allow": [{"host": "allowed.test", "schemes": ["http"], "ports": [8080]}]}
    doc = {"name": "short-idle", "network": network, "timeouts": {"idle_s": 0.3, "run_s": 60}}
    policy.write_text(yaml.safe_dump(doc))
    w = RawWrap(["--policy", str(policy), *raw_args()])
    try:
        # all before the container is up: once the first is answered, 0.3 s of this process not sending the next
        # (a loaded host) would be idle, which is not what this tests
        w.send({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": INIT})
        w.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        w.send({"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
        first, listed = w.answer(0), w.answer(1)
    finally:
        w.close()
    assert "result" in first and "result" in listed, (first, w.stderr[-3000:])
