"""SafeFetch without a proxy (as with --sandbox none), against HTTP servers on loopback only."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from toolcage.policies import validate_policy
from toolcage.worker.egress.safefetch import EgressDenied, FetchFailed, SafeFetch


class Handler(http.server.BaseHTTPRequestHandler):
    def _send(self, code: int, body: bytes, headers: tuple[tuple[str, str], ...] = ()) -> None:
        self.send_response(code)
        for k, v in headers:
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        port = self.server.server_address[1]
        routes: dict[str, tuple[int, bytes, tuple[tuple[str, str], ...]]] = {
            "/redirect-out": (302, b"", (("Location", f"http://other.local.test:{port}/"),)),
            "/redirect-in": (301, b"", (("Location", "/ok"),)),
            "/loop": (302, b"", (("Location", "/loop"),)),
            "/big": (200, b"x" * 10_000, ()),
            "/see-other": (303, b"", (("Location", "/ok"),)),
        }
        code, body, headers = routes.get(
            self.path, (200, f"{self.command} {self.path} {self.headers['Host']}".encode(), ())
        )
        self._send(code, body, headers)

    do_POST = do_GET

    def log_message(self, *a: Any) -> None:
        pass


@pytest.fixture(scope="module")
def server() -> Iterator[int]:
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield srv.server_address[1]
    srv.shutdown()
    srv.server_close()


def resolver(host: str) -> list[str]:
    return {"api.local.test": ["127.0.0.1"], "other.local.test": ["127.0.0.1"]}[host]


def client(port: int, open_loopback: bool = True, **kw: Any) -> SafeFetch:
    policy = validate_policy(
        {
            "network": {
                "mode": "proxy",
                "allow": [{"host": "api.local.test", "schemes": ["http"], "ports": [port], "methods": ["GET", "POST"]}],
                "allow_private_cidrs": ["127.0.0.0/8"] if open_loopback else [],
            }
        }
    )
    return SafeFetch(policy, resolver=resolver, **kw)


def test_allowed_fetch_connects_to_checked_address(server: int) -> None:
    """An allowed request is sent to the checked address with the original Host."""
    r = client(server).fetch(f"http://api.local.test:{server}/hello")
    assert r.status == 200 and r.body.decode() == f"GET /hello api.local.test:{server}"
    assert r.decisions[0]["addresses"] == ["127.0.0.1"]


def test_redirect_rechecked_each_hop(server: int) -> None:
    """A same-host redirect is followed (new decision); one to a denied host is refused."""
    r = client(server).fetch(f"http://api.local.test:{server}/redirect-in")
    assert r.url.endswith("/ok") and len(r.decisions) == 2
    with pytest.raises(EgressDenied, match=r"other\.local\.test is not in the allowlist"):
        client(server).fetch(f"http://api.local.test:{server}/redirect-out")


def test_redirect_limit(server: int) -> None:
    """A redirect loop ends after the hop limit."""
    with pytest.raises(FetchFailed, match="redirects"):
        client(server).fetch(f"http://api.local.test:{server}/loop")


def test_303_turns_post_into_get(server: int) -> None:
    """303 See Other re-requests with GET and no body."""
    r = client(server).fetch(f"http://api.local.test:{server}/see-other", "POST", body=b"data")
    assert r.body.decode().startswith("GET /ok")


def test_body_cap(server: int) -> None:
    """Response bodies are capped and marked truncated."""
    r = client(server, max_bytes=1024).fetch(f"http://api.local.test:{server}/big")
    assert len(r.body) == 1024 and r.truncated


def test_private_address_needs_open_range(server: int) -> None:
    """Without allow_private_cidrs the loopback answer is refused."""
    with pytest.raises(EgressDenied, match="which is loopback"):
        client(server, open_loopback=False).fetch(f"http://api.local.test:{server}/")


def test_host_header_cannot_be_set(server: int) -> None:
    """Callers cannot set Host (domain fronting) or proxy headers."""
    with pytest.raises(EgressDenied, match="headers not allowed: Host"):
        client(server).fetch(f"http://api.local.test:{server}/", headers={"Host": "other.local.test"})


def test_env_proxies_ignored(server: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """HTTP_PROXY in the environment does not steer SafeFetch."""
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")
    monkeypatch.setenv("http_proxy", "http://127.0.0.1:9")
    assert client(server).fetch(f"http://api.local.test:{server}/x").status == 200


def test_bad_certificate_is_fetch_failed(server: int) -> None:
    """Direct mode: TLS to a server that does not speak it, or with an untrusted certificate, is a FetchFailed."""
    policy = validate_policy(
        {
            "network": {
                "mode": "proxy",
                "allow": [{"host": "api.local.test", "ports": [server]}],
                "allow_private_cidrs": ["127.0.0.0/8"],
            }
        }
    )
    with pytest.raises(FetchFailed, match="failed"):
        SafeFetch(policy, resolver=resolver).fetch(f"https://api.local.test:{server}/")


# --- credentials across origins (issue 7, attack 8): two TLS servers and a plain one on loopback ---


class Recorder(http.server.BaseHTTPRequestHandler):
    """Records the headers it received; /go?to=URL redirects there (302)."""

    seen: list[dict[str, str]]

    def do_GET(self) -> None:
        type(self).seen.append({k.lower(): v for k, v in self.headers.items()})
        if self.path.startswith("/go?to="):
            self.send_response(302)
            self.send_header("Location", self.path[len("/go?to=") :])
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        body = b"landed"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *a: Any) -> None:
        pass


@pytest.fixture(scope="module")
def origins(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """https on two ports and http on a third, all for api.local.test, with a trustme CA."""
    import ssl

    import trustme

    ca = trustme.CA()
    cert = ca.issue_cert("api.local.test")
    ca_file = tmp_path_factory.mktemp("ca") / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    servers: dict[str, Any] = {}
    for name, tls in (("a", True), ("b", True), ("plain", False)):
        handler = type(f"Rec_{name}", (Recorder,), {"seen": []})
        srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        if tls:
            ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            cert.configure_cert(ctx)
            srv.socket = ctx.wrap_socket(srv.socket, server_side=True)
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        servers[name] = (srv, handler)
    ports = {n: s.server_address[1] for n, (s, _) in servers.items()}
    policy = validate_policy(
        {
            "network": {
                "mode": "proxy",
                "allow": [{"host": "api.local.test", "schemes": ["https", "http"], "ports": list(ports.values())}],
                "allow_private_cidrs": ["127.0.0.0/8"],
            }
        }
    )
    yield {
        "ports": ports,
        "seen": {n: h.seen for n, (_, h) in servers.items()},
        "client": SafeFetch(policy, resolver=resolver, ca_file=str(ca_file)),
    }
    for srv, _ in servers.values():
        srv.shutdown()
        srv.server_close()


CREDS = {"Authorization": "Bearer s3cret", "Cookie": "session=s3cret"}


def test_credentials_dropped_when_port_changes(origins: dict[str, Any]) -> None:
    """A redirect from https://api:A to https://api:B (same host, other port) arrives without
    Authorization or Cookie: another port is another origin (before the fix B received both)."""
    a, b = origins["ports"]["a"], origins["ports"]["b"]
    origins["seen"]["b"].clear()
    r = origins["client"].fetch(f"https://api.local.test:{a}/go?to=https://api.local.test:{b}/land", headers=CREDS)
    assert r.status == 200 and r.body == b"landed"
    (got,) = origins["seen"]["b"]
    assert "authorization" not in got and "cookie" not in got, got


def test_credentials_kept_on_same_origin_redirect(origins: dict[str, Any]) -> None:
    """A redirect within one origin (scheme, host and port unchanged) keeps the credentials."""
    a = origins["ports"]["a"]
    origins["seen"]["a"].clear()
    r = origins["client"].fetch(f"https://api.local.test:{a}/go?to=/land", headers=CREDS)
    assert r.status == 200
    assert origins["seen"]["a"][-1]["authorization"] == "Bearer s3cret"
    assert origins["seen"]["a"][-1]["cookie"] == "session=s3cret"


def test_https_to_http_redirect_refused(origins: dict[str, Any]) -> None:
    """A redirect from https to http is refused (EgressDenied, reason says downgrade) and the plain
    server receives nothing (before the fix it was followed, with the credentials)."""
    a, plain = origins["ports"]["a"], origins["ports"]["plain"]
    origins["seen"]["plain"].clear()
    with pytest.raises(EgressDenied, match="https to http") as info:
        origins["client"].fetch(f"https://api.local.test:{a}/go?to=http://api.local.test:{plain}/", headers=CREDS)
    assert "downgrade" in info.value.data["reason"]
    assert origins["seen"]["plain"] == []
