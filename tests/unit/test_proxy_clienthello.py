"""The egress proxy's ClientHello parser (worker.egress.clienthello): real and hand-built hellos, without Docker."""

from __future__ import annotations

import ssl
import struct

import pytest

from toolcage.worker.egress.clienthello import MAX_RECORD, NotClientHello, needed, server_name


def real_hello(sni: str | None) -> bytes:
    """The ClientHello Python's ssl sends (in memory, nothing on the network)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    obj = ctx.wrap_bio(incoming, outgoing, server_hostname=sni)
    with pytest.raises(ssl.SSLWantReadError):
        obj.do_handshake()
    return outgoing.read()


def _vec(n: int, data: bytes) -> bytes:
    return len(data).to_bytes(n, "big") + data


def sni_ext(*names: bytes, kind: int = 0) -> bytes:
    body = b"".join(bytes([kind]) + _vec(2, n) for n in names)
    return struct.pack(">H", 0) + _vec(2, _vec(2, body))


def hello(exts: bytes | None, hs_len_extra: int = 0, trailing: bytes = b"") -> bytes:
    """A minimal ClientHello record (RFC 8446 §4.1.2) around the given extensions block."""
    body = b"\x03\x03" + b"\x00" * 32 + _vec(1, b"") + _vec(2, b"\x13\x01") + _vec(1, b"\x00")
    if exts is not None:
        body += _vec(2, exts)
    body += trailing
    hs = b"\x01" + (len(body) + hs_len_extra).to_bytes(3, "big") + body
    return b"\x16\x03\x01" + _vec(2, hs)


def test_real_hello_sni() -> None:
    """Python's own ClientHello yields its server name."""
    assert server_name(real_hello("api.allowed.test")) == "api.allowed.test"


def test_real_hello_without_sni() -> None:
    """A ClientHello for an IP address (no SNI) yields None."""
    assert server_name(real_hello(None)) is None


def test_name_is_lowercased() -> None:
    """The name is compared case-insensitively: it comes back lowercase."""
    assert server_name(hello(sni_ext(b"API.Allowed.TEST"))) == "api.allowed.test"


def test_no_extensions_means_no_sni() -> None:
    """A ClientHello without an extensions block has no SNI."""
    assert server_name(hello(None)) is None


def test_needed_reads_the_record_length() -> None:
    """needed() asks for the 5-byte header first, then the whole record."""
    h = hello(sni_ext(b"a.test"))
    assert needed(h[:3]) == 5
    assert needed(h[:5]) == len(h)


BAD = [
    ("http_bytes", b"GET / HTTP/1.1\r\nHost: other.test\r\n\r\n", "not a TLS ClientHello"),
    ("ssh_banner", b"SSH-2.0-OpenSSH_9.6\r\n", "not a TLS ClientHello"),
    ("record_too_long", b"\x16\x03\x01" + struct.pack(">H", MAX_RECORD + 1), "out of range"),
    ("record_empty", b"\x16\x03\x01\x00\x00", "out of range"),
    ("incomplete", hello(sni_ext(b"a.test"))[:20], "incomplete"),
    ("not_client_hello", b"\x16\x03\x01" + _vec(2, b"\x02\x00\x00\x00"), "not a ClientHello"),
    ("fragmented", hello(sni_ext(b"a.test"), hs_len_extra=100), "fragmented"),
    ("duplicate_sni_ext", hello(sni_ext(b"a.test") + sni_ext(b"b.test")), "duplicate TLS extension"),
    ("two_names", hello(sni_ext(b"a.test", b"b.test")), "exactly one host_name"),
    ("unknown_name_type", hello(sni_ext(b"a.test", kind=1)), "unknown server_name type"),
    ("non_ascii_name", hello(sni_ext("é.test".encode())), "printable ASCII"),
    ("name_with_nul", hello(sni_ext(b"a.test\x00b.test")), "printable ASCII"),
    ("ext_overruns", hello(struct.pack(">HH", 0, 500) + b"\x00\x01"), "truncated"),
    ("bytes_after_exts", hello(sni_ext(b"a.test"), trailing=b"\x00"), "bytes after"),
]


@pytest.mark.parametrize(("name", "data", "reason"), BAD, ids=[b[0] for b in BAD])
def test_malformed_hello_refused(name: str, data: bytes, reason: str) -> None:
    """Anything but one well-formed ClientHello in one record is NotClientHello, with the reason."""
    with pytest.raises(NotClientHello, match=reason):
        server_name(data)


def test_truncations_never_crash() -> None:
    """Every prefix of a real ClientHello, with its lengths patched to claim completeness, fails cleanly."""
    full = real_hello("api.allowed.test")
    for cut in range(6, len(full)):
        data = full[:3] + struct.pack(">H", cut - 5) + full[5:cut]
        try:
            server_name(data)
        except NotClientHello:
            pass
