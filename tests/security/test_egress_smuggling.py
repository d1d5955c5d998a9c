"""Request smuggling through the egress proxy: a table of named raw-byte attacks, on the real engine.

Each case is sent as raw bytes from inside a sandbox (a socket to the worker's relay,
127.0.0.1:3128) through the run's egress proxy to a stock ``http.server`` upstream that
keeps connections open whatever ``Connection`` says and records every request it parses.
Each case asserts the proxy's answer (status and reason) and what the upstream received:
a smuggled ``DELETE`` or a request for ``other.test`` must never reach it. The upstream
is a container of this test on an internal network the test creates; nothing leaves the
machine.
"""

from __future__ import annotations

import json
import os
import secrets
import textwrap
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from toolcage import DEFAULT_IMAGE, Sandbox, wait_removed

# The upstream: ignores "Connection: close" (so a pipelined or smuggled second request on the
# same connection is executed), reads bodies by Content-Length only (like many back ends), and
# logs one JSON line per request it parses, and the SNI of every TLS handshake.
UPSTREAM = r"""
import http.server, json, os, ssl, sys, threading
def out(**kw):
    sys.stdout.write(json.dumps(kw) + "\n"); sys.stdout.flush()
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def parse_request(self):
        ok = super().parse_request()
        self.close_connection = False  # threat model: a back end that ignores Connection: close
        return ok
    def _any(self):
        n = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(n) if n else b""
        out(saw=self.command, path=self.path, host=self.headers.get("Host"), body=body.decode("latin-1"))
        reply = ("seen %s %s" % (self.command, self.path)).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)
    do_GET = do_POST = do_DELETE = do_PUT = _any
    def log_message(self, *a):
        pass
open("/tmp/cert.pem", "w").write(os.environ["TLS_CERT"])
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
ctx.load_cert_chain("/tmp/cert.pem")
ctx.sni_callback = lambda sock, name, c: out(sni=name)
tls = http.server.ThreadingHTTPServer(("0.0.0.0", 8443), H)
tls.socket = ctx.wrap_socket(tls.socket, server_side=True)
threading.Thread(target=tls.serve_forever, daemon=True).start()
plain = http.server.ThreadingHTTPServer(("0.0.0.0", 8080), H)
print("listening", flush=True)  # both bound: the fixture starts the sandbox only now
plain.serve_forever()
"""

A = "api.allowed.test:8080"
T = "api.allowed.test:8443"


@dataclass(frozen=True)
class Case:
    name: str
    kind: str  # "raw": send bytes; "tls": CONNECT then a TLS handshake with `sni`
    data: bytes = b""
    status: int = 400
    reason: str = ""  # must appear in the status line or X-Toolcage-Denied
    marker: str = ""  # a path marker the upstream must (status 200) or must not have seen
    sni: str | None = None
    connect: str = T


def _get(path: str, extra: str = "", host: str = A, ends: str = "\r\n") -> bytes:
    head = f"GET http://{A}/{path} HTTP/1.1{ends}Host: {host}{ends}{extra}{ends}"
    return head.encode("latin-1")


