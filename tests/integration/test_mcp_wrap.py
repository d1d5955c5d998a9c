"""`toolcage mcp wrap` on the real engine, driven by the official MCP client over stdio: two servers from
PyPI (mcp-server-time with no network, mcp-server-fetch behind the egress proxy) and a probe server of
our own that tries to reach the network around the proxy. The upstream is a container of this test on
a Docker network the test made; nothing here reaches beyond the machine."""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from mcp import ClientSession
from mcp.shared.exceptions import MCPError

from tests.helpers import (
    MCP_FETCH,
    MCP_TIME,
    PROBE,
    PROBE_DIR,
    run_cli,
    start_upstream,
    wrap_image,
    wrap_session,
)
from toolcage import wait_removed
from toolcage.lifecycle import audit

FETCH_IMAGE = "toolcage-test-mcp-fetch:1"

UPSTREAM = r"""
import http.server
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        print("GET " + self.headers.get("Host", "") + self.path, flush=True)
        body = ("<html><body><h1>upstream page</h1><p>you asked for %s</p></body></html>" % self.path).encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
print("listening", flush=True)
http.server.ThreadingHTTPServer(("0.0.0.0", 8080), H).serve_forever()
"""


pytestmark = pytest.mark.usefixtures("no_wrap_leaks")
# left to the runc pass: what a wrapped server cannot reach runs under gVisor (tests/security/test_mcp_wrap_attacks.py)
FROM_PYPI = "an MCP server from PyPI working through `mcp wrap`: the relay, host-side (50 s under gVisor)"


@pytest.fixture(scope="module")
def fetch_image(engine: Any) -> str:
    """mcp-server-fetch (and the mcp SDK the probe server uses) on the worker image: built once, then cached."""
    return wrap_image(MCP_FETCH, FETCH_IMAGE)


@pytest.fixture(scope="module")
def upstream(engine: Any) -> Iterator[dict[str, Any]]:
    """One HTTP server on an internal network of this test, answering as allowed.test and denied.test."""
    tag = secrets.token_hex(3)
    net = f"toolcage-test-wrap-{tag}"
    labels = {"toolcage.test": tag}
    engine.create_network(net, internal=True, labels=labels)
    cid = None
    try:
        cid = start_upstream(
            engine, f"toolcage-test-wrap-upstream-{tag}", net, UPSTREAM, ["allowed.test", "denied.test"], labels, {}
        )
        deadline = time.monotonic() + 10
        while "listening" not in engine.logs(cid):
            assert time.monotonic() < deadline, engine.logs(cid)
            time.sleep(0.05)
        ip = engine.inspect(cid)["NetworkSettings"]["Networks"][net]["IPAddress"]
        subnet = engine.network(net)["IPAM"]["Config"][0]["Subnet"]
        yield {"network": net, "ip": ip, "subnet": subnet, "cid": cid}
    finally:
        if cid is not None:
            engine.remove(cid)
        wait_removed(60)  # the runs that used it are removed in the background
        engine.remove_network(net)


@pytest.fixture
def proxy_policy(tmp_path: Path, upstream: dict[str, Any]) -> Path:
    """Only GET http://allowed.test:8080 (the test network's range opened for it), through the egress proxy."""
    path = tmp_path / "wrap-fetch.yaml"
    network = {
        "mode": "proxy",
        "allow": [{"host": "allowed.test", "schemes": ["http"], "ports": [8080], "methods": ["GET"]}],
        "allow_private_cidrs": [upstream["subnet"]],
    }
    doc = {"name": "wrap-fetch", "network": network, "timeouts": {"call_s": 20, "run_s": 120}}
    path.write_text(yaml.safe_dump(doc))
    return path


def text(res: Any) -> str:
    return "\n".join(c.text for c in res.content if c.type == "text")


async def probe(s: ClientSession, tool: str, args: dict[str, Any]) -> Any:
    """A probe server tool's answer (its JSON text), failing the test on an isError result."""
    res = await s.call_tool(tool, args)
    assert not res.is_error, text(res)
    return json.loads(text(res))


