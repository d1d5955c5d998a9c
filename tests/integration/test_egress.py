"""Network by policy only, on the real engine: SafeFetch, the egress proxy, and what raw code can reach.

The upstream servers are containers of this test (network aliases api.allowed.test and
other.test) on an egress network the test creates with ``internal=True``, so nothing
here can reach beyond the machine. Everything is labelled and removed afterwards.
"""

from __future__ import annotations

import json
import secrets
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.helpers import start_upstream
from toolcage import Sandbox, wait_removed

pytestmark = pytest.mark.usefixtures("no_leaks")

UPSTREAM = r"""
import http.server
class H(http.server.BaseHTTPRequestHandler):
    def _send(self, code, body, headers=()):
        self.send_response(code)
        for k, v in headers:
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def do_GET(self):
        if self.path == "/redirect-out":
            return self._send(302, b"", [("Location", "http://other.test:8080/secret")])
        if self.path == "/redirect-in":
            return self._send(302, b"", [("Location", "/ok")])
        self._send(200, ("hello %s %s" % (self.headers.get("Host"), self.path)).encode())
    do_POST = do_DELETE = do_GET
    def log_message(self, *a):
        pass
import os, ssl, threading
if os.environ.get("TLS_CERT"):
    open("/tmp/cert.pem", "w").write(os.environ["TLS_CERT"])
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain("/tmp/cert.pem")
    tls = http.server.ThreadingHTTPServer(("0.0.0.0", 8443), H)
    tls.socket = ctx.wrap_socket(tls.socket, server_side=True)
    threading.Thread(target=tls.serve_forever, daemon=True).start()
http.server.ThreadingHTTPServer(("0.0.0.0", 8080), H).serve_forever()
"""

CORP_PROXY = r"""
import socket, threading, sys
def pipe(a, b):
    try:
        while True:
            d = a.recv(65536)
            if not d:
                break
            b.sendall(d)
    except OSError:
        pass
    finally:
        try:
            b.shutdown(socket.SHUT_WR)
        except OSError:
            pass
def handle(c):
    head = b""
    while b"\r\n\r\n" not in head:
        head += c.recv(4096)
    line = head.split(b"\r\n")[0].decode()
    print("corp-proxy saw: " + line, flush=True)
    host, port = line.split(" ")[1].rsplit(":", 1)
    u = socket.create_connection((host.strip("[]"), int(port)))
    c.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
    threading.Thread(target=pipe, args=(c, u), daemon=True).start()
    pipe(u, c)
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", 3128)); s.listen(16)
while True:
    c, _ = s.accept()
    threading.Thread(target=handle, args=(c,), daemon=True).start()
"""


