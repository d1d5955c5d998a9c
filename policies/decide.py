"""``decide(request, policy, resolver) -> Decision``: the one egress decision.

SafeFetch (in the worker), the egress proxy and ``toolcage policy test`` all call this
function, so they cannot disagree. Deny is the fall-through; every decision carries a
reason. Order: parse the URL strictly (one parser, no ambiguity), normalise the host,
match the allowlist by name (IP literals count as their address, never as a name),
check scheme, port and method, then resolve once and check every address. The caller
connects only to ``Decision.addresses`` (no second lookup between check and connect).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from toolcage.policies.addresses import address_problem
from toolcage.policies.model import DEFAULT_PORTS, AllowRule, NetworkPolicy, Policy
from toolcage.policies.names import NameError_, host_matches, ip_literal, normalize_host

Resolver = Callable[[str], Sequence[str]]
MAX_REDIRECTS = 5


class ResolveError(Exception):
    """Raised by a resolver that cannot resolve a name."""


@dataclass(frozen=True)
class Request:
    """What is about to be sent: ``method`` None when it cannot be known (a CONNECT tunnel)."""

    url: str
    method: str | None = "GET"


@dataclass(frozen=True)
class Target:
    scheme: str
    host: str  # normalised name, or the canonical text of an IP literal
    port: int
    literal: bool  # the URL named an IP address


@dataclass(frozen=True)
class Decision:
    allowed: bool
    reason: str
    rule: str | None = None
    target: Target | None = None
    addresses: tuple[str, ...] = field(default=())
    # audit-only (network.unsafe_audit_only): allowed, but the allowlist would have refused it, for this reason
    would_deny: str | None = None

    def to_dict(self) -> dict[str, object]:
        out: dict[str, object] = {
            "allowed": self.allowed, "reason": self.reason, "rule": self.rule, "addresses": list(self.addresses),
        }  # fmt: skip
        if self.would_deny is not None:
            out["would_deny"] = self.would_deny
        return out


def _deny(reason: str, target: Target | None = None, rule: str | None = None) -> Decision:
    return Decision(False, reason, rule, target)


def parse_target(url: str) -> Target:
    """Parse an absolute http(s) URL strictly; raise ValueError on anything ambiguous."""
    if any(ord(c) <= 0x20 or ord(c) == 0x7F for c in url) or "\\" in url:
        raise ValueError("the URL contains whitespace, control characters or a backslash")
    scheme, sep, rest = url.partition("://")
    if not sep:
        raise ValueError("not an absolute URL (expected scheme://host/...)")
    scheme = scheme.lower()
    if scheme not in DEFAULT_PORTS:
        raise ValueError(f"scheme {scheme!r} is not allowed (only http and https)")
    authority = rest
    for stop in "/?#":
        authority = authority.split(stop, 1)[0]
    if "@" in authority:
        raise ValueError("URLs with user info (user@host) are refused")
    if authority.startswith("["):
        end = authority.find("]")
        if end < 0:
            raise ValueError("unterminated IPv6 literal")
        host_text, after = authority[1:end], authority[end + 1 :]
        try:
            ipaddress.IPv6Address(host_text)
        except ValueError:
            raise ValueError(f"[{host_text}] is not an IPv6 address") from None
        if after and not after.startswith(":"):
            raise ValueError("garbage after the IPv6 literal")
        port_text = after[1:] if after else ""
    else:
        if authority.count(":") > 1:
            raise ValueError("more than one ':' in the host (IPv6 literals need brackets)")
        host_text, _, port_text = authority.partition(":")
    if authority.endswith(":") or (port_text == "" and authority.rstrip("]").endswith(":")):
        raise ValueError("empty port")
    if port_text:
        if not port_text.isdigit() or not port_text.isascii() or len(port_text) > 5:
            raise ValueError(f"port {port_text!r} is not a number")
        port = int(port_text)
        if not 1 <= port <= 65535:
            raise ValueError(f"port {port} is out of range")
    else:
        port = DEFAULT_PORTS[scheme]
    if not host_text:
        raise ValueError("the URL has no host")
    literal = ip_literal(host_text)
    if literal is not None:
        return Target(scheme, str(literal), port, True)
    try:
        return Target(scheme, normalize_host(host_text), port, False)
    except NameError_ as exc:
        raise ValueError(str(exc)) from None


def _matching(rules: Sequence[AllowRule], t: Target) -> list[AllowRule]:
    if t.literal:
        return [r for r in rules if r.host == t.host]
    return [r for r in rules if not ip_literal(r.host) and host_matches(t.host, r.host)]


def decide(request: Request, policy: Policy, resolver: Resolver | None) -> Decision:
    """Allow or deny one request, with the reason. ``resolver=None`` checks names only (the
    proxy checks addresses); otherwise every resolved address must pass."""
    net = policy.network
    if net.mode == "none":
        return _deny("network access is disabled by the policy (network.mode: none)")
    try:
        t = parse_target(request.url)
    except ValueError as exc:
        return _deny(f"bad URL: {exc}")
    refused = _by_allowlist(net.allow, t, request.method)
    would_deny = None
    if isinstance(refused, Decision):
        if not net.unsafe_audit_only:
            return refused
        would_deny, rule = refused.reason, "(audit-only)"  # let through, recorded; the floor below still holds
    else:
        rule = refused
    if resolver is None:
        why = f"allowed by rule {rule} (addresses are checked by the egress proxy)"
        return Decision(True, why, rule, t, would_deny=would_deny)
    if t.literal:
        answers: Sequence[str] = [t.host]
    else:
        try:
            answers = list(resolver(t.host))
        except (ResolveError, OSError) as exc:
            return _deny(f"cannot resolve {t.host}: {exc}", t, rule)
        if not answers:
            return _deny(f"cannot resolve {t.host}: no addresses", t, rule)
    private = net.private_networks()
    checked = []
    for raw in answers:
        try:
            ip = ipaddress.ip_address(raw.split("%", 1)[0])
        except ValueError:
            return _deny(f"{t.host} resolved to something that is not an address: {raw!r}", t, rule)
        problem = address_problem(ip, private)
        if problem is not None:
            return _deny(f"{t.host} resolves to {ip}, which is {problem}", t, rule)
        checked.append(str(ip))
    return Decision(True, f"allowed by rule {rule}", rule, t, tuple(dict.fromkeys(checked)), would_deny)


def _by_allowlist(allow: Sequence[AllowRule], t: Target, method_asked: str | None) -> str | Decision:
    """The first rule that lets ``t`` (by name, scheme, port and method) through, or the refusal with its reason."""
    rules = _matching(allow, t)
    if not rules:
        kind = "IP address" if t.literal else "host"
        return _deny(f"{kind} {t.host} is not in the allowlist", t)
    by_scheme = [r for r in rules if t.scheme in r.schemes]
    if not by_scheme:
        allowed = sorted({s for r in rules for s in r.schemes})
        return _deny(f"scheme {t.scheme} is not allowed for {t.host} (allowed: {', '.join(allowed)})", t)
    by_port = [r for r in by_scheme if t.port in r.allowed_ports(t.scheme)]
    if not by_port:
        allowed_ports = sorted({p for r in by_scheme for p in r.allowed_ports(t.scheme)})
        return _deny(f"port {t.port} is not allowed for {t.scheme}://{t.host} (allowed: {allowed_ports})", t)
    method = method_asked.upper() if method_asked else None
    by_method = [r for r in by_port if method is None or not r.methods or method in r.methods]
    if not by_method:
        allowed_methods = sorted({m for r in by_port for m in r.methods})
        return _deny(f"method {method} is not allowed for {t.host} (allowed: {', '.join(allowed_methods)})", t)
    return by_method[0].host


def change_problem(current: Policy, network: NetworkPolicy) -> str | None:
    """Why a running sandbox's network may not become ``network`` (None: it may). The same rules as a policy at
    start (the caller built ``network`` with the model's checks, and the whole policy with it), plus the floor,
    refused when asked rather than only later per request: a change never opens a private range the run did not
    start with, and never names an address the floor refuses (loopback, link-local and metadata, private ranges)."""
    wider = sorted(set(network.allow_private_cidrs) - set(current.network.allow_private_cidrs))
    if wider:
        return (
            f"allow_private_cidrs {wider} were not in the policy the sandbox started with: a live change never "
            "opens a private range (start the sandbox with them)"
        )
    private = network.private_networks()
    for rule in network.allow:
        ip = ip_literal(rule.host)
        if ip is not None:
            problem = address_problem(ip, private)
            if problem is not None:
                return f"allow rule {rule.host}: the address is {problem}, which the egress floor always refuses"
        elif rule.host == "localhost" or rule.host.endswith(".localhost"):
            return f"allow rule {rule.host}: names the machine itself, which the egress floor always refuses"
    return None


def system_resolver(host: str) -> list[str]:
    """Resolve with getaddrinfo, once; every A and AAAA answer is returned (and must pass)."""
    import socket

    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise ResolveError(exc.strerror or str(exc)) from None
    return [str(info[4][0]) for info in infos]