CASES = [
    Case("plain_ok", "raw", _get("ok-plain"), 200, marker="ok-plain"),
    Case(
        "body_content_length_ok",
        "raw",
        _get("ok-body", "Content-Length: 3\r\n") + b"abc",
        200,
        marker="ok-body",
    ),
    Case(
        "bare_lf_smuggles_delete",
        "raw",
        _get("lf", "X-A: a\n\nDELETE /admin-lf HTTP/1.1\nHost: other.test\r\n"),
        400,
        "bare LF",
        "admin-lf",
    ),
    Case("bare_lf_everywhere", "raw", _get("lf2", ends="\n"), 400, "bare LF", "lf2"),
    Case("x_a_lf_host", "raw", _get("xalf", "X-A: a\nHost: other.test\r\n"), 400, "bare LF", "xalf"),
    Case("bare_cr", "raw", _get("cr", "X-A: a\rHost: other.test\r\n"), 400, "bare CR", "cr"),
    Case(
        "cl_te",
        "raw",
        _get("clte", "Content-Length: 5\r\nTransfer-Encoding: chunked\r\n")
        + b"0\r\n\r\nDELETE /admin-clte HTTP/1.1\r\nHost: other.test\r\n\r\n",
        400,
        "Content-Length and Transfer-Encoding",
        "admin-clte",
    ),
    Case(
        "te_cl",
        "raw",
        _get("tecl", "Transfer-Encoding: chunked\r\nContent-Length: 4\r\n")
        + b"4b\r\nDELETE /admin-tecl HTTP/1.1\r\nHost: other.test\r\nContent-Length: 10\r\n\r\n0\r\n\r\n\r\n0\r\n\r\n",
        400,
        "Content-Length and Transfer-Encoding",
        "admin-tecl",
    ),
    Case(
        "te_obs_fold",
        "raw",
        _get("tefold", "Content-Length: 5\r\nTransfer-Encoding:\r\n chunked\r\n")
        + b"0\r\n\r\nDELETE /admin-tefold HTTP/1.1\r\nHost: other.test\r\n\r\n",
        400,
        "obs-fold",
        "admin-tefold",
    ),
    Case(
        "te_chunked_identity",
        "raw",
        _get("teci", "Transfer-Encoding: chunked, identity\r\n") + b"0\r\n\r\n",
        400,
        "Transfer-Encoding",
        "teci",
    ),
    Case(
        "te_space_before_colon",
        "raw",
        _get("tesp", "Content-Length: 5\r\nTransfer-Encoding : chunked\r\n")
        + b"0\r\n\r\nDELETE /admin-tesp HTTP/1.1\r\nHost: other.test\r\n\r\n",
        400,
        "header name",
        "admin-tesp",
    ),
    Case("host_space_before_colon", "raw", _get("hsp", "Host : other.test\r\n"), 400, "header name", "hsp"),
    Case(
        "pipelined_second_request",
        "raw",
        _get("pipe1") + f"DELETE http://{A}/admin-pipe HTTP/1.1\r\nHost: other.test\r\n\r\n".encode(),
        200,
        marker="pipe1",
    ),
    Case("absolute_form_host_mismatch", "raw", _get("mismatch", host="other.test"), 403, "Host header", "mismatch"),
    Case("duplicate_host", "raw", _get("duphost", "Host: other.test\r\n"), 400, "Host", "duphost"),
    Case("missing_host", "raw", f"GET http://{A}/nohost HTTP/1.1\r\n\r\n".encode(), 400, "Host", "nohost"),
    Case("connect_sni_ok", "tls", status=200, marker="ok-tls", sni="api.allowed.test"),
    Case("connect_sni_mismatch", "tls", status=200, reason="closed", marker="sni-other", sni="other.test"),
    Case("connect_no_sni_to_name", "tls", status=200, reason="closed", marker="sni-none", sni=""),
    Case(
        "connect_not_tls",
        "raw",
        f"CONNECT {A} HTTP/1.1\r\nHost: {A}\r\n\r\nGET /admin-nottls HTTP/1.1\r\nHost: other.test\r\n\r\n".encode(),
        200,
        "closed",
        "admin-nottls",
    ),
    Case(
        "connect_host_header_mismatch",
        "raw",
        f"CONNECT {T} HTTP/1.1\r\nHost: other.test:8443\r\n\r\n".encode(),
        403,
        "Host header",
    ),
]

