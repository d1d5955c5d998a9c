"""SafeFetch: the HTTP client for tool handlers, enforcing the run's egress policy.

Every request and every redirect hop goes through ``policies.decide``. Directly (no proxy,
e.g. ``--sandbox none``) it resolves once, checks every address and connects only to a
checked one, with TLS verified against the original host name. Behind the egress proxy
(``network.mode: proxy`` in a container) it checks names, schemes, ports and methods
itself and sends everything through the proxy, which checks again with addresses.
Environment proxies (HTTP_PROXY and friends) are ignored: only the runner's
``TOOLCAGE_PROXY`` steers it.

Redirects (threat: a server, or whoever controls an allowed URL, harvesting the caller's
credentials): ``Authorization``, ``Cookie`` and ``Proxy-Authorization`` are dropped on any
change of origin (scheme, host or port), and a redirect from https to http is refused
outright (EgressDenied, reason ``downgrade``), since it would send the request in clear.

Secrets (``auth=NAME``): the worker adds the secret's header itself, on hops to the origin
the policy binds it to (worker.secrets); a first hop elsewhere is refused, and once a
redirect leaves that origin the header is never sent again in that fetch.

Threat: a handler that makes the bound host echo the secret back in a form of its choosing.
So SafeFetch, not the handler, decides the transport of a fetch that carries a secret or goes
to a secret's origin (the host may have kept the value from an earlier request): a handler's
Accept-Encoding, Range, If-Range, Accept-Charset or A-IM is refused there, ``identity`` is
asked for, and an answer in any other content or transfer coding is refused unread. And the
body is redacted before it is cut to the output cap: SafeFetch reads ``lookahead`` bytes past
the cap, so a value that starts before the cut is removed whole (worker.redaction).
"""

from __future__ import annotations

import http.client
import os
import socket
import ssl
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urljoin, urlsplit

from toolcage.policies import Policy, contract
from toolcage.policies.decide import MAX_REDIRECTS, Decision, Request, Resolver, decide, system_resolver
from toolcage.worker.errors import EgressDenied, FetchFailed

_REDIRECTS = (301, 302, 303, 307, 308)
# headers a caller may not set: Host must be the checked name (no domain fronting),
# proxy headers belong to the proxy, framing headers to http.client
_FORBIDDEN_HEADERS = {
    "host",
    "proxy-authorization",
    "proxy-connection",
    "connection",
    "content-length",
    "transfer-encoding",
    "te",
    "upgrade",
    "keep-alive",
    "trailer",
}
_CREDENTIALS = {"authorization", "cookie", "proxy-authorization"}
# headers with which a handler would choose the form of the answer (a coding, a range, a charset, a delta):
# where a secret is sent, that choice is SafeFetch's
_TRANSPORT_HEADERS = {"accept-encoding", "range", "if-range", "accept-charset", "a-im"}


@dataclass
class FetchResult:
    status: int
    reason: str
    headers: list[tuple[str, str]]
    body: bytes
    truncated: bool
    url: str
    decisions: list[dict[str, Any]] = field(default_factory=list)


def proxy_from_env() -> tuple[str, int] | None:
    raw = os.environ.get(contract.ENV_PROXY)
    if not raw:
        return None
    host, _, port = raw.rpartition(":")
    return host, int(port)


