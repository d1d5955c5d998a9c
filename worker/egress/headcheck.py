"""Strict checks on a raw HTTP/1.1 request head, run by the egress proxy before h11 parses it.

h11 0.16 is lenient where a back end may read the bytes differently: it accepts bare LF
line ends, unfolds obs-fold continuation lines, and frames by Transfer-Encoding when
Content-Length is also present (RFC 9112 §6.3 allows that; a proxy must not forward it).
Each of those is a request-smuggling primitive (one request to the proxy, two to the
upstream), so the proxy refuses them here, on the raw bytes, and lets h11 do the rest.
Every function returns a reason (a sentence) or None.
"""

from __future__ import annotations

import re

# RFC 9112 §2.2: a recipient MAY accept bare LF; a proxy forwarding to a back end that
# splits lines differently MUST NOT. Bare CR is invalid outright.
_BAD_EOL = re.compile(rb"(?<!\r)\n|\r(?!\n)")
_TOKEN = re.compile(rb"[!#$%&'*+.^_`|~0-9A-Za-z-]+")  # RFC 9110 §5.6.2
_CTL_IN_VALUE = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")  # HTAB is the only control allowed (RFC 9110 §5.5)
_REQUEST_LINE = re.compile(rb"([!#$%&'*+.^_`|~0-9A-Za-z-]+) ([\x21-\x7e]+) HTTP/1\.[01]")
_AUTHORITY = re.compile(r"(\[[0-9A-Fa-f:.]+\]|[^\s/?#@\[\]:]+):[0-9]{1,5}")


def bad_line_end(buf: bytes | bytearray, start: int = 0, end: int | None = None, complete: bool = False) -> str | None:
    """A bare LF or bare CR in ``buf[start:end]``; a CR as the very last byte of an incomplete
    head is not judged yet (its LF may be in the next read)."""
    stop = len(buf) if end is None else end
    m = _BAD_EOL.search(buf, max(start, 0), stop)
    if m is None:
        return None
    if m.group() == b"\r" and m.start() == stop - 1 and not complete:
        return None
    kind = "bare LF" if m.group() == b"\n" else "bare CR"
    return f"{kind} in the request head (line ends must be CRLF: request smuggling)"


def check_head(head: bytes) -> str | None:
    """Structure of a complete head (ending in CRLF CRLF): request line, header lines, framing, Host."""
    if not head.endswith(b"\r\n\r\n"):
        return "incomplete request head"
    problem = bad_line_end(head, complete=True)
    if problem:
        return problem
    lines = head[:-4].split(b"\r\n")
    m = _REQUEST_LINE.fullmatch(lines[0])
    if m is None:
        return "malformed request line (expected METHOD SP target SP HTTP/1.x, nothing before it)"
    counts: dict[bytes, list[bytes]] = {}
    for line in lines[1:]:
        if line[:1] in (b" ", b"\t"):
            # obs-fold (RFC 9112 §5.2): h11 would join the lines; a back end may not
            return "obs-fold (a header line starting with whitespace) is refused"
        name, colon, value = line.partition(b":")
        if not colon:
            return "malformed header line (no colon)"
        if _TOKEN.fullmatch(name) is None:
            # "Transfer-Encoding : chunked": ignored by one parser, honoured by another
            shown = name.decode("latin-1")[:64]
            return f"bad header name {shown!r}: whitespace or a non-token character in a header name"
        if _CTL_IN_VALUE.search(value):
            return f"control character in the value of header {name.decode('latin-1')!r}"
        counts.setdefault(name.lower(), []).append(value.strip(b" \t"))
    hosts = counts.get(b"host", [])
    # RFC 9112 §3.2: HTTP/1.1 requires exactly one Host. HTTP/1.0 (Python's CONNECT, for one)
    # may omit it; the proxy then names the target itself. Two are refused in any version.
    if len(hosts) > 1 or (not hosts and lines[0].endswith(b"HTTP/1.1")):
        return f"exactly one Host header is required (found {len(hosts)})"
    te, cl = counts.get(b"transfer-encoding"), counts.get(b"content-length")
    if te is not None and cl is not None:
        return "Content-Length and Transfer-Encoding together are refused (request smuggling: CL.TE / TE.CL)"
    if te is not None and (len(te) != 1 or te[0].lower() != b"chunked"):
        return "Transfer-Encoding other than one 'chunked' is refused"
    if cl is not None and (len(cl) != 1 or not cl[0].isdigit() or len(cl[0]) > 15):
        return "Content-Length must be one decimal number"
    if m.group(1) == b"CONNECT":
        if te is not None or cl is not None:
            return "CONNECT with a body is refused"
        if _AUTHORITY.fullmatch(m.group(2).decode("ascii")) is None:
            return "CONNECT target must be host:port"
    return None