PROBE = r"""
import json, os, socket, ssl
h, p = os.environ["TOOLCAGE_PROXY"].split(":")
def recv_all(s):
    data = b""
    try:
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
    except OSError:
        pass
    return data
def summary(data, closed):
    head = data.split(b"\r\n\r\n", 1)[0].decode("latin-1")
    lines = head.split("\r\n")
    denied = [l.split(":", 1)[1].strip() for l in lines[1:] if l.lower().startswith("x-toolcage-denied:")]
    return {"status_line": lines[0], "denied": denied[0] if denied else "", "responses": data.count(b"HTTP/1."),
            "body": data.split(b"\r\n\r\n", 1)[-1].decode("latin-1")[:200], "closed": closed}
def raw(data):
    s = socket.create_connection((h, int(p)), timeout=4)
    s.sendall(data)
    out = recv_all(s)
    s.close()
    r = summary(out, True)
    if r["status_line"].split(" ")[1:2] == ["200"] and data.startswith(b"CONNECT"):
        # the tunnel is open: did anything come back for the bytes we sent into it?
        r["closed"] = out.split(b"\r\n\r\n", 1)[-1] == b""
    return r
def tls(connect, sni, marker):
    s = socket.create_connection((h, int(p)), timeout=4)
    s.sendall(("CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n" % (connect, connect)).encode())
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = s.recv(1)
        if not chunk:
            break
        head += chunk
    r = summary(head, False)
    if " 200 " not in r["status_line"]:
        return r
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    try:
        t = ctx.wrap_socket(s, server_hostname=sni or None)
        t.sendall(("GET /%s HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n" % (marker, sni or "x")).encode())
        r["body"] = recv_all(t).split(b"\r\n\r\n", 1)[-1].decode("latin-1")
    except (OSError, ssl.SSLError) as e:
        r["closed"] = True
        r["error"] = type(e).__name__
    return r
CASES = json.loads(CASES_JSON)
res = {}
for c in CASES:
    if c["kind"] == "tls":
        res[c["name"]] = tls(c["connect"], c["sni"], c["marker"])
    else:
        res[c["name"]] = raw(c["data"].encode("latin-1"))
print(json.dumps(res))
"""