class SafeFetch:
    def __init__(
        self,
        policy: Policy,
        *,
        proxy: tuple[str, int] | None = None,
        resolver: Resolver = system_resolver,
        max_bytes: int | None = None,
        ca_file: str | None = None,
        on_decision: Any = None,
        secrets: Any = None,
    ) -> None:
        self.policy = policy
        self.proxy = proxy
        self.resolver = resolver
        self.max_bytes = max_bytes or policy.limits.output_cap
        self.ca_file = ca_file or os.environ.get(contract.ENV_CA_FILE) or None
        self.on_decision = on_decision
        self.secrets = secrets  # a worker.secrets.SecretStore, for auth=
        self.secrets_sent: list[dict[str, Any]] = []  # every secret this client sent, names and origins

    def _tls(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=self.ca_file)
        extra = os.environ.get(contract.ENV_CA_PEM)
        if extra:  # an operator's extra CA (corporate, or a test CA), on top of the system store
            ctx.load_verify_locations(cadata=extra)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        return ctx

    def _decide(self, url: str, method: str) -> Decision:
        d = decide(Request(url, method), self.policy, None if self.proxy else self.resolver)
        if self.on_decision is not None:
            self.on_decision(url, method, d)
        if not d.allowed:
            raise EgressDenied(f"egress denied: {d.reason}", {"url": url, "method": method, "reason": d.reason})
        return d

    def _connection(self, d: Decision, timeout: float) -> http.client.HTTPConnection:
        t = d.target
        assert t is not None
        if self.proxy is not None:
            phost, pport = self.proxy
            if t.scheme == "https":
                conn: http.client.HTTPConnection = http.client.HTTPSConnection(
                    phost, pport, timeout=timeout, context=self._tls()
                )
                conn.set_tunnel(f"[{t.host}]" if ":" in t.host else t.host, t.port)
            else:
                conn = http.client.HTTPConnection(phost, pport, timeout=timeout)
            return conn
        # direct: connect to a checked address only, never re-resolve
        last: OSError | None = None
        for addr in d.addresses:
            try:
                sock = socket.create_connection((addr, t.port), timeout=timeout)
            except OSError as exc:
                last = exc
                continue
            if t.scheme == "https":
                sock = self._tls().wrap_socket(sock, server_hostname=t.host)
                conn = http.client.HTTPSConnection(t.host, t.port, timeout=timeout)
            else:
                conn = http.client.HTTPConnection(t.host, t.port, timeout=timeout)
            conn.sock = sock
            return conn
        raise FetchFailed(f"cannot connect to {t.host}:{t.port}: {last}", {"addresses": list(d.addresses)})

    def fetch(
        self,
        url: str,
        method: str = "GET",
        headers: dict[str, str] | None = None,
        body: bytes | None = None,
        timeout_s: float = 30.0,
        auth: str | None = None,
    ) -> FetchResult:
        deadline = time.monotonic() + timeout_s
        method = method.upper()
        hdrs = {k: v for k, v in (headers or {}).items()}
        bad = sorted(k for k in hdrs if k.lower() in _FORBIDDEN_HEADERS)
        if bad:
            raise EgressDenied(f"headers not allowed: {', '.join(bad)}", {"headers": bad})
        if not any(k.lower() == "user-agent" for k in hdrs):
            hdrs["User-Agent"] = "toolcage"  # some APIs (GitHub's) refuse a request without one
        decisions: list[dict[str, Any]] = []
        if auth is not None and self.secrets is None:
            raise EgressDenied(f"no secret named {auth} in this run", {"secret": auth, "reason": "unknown_secret"})
        guarded = False  # once a hop carried a secret or went to a secret's origin, for the rest of the fetch
        for hop in range(MAX_REDIRECTS + 1):
            d = self._decide(url, method)
            decisions.append({"url": url, "method": method, **d.to_dict()})
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise FetchFailed("timed out", {"url": url})
            t = d.target
            assert t is not None
            if not guarded and (auth is not None or (self.secrets is not None and self.secrets.binds(t))):
                guarded = True
                _refuse_transport_headers(hdrs)
            send = {**hdrs, "Accept-Encoding": "identity"} if guarded else hdrs
            if auth is not None:
                # first hop: refused unless it goes to the bound origin; later hops: only while
                # every redirect so far stayed on that origin (auth is cleared when one leaves it)
                name, value = self.secrets.header_for(auth, t)
                send = {k: v for k, v in send.items() if k.lower() != name.lower()}
                send[name] = value
                origin = f"{t.scheme}://{t.host}:{t.port}"
                # on the client, not the result: kept even if a later hop fails, the audit needs it
                self.secrets_sent.append({"secret": auth, "origin": origin, "method": method, "hop": hop})
            conn: http.client.HTTPConnection | None = None
            try:
                # connecting (and, direct, the TLS handshake) is inside: a refused connection or a
                # bad certificate is a FetchFailed, not an internal error
                conn = self._connection(d, remaining)
                path = url if (self.proxy and t.scheme == "http") else _origin_form(url)
                conn.request(method, path, body=body, headers=send)
                resp = conn.getresponse()
                status, reason, rheaders = resp.status, resp.reason, resp.getheaders()
                if guarded:
                    _refuse_codings(rheaders, url)
                # past the cap, what shows a value that starts before it whole (redacted below, then cut)
                extra = self.secrets.lookahead if self.secrets is not None else 0
                data = resp.read(self.max_bytes + extra + 1) if method != "HEAD" else b""
            except (OSError, http.client.HTTPException, ssl.SSLError) as exc:
                text = str(exc)
                if "Tunnel connection failed: 403" in text:
                    raise EgressDenied(f"egress denied by the proxy: {text}", {"url": url}) from None
                raise FetchFailed(f"request to {url} failed: {type(exc).__name__}: {text}", {"url": url}) from None
            finally:
                if conn is not None:
                    conn.close()
            lower = {k.lower(): v for k, v in rheaders}
            reason_text = lower.get("x-toolcage-denied") if self.proxy and status == 403 else None
            if reason_text:
                raise EgressDenied(f"egress denied by the proxy: {reason_text}", {"url": url, "reason": reason_text})
            location = lower.get("location")
            if status in _REDIRECTS and location:
                new_url = urljoin(url, location)
                if t.scheme == "https" and urlsplit(new_url).scheme.lower() == "http":
                    reason = f"downgrade: refusing to follow a redirect from https to http ({new_url})"
                    if self.on_decision is not None:
                        self.on_decision(new_url, method, Decision(False, reason))
                    raise EgressDenied(
                        "egress denied: a redirect from https to http would send the request in clear",
                        {"url": new_url, "from": url, "method": method, "reason": reason},
                    )
                if _origin(new_url) != _origin(url):
                    # another origin must not receive this one's credentials (another port is another origin)
                    hdrs = {k: v for k, v in hdrs.items() if k.lower() not in _CREDENTIALS}
                    auth = None  # a secret never follows a redirect to another origin
                if status == 303 or (status in (301, 302) and method == "POST"):
                    method, body = "GET", None
                url = new_url
                continue
            body = self.secrets.cut_bytes(data, self.max_bytes) if self.secrets is not None else data[: self.max_bytes]
            return FetchResult(status, reason, rheaders, body, len(data) > self.max_bytes, url, decisions)
        raise FetchFailed(f"more than {MAX_REDIRECTS} redirects", {"url": url})


