"""Read the server name (SNI) from a TLS ClientHello, so the egress proxy can check it against CONNECT.

Threat: an allowed CONNECT tunnel whose TLS handshake names another site (SNI), which a
shared front end would then serve. The parser is small, bounded and strict: it reads
one TLS record, which must hold the whole ClientHello; anything else (not TLS, a
ClientHello split over records, a length that does not add up, two server_name
extensions, two names) is an error, and the proxy closes the tunnel (fail closed).
"""

from __future__ import annotations

RECORD_HEADER = 5
MAX_RECORD = 1 << 14  # RFC 8446 §5.1: TLSPlaintext.length MUST NOT exceed 2^14
_HANDSHAKE = 22  # RFC 8446 §5.1 ContentType.handshake
_CLIENT_HELLO = 1  # RFC 8446 §4 HandshakeType.client_hello
_SERVER_NAME = 0  # RFC 6066 §3 ExtensionType.server_name
_HOST_NAME = 0  # RFC 6066 §3 NameType.host_name


class NotClientHello(ValueError):
    """The bytes are not one well-formed ClientHello in one TLS record."""


def needed(buf: bytes) -> int:
    """How many bytes the first TLS record needs in all (header + body), as far as known yet."""
    if len(buf) < RECORD_HEADER:
        return RECORD_HEADER
    if buf[0] != _HANDSHAKE or buf[1] != 3:
        raise NotClientHello("not a TLS ClientHello (the first bytes are not a TLS handshake record)")
    length = int.from_bytes(buf[3:5], "big")
    if length == 0 or length > MAX_RECORD:
        raise NotClientHello(f"TLS record length {length} is out of range")
    return RECORD_HEADER + length


class _Reader:
    """Bounds-checked reads over one buffer; every overrun is NotClientHello."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def take(self, n: int) -> bytes:
        if n < 0 or self.pos + n > len(self.data):
            raise NotClientHello("ClientHello is truncated or a length field overruns it")
        out = self.data[self.pos : self.pos + n]
        self.pos += n
        return out

    def num(self, n: int) -> int:
        return int.from_bytes(self.take(n), "big")

    def vector(self, len_bytes: int, lo: int = 0, hi: int | None = None) -> bytes:
        n = self.num(len_bytes)
        if n < lo or (hi is not None and n > hi):
            raise NotClientHello("ClientHello vector length out of range")
        return self.take(n)

    def done(self) -> bool:
        return self.pos == len(self.data)


def server_name(buf: bytes) -> str | None:
    """The ClientHello's host_name (lowercase ASCII), or None when it sends no SNI."""
    total = needed(buf)
    if len(buf) < total:
        raise NotClientHello("the TLS record is incomplete")
    rec = _Reader(buf[RECORD_HEADER:total])
    if rec.num(1) != _CLIENT_HELLO:
        raise NotClientHello("the first handshake message is not a ClientHello")
    body_len = rec.num(3)  # RFC 8446 §4: Handshake.length is uint24
    if body_len > len(rec.data) - rec.pos:
        # a ClientHello fragmented over several records (RFC 8446 §5.1 allows it): refused,
        # since checking only the first fragment would let a later one carry the real name
        raise NotClientHello("the ClientHello does not fit in one TLS record (fragmented)")
    hello = _Reader(rec.take(body_len))
    # RFC 8446 §4.1.2 ClientHello (same layout as TLS 1.2, RFC 5246 §7.4.1.2)
    if hello.num(1) != 3:
        raise NotClientHello("ClientHello legacy_version is not 3.x")
    hello.take(1)
    hello.take(32)  # random
    hello.vector(1, 0, 32)  # legacy_session_id<0..32>
    hello.vector(2, 2, (1 << 16) - 2)  # cipher_suites<2..2^16-2>
    hello.vector(1, 1, 255)  # legacy_compression_methods<1..2^8-1>
    if hello.done():
        return None  # no extensions at all (TLS 1.2 and earlier allow it): no SNI
    exts = _Reader(hello.vector(2, 0))  # extensions<8..2^16-1>
    if not hello.done():
        raise NotClientHello("bytes after the ClientHello extensions")
    seen: set[int] = set()
    name: str | None = None
    while not exts.done():
        ext_type = exts.num(2)
        data = exts.vector(2)
        if ext_type in seen:
            # RFC 8446 §4.2: no more than one extension of the same type
            raise NotClientHello(f"duplicate TLS extension {ext_type}")
        seen.add(ext_type)
        if ext_type == _SERVER_NAME:
            name = _host_name(data)
    return name


def _host_name(data: bytes) -> str:
    """RFC 6066 §3 ServerNameList with exactly one host_name (ASCII, no trailing dot required)."""
    outer = _Reader(data)
    names = _Reader(outer.vector(2, 1))
    if not outer.done():
        raise NotClientHello("bytes after the server_name list")
    found: list[bytes] = []
    while not names.done():
        kind = names.num(1)
        value = names.vector(2, 1)
        if kind != _HOST_NAME:
            raise NotClientHello(f"unknown server_name type {kind}")
        found.append(value)
    if len(found) != 1:
        # RFC 6066 §3: MUST NOT contain more than one name of the same name_type
        raise NotClientHello("the server_name extension must carry exactly one host_name")
    raw = found[0]
    if not raw.isascii() or any(b <= 0x20 or b == 0x7F for b in raw):
        raise NotClientHello("SNI host_name is not printable ASCII")
    return raw.decode("ascii").lower()