@pytest.fixture(scope="module")
def outcome(engine: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """Run every case through one sandbox and collect the proxy's answers and the upstream's log."""
    import trustme

    ca = trustme.CA()
    cert = ca.issue_cert("api.allowed.test")
    pem = cert.private_key_pem.bytes().decode() + "".join(b.bytes().decode() for b in cert.cert_chain_pems)
    tag = secrets.token_hex(3)
    net = f"toolcage-test-smuggle-{tag}"
    labels = {"toolcage.test": tag}
    engine.create_network(net, internal=True, labels=labels)
    cid = None
    try:
        cid = engine.create(
            {
                "Image": os.environ.get("TOOLCAGE_IMAGE", DEFAULT_IMAGE),
                "Entrypoint": ["python3", "-c", UPSTREAM],
                "User": "65532:65532",
                "Labels": labels,
                "Env": [f"TLS_CERT={pem}"],
                "HostConfig": {
                    "NetworkMode": net,
                    "ReadonlyRootfs": True,
                    "CapDrop": ["ALL"],
                    "Memory": 128 << 20,
                    "PidsLimit": 64,
                    "SecurityOpt": ["no-new-privileges"],
                    "Tmpfs": {"/tmp": "size=1m"},
                    # explicit: Podman's default nofile and nproc are ones runc cannot set with every capability dropped
                    "Ulimits": [
                        {"Name": "nofile", "Soft": 1024, "Hard": 1024},
                        {"Name": "nproc", "Soft": 4096, "Hard": 4096},
                    ],
                },
                "NetworkingConfig": {"EndpointsConfig": {net: {"Aliases": ["api.allowed.test", "other.test"]}}},
            },
            f"toolcage-test-smuggle-upstream-{tag}",
        )
        engine.start(cid)
        subnet = engine.network(net)["IPAM"]["Config"][0]["Subnet"]
        # not a fixed sleep: a sandbox now answers (and its proxy connects) before a cold upstream listens
        deadline = time.monotonic() + 60
        while "listening" not in engine.logs(cid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert "listening" in engine.logs(cid), engine.logs(cid)[-2000:]
        pol = tmp_path_factory.mktemp("pol") / "smuggle.yaml"
        pol.write_text(
            yaml.safe_dump(
                {
                    "name": "smuggle",
                    "network": {
                        "mode": "proxy",
                        "allow": [
                            {
                                "host": "api.allowed.test",
                                "schemes": ["http", "https"],
                                "ports": [8080, 8443],
                                "methods": ["GET"],
                            }
                        ],
                        "allow_private_cidrs": [subnet],
                    },
                    "timeouts": {"call_s": 170, "run_s": 200},
                }
            )
        )
        cases = [
            {"name": c.name, "kind": c.kind, "data": c.data.decode("latin-1"), "sni": c.sni, "connect": c.connect}
            | {"marker": c.marker}
            for c in CASES
        ]
        code = PROBE.replace("CASES_JSON", repr(json.dumps(cases)))
        with Sandbox(Path(pol), egress_network=net) as sb:
            r = sb.call("run_python", {"code": textwrap.dedent(code), "timeout_s": 160})
            assert r.result["exit_code"] == 0, r.result["stderr"]
            answers = json.loads(r.result["stdout"].strip().splitlines()[-1])
        time.sleep(0.3)
        seen = [json.loads(ln) for ln in engine.logs(cid).splitlines() if ln.startswith("{")]
        result = {"answers": answers, "seen": seen, "decisions": list(sb._run.backend._egress.decisions)}
        if os.environ.get("TOOLCAGE_SMUGGLE_DUMP"):  # for a human comparing before/after a change
            Path(os.environ["TOOLCAGE_SMUGGLE_DUMP"]).write_text(json.dumps(result, indent=1))
        yield result
    finally:
        if cid is not None:
            engine.remove(cid)
        wait_removed(60)  # the runs that used it are removed in the background
        engine.remove_network(net)


def _upstream_saw(seen: list[dict[str, Any]], marker: str) -> list[dict[str, Any]]:
    return [s for s in seen if marker and (marker in str(s.get("path")) or marker in str(s.get("body")))]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_smuggling_case(outcome: dict[str, Any], case: Case) -> None:
    """The proxy answers each case as the table says, and the upstream never sees a smuggled request."""
    got = outcome["answers"][case.name]
    seen = outcome["seen"]
    assert got["status_line"].split(" ")[1:2] == [str(case.status)], got
    if case.status == 200 and not case.reason:
        # allowed: exactly one request reached the upstream, with the right Host
        hits = _upstream_saw(seen, case.marker)
        assert len(hits) == 1 and hits[0]["saw"] == "GET" and hits[0]["host"].startswith("api.allowed.test"), hits
        assert got["responses"] == 1 or case.kind == "tls", got
    elif case.reason == "closed":
        # an allowed tunnel whose first bytes are not a TLS ClientHello naming the CONNECT host: closed
        assert got["closed"] and "seen" not in got["body"], got
        assert not _upstream_saw(seen, case.marker), seen
    else:
        assert case.reason in got["status_line"] + got["denied"], got
        assert not _upstream_saw(seen, case.marker), seen


def test_upstream_never_sees_a_smuggled_request(outcome: dict[str, Any]) -> None:
    """Whatever the case, no DELETE and no request for other.test ever reaches the upstream."""
    seen = outcome["seen"]
    assert not [s for s in seen if s.get("saw") == "DELETE" or s.get("host") == "other.test"], seen


def test_no_upstream_tls_handshake_names_another_host(outcome: dict[str, Any]) -> None:
    """Only the CONNECT host's name reaches the upstream as SNI; a mismatching SNI never leaves the proxy."""
    snis = [s["sni"] for s in outcome["seen"] if "sni" in s]
    assert snis == ["api.allowed.test"], snis


def test_tunnel_refusals_are_logged_with_reason(outcome: dict[str, Any]) -> None:
    """A CONNECT refused for its SNI or for non-TLS bytes is an egress.denied decision with the reason."""
    denied = [d for d in outcome["decisions"] if d.get("event") == "egress.denied"]
    reasons = " | ".join(str(d.get("reason")) for d in denied)
    assert "SNI other.test differs from the CONNECT host" in reasons, reasons
    assert "not a TLS ClientHello" in reasons, reasons
    assert "no SNI" in reasons, reasons
