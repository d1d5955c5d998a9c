"""Which resolved addresses a sandbox may connect to: only global unicast, unless a policy opens a range.

Threats: the host (loopback), the LAN (RFC 1918, ULA), cloud metadata (169.254.169.254,
fd00:ec2::254), CGNAT, multicast, reserved and unspecified addresses, and IPv6 forms that
embed any of those (IPv4-mapped, IPv4-compatible, 6to4, NAT64, Teredo). The table is
explicit rather than trusting ``ipaddress.is_global`` alone (CVE-2024-4032 showed its
tables lagging IANA); ``is_global`` is still checked as a backstop.
"""

from __future__ import annotations

import ipaddress
from typing import Union

Address = Union[ipaddress.IPv4Address, ipaddress.IPv6Address]  # noqa: UP007

_DENY_V4 = [
    ("0.0.0.0/8", "unspecified/this-network"),
    ("10.0.0.0/8", "private"),
    ("100.64.0.0/10", "carrier-grade NAT"),
    ("127.0.0.0/8", "loopback"),
    ("169.254.0.0/16", "link-local (cloud metadata)"),
    ("172.16.0.0/12", "private"),
    ("192.0.0.0/24", "IETF protocol assignments"),
    ("192.0.2.0/24", "documentation"),
    ("192.88.99.0/24", "6to4 relay anycast"),
    ("192.168.0.0/16", "private"),
    ("198.18.0.0/15", "benchmarking"),
    ("198.51.100.0/24", "documentation"),
    ("203.0.113.0/24", "documentation"),
    ("224.0.0.0/4", "multicast"),
    ("240.0.0.0/4", "reserved"),
    ("255.255.255.255/32", "broadcast"),
]
_DENY_V6 = [
    ("::/128", "unspecified"),
    ("::1/128", "loopback"),
    ("100::/64", "discard-only"),
    ("2001:db8::/32", "documentation"),
    ("2001:10::/28", "ORCHID"),
    ("2001:20::/28", "ORCHIDv2"),
    ("3fff::/20", "documentation"),
    ("5f00::/16", "SRv6 SIDs"),
    ("fc00::/7", "unique local (private)"),
    ("fe80::/10", "link-local"),
    ("fec0::/10", "site-local"),
    ("ff00::/8", "multicast"),
]
_V4 = [(ipaddress.ip_network(n), why) for n, why in _DENY_V4]
_V6 = [(ipaddress.ip_network(n), why) for n, why in _DENY_V6]
_6TO4 = ipaddress.ip_network("2002::/16")
_NAT64 = (ipaddress.ip_network("64:ff9b::/96"), ipaddress.ip_network("64:ff9b:1::/48"))
_TEREDO = ipaddress.ip_network("2001::/32")
_COMPAT = ipaddress.ip_network("::/96")


def embedded_v4(ip: ipaddress.IPv6Address) -> tuple[ipaddress.IPv4Address, str] | None:
    """The IPv4 address an IPv6 address carries, and how (mapped, 6to4, NAT64, Teredo, compatible)."""
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped, "IPv4-mapped"
    if ip in _6TO4:
        return ipaddress.IPv4Address(ip.packed[2:6]), "6to4"
    for net in _NAT64:
        if ip in net:
            return ipaddress.IPv4Address(ip.packed[-4:]), "NAT64"
    if ip in _TEREDO:
        # Teredo: the client's address is stored inverted in the last 32 bits
        return ipaddress.IPv4Address(bytes(b ^ 0xFF for b in ip.packed[-4:])), "Teredo"
    if ip in _COMPAT and int(ip) > 1:
        return ipaddress.IPv4Address(ip.packed[-4:]), "IPv4-compatible"
    return None


def address_problem(ip: Address, allowed: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...] = ()) -> str | None:
    """None if ``ip`` may be connected to; else why not (e.g. ``'loopback (127.0.0.0/8)'``)."""
    if any(ip.version == net.version and ip in net for net in allowed):
        return None
    if isinstance(ip, ipaddress.IPv6Address):
        inner = embedded_v4(ip)
        if inner is not None:
            v4, how = inner
            problem = address_problem(v4, allowed)
            if problem is not None:
                return f"{how} form of {v4}: {problem}"
            if how in ("Teredo", "6to4", "NAT64", "IPv4-compatible"):
                return f"{how} tunnel address (carries {v4})"
            return None
        table = _V6
    else:
        table = _V4
    for net, why in table:
        if ip in net:
            return f"{why} ({net})"
    if not ip.is_global:
        return "not a global unicast address"
    return None
