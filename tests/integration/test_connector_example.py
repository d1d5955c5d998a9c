"""examples/connectors (github.py + github.yaml) against a fake GitHub, on the real engine: the token
reaches api.github.com in one header, and nothing else ever holds it.

Two upstream containers of this test (from the worker image, non-root, on an internal
network the test creates) answer HTTPS on port 443 with certificates from a trustme CA:
``api.github.com`` (issues, a repo, an endpoint echoing the request's headers, redirects)
and ``echo.test`` (echoes the request's headers), each printing every request it gets as
a JSON line on its stdout, which the test reads back with ``docker logs``. Nothing here
reaches beyond the machine. Everything is labelled and removed afterwards.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote

import pytest
import yaml

from tests.helpers import run_cli, start_upstream
from toolcage import Sandbox, wait_removed
from toolcage.lifecycle import audit

pytestmark = pytest.mark.usefixtures("no_leaks")

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "connectors"
SECRET_MARK = "[secret GITHUB_TOKEN]"

UPSTREAM = r"""
import http.server, json, os, ssl, sys
from urllib.parse import quote
ROLE = os.environ["ROLE"]
ISSUES = [
    {"number": 3, "title": "Crash on empty input", "state": "open"},
    {"number": 2, "title": "Add a --json flag", "state": "open", "pull_request": {"url": "x"}},
    {"number": 1, "title": "Docs: typo in README", "state": "open"},
]
REPO = {"full_name": "octo/hello", "description": "Hello", "default_branch": "main",
        "stargazers_count": 7, "open_issues_count": 2, "private": False}
class H(http.server.BaseHTTPRequestHandler):
    def _send(self, code, obj, headers=()):
        body = json.dumps(obj).encode()
        self.send_response(code)
        for k, v in headers:
            self.send_header(k, v)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def do_GET(self):
        seen = {"role": ROLE, "method": self.command, "path": self.path, "headers": self.headers.items()}
        print(json.dumps(seen), flush=True)
        path = self.path.split("?")[0]
        if ROLE == "echo" or path == "/echo-headers":
            auth = self.headers.get("Authorization", "")
            return self._send(200, {"headers": self.headers.items()}, [("X-Echo-Authorization", auth)])
        if path == "/repos/octo/hello/issues":
            return self._send(200, ISSUES)
        if path == "/repos/octo/hello":
            return self._send(200, REPO)
        if path == "/redirect-out":
            return self._send(302, {}, [("Location", "https://echo.test/after-redirect")])
        if path == "/redirect-in":
            return self._send(302, {}, [("Location", "/echo-headers")])
        seen_auth = "?seen=" + quote(self.headers.get("Authorization", ""))
        if path == "/redirect-with-token":  # the bound host puts what it got into a redirect
            return self._send(302, {}, [("Location", "/echo-headers" + seen_auth)])
        if path == "/redirect-away-with-token":
            return self._send(302, {}, [("Location", "https://elsewhere.test/" + seen_auth)])
        self._send(404, {"message": "Not Found"})
    do_HEAD = do_POST = do_PUT = do_DELETE = do_GET
    def log_message(self, *a):
        pass
open("/tmp/tls.pem", "w").write(os.environ["TLS_PEM"])
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
ctx.load_cert_chain("/tmp/tls.pem")
srv = http.server.ThreadingHTTPServer(("0.0.0.0", 443), H)
srv.socket = ctx.wrap_socket(srv.socket, server_side=True)
print(json.dumps({"role": ROLE, "listening": 443}), flush=True)
srv.serve_forever()
"""

# a test connector: returns what the handler itself received, hex-encoded, so the runner's redaction
# of results cannot hide a value the worker let through
PROBE = '''
import json
from toolcage.sdk import Context, EgressDenied, FetchFailed, tool

@tool
def probe_fetch(ctx: Context, url: str, auth: bool = False, catch: bool = False) -> dict:
    """Fetch a URL (with GITHUB_TOKEN when auth); return what this handler received, hex-encoded
    (with catch, the error it got too)."""
    try:
        r = ctx.fetch(url, auth="GITHUB_TOKEN" if auth else None)
    except (EgressDenied, FetchFailed) as exc:
        if not catch:
            raise
        seen = {"error": type(exc).__name__, "message": exc.message, "data": exc.data}
    else:
        seen = {"status": r.status, "url": r.url, "headers": r.headers, "body": r.text}
    return {"hex": json.dumps(seen).encode().hex()}

@tool
def probe_secret(ctx: Context) -> str:
    """Ask for the token's value itself."""
    return ctx.secret("GITHUB_TOKEN").encode().hex()