@pytest.mark.runc_only(FROM_PYPI)
def test_time_server_with_no_network(engine: Any, tmp_path: Path) -> None:
    """mcp-server-time from --pip under network none: its tools list and answer; --deny-tool convert_time
    hides that tool and refuses a call to it without reaching the server; each call is audited (name,
    outcome, duration, params only as size and digest)."""
    log = tmp_path / "audit.jsonl"
    build = run_cli("mcp", "wrap", "--pip", MCP_TIME, "--", "true", timeout=600)  # build (or find) the image
    assert build.returncode == 0, build.stderr[-2000:]
    seen: dict[str, Any] = {}

    async def body(s: ClientSession) -> None:
        t0 = time.monotonic()
        await s.initialize()
        seen["initialize_s"] = time.monotonic() - t0
        tools = {t.name for t in (await s.list_tools()).tools}
        assert tools == {"get_current_time"}
        res = await s.call_tool("get_current_time", {"timezone": "Europe/Paris"})
        assert not res.is_error, text(res)
        assert json.loads(text(res))["timezone"] == "Europe/Paris"
        with pytest.raises(MCPError, match=r"convert_time.*deny-tool") as refused:
            await s.call_tool("convert_time", {"source_timezone": "UTC", "time": "12:00", "target_timezone": "UTC"})
        assert refused.value.error.code == -32602

    args = ["--policy", "default", "--audit-log", str(log), "--deny-tool", "convert_time", "--pip", MCP_TIME]
    run = wrap_session([*args, "--", "mcp-server-time"], body)
    print(f"wrap start-up to the initialize answer: {seen['initialize_s']:.2f}s")
    assert run.exit_code == 0, run.stderr
    records = list(audit.read(log))
    started = next(r for r in records if r["event"] == "run.started")
    assert started["network"] == "none" and started["command"] == ["mcp-server-time"]
    assert started["deny_tools"] == ["convert_time"] and started["tool"] == "mcp-wrap"
    calls = [r for r in records if r["event"] == "run.call"]
    assert [(c["tool"], c["status"], c["error_code"]) for c in calls] == [
        ("get_current_time", "ok", None),
        ("convert_time", "error", -32602),
    ]
    assert calls[0]["params_bytes"] > 0 and len(calls[0]["params_sha256"]) == 64 and calls[0]["duration_ms"] > 0
    assert "Europe/Paris" not in log.read_text()
    assert [r["status"] for r in records if r["event"] == "run.finished"] == ["ok"]
    assert audit.verify(log) == []


@pytest.mark.runc_only(FROM_PYPI)
def test_fetch_server_behind_the_egress_proxy(
    engine: Any, fetch_image: str, upstream: dict[str, Any], proxy_policy: Path
) -> None:
    """mcp-server-fetch (from an image built with `image build --pip`, run with --image) fetches the allowed
    URL through the egress proxy; a URL the policy does not allow is refused and never reaches the upstream."""
    marker = secrets.token_hex(4)

    async def body(s: ClientSession) -> None:
        await s.initialize()
        assert "fetch" in {t.name for t in (await s.list_tools()).tools}
        res = await s.call_tool("fetch", {"url": f"http://allowed.test:8080/page-{marker}"})
        assert not res.is_error, text(res)
        assert "upstream page" in text(res) and f"page-{marker}" in text(res)
        res = await s.call_tool("fetch", {"url": f"http://denied.test:8080/secret-{marker}"})
        assert res.is_error and "403" in text(res), text(res)

    args = ["--policy", str(proxy_policy), "--egress-network", upstream["network"], "--image", fetch_image]
    run = wrap_session([*args, "--", "mcp-server-fetch", "--ignore-robots-txt"], body)
    assert run.exit_code == 0, run.stderr
    got = engine.logs(upstream["cid"])
    assert f"GET allowed.test:8080/page-{marker}" in got and f"secret-{marker}" not in got


def test_raw_connections_from_the_wrapped_server_fail(
    engine: Any, fetch_image: str, upstream: dict[str, Any], proxy_policy: Path
) -> None:
    """Inside the same wrapped-server set-up (proxy policy, the probe server of tests/fixtures/mcp_wrap), a
    direct TCP connection to the upstream's own address fails (no interface but lo: ENETUNREACH) and names do
    not resolve, while a request through HTTP_PROXY to the allowed host works and one to another host is 403."""

    async def body(s: ClientSession) -> None:
        await s.initialize()
        raw = await probe(s, "raw_connect", {"host": upstream["ip"], "port": 8080})
        assert raw["connected"] is False and raw["errno"] in ("ENETUNREACH", "EHOSTUNREACH"), (
            raw
        )  # gVisor: EHOSTUNREACH
        named = await probe(s, "raw_connect", {"host": "allowed.test", "port": 8080})
        assert named["connected"] is False and named["resolved"] is False, named
        ok = await probe(s, "proxied_get", {"url": "http://allowed.test:8080/via-proxy"})
        assert ok["status"] == 200 and "upstream page" in ok["body"], ok
        no = await probe(s, "proxied_get", {"url": "http://denied.test:8080/"})
        assert no["status"] == 403, no

    args = ["--policy", str(proxy_policy), "--egress-network", upstream["network"], "--image", fetch_image]
    run = wrap_session([*args, "--workspace", str(PROBE_DIR), "--", *PROBE], body)
    assert run.exit_code == 0, run.stderr


def test_unknown_image_is_exit_2(engine: Any) -> None:
    """--image naming an image this engine does not have: exit 2, one line, nothing started."""
    proc = run_cli("mcp", "wrap", "--image", "toolcage-test-no-such-image:0", "--", "srv", stdin="")
    assert proc.returncode == 2 and "no such image" in proc.stderr and "Traceback" not in proc.stderr
    assert proc.stdout == ""
