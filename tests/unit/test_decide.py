"""decide(): table-driven SSRF cases, each asserting the decision and its reason."""

from __future__ import annotations

from typing import Any

import pytest

from toolcage.policies import PolicyError, validate_policy
from toolcage.policies.decide import Request, ResolveError, decide, parse_target

POLICY = validate_policy(
    {
        "network": {
            "mode": "proxy",
            "allow": [
                {"host": "api.example.com", "methods": ["GET", "POST"]},
                {"host": "*.example.org", "schemes": ["http", "https"]},
                {"host": "svc.internal.test", "schemes": ["http"], "ports": [8080]},
                {"host": "bücher.example", "schemes": ["https"]},
                {"host": "93.184.216.34", "schemes": ["https"]},
                {"host": "10.20.0.7", "schemes": ["http"]},
            ],
            "allow_private_cidrs": ["10.20.0.0/16"],
        }
    }
)

DNS: dict[str, list[str]] = {
    "api.example.com": ["93.184.216.34"],
    "a.example.org": ["93.184.216.40"],
    "deep.sub.example.org": ["93.184.216.41"],
    "svc.internal.test": ["10.20.0.5"],
    "xn--bcher-kva.example": ["93.184.216.42"],
    # names that resolve to places a sandbox must never reach
    "loop.example.org": ["127.0.0.1"],
    "meta.example.org": ["169.254.169.254"],
    "lan.example.org": ["192.168.1.10"],
    "priv10.example.org": ["10.0.0.1"],
    "cgnat.example.org": ["100.64.0.1"],
    "zero.example.org": ["0.0.0.0"],
    "mcast.example.org": ["224.0.0.1"],
    "bcast.example.org": ["255.255.255.255"],
    "reserved.example.org": ["240.0.0.1"],
    "v6loop.example.org": ["::1"],
    "v6unspec.example.org": ["::"],
    "v6ula.example.org": ["fd00:ec2::254"],
    "v6ll.example.org": ["fe80::1"],
    "mapped.example.org": ["::ffff:127.0.0.1"],
    "mapped-meta.example.org": ["::ffff:169.254.169.254"],
    "sixtofour.example.org": ["2002:7f00:1::"],
    "nat64.example.org": ["64:ff9b::a9fe:a9fe"],
    "teredo.example.org": ["2001:0:4136:e378:8000:63bf:3fff:fdd2"],
    "compat.example.org": ["::7f00:1"],
    "mixed.example.org": ["93.184.216.43", "10.0.0.9"],
    "rebind-ok-v6.example.org": ["2606:2800:220:1:248:1893:25c8:1946"],
    "empty.example.org": [],
}


def resolver(host: str) -> list[str]:
    if host not in DNS:
        raise ResolveError("Name or service not known")
    return DNS[host]


ALLOW = [
    ("exact_name", "https://api.example.com/v1/items", "GET"),
    ("post_allowed", "https://api.example.com/v1/items", "POST"),
    ("upper_case_name", "https://API.Example.COM/v1", "GET"),
    ("trailing_dot", "https://api.example.com./v1", "GET"),
    ("explicit_default_port", "https://api.example.com:443/", "GET"),
    ("wildcard_subdomain", "https://a.example.org/", "GET"),
    ("wildcard_deep_subdomain", "http://deep.sub.example.org/", "GET"),
    ("listed_port_and_private_cidr", "http://svc.internal.test:8080/health", "GET"),
    ("idn_unicode", "https://bücher.example/", "GET"),
    ("idn_punycode", "https://xn--bcher-kva.example/", "GET"),
    ("public_v6_answer", "https://rebind-ok-v6.example.org/", "GET"),
    ("listed_ip_literal", "https://93.184.216.34/", "GET"),
    ("listed_private_ip_in_open_cidr", "http://10.20.0.7/", "GET"),
]


@pytest.mark.parametrize(("case", "url", "method"), ALLOW, ids=[c[0] for c in ALLOW])
def test_allowed(case: str, url: str, method: str) -> None:
    """Requests inside the allowlist are allowed, with the matching rule and the checked addresses."""
    d = decide(Request(url, method), POLICY, resolver)
    assert d.allowed, d.reason
    assert d.reason.startswith("allowed by rule ") and d.rule is not None
    assert d.addresses


