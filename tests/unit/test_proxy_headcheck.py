"""The egress proxy's strict head checks (worker.egress.headcheck), on raw bytes, without Docker."""

from __future__ import annotations

import pytest

from toolcage.worker.egress.headcheck import bad_line_end, check_head

A = b"GET http://api.test/ HTTP/1.1\r\nHost: api.test\r\n"

CASES = [
    ("plain", A + b"\r\n", None),
    ("http10_without_host", b"GET http://api.test/ HTTP/1.0\r\n\r\n", None),
    ("connect", b"CONNECT api.test:443 HTTP/1.1\r\nHost: api.test:443\r\n\r\n", None),
    ("connect_ipv6", b"CONNECT [2001:db8::1]:443 HTTP/1.1\r\nHost: [2001:db8::1]:443\r\n\r\n", None),
    ("content_length", A + b"Content-Length: 3\r\n\r\n", None),
    ("chunked", A + b"Transfer-Encoding: chunked\r\n\r\n", None),
    ("bare_lf", A + b"X-A: a\nHost: other.test\r\n\r\n", "bare LF"),
    ("bare_lf_head", b"GET http://api.test/ HTTP/1.1\nHost: api.test\n\r\n\r\n", "bare LF"),
    ("bare_cr", A + b"X-A: a\rHost: other.test\r\n\r\n", "bare CR"),
    ("obs_fold", A + b"X-A: a\r\n b\r\n\r\n", "obs-fold"),
    ("obs_fold_tab", A + b"Transfer-Encoding:\r\n\tchunked\r\n\r\n", "obs-fold"),
    ("space_before_colon", A + b"Transfer-Encoding : chunked\r\n\r\n", "header name"),
    ("space_in_name", A + b"X A: b\r\n\r\n", "header name"),
    ("empty_name", A + b": b\r\n\r\n", "header name"),
    ("no_colon", A + b"garbage\r\n\r\n", "no colon"),
    ("nul_in_value", A + b"X-A: a\x00b\r\n\r\n", "control character"),
    ("cl_te", A + b"Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n", "Content-Length and Transfer-Encoding"),
    ("te_cl", A + b"Transfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n", "Content-Length and Transfer-Encoding"),
    ("te_chunked_identity", A + b"Transfer-Encoding: chunked, identity\r\n\r\n", "Transfer-Encoding other"),
    ("te_twice", A + b"Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n", "Transfer-Encoding other"),
    ("te_xchunked", A + b"Transfer-Encoding: xchunked\r\n\r\n", "Transfer-Encoding other"),
    ("cl_twice", A + b"Content-Length: 3\r\nContent-Length: 3\r\n\r\n", "one decimal number"),
    ("cl_signed", A + b"Content-Length: +3\r\n\r\n", "one decimal number"),
    ("duplicate_host", A + b"Host: other.test\r\n\r\n", "exactly one Host"),
    ("missing_host_11", b"GET http://api.test/ HTTP/1.1\r\n\r\n", "exactly one Host"),
    ("duplicate_host_10", b"GET http://api.test/ HTTP/1.0\r\nHost: a\r\nHost: b\r\n\r\n", "exactly one Host"),
    ("leading_crlf", b"\r\n" + A + b"\r\n", "malformed request line"),
    ("double_space", b"GET  http://api.test/ HTTP/1.1\r\nHost: api.test\r\n\r\n", "malformed request line"),
    ("http2", b"GET http://api.test/ HTTP/2.0\r\nHost: api.test\r\n\r\n", "malformed request line"),
    ("connect_with_body", b"CONNECT a:443 HTTP/1.1\r\nHost: a:443\r\nContent-Length: 1\r\n\r\n", "CONNECT with a body"),
    ("connect_path", b"CONNECT a:443/x HTTP/1.1\r\nHost: a:443\r\n\r\n", "host:port"),
    ("connect_userinfo", b"CONNECT u@a:443 HTTP/1.1\r\nHost: a:443\r\n\r\n", "host:port"),
    ("connect_no_port", b"CONNECT a HTTP/1.1\r\nHost: a\r\n\r\n", "host:port"),
]


@pytest.mark.parametrize(("name", "head", "reason"), CASES, ids=[c[0] for c in CASES])
def test_check_head(name: str, head: bytes, reason: str | None) -> None:
    """Each head is accepted or refused with a reason naming the problem."""
    got = check_head(head)
    if reason is None:
        assert got is None
    else:
        assert got is not None and reason in got


def test_bare_line_end_found_in_an_incomplete_head() -> None:
    """A bare LF is refused as soon as it is read; a CR as the last byte read is not judged yet."""
    assert "bare LF" in (bad_line_end(b"GET / HTTP/1.1\nHo") or "")
    assert bad_line_end(b"GET / HTTP/1.1\r") is None
    assert "bare CR" in (bad_line_end(b"GET / HTTP/1.1\r", complete=True) or "")
    assert "bare CR" in (bad_line_end(b"GET / HTTP/1.1\rX") or "")
    assert bad_line_end(b"a\r\nb\r\n\r\n", start=3) is None


def test_bare_lf_found_from_a_resumed_scan() -> None:
    """Scanning resumes where it stopped and still sees a bare LF right after a CR read earlier."""
    buf = b"GET / HTTP/1.1\r\nX: a\r"
    assert bad_line_end(buf) is None
    buf += b"Y"
    assert "bare CR" in (bad_line_end(buf, start=len(buf) - 2) or "")
