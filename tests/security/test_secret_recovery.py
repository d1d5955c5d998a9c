"""A hostile connector recovers a secret it may only use (``auth=``) through the bound host's own echo.

The bound host (a container of this test on an internal network, HTTP on 80 and HTTPS on 443
with a trustme certificate) is an ordinary echo: it reflects text the handler chose, then the
request's Authorization header, as httpbin's ``/anything``, debug endpoints and many error
pages do; by path or by request header it also gives that echo compressed, base64, hex,
UTF-16, percent-encoded or as a byte range. The handlers are tests/fixtures/echo_attacks.py.

What must hold: no part of the value reaches the handler, at any cut, in any form of the echo
the handler chose; what is left is an oracle that confirms a whole guess, and only a whole one.
Nothing leaves the machine; everything created here is labelled and removed.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
import yaml

from tests.helpers import start_upstream
from toolcage import CallResult, Sandbox, wait_removed

pytestmark = pytest.mark.usefixtures("no_leaks")

ROOT = Path(__file__).resolve().parents[2]
ATTACKS = ROOT / "tests" / "fixtures" / "echo_attacks.py"
BOUND = "bound.test"
TOKEN = "tcsecret_" + secrets.token_hex(16)  # bound to https://bound.test:443
PLAIN = "tcsecret_" + secrets.token_hex(16)  # bound to http://bound.test:80
CAP = 1024  # the smallest output_cap a policy may set: the cut the attack moves through the value
HTTPS, HTTP = f"https://{BOUND}", f"http://{BOUND}"

ECHO = r"""
import base64, gzip, http.server, json, os, ssl, sys, threading
from urllib.parse import parse_qs, quote, urlsplit
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_GET(self):
        u = urlsplit(self.path)
        pad = parse_qs(u.query).get("pad", [""])[0]
        body = (pad + "|" + self.headers.get("Authorization", "")).encode()
        headers, code = [("Content-Type", "text/plain; charset=utf-8")], 200
        if u.path == "/b64":
            body = base64.b64encode(body)
        elif u.path == "/hex":
            body = body.hex().encode()
        elif u.path == "/quoted":
            body = quote(body, safe="").encode()
        elif u.path == "/utf16" or "utf-16" in self.headers.get("Accept-Charset", ""):
            body, headers = body.decode().encode("utf-16-le"), [("Content-Type", "text/plain; charset=utf-16le")]
        if u.path == "/to-self":  # the bound host puts what it got into a redirect on its own origin
            self.send_response(302)
            self.send_header("Location", "/echo?pad=" + quote(self.headers.get("Authorization", "")))
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        rng = self.headers.get("Range", "")
        if rng.startswith("bytes=") and u.path == "/echo":
            a, _, b = rng[6:].partition("-")
            body, code = body[int(a) : int(b) + 1], 206
        if u.path == "/gzip" or "gzip" in self.headers.get("Accept-Encoding", ""):
            body = gzip.compress(body)
            headers.append(("Content-Encoding", "gzip"))
        self.send_response(code)
        for k, v in headers:
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
open("/tmp/tls.pem", "w").write(os.environ["TLS_PEM"])
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
ctx.load_cert_chain("/tmp/tls.pem")
tls = http.server.ThreadingHTTPServer(("0.0.0.0", 443), H)
tls.socket = ctx.wrap_socket(tls.socket, server_side=True)
threading.Thread(target=tls.serve_forever, daemon=True).start()
plain = http.server.ThreadingHTTPServer(("0.0.0.0", 80), H)
print(json.dumps({"listening": [80, 443]}), flush=True)
plain.serve_forever()
"""


@pytest.fixture(scope="module")
def bound(engine: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """An internal network with the echo as bound.test (HTTP and HTTPS, a test CA)."""
    import trustme

    ca = trustme.CA()
    ca_file = tmp_path_factory.mktemp("ca") / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    tag = secrets.token_hex(3)
    net = f"toolcage-test-echo-{tag}"
    labels = {"toolcage.test": tag}
    engine.create_network(net, internal=True, labels=labels)
    cid = None
    try:
        cert = ca.issue_cert(BOUND)
        pem = cert.private_key_pem.bytes().decode() + "".join(b.bytes().decode() for b in cert.cert_chain_pems)
        cid = start_upstream(
            engine,
            f"toolcage-test-echo-{tag}",
            net,
            ECHO,
            [BOUND],
            labels,
            {"TLS_PEM": pem},
            sysctls={"net.ipv4.ip_unprivileged_port_start": "0"},
        )
        deadline = time.monotonic() + 10
        while '"listening"' not in engine.logs(cid):
            assert time.monotonic() < deadline, engine.logs(cid)
            time.sleep(0.05)
        subnet = engine.network(net)["IPAM"]["Config"][0]["Subnet"]
        audit = tmp_path_factory.mktemp("audit") / "audit.jsonl"
        yield {"network": net, "subnet": subnet, "ca_file": ca_file, "audit": audit}
    finally:
        if cid is not None:
            engine.remove(cid)
        wait_removed(60)  # the runs that used it are removed in the background
        engine.remove_network(net)


@pytest.fixture(scope="module")
def attacker(bound: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sandbox]:
    """A sandbox with the attack handlers: TOKEN bound to the echo over https, PLAIN over http, neither
    exposed, output_cap at its smallest."""
    doc = {
        "name": "echo-attack",
        "network": {
            "mode": "proxy",
            "allow": [{"host": BOUND, "schemes": ["http", "https"]}],
            "allow_private_cidrs": [bound["subnet"]],
        },
        "limits": {"output_cap": CAP},
        "timeouts": {"call_s": 120, "run_s": 900, "idle_s": 900},
        "secrets": {
            "TOKEN": {"send_to": {"host": BOUND}},
            "PLAIN": {"send_to": {"host": BOUND, "scheme": "http"}},
        },
    }
    pol = tmp_path_factory.mktemp("pol") / "echo-attack.yaml"
    pol.write_text(yaml.safe_dump(doc))
    with Sandbox(
        pol,
        tool="echo-attack",
        tools=[ATTACKS],
        secrets={"TOKEN": TOKEN, "PLAIN": PLAIN},
        egress_network=bound["network"],
        ca_file=bound["ca_file"],
        audit=bound["audit"],
    ) as sb:
        yield sb


def _ok(r: CallResult) -> dict[str, Any]:
    assert r.status == "ok", r
    assert TOKEN not in str(r.to_dict()) and PLAIN not in str(r.to_dict())
    return dict(r.result)


def _unreversed(value: str | None) -> str:
    return (value or "")[::-1]


SCHEMES = [("https", HTTPS, "TOKEN", TOKEN), ("http", HTTP, "PLAIN", PLAIN)]


@pytest.mark.parametrize(("url", "name", "value"), [s[1:] for s in SCHEMES], ids=[s[0] for s in SCHEMES])
def test_a_cut_never_leaves_part_of_a_secret(attacker: Sandbox, url: str, name: str, value: str) -> None:
    """Padding the echo so that the output cap falls 1, 2, ... characters into the value, then guessing the
    last one through the same echo, recovers nothing: the value straddling the cut is removed whole."""
    got = _ok(attacker.call("recover", {"url": f"{url}/echo", "auth": name, "cap": CAP}))
    assert got["saw_mark"] and got["fetches"] >= 1, got  # the echo reflected the value, and it was redacted
    prefix, recovered = _unreversed(got["prefix"]), _unreversed(got["recovered"])
    assert recovered != value, f"recovered the whole value in {got['fetches']} fetches"
    assert not (prefix and value.startswith(prefix)), f"recovered {len(prefix)} of {len(value)} characters"
    assert attacker.call("hello").result == {"hello": "world"}


def test_a_range_the_handler_asks_for_never_cuts_a_secret(attacker: Sandbox) -> None:
    """Asking the bound host itself for bytes 0..n of its echo (Range), n one further into the value each time,
    is refused on a fetch that carries a secret: SafeFetch, not the handler, decides the transport there."""
    got = _ok(attacker.call("recover", {"url": f"{HTTPS}/echo", "auth": "TOKEN", "cap": CAP, "how": "range"}))
    prefix = _unreversed(got["prefix"])
    assert not (prefix and TOKEN.startswith(prefix)), f"recovered {len(prefix)} of {len(TOKEN)} characters"
    assert got["errors"] and got["errors"][0]["reason"] == "transport_header", got


# (name, url path, request headers, auth): every way a handler can pick the form of the echo
FORMS: list[tuple[str, str, dict[str, str], str]] = [
    ("gzip_asked_https", f"{HTTPS}/echo", {"Accept-Encoding": "gzip"}, "TOKEN"),
    ("gzip_asked_http", f"{HTTP}/echo", {"Accept-Encoding": "gzip"}, "PLAIN"),
    ("gzip_always", f"{HTTPS}/gzip", {}, "TOKEN"),
    ("charset_asked", f"{HTTPS}/echo", {"Accept-Charset": "utf-16"}, "TOKEN"),
    ("utf16_path", f"{HTTPS}/utf16", {}, "TOKEN"),
    ("base64_path", f"{HTTPS}/b64", {}, "TOKEN"),
    ("hex_path", f"{HTTPS}/hex", {}, "TOKEN"),
    ("percent_path", f"{HTTPS}/quoted", {}, "TOKEN"),
]


@pytest.mark.parametrize(("path", "headers", "auth"), [f[1:] for f in FORMS], ids=[f[0] for f in FORMS])
def test_no_form_of_the_echo_carries_the_secret(
    attacker: Sandbox, path: str, headers: dict[str, str], auth: str
) -> None:
    """The echo compressed (asked for, or always), in UTF-16, base64, hex or percent-encoded: decoded every way the
    handler can, it holds no value; a transport header is refused, a coding SafeFetch did not ask for is refused,
    and every other form comes back with the value redacted in that form."""
    got = _ok(attacker.call("echo_forms", {"url": path, "auth": auth, "headers": headers}))
    assert got["hits"] == [], f"the handler decoded the secret: {got}"
    if headers:  # a transport header on a fetch that carries a secret
        assert (got.get("raised"), got.get("reason")) == ("EgressDenied", "transport_header"), got
    elif path.endswith("/gzip"):  # the bound host compressed although SafeFetch asked for identity
        assert (got.get("raised"), got.get("reason")) == ("FetchFailed", "content_coding"), got
    else:  # the form the host chose: the value in it is redacted, so the echo is seen and the mark is there
        assert got["status"] == 200 and got["marked"], got
    assert attacker.call("hello").result == {"hello": "world"}


def test_a_transport_header_is_a_clear_error_on_the_call(attacker: Sandbox) -> None:
    """Uncaught, a handler's Range on an auth= fetch ends its call with -32010 naming the header and why; without
    auth= too (the bound host may keep a value from an earlier request); the sandbox answers the next call."""
    for auth in ("TOKEN", None):
        params = {"url": f"{HTTPS}/echo", "auth": auth, "headers": {"Range": "bytes=0-9"}, "catch": False}
        r = attacker.call("echo_forms", params)
        assert r.status == "error" and r.error is not None, r
        assert r.error["code"] == -32010 and r.error["data"]["reason"] == "transport_header", r.error
        assert "Range" in r.error["message"] and "SafeFetch decides the transport" in r.error["message"], r.error
    assert attacker.call("hello").result == {"hello": "world"}


def test_a_confirmed_guess_is_an_oracle_for_whole_values_only(attacker: Sandbox) -> None:
    """Sent unauthenticated through the echo, the whole value comes back redacted (the oracle, documented); a value
    with one character wrong does not, and a prefix the handler places at the cut is shown as it is, the same as
    any other text: the cut answers nothing about a partial guess. The whole value across the cut is removed."""
    whole = _ok(attacker.call("guess", {"url": f"{HTTPS}/echo", "text": TOKEN}))
    wrong = _ok(attacker.call("guess", {"url": f"{HTTPS}/echo", "text": TOKEN[:-1] + "!"}))
    assert whole["confirmed"] and not wrong["confirmed"], (whole, wrong)
    across = _ok(attacker.call("guess", {"url": f"{HTTPS}/echo", "text": TOKEN, "cap": CAP, "before_cut": 20}))
    assert across["confirmed"] and not (_unreversed(across["shown"]) and TOKEN.startswith(_unreversed(across["shown"])))
    other = "tcsecret_" + secrets.token_hex(16)
    shown = {}
    for label, text in (("prefix", TOKEN[:20] + "zz"), ("other", other[:20] + "zz")):
        got = _ok(attacker.call("guess", {"url": f"{HTTPS}/echo", "text": text, "cap": CAP, "before_cut": 20}))
        assert not got["confirmed"], got
        shown[label] = _unreversed(got["shown"])
    assert shown == {"prefix": TOKEN[:20], "other": other[:20]}, shown  # the handler's own text, as it sent it


def test_a_value_the_bound_host_puts_in_a_url_stays_out_of_the_audit(attacker: Sandbox, bound: dict[str, Any]) -> None:
    """Over http the egress proxy sees whole URLs: a bound host that redirects to a URL carrying the value it
    got leaves neither that value in the audit log's proxy records nor in what the handler receives."""
    got = _ok(attacker.call("echo_forms", {"url": f"{HTTP}/to-self", "auth": "PLAIN"}))
    assert got["status"] == 200 and got["hits"] == [] and "raw" in got["marked"], got
    time.sleep(1)  # the proxy's records reach the audit log within its batch window
    text = bound["audit"].read_text()
    assert "/echo?pad=" in text, "the proxy's record of the redirected hop is not in the audit log"
    assert PLAIN not in text and quote(PLAIN) not in text, "the value is in the audit log"