DENY: list[tuple[str, str, str | None, str]] = [
    # names
    ("not_listed", "https://evil.com/", "GET", "host evil.com is not in the allowlist"),
    ("apex_of_wildcard", "https://example.org/", "GET", "host example.org is not in the allowlist"),
    ("suffix_not_subdomain", "https://notexample.org/", "GET", "not in the allowlist"),
    ("substring_trick", "https://api.example.com.evil.com/", "GET", "not in the allowlist"),
    ("prefix_trick", "https://evilapi.example.com/", "GET", "not in the allowlist"),
    ("unresolvable", "https://nope.example.org/", "GET", "cannot resolve nope.example.org"),
    ("no_answers", "https://empty.example.org/", "GET", "cannot resolve empty.example.org: no addresses"),
    # scheme, port, method
    ("http_when_https_only", "http://api.example.com/", "GET", "scheme http is not allowed for api.example.com"),
    ("ftp", "ftp://api.example.com/", "GET", "scheme 'ftp' is not allowed"),
    ("file", "file:///etc/passwd", "GET", "scheme 'file' is not allowed"),
    ("gopher", "gopher://api.example.com/", "GET", "scheme 'gopher' is not allowed"),
    ("other_port", "https://api.example.com:8443/", "GET", "port 8443 is not allowed"),
    ("port_zero", "https://api.example.com:0/", "GET", "port 0 is out of range"),
    ("port_too_big", "https://api.example.com:70000/", "GET", "port 70000 is out of range"),
    ("port_not_number", "https://api.example.com:https/", "GET", "is not a number"),
    ("empty_port", "https://api.example.com:/", "GET", "empty port"),
    ("method_not_listed", "https://api.example.com/", "DELETE", "method DELETE is not allowed"),
    # URL parser confusion
    ("userinfo", "https://user:pw@api.example.com/", "GET", "user info"),
    ("userinfo_trick", "https://api.example.com@evil.com/", "GET", "user info"),
    ("backslash", "https://api.example.com\\@evil.com/", "GET", "backslash"),
    ("space", "https://api.example.com /", "GET", "whitespace"),
    ("tab", "https://api.exa\tmple.com/", "GET", "whitespace"),
    ("nul", "https://api.example.com\x00.evil.com/", "GET", "control characters"),
    ("relative", "//api.example.com/", "GET", "not an absolute URL"),
    ("no_host", "https:///path", "GET", "no host"),
    ("bracket_not_v6", "https://[api.example.com]/", "GET", "is not an IPv6 address"),
    ("percent_in_host", "https://api%2eexample.com/", "GET", "invalid host"),
    # IP literals count as their address, never as a name
    ("ipv4_loopback_literal", "http://127.0.0.1/", "GET", "IP address 127.0.0.1 is not in the allowlist"),
    ("ipv4_short_form", "http://127.1/", "GET", "IP address 127.0.0.1"),
    ("ipv4_hex", "http://0x7f.0.0.1/", "GET", "IP address 127.0.0.1"),
    ("ipv4_octal", "http://0177.0.0.1/", "GET", "IP address 127.0.0.1"),
    ("ipv4_decimal", "http://2130706433/", "GET", "IP address 127.0.0.1"),
    ("octal_looks_public", "http://012.1.2.3/", "GET", "IP address 10.1.2.3"),
    ("metadata_literal", "http://169.254.169.254/latest/meta-data/", "GET", "IP address 169.254.169.254"),
    ("ipv6_loopback_literal", "http://[::1]/", "GET", "IP address ::1"),
    ("ipv6_mapped_literal", "http://[::ffff:127.0.0.1]/", "GET", "IP address ::ffff:7f00:1"),
    ("listed_ip_wrong_scheme", "http://93.184.216.34/", "GET", "scheme http is not allowed for 93.184.216.34"),
    # a listed name that resolves somewhere it must not go
    ("resolves_loopback", "https://loop.example.org/", "GET", "resolves to 127.0.0.1, which is loopback"),
    ("resolves_metadata", "https://meta.example.org/", "GET", "169.254.169.254, which is link-local"),
    ("resolves_lan", "https://lan.example.org/", "GET", "192.168.1.10, which is private"),
    ("resolves_10_outside_open_cidr", "https://priv10.example.org/", "GET", "10.0.0.1, which is private"),
    ("resolves_cgnat", "https://cgnat.example.org/", "GET", "100.64.0.1, which is carrier-grade NAT"),
    ("resolves_unspecified", "https://zero.example.org/", "GET", "0.0.0.0, which is unspecified"),
    ("resolves_multicast", "https://mcast.example.org/", "GET", "224.0.0.1, which is multicast"),
    ("resolves_broadcast", "https://bcast.example.org/", "GET", "255.255.255.255, which is"),
    ("resolves_reserved", "https://reserved.example.org/", "GET", "240.0.0.1, which is reserved"),
    ("resolves_v6_loopback", "https://v6loop.example.org/", "GET", "::1, which is loopback"),
    ("resolves_v6_unspecified", "https://v6unspec.example.org/", "GET", ":: , which is unspecified".replace(" ,", ",")),
    ("resolves_v6_ula_metadata", "https://v6ula.example.org/", "GET", "fd00:ec2::254, which is unique local"),
    ("resolves_v6_link_local", "https://v6ll.example.org/", "GET", "fe80::1, which is link-local"),
    ("resolves_mapped_loopback", "https://mapped.example.org/", "GET", "IPv4-mapped form of 127.0.0.1: loopback"),
    ("resolves_mapped_metadata", "https://mapped-meta.example.org/", "GET", "IPv4-mapped form of 169.254.169.254"),
    ("resolves_6to4_loopback", "https://sixtofour.example.org/", "GET", "6to4 form of 127.0.0.1"),
    ("resolves_nat64_metadata", "https://nat64.example.org/", "GET", "NAT64 form of 169.254.169.254"),
    ("resolves_teredo", "https://teredo.example.org/", "GET", "Teredo"),
    ("resolves_v4_compatible", "https://compat.example.org/", "GET", "IPv4-compatible form of 127.0.0.1"),
    ("any_answer_private", "https://mixed.example.org/", "GET", "10.0.0.9, which is private"),
]


