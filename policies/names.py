"""Host-name normalisation and allowlist globs, shared by the policy model and decide().

Names are compared after IDNA (UTS 46) to Punycode, lower case and one trailing dot
removed, never as substrings. A glob is an exact name or ``*.`` + name: any subdomain at
any depth, never the apex.
"""

from __future__ import annotations

import ipaddress
import re
import socket

_LDH = re.compile(r"^[a-z0-9_]([a-z0-9_-]{0,61}[a-z0-9_])?$")
_IPV4ISH = re.compile(r"^[0-9a-fx.]+$")


class NameError_(ValueError):
    """A host that cannot be normalised (not a valid DNS name or IP literal)."""


def normalize_host(raw: str) -> str:
    """Lower-case, strip one trailing dot, IDNA-encode; raise NameError_ when it is not a valid name."""
    if not raw or any(c in raw for c in "\x00 \t\r\n/\\@?#%[]"):
        raise NameError_(f"invalid host {raw!r}")
    host = raw[:-1] if raw.endswith(".") else raw
    host = host.lower()
    if not host or host.endswith("."):
        raise NameError_(f"invalid host {raw!r}")
    if not host.isascii():
        import idna

        try:
            host = idna.encode(host, uts46=True).decode("ascii")
        except idna.IDNAError as exc:
            raise NameError_(f"invalid international host {raw!r}: {exc}") from None
    labels = host.split(".")
    if len(host) > 253 or not all(_LDH.match(label) for label in labels):
        raise NameError_(f"invalid host {raw!r}")
    return host


def ip_literal(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """The address a host string denotes as a literal, in every form the C library accepts.

    Threat: ``127.1``, ``0x7f.0.0.1``, ``0177.0.0.1`` and ``2130706433`` are all 127.0.0.1 to
    ``getaddrinfo``; treating them as names would let them dodge the address checks.
    """
    h = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    try:
        return ipaddress.ip_address(h)
    except ValueError:
        pass
    if _IPV4ISH.match(h.lower()):
        try:
            return ipaddress.IPv4Address(socket.inet_aton(h))
        except OSError:
            return None
    return None


def validate_glob(pattern: str) -> str:
    """Check an allowlist host and return its normal form (``*.`` prefix kept)."""
    if pattern.startswith("*."):
        rest = pattern[2:]
        if "*" in rest or not rest:
            raise ValueError(f"host {pattern!r}: only one leading '*.' wildcard is allowed")
        if ip_literal(rest) is not None:
            raise ValueError(f"host {pattern!r}: a wildcard cannot apply to an IP address")
        return "*." + normalize_host(rest)
    if "*" in pattern:
        raise ValueError(f"host {pattern!r}: a wildcard is allowed only as a leading '*.' (e.g. '*.example.com')")
    literal = ip_literal(pattern)
    if literal is not None:
        return str(literal)
    return normalize_host(pattern)


def host_matches(host: str, glob: str) -> bool:
    """Whether a normalised host matches a normalised glob (apex excluded for ``*.``)."""
    if glob.startswith("*."):
        return host.endswith(glob[1:]) and len(host) > len(glob) - 1
    return host == glob