@pytest.fixture(scope="module")
def upstream(engine: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """An internal egress network with one HTTP(S) server answering as api.allowed.test, wrong.allowed.test
    and other.test (TLS certificate from a test CA, for api.allowed.test only), and a corporate CONNECT proxy."""
    import time

    import trustme

    ca = trustme.CA()
    cert = ca.issue_cert("api.allowed.test")
    ca_file = tmp_path_factory.mktemp("ca") / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    pem = cert.private_key_pem.bytes().decode() + "".join(b.bytes().decode() for b in cert.cert_chain_pems)
    tag = secrets.token_hex(3)
    net = f"toolcage-test-egress-{tag}"
    labels = {"toolcage.test": tag}
    engine.create_network(net, internal=True, labels=labels)
    cids: list[str] = []
    try:
        cids.append(
            start_upstream(
                engine,
                f"toolcage-test-upstream-{tag}",
                net,
                UPSTREAM,
                ["api.allowed.test", "wrong.allowed.test", "other.test"],
                labels,
                {"TLS_CERT": pem},
            )
        )
        cids.append(
            start_upstream(engine, f"toolcage-test-corp-proxy-{tag}", net, CORP_PROXY, ["corp-proxy"], labels, {})
        )
        ip = engine.inspect(cids[0])["NetworkSettings"]["Networks"][net]["IPAddress"]
        subnet = engine.network(net)["IPAM"]["Config"][0]["Subnet"]
        time.sleep(0.2)  # (start_upstream waited for each to listen; the TLS one binds just after)
        yield {"network": net, "ip": ip, "subnet": subnet, "ca_file": ca_file, "corp_proxy": cids[1]}
    finally:
        for cid in cids:
            engine.remove(cid)
        wait_removed(60)  # the runs that used it are removed in the background
        engine.remove_network(net)


def policy_file(tmp_path: Path, network: dict[str, Any], name: str = "egress-test") -> Path:
    p = tmp_path / f"{name}.yaml"
    p.write_text(yaml.safe_dump({"name": name, "network": network, "timeouts": {"call_s": 10, "run_s": 60}}))
    return p


@pytest.fixture
def allow_api(tmp_path: Path, upstream: dict[str, Any]) -> Path:
    return policy_file(
        tmp_path,
        {
            "mode": "proxy",
            "allow": [{"host": "api.allowed.test", "schemes": ["http"], "ports": [8080], "methods": ["GET", "POST"]}],
            "allow_private_cidrs": [upstream["subnet"]],
        },
    )


def fetch(sb: Sandbox, url: str, **kw: Any) -> Any:
    return sb.call("http_fetch", {"url": url, **kw})


def run_probe(sb: Sandbox, code: str) -> dict[str, Any]:
    r = sb.call("run_python", {"code": textwrap.dedent(code), "timeout_s": 20})
    assert r.result["exit_code"] == 0, r.result["stderr"]
    return json.loads(r.result["stdout"].strip().splitlines()[-1])  # type: ignore[no-any-return]


def assert_run_gone(engine: Any, run_id: str) -> None:
    assert wait_removed(30)  # removed in the background, off the caller's path
    assert engine.containers(f"toolcage.run_id={run_id}") == []
    assert engine.networks(f"toolcage.run_id={run_id}") == []


def test_allowed_request_succeeds(engine: Any, upstream: dict[str, Any], allow_api: Path) -> None:
    """http_fetch to an allowed host goes through the proxy and returns the upstream's answer."""
    with Sandbox(allow_api, egress_network=upstream["network"]) as sb:
        r = fetch(sb, "http://api.allowed.test:8080/ok")
        assert r.status == "ok", r
        assert r.result["status"] == 200 and r.result["body"] == "hello api.allowed.test:8080 /ok"
        local_redirect = fetch(sb, "http://api.allowed.test:8080/redirect-in")
        assert local_redirect.result["url"].endswith("/ok") and len(local_redirect.result["decisions"]) == 2
    assert_run_gone(engine, sb.run_id)
    assert any(d["event"] == "egress.allowed" for d in sb._run.backend._egress.decisions)


@pytest.mark.parametrize(
    ("url", "method", "reason"),
    [
        ("http://other.test:8080/", "GET", "host other.test is not in the allowlist"),
        ("http://api.allowed.test:9090/", "GET", "port 9090 is not allowed"),
        ("https://api.allowed.test:8080/", "GET", "scheme https is not allowed"),
        ("http://api.allowed.test:8080/", "DELETE", "method DELETE is not allowed"),
        ("http://169.254.169.254/latest/meta-data/", "GET", "IP address 169.254.169.254 is not in the allowlist"),
    ],
)
def test_safefetch_refuses_with_reason(
    engine: Any, upstream: dict[str, Any], allow_api: Path, url: str, method: str, reason: str
) -> None:
    """A denied host, port, scheme or method is refused by SafeFetch with the reason."""
    with Sandbox(allow_api, egress_network=upstream["network"]) as sb:
        r = fetch(sb, url, method=method)
    assert r.status == "error" and r.error is not None and r.error["code"] == -32010
    assert reason in r.error["data"]["reason"]


def test_redirect_to_denied_host_refused(engine: Any, upstream: dict[str, Any], allow_api: Path) -> None:
    """A redirect from an allowed host to a denied one is refused at the hop."""
    with Sandbox(allow_api, egress_network=upstream["network"]) as sb:
        r = fetch(sb, "http://api.allowed.test:8080/redirect-out")
    assert r.error is not None and "other.test is not in the allowlist" in r.error["data"]["reason"]


RAW = """
import json, os, socket
h, p = os.environ["TOOLCAGE_PROXY"].split(":")
def raw(req):
    s = socket.create_connection((h, int(p)), timeout=5)
    s.sendall(req)
    data = b""
    while b"\\r\\n\\r\\n" not in data:
        chunk = s.recv(4096)
        if not chunk:
            break
        data += chunk
    s.close()
    return data.split(b"\\r\\n")[0].decode()
def tunnel_get(host):
    s = socket.create_connection((h, int(p)), timeout=5)
    s.sendall(("CONNECT %s:8080 HTTP/1.1\\r\\nHost: %s:8080\\r\\n\\r\\n" % (host, host)).encode())
    first = s.recv(4096).split(b"\\r\\n")[0].decode()
    if " 200 " not in first:
        return first, ""
    s.sendall(("GET /via-tunnel HTTP/1.1\\r\\nHost: %s:8080\\r\\nConnection: close\\r\\n\\r\\n" % host).encode())
    body = b""
    while True:
        chunk = s.recv(4096)
        if not chunk:
            break
        body += chunk
    return first, body.split(b"\\r\\n\\r\\n", 1)[-1].decode()
def connect(addr, port):
    s = socket.socket(); s.settimeout(3)
    try:
        s.connect((addr, port)); return "connected"
    except OSError as e:
        return type(e).__name__ + ":" + str(e.errno)
def dns(name):
    try:
        socket.getaddrinfo(name, 80); return "resolved"
    except socket.gaierror:
        return "failed"
print(json.dumps({
    "raw_get_denied": raw(b"GET http://other.test:8080/ HTTP/1.1\\r\\nHost: other.test:8080\\r\\n\\r\\n"),
    "raw_connect_denied": raw(b"CONNECT other.test:8080 HTTP/1.1\\r\\nHost: other.test:8080\\r\\n\\r\\n"),
    "raw_get_allowed": raw(b"GET http://api.allowed.test:8080/x HTTP/1.1\\r\\nHost: api.allowed.test:8080\\r\\n\\r\\n"),
    "fronting": raw(b"GET http://api.allowed.test:8080/ HTTP/1.1\\r\\nHost: other.test:8080\\r\\n\\r\\n"),
    "tunnel_allowed": tunnel_get("api.allowed.test"),
    "direct_to_upstream": connect(UPSTREAM_IP, 8080),
    "direct_to_metadata": connect("169.254.169.254", 80),
    "direct_to_host": connect(HOST_IP, HOST_PORT),
    "dns_external": dns("exfil-probe.invalid"),
    "dns_upstream_alias": dns("api.allowed.test"),
    "interfaces": sorted(name for _, name in socket.if_nameindex()),  # the kernel's list (gVisor has no /sys/class/net)
}))
"""


def test_raw_code_cannot_bypass(engine: Any, upstream: dict[str, Any], allow_api: Path) -> None:
    """Code that skips SafeFetch gets 403 from the proxy for denied hosts, no route to anything else
    (the upstream, the metadata address, the host's own docker0 address with a listener on it), no DNS."""
    import socket

    listener = socket.socket()
    listener.bind(("0.0.0.0", 0))  # a service on the host, on every address
    listener.listen(1)
    import ipaddress

    cfg = engine.network("bridge")["IPAM"]["Config"][0]
    gateway = cfg.get("Gateway") or str(next(ipaddress.ip_network(cfg["Subnet"]).hosts()))  # docker0 on the host
    code = (
        RAW.replace("UPSTREAM_IP", repr(upstream["ip"]))
        .replace("HOST_IP", repr(gateway))
        .replace("HOST_PORT", str(listener.getsockname()[1]))
    )
    try:
        with Sandbox(allow_api, egress_network=upstream["network"]) as sb:
            out = run_probe(sb, code)
    finally:
        listener.close()
    assert out["raw_get_denied"].startswith("HTTP/1.1 403")
    assert out["raw_connect_denied"].startswith("HTTP/1.1 403")
    assert " 200 " in out["raw_get_allowed"]
    assert out["fronting"].startswith("HTTP/1.1 403") and "Host header" in out["fronting"]
    # CONNECT is a TLS tunnel: it counts as https, which this policy does not allow
    assert out["tunnel_allowed"][0].startswith("HTTP/1.1 403") and "scheme https" in out["tunnel_allowed"][0]
    # no interface but lo: every address outside the sandbox is unreachable at once (ENETUNREACH)
    unreachable = ("OSError:101", "OSError:113")  # ENETUNREACH; gVisor's netstack: EHOSTUNREACH
    assert out["direct_to_upstream"] in unreachable
    assert out["direct_to_metadata"] in unreachable
    assert out["direct_to_host"] in unreachable
    assert out["dns_external"] == "failed" and out["dns_upstream_alias"] == "failed"
    assert out["interfaces"] == ["lo"]
    assert_run_gone(engine, sb.run_id)


def test_private_address_refused_unless_opened(engine: Any, tmp_path: Path, upstream: dict[str, Any]) -> None:
    """A name that resolves to a private address is refused (by the proxy) unless its range is opened."""
    closed = policy_file(
        tmp_path,
        {"mode": "proxy", "allow": [{"host": "api.allowed.test", "schemes": ["http"], "ports": [8080]}]},
        "closed",
    )
    with Sandbox(closed, egress_network=upstream["network"]) as sb:
        r = fetch(sb, "http://api.allowed.test:8080/ok")
    assert r.error is not None and r.error["code"] == -32010
    assert "which is private" in r.error["data"]["reason"]
    wait_removed(60)  # the run's end is in the background: its proxy's last decisions are read by then
    denied = [d for d in sb._run.backend._egress.decisions if d["event"] == "egress.denied"]
    assert denied and "private" in denied[0]["reason"]


def test_mode_none_reaches_nothing(engine: Any) -> None:
    """With network mode none, http_fetch is refused and raw code has no interface but lo."""
    with Sandbox() as sb:
        r = fetch(sb, "http://api.allowed.test:8080/ok")
        ifs = sb.call("run_python", {"code": "import socket; print(sorted(n for _, n in socket.if_nameindex()))"})
    assert r.error is not None and "network.mode: none" in r.error["data"]["reason"]
    assert ifs.result["stdout"].strip() == "['lo']"


TLS_TUNNEL = """
import json, os, socket, ssl
h, p = os.environ["TOOLCAGE_PROXY"].split(":")
s = socket.create_connection((h, int(p)), timeout=5)
s.sendall(b"CONNECT api.allowed.test:8443 HTTP/1.1\\r\\nHost: api.allowed.test:8443\\r\\n\\r\\n")
head = b""
while b"\\r\\n\\r\\n" not in head:
    head += s.recv(1)
ctx = ssl.create_default_context(cadata=CA_PEM)
t = ctx.wrap_socket(s, server_hostname="api.allowed.test")
t.sendall(b"GET /via-tunnel HTTP/1.1\\r\\nHost: api.allowed.test:8443\\r\\nConnection: close\\r\\n\\r\\n")
body = b""
while True:
    chunk = t.recv(4096)
    if not chunk:
        break
    body += chunk
print(json.dumps({"t": [head.split(b"\\r\\n")[0].decode(), body.split(b"\\r\\n\\r\\n", 1)[-1].decode()]}))
"""


def test_connect_tunnel_pipes_bytes(engine: Any, tmp_path: Path, upstream: dict[str, Any]) -> None:
    """An allowed CONNECT whose ClientHello names the CONNECT host opens a tunnel that relays TLS both ways."""
    tls_ok = policy_file(
        tmp_path,
        {
            "mode": "proxy",
            "allow": [{"host": "api.allowed.test", "schemes": ["https"], "ports": [8443]}],
            "allow_private_cidrs": [upstream["subnet"]],
        },
        "tunnel",
    )
    code = TLS_TUNNEL.replace("CA_PEM", repr(Path(upstream["ca_file"]).read_text()))
    with Sandbox(tls_ok, egress_network=upstream["network"]) as sb:
        out = run_probe(sb, code)
    first, body = out["t"]
    assert first.startswith("HTTP/1.1 200") and body == "hello api.allowed.test:8443 /via-tunnel"
    wait_removed(60)  # the run's end is in the background: its proxy's last decisions are read by then
    allowed = [d for d in sb._run.backend._egress.decisions if d["event"] == "egress.allowed"]
    assert allowed and allowed[0]["sni"] == "api.allowed.test"


def test_https_verified_against_original_name(engine: Any, tmp_path: Path, upstream: dict[str, Any]) -> None:
    """HTTPS through the proxy's CONNECT tunnel verifies the certificate against the URL's name."""
    pol = policy_file(
        tmp_path,
        {
            "mode": "proxy",
            "allow": [{"host": "*.allowed.test", "ports": [8443]}],
            "allow_private_cidrs": [upstream["subnet"]],
        },
        "https",
    )
    with Sandbox(pol, egress_network=upstream["network"], ca_file=upstream["ca_file"]) as sb:
        ok = fetch(sb, "https://api.allowed.test:8443/secure")
        wrong = fetch(sb, "https://wrong.allowed.test:8443/secure")
    assert ok.status == "ok" and ok.result["body"] == "hello api.allowed.test:8443 /secure", ok
    assert wrong.error is not None and wrong.error["code"] == -32011
    assert "CERTIFICATE_VERIFY_FAILED" in wrong.error["message"] or "certificate" in wrong.error["message"].lower()


def test_upstream_proxy_gets_checked_address(engine: Any, upstream: dict[str, Any], allow_api: Path) -> None:
    """With --egress-proxy, allowed traffic goes through the operator's proxy, pinned to the checked address."""
    with Sandbox(allow_api, egress_network=upstream["network"], egress_proxy="http://corp-proxy:3128") as sb:
        r = fetch(sb, "http://api.allowed.test:8080/via-corp")
        denied = fetch(sb, "http://other.test:8080/")
    assert r.status == "ok" and r.result["body"] == "hello api.allowed.test:8080 /via-corp"
    assert denied.error is not None and denied.error["code"] == -32010
    seen = engine.logs(upstream["corp_proxy"])
    assert f"corp-proxy saw: CONNECT {upstream['ip']}:8080" in seen
    assert "other.test" not in seen


FLOOD = """
import json, os, socket
h, p = os.environ["TOOLCAGE_PROXY"].split(":")
def raw(req):
    s = socket.create_connection((h, int(p)), timeout=10)
    s.sendall(req)
    data = b""
    while True:
        chunk = s.recv(65536)
        if not chunk:
            break
        data += chunk
    s.close()
    return data.split(b"\\r\\n")[0].decode()
pad = "a" * 60000
denied = [raw(("GET http://other.test:8080/%d-%s HTTP/1.1\\r\\nHost: other.test:8080\\r\\n\\r\\n" % (i, pad)).encode())
          for i in range(40)]
ok = raw(b"GET http://api.allowed.test:8080/carry-out?data=s3cr3t HTTP/1.1\\r\\n"
         b"Host: api.allowed.test:8080\\r\\n\\r\\n")
print(json.dumps({"denied": sorted(set(d[:12] for d in denied)), "ok": ok}))
"""


def _proxy_decisions(path: Path, run_id: str) -> list[dict[str, Any]]:
    from toolcage.lifecycle import audit

    return [r for r in audit.read(path) if r.get("event") == "egress.decision" and r.get("run_id") == run_id]


def test_flood_of_denied_requests_cannot_hide_the_allowed_one(
    engine: Any, upstream: dict[str, Any], allow_api: Path, tmp_path: Path
) -> None:
    """40 denied requests with 60 KB targets, then one allowed: all 41 are in the audit log (long targets
    cut with a marker), the allowed one with its target, and the chain verifies."""
    from toolcage.lifecycle import audit

    log = tmp_path / "audit.jsonl"
    with Sandbox(allow_api, egress_network=upstream["network"], audit=log) as sb:
        out = run_probe(sb, FLOOD)
    assert out["denied"] == ["HTTP/1.1 403"] and " 200 " in out["ok"]
    recs = [r for r in _proxy_decisions(log, sb.run_id) if r["source"] == "proxy"]
    allowed = [r for r in recs if r["allowed"]]
    denied = [r for r in recs if not r["allowed"]]
    assert [r["target"] for r in allowed] == ["http://api.allowed.test:8080/carry-out?data=s3cr3t"]
    assert len(denied) == 40
    assert all(len(r["target"]) < 600 and "truncated" in r["target"] for r in denied)
    assert all("other.test is not in the allowlist" in r["reason"] for r in denied)
    assert audit.verify(log) == []


def test_decisions_are_on_disk_while_the_run_is_live(
    engine: Any, upstream: dict[str, Any], allow_api: Path, tmp_path: Path
) -> None:
    """A proxy decision is in the audit file before the run ends (so a runner killed later keeps it)."""
    import time

    log = tmp_path / "audit.jsonl"
    with Sandbox(allow_api, egress_network=upstream["network"], audit=log) as sb:
        r = sb.call(
            "run_python",
            {
                "code": textwrap.dedent(
                    """
                    import os, socket
                    h, p = os.environ["TOOLCAGE_PROXY"].split(":")
                    s = socket.create_connection((h, int(p)), timeout=5)
                    s.sendall(b"GET http://api.allowed.test:8080/live HTTP/1.1\\r\\n"
                              b"Host: api.allowed.test:8080\\r\\n\\r\\n")
                    print(s.recv(100).split(b"\\r\\n")[0].decode())
                    """
                ),
                "timeout_s": 20,
            },
        )
        assert " 200 " in r.result["stdout"], r.result
        deadline = time.monotonic() + 3
        live: list[dict[str, Any]] = []
        while time.monotonic() < deadline and not live:
            live = [d for d in _proxy_decisions(log, sb.run_id) if d["source"] == "proxy"] if log.exists() else []
            time.sleep(0.05)
        assert [d["target"] for d in live] == ["http://api.allowed.test:8080/live"] and live[0]["allowed"]


KILLED_RUNNER = """
import json, sys, time
from toolcage import Sandbox
policy, net, log = sys.argv[1:4]
code = '''
import os, socket
h, p = os.environ["TOOLCAGE_PROXY"].split(":")
s = socket.create_connection((h, int(p)), timeout=5)
s.sendall(b"GET http://api.allowed.test:8080/before-kill HTTP/1.1\\\\r\\\\n"
          b"Host: api.allowed.test:8080\\\\r\\\\n\\\\r\\\\n")
print(s.recv(100).split(b"\\\\r\\\\n")[0].decode())
'''
sb = Sandbox(policy, egress_network=net, audit=log).start()
r = sb.call("run_python", {"code": code, "timeout_s": 20})
time.sleep(0.2)  # the audit writer's batch window (20 ms), with room to spare
print(json.dumps({"run_id": sb.run_id, "stdout": r.result["stdout"]}), flush=True)
time.sleep(120)
"""


def test_decisions_survive_a_sigkilled_runner(
    engine: Any, upstream: dict[str, Any], allow_api: Path, tmp_path: Path
) -> None:
    """A runner SIGKILLed mid-run leaves the proxy's decisions so far in the audit log, and the chain verifies."""
    import os
    import signal
    import subprocess
    import sys

    from toolcage.lifecycle import audit

    log = tmp_path / "audit.jsonl"
    proc = subprocess.Popen(
        [sys.executable, "-c", KILLED_RUNNER, str(allow_api), upstream["network"], str(log)],
        stdout=subprocess.PIPE,
        text=True,
    )
    run_id = None
    try:
        assert proc.stdout is not None
        out = json.loads(proc.stdout.readline())
        run_id = out["run_id"]
        assert " 200 " in out["stdout"]
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
        recs = [r for r in _proxy_decisions(log, run_id) if r["source"] == "proxy"]
        assert [r["target"] for r in recs] == ["http://api.allowed.test:8080/before-kill"] and recs[0]["allowed"]
        assert audit.verify(log) == []
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        if proc.stdout is not None:
            proc.stdout.close()
        if run_id is not None:  # the killed runner's sandbox and proxy are orphans: remove them here
            for c in engine.containers(f"toolcage.run_id={run_id}"):
                engine.remove(c["Id"])
            for v in engine.volumes(f"toolcage.run_id={run_id}"):
                engine.remove_volume(v["Name"])


def test_the_first_answer_does_not_wait_for_the_proxy_and_an_early_connection_is_held(
    engine: Any, upstream: dict[str, Any], allow_api: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 27: a cold run's first answer comes before its egress proxy listens (the proxy starts beside the
    sandbox), and a connection tool code makes at once is held by the worker's relay until the proxy listens,
    then goes through it: decided and audited like any other. (The proxy is made two seconds slower here, so
    that the connection surely comes first.)"""
    from toolcage.backends import egress as egress_mod

    made = egress_mod.proxy_container_config

    def slow(*a: Any, **kw: Any) -> dict[str, Any]:
        cfg = made(*a, **kw)
        cfg["Entrypoint"] = ["sh", "-c", "sleep 2 && exec " + " ".join(cfg["Entrypoint"])]
        return cfg  # type: ignore[no-any-return]

    monkeypatch.setattr(egress_mod, "proxy_container_config", slow)
    audit = allow_api.parent / "audit.jsonl"
    with Sandbox(allow_api, egress_network=upstream["network"], audit=audit) as sb:
        first = sb.call("ping")
        proxy_up = sb._run.backend._egress._ready.is_set()  # its proxy.listening line was read
        r = fetch(sb, "http://api.allowed.test:8080/early")
        assert first.result == "pong" and r.status == "ok", r
        assert r.result["body"] == "hello api.allowed.test:8080 /early"
    assert_run_gone(engine, sb.run_id)
    assert not proxy_up, "the first answer waited for the proxy: this test no longer shows the early connection"
    allowed = [
        json.loads(line) for line in audit.read_text().splitlines() if '"egress.decision"' in line and "/early" in line
    ]
    assert allowed and all(rec["allowed"] is True for rec in allowed), allowed


def test_the_sandbox_starts_before_its_egress_network_and_a_network_that_fails_ends_the_run(
    engine: Any, allow_api: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sandbox has no network, only the proxy's socket volume: it starts once the volume exists, while the
    egress network (only the proxy joins it, and it is the slow one) is made on a thread of its own. When that
    creation fails, the run ends with why (the proxy never starts), and nothing it made is left."""
    import threading

    from toolcage.engine.docker_adapter import Engine
    from toolcage.errors import SandboxError

    made = Engine.create_network
    started = threading.Event()
    release = threading.Event()

    def slow_then_fail(self: Any, *a: Any, **kw: Any) -> Any:
        started.set()
        release.wait(30)  # the sandbox answers while its network is still being made
        raise RuntimeError("network-boom: the address pools are full")

    monkeypatch.setattr(Engine, "create_network", slow_then_fail)
    sb = Sandbox(allow_api)  # no egress_network: the run makes its own
    with sb, pytest.raises(SandboxError, match=r"egress proxy did not start.*network-boom"):
        assert sb.call("ping").result == "pong"  # the network is not made yet
        assert started.is_set()
        release.set()
        for _ in range(100):  # the launch's failure ends the run while these are made
            sb.call("run_python", {"code": "import time; time.sleep(0.05)"})
    monkeypatch.setattr(Engine, "create_network", made)
    assert_run_gone(engine, sb.run_id)
    assert engine.volumes(f"toolcage.run_id={sb.run_id}") == []


def test_a_proxy_that_never_comes_up_ends_the_run_with_why(
    engine: Any, upstream: dict[str, Any], allow_api: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The proxy starts after the run's first answer could come: when it dies instead of listening, the run
    ends with the proxy's own words (the call waiting is answered with it, and every later one), and the
    sandbox, the proxy, the network and the volume are removed."""
    from toolcage.backends import egress as egress_mod
    from toolcage.errors import SandboxError

    made = egress_mod.proxy_container_config

    def dying(*a: Any, **kw: Any) -> dict[str, Any]:
        cfg = made(*a, **kw)
        cfg["Entrypoint"] = ["python3", "-c", "import sys; sys.exit('proxy-boom: no policy for me')"]
        return cfg  # type: ignore[no-any-return]

    monkeypatch.setattr(egress_mod, "proxy_container_config", dying)
    sb = Sandbox(allow_api, egress_network=upstream["network"])
    with sb, pytest.raises(SandboxError, match=r"egress proxy did not start.*proxy-boom"):
        for _ in range(100):  # the proxy's end comes while these calls are made
            sb.call("run_python", {"code": "import time; time.sleep(0.05)"})
    assert_run_gone(engine, sb.run_id)
    assert engine.volumes(f"toolcage.run_id={sb.run_id}") == []