@pytest.mark.parametrize(("case", "url", "method", "reason"), DENY, ids=[c[0] for c in DENY])
def test_denied(case: str, url: str, method: str | None, reason: str) -> None:
    """Each SSRF trick is denied, and the reason says why."""
    d = decide(Request(url, method), POLICY, resolver)
    assert not d.allowed
    assert reason in d.reason, d.reason
    assert d.addresses == ()


def test_mode_none_denies_everything() -> None:
    """With network mode none nothing is allowed, whatever the URL."""
    d = decide(Request("https://api.example.com/"), validate_policy({}), resolver)
    assert not d.allowed and "network.mode: none" in d.reason


def test_names_only_check_for_proxy_mode() -> None:
    """Without a resolver (SafeFetch behind the proxy) names, schemes, ports and methods are still checked."""
    assert decide(Request("https://api.example.com/"), POLICY, None).allowed
    assert not decide(Request("https://evil.com/"), POLICY, None).allowed
    assert not decide(Request("https://api.example.com/", "DELETE"), POLICY, None).allowed


def test_connect_has_no_method() -> None:
    """A CONNECT tunnel (method unknown) is checked on host and port only."""
    assert decide(Request("https://api.example.com:443", None), POLICY, resolver).allowed


def test_parse_target_brackets_and_ports() -> None:
    """IPv6 literals need brackets; ports are decimal."""
    t = parse_target("http://[2606:2800:220:1::1]:8080/x")
    assert (t.host, t.port, t.literal) == ("2606:2800:220:1::1", 8080, True)
    with pytest.raises(ValueError, match="more than one"):
        parse_target("http://2606:2800::1/")


BAD_NETWORK: list[tuple[dict[str, Any], str]] = [
    ({"mode": "none", "allow": [{"host": "a.com"}]}, "cannot enforce an allowlist"),
    ({"mode": "proxy", "allow": [{"host": "*"}]}, "leading '*.'"),
    ({"mode": "proxy", "allow": [{"host": "api.*.com"}]}, "leading '*.'"),
    ({"mode": "proxy", "allow": [{"host": "*.*.com"}]}, "only one leading"),
    ({"mode": "proxy", "allow": [{"host": "*.10.0.0.1"}]}, "cannot apply to an IP"),
    ({"mode": "proxy", "allow": [{"host": "a.com", "schemes": ["ftp"]}]}, "schemes"),
    ({"mode": "proxy", "allow": [{"host": "a.com", "schemes": []}]}, "must not be empty"),
    ({"mode": "proxy", "allow": [{"host": "a.com", "ports": [0]}]}, "ports"),
    ({"mode": "proxy", "allow": [{"host": "a.com", "methods": ["TRACE"]}]}, "methods"),
    ({"mode": "proxy", "allow": [{"host": "a b.com"}]}, "invalid host"),
    ({"mode": "proxy", "allow_private_cidrs": ["0.0.0.0/0"]}, "every address"),
    ({"mode": "proxy", "allow_private_cidrs": ["10.0.0.1/8"]}, "not a network"),
    ({"mode": "tunnel"}, "mode"),
]


@pytest.mark.parametrize(("network", "needle"), BAD_NETWORK)
def test_unenforceable_policies_refused(network: dict[str, Any], needle: str) -> None:
    """A network section that grants what cannot be enforced, or is malformed, is refused naming why."""
    with pytest.raises(PolicyError) as info:
        validate_policy({"network": network})
    assert needle in str(info.value)


def test_hosts_are_stored_normalised() -> None:
    """Rule hosts are stored in normal form (lower case, Punycode)."""
    p = validate_policy({"network": {"mode": "proxy", "allow": [{"host": "API.Bücher.Example."}]}})
    assert p.network.allow[0].host == "api.xn--bcher-kva.example"


def test_network_policy_round_trips_through_worker_builder() -> None:
    """The worker rebuilds the identical network policy from canonical JSON (no pydantic)."""
    from toolcage.policies import policy_from_json

    assert policy_from_json(POLICY.canonical_json()) == POLICY