'''


@pytest.fixture(scope="module")
def upstream(engine: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """An internal network with a fake api.github.com and an echo.test, both HTTPS on 443 (test CA)."""
    import trustme

    ca = trustme.CA()
    ca_file = tmp_path_factory.mktemp("ca") / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    tag = secrets.token_hex(3)
    net = f"toolcage-test-github-{tag}"
    labels = {"toolcage.test": tag}
    engine.create_network(net, internal=True, labels=labels)
    cids: dict[str, str] = {}
    try:
        for role, alias in (("github", "api.github.com"), ("echo", "echo.test")):
            cert = ca.issue_cert(alias)
            pem = cert.private_key_pem.bytes().decode() + "".join(b.bytes().decode() for b in cert.cert_chain_pems)
            cids[role] = start_upstream(
                engine,
                f"toolcage-test-{role}-{tag}",
                net,
                UPSTREAM,
                [alias],
                labels,
                {"ROLE": role, "TLS_PEM": pem},
                # port 443 without root or a capability: a sysctl of the container's own network namespace
                sysctls={"net.ipv4.ip_unprivileged_port_start": "0"},
            )
        deadline = time.monotonic() + 10
        while not all('"listening"' in engine.logs(c) for c in cids.values()):
            assert time.monotonic() < deadline, {r: engine.logs(c) for r, c in cids.items()}
            time.sleep(0.05)
        subnet = engine.network(net)["IPAM"]["Config"][0]["Subnet"]
        yield {"network": net, "subnet": subnet, "ca_file": ca_file, **cids}
    finally:
        for cid in cids.values():
            engine.remove(cid)
        wait_removed(60)  # the runs that used it are removed in the background
        engine.remove_network(net)


def seen(engine: Any, cid: str) -> list[dict[str, Any]]:
    """Every request an upstream has received so far (method, path, headers as sent)."""
    lines = [json.loads(line) for line in engine.logs(cid).splitlines() if line.startswith("{")]
    return [r for r in lines if "path" in r]


def authorization(record: dict[str, Any]) -> list[str]:
    return [v for k, v in record["headers"] if k.lower() == "authorization"]


def derived_policy(tmp_path: Path, upstream: dict[str, Any], *, echo: bool) -> Path:
    """github.yaml as shipped, plus the test network's private range (the fake hosts live there)
    and, with ``echo``, echo.test: allowed, but not bound to the secret."""
    doc = yaml.safe_load((EXAMPLE / "github.yaml").read_text())
    doc["network"]["allow_private_cidrs"] = [upstream["subnet"]]
    if echo:
        doc["name"] = "github-and-echo"
        doc["network"]["allow"].append({"host": "echo.test", "schemes": ["https"], "methods": ["GET"]})
    path = tmp_path / f"{doc['name']}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.fixture
def token() -> str:
    """A fresh token per test, shaped like a GitHub one (long enough to be redacted)."""
    return "ghp_" + secrets.token_hex(18)


def test_example_policy_is_get_only_to_api_github_com() -> None:
    """github.yaml binds GITHUB_TOKEN to https://api.github.com:443 and allows GET there and nothing else."""
    from toolcage import load_policy
    from toolcage.policies.decide import Request, decide

    policy = load_policy(str(EXAMPLE / "github.yaml"))

    def public(host: str) -> list[str]:
        return ["140.82.121.6"]  # a GitHub address: nothing is resolved

    assert decide(Request("https://api.github.com/repos/a/b/issues", "GET"), policy, public).allowed
    for url, method in [
        ("https://api.github.com/repos/a/b/issues", "POST"),
        ("https://api.github.com/repos/a/b", "DELETE"),
        ("http://api.github.com/", "GET"),
        ("https://uploads.github.com/", "GET"),
        ("https://github.com/", "GET"),
    ]:
        assert not decide(Request(url, method), policy, public).allowed, (url, method)
    assert [(n, s.send_to.origin(), s.unsafe_expose_to_handler) for n, s in policy.secrets.items()] == [
        ("GITHUB_TOKEN", "https://api.github.com:443", False)
    ]


def test_list_issues_sends_the_token_once_and_keeps_it_out_of_everything(
    engine: Any, upstream: dict[str, Any], tmp_path: Path, token: str
) -> None:
    """list_issues returns the fake issues; api.github.com got `Authorization: Bearer <token>` exactly once
    per request; the audit log records the secret sent and where, never its value; docker inspect of the
    run's containers holds no token."""
    log = tmp_path / "audit.jsonl"
    before = len(seen(engine, upstream["github"]))
    with Sandbox(
        derived_policy(tmp_path, upstream, echo=False),
        tools=[EXAMPLE],
        secrets={"GITHUB_TOKEN": token},
        egress_network=upstream["network"],
        ca_file=upstream["ca_file"],
        audit=log,
    ) as sb:
        issues = sb.call("list_issues", {"repo": "octo/hello"})
        repo = sb.call("get_repo", {"repo": "octo/hello"})
        bad = sb.call("list_issues", {"repo": "octo/.."})  # would be GET /repos/octo/../issues
        missing = sb.call("get_repo", {"repo": "octo/missing"})
        inspected = [engine.inspect(c["Id"]) for c in engine.containers(f"toolcage.run_id={sb.run_id}")]
    assert issues.status == "ok", issues
    assert issues.result == [
        {"number": 3, "title": "Crash on empty input"},
        {"number": 1, "title": "Docs: typo in README"},
    ]
    assert repo.status == "ok" and repo.result["default_branch"] == "main", repo
    assert bad.error is not None and bad.error["code"] == -32001 and "OWNER/NAME" in bad.error["message"]
    assert missing.error is not None and missing.error["code"] == -32001 and "HTTP 404" in missing.error["message"]

    got = seen(engine, upstream["github"])[before:]
    assert [r["path"] for r in got] == [
        "/repos/octo/hello/issues?state=open&per_page=20",
        "/repos/octo/hello",
        "/repos/octo/missing",  # octo/.. never left the handler
    ]
    for r in got:
        assert authorization(r) == [f"Bearer {token}"], r["path"]
        assert ("User-Agent", "toolcage-example") in [tuple(h) for h in r["headers"]]

    assert {sb.container_id} < {c["Id"] for c in inspected}  # the sandbox and its egress proxy, while running
    assert token not in json.dumps(inspected)

    text = log.read_text()
    assert token not in text
    records = audit.read(log)
    calls = [r for r in records if r["event"] == "run.call" and r.get("tool") == "list_issues"]
    assert calls[0]["secrets_sent"] == [
        {"secret": "GITHUB_TOKEN", "origin": "https://api.github.com:443", "method": "GET"}
    ]
    assert audit.verify(log) == []


def test_cli_run_keeps_the_token_out_of_its_output(
    engine: Any, upstream: dict[str, Any], tmp_path: Path, token: str
) -> None:
    """`toolcage run list_issues --tools examples/connectors --secret GITHUB_TOKEN=env:...` exits 0 with the
    issues; the token is in neither stdout, stderr (-vv) nor the audit log, and reached the upstream."""
    log = tmp_path / "cli-audit.jsonl"
    before = len(seen(engine, upstream["github"]))
    args = [
        "run", "list_issues", "-vv",
        "--tools", "examples/connectors",
        "--policy", str(derived_policy(tmp_path, upstream, echo=False)),
        "--secret", "GITHUB_TOKEN=env:GITHUB_TOKEN",
        "--params", '{"repo": "octo/hello", "state": "all", "limit": 500}',
        "--egress-network", upstream["network"],
        "--ca-file", str(upstream["ca_file"]),
        "--audit-log", str(log),
    ]  # fmt: skip
    proc = run_cli(*args, env={"GITHUB_TOKEN": token})
    assert proc.returncode == 0, (proc.stdout[-2000:], proc.stderr[-2000:])
    out = json.loads(proc.stdout)
    assert out["status"] == "ok" and [i["number"] for i in out["result"]] == [3, 1]
    assert "run.configured" in proc.stderr  # the logs really are on
    for where, text in (("stdout", proc.stdout), ("stderr", proc.stderr), ("audit log", log.read_text())):
        assert token not in text, where
    got = seen(engine, upstream["github"])[before:]
    assert [r["path"] for r in got] == ["/repos/octo/hello/issues?state=all&per_page=100"]
    assert authorization(got[0]) == [f"Bearer {token}"]


def test_the_token_goes_to_its_bound_origin_only(
    engine: Any, upstream: dict[str, Any], tmp_path: Path, token: str
) -> None:
    """Under a policy that also allows echo.test: auth= to echo.test is refused (secret_not_bound) before
    any request; without auth the echo works and holds no token; a redirect from api.github.com to
    echo.test arrives there without it; a same-origin redirect keeps it; what the bound host echoes back
    reaches the handler as [secret GITHUB_TOKEN]; the handler cannot read the value itself."""
    probe = tmp_path / "probe.py"
    probe.write_text(PROBE)
    gh, echo = len(seen(engine, upstream["github"])), len(seen(engine, upstream["echo"]))
    with Sandbox(
        derived_policy(tmp_path, upstream, echo=True),
        tools=[EXAMPLE, probe],
        secrets={"GITHUB_TOKEN": token},
        egress_network=upstream["network"],
        ca_file=upstream["ca_file"],
    ) as sb:

        def probe_fetch(url: str, auth: bool) -> Any:
            return sb.call("probe_fetch", {"url": url, "auth": auth})

        unbound = probe_fetch("https://echo.test/with-auth", True)
        plain = probe_fetch("https://echo.test/without-auth", False)
        away = probe_fetch("https://api.github.com/redirect-out", True)
        echoed = probe_fetch("https://api.github.com/echo-headers", True)
        same_origin = probe_fetch("https://api.github.com/redirect-in", True)
        exposed = sb.call("probe_secret", {})

    def received(r: Any) -> dict[str, Any]:
        """What the handler itself saw (decoded from its hex, which no redaction touches)."""
        assert r.status == "ok", r
        return json.loads(bytes.fromhex(r.result["hex"]))  # type: ignore[no-any-return]

    assert unbound.error is not None and unbound.error["code"] == -32010, unbound
    assert unbound.error["data"]["reason"] == "secret_not_bound"
    assert unbound.error["data"]["bound_to"] == "https://api.github.com:443"

    plain_seen = received(plain)
    assert plain_seen["status"] == 200 and '"Host", "echo.test"' in plain_seen["body"]
    assert "authorization" not in plain_seen["body"].lower()

    away_seen = received(away)
    assert away_seen["url"] == "https://echo.test/after-redirect"
    assert "authorization" not in away_seen["body"].lower()

    echoed_seen = received(echoed)
    assert f"Bearer {SECRET_MARK}" in echoed_seen["body"]
    assert ["X-Echo-Authorization", f"Bearer {SECRET_MARK}"] in echoed_seen["headers"]
    assert received(same_origin)["url"] == "https://api.github.com/echo-headers"
    assert f"Bearer {SECRET_MARK}" in received(same_origin)["body"]

    assert exposed.error is not None and exposed.error["code"] == -32010
    assert exposed.error["data"]["reason"] == "secret_not_exposed"

    for r in (unbound, plain, away, echoed, same_origin, exposed):
        assert token not in json.dumps(r.to_dict())
        assert r.error is not None or token not in json.dumps(received(r))
    echo_got = seen(engine, upstream["echo"])[echo:]
    assert [r["path"] for r in echo_got] == ["/without-auth", "/after-redirect"]  # /with-auth never left
    assert all(authorization(r) == [] for r in echo_got) and token not in json.dumps(echo_got)
    gh_got = seen(engine, upstream["github"])[gh:]
    assert [r["path"] for r in gh_got] == ["/redirect-out", "/echo-headers", "/redirect-in", "/echo-headers"]
    assert all(authorization(r) == [f"Bearer {token}"] for r in gh_got)


def test_a_token_the_bound_host_puts_in_a_redirect_stays_out_of_the_handler(
    engine: Any, upstream: dict[str, Any], tmp_path: Path, token: str
) -> None:
    """api.github.com redirecting to a URL that carries the token (same origin, or a denied host): the
    handler's final URL, the error it catches, and the audit log's decisions hold [secret GITHUB_TOKEN]."""
    probe = tmp_path / "probe.py"
    probe.write_text(PROBE)
    with Sandbox(
        derived_policy(tmp_path, upstream, echo=False),
        tools=[probe],
        secrets={"GITHUB_TOKEN": token},
        egress_network=upstream["network"],
        ca_file=upstream["ca_file"],
        audit=tmp_path / "audit.jsonl",
    ) as sb:
        followed = sb.call("probe_fetch", {"url": "https://api.github.com/redirect-with-token", "auth": True})
        refused = sb.call(
            "probe_fetch", {"url": "https://api.github.com/redirect-away-with-token", "auth": True, "catch": True}
        )
    for r in (followed, refused):
        assert r.status == "ok", r
        handler_saw = bytes.fromhex(r.result["hex"]).decode()
        assert token not in handler_saw
        assert SECRET_MARK in handler_saw or quote(SECRET_MARK) in handler_saw, handler_saw
    assert json.loads(bytes.fromhex(followed.result["hex"]))["url"].startswith("https://api.github.com/echo-headers?")
    assert json.loads(bytes.fromhex(refused.result["hex"]))["error"] == "EgressDenied"
    decisions = [r for r in audit.read(tmp_path / "audit.jsonl") if r.get("source") == "safefetch"]
    assert any(SECRET_MARK in unquote(d["url"]) for d in decisions)
    assert token not in (tmp_path / "audit.jsonl").read_text()