def _refuse_transport_headers(headers: dict[str, str]) -> None:
    bad = sorted(k for k in headers if k.lower() in _TRANSPORT_HEADERS)
    if bad:
        raise EgressDenied(
            f"headers not allowed on a fetch that carries a secret or goes to its origin: {', '.join(bad)} "
            "(SafeFetch decides the transport there, so that the answer can be redacted)",
            {"headers": bad, "reason": "transport_header"},
        )


def _refuse_codings(headers: list[tuple[str, str]], url: str) -> None:
    """An answer SafeFetch did not ask for (it asked for identity): unread, since it cannot be redacted."""
    for key, value in headers:
        k, v = key.lower(), value.strip().lower()
        if (k == "content-encoding" and v not in ("", "identity")) or (k == "transfer-encoding" and v != "chunked"):
            shown = value if len(value) <= 40 else "(a long value)"  # whole or not at all: a cut one could hold a part
            raise FetchFailed(
                f"the answer from {url} came in {key}: {shown}, which SafeFetch did not ask for; on a fetch that "
                "carries a secret or goes to its origin only a plain body is read (it could not be redacted)",
                {"url": url, "reason": "content_coding", "header": key},
            )


def _origin(url: str) -> tuple[str, str, int | None]:
    """(scheme, host, port) with the scheme's default port filled in; an unparsable port is
    its own origin (the next hop's decision refuses it anyway)."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    try:
        port = parts.port
    except ValueError:
        port = -1
    return scheme, (parts.hostname or "").rstrip(".").lower(), port or {"http": 80, "https": 443}.get(scheme)


def _origin_form(url: str) -> str:
    parts = urlsplit(url)
    path = parts.path or "/"
    return f"{path}?{parts.query}" if parts.query else path
