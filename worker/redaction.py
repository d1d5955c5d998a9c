"""What redaction recognises of a secret's value, and how a cut never leaves a part of one.

Threat: a handler that may only *use* a secret (``auth=``) gets the bound host to echo it
back: with its own text before it, so that a length limit cuts inside the value (a prefix per
fetch, then the whole value by moving the cut), or in a form that the handler picked (base64,
hex, UTF-16, percent-encoded), which plain search for the value misses.

So every limit cuts *after* redaction, and a value that starts before the cut is removed
whole (:meth:`Redactor.cut` is given enough bytes past the limit to see all of it). Nothing
depends on whether text at the cut is the start of a secret: a cut that dropped such a
prefix would tell the handler, one character at a time, which of its guesses were right.

Recognised, for each value: the value itself; its JSON string forms (``\\uXXXX`` escapes,
``\\/``); its HTML escape; its percent-encodings (``quote``, ``quote_plus``, upper-case
hex); its hex (lower and upper case); its base64 and URL-safe base64 at any alignment, so
also inside the base64 of a longer text such as ``Bearer <value>`` or ``user:<value>``
(the characters that mix the value's bits with a neighbour's go too); for a value that is
itself base64 (a Basic credential), the text it decodes to; and, in bytes, the value in
UTF-16 and UTF-32 (either byte order). Not recognised: any other transformation (a
compression, an encryption or hash, case changes, base64 with line breaks, an escape of
every character, the value split across lines or fields), and a part of the value that the
bound host itself cuts off. The transport that could produce most of these on the handler's
request (content codings, ranges, charsets) is decided by SafeFetch (worker.egress.safefetch).
"""

from __future__ import annotations

import base64
import binascii
import html
import json
import re
from typing import NamedTuple
from urllib.parse import quote, quote_plus

_B64 = {"std": (base64.b64encode, "A-Za-z0-9+/"), "url": (base64.urlsafe_b64encode, "A-Za-z0-9_-")}
_WIDE = ("utf-16-le", "utf-16-be", "utf-32-le", "utf-32-be")


class _Needle(NamedTuple):
    literal: str  # what is looked for first (a fast substring test)
    pattern: str  # the regular expression that finds it, its edges included
    span: int  # the most characters the pattern can match


def _base64_cores(raw: bytes) -> list[_Needle]:
    """The characters of base64(prefix + raw + suffix) that depend on ``raw`` alone, at each of the three
    alignments, with the one character on each side that mixes its bits with a neighbour's."""
    out = []
    for encode, alphabet in _B64.values():
        for shift in range(3):
            enc = encode(b"\0" * shift + raw + b"\0\0").decode()
            start, end = 8 * shift, 8 * (shift + len(raw))  # the value's bits
            core = enc[-(-start // 6) : end // 6]
            before = f"[{alphabet}]?" if start % 6 else ""
            after = f"[{alphabet}]?" if end % 6 else ""
            out.append(_Needle(core, before + re.escape(core) + after, len(core) + 2))
    return out


def text_forms(value: str) -> list[_Needle]:
    """Every form of ``value`` recognised in text (see the module's docstring)."""
    sp = "surrogatepass"  # a value from the environment may hold lone surrogates (undecodable bytes)
    forms = {value, html.escape(value), quote(value, "", errors=sp), quote(value, errors=sp)}
    forms.add(quote_plus(value, "", errors=sp))
    for ascii_only in (True, False):
        escaped = json.dumps(value, ensure_ascii=ascii_only)[1:-1]
        forms |= {escaped, escaped.replace("/", "\\/")}
    raw = value.encode("utf-8", errors="surrogatepass")
    forms |= {raw.hex(), raw.hex().upper()}
    try:  # a Basic credential: base64 of user:password; the host may echo it decoded
        decoded = base64.b64decode(value, validate=True).decode("utf-8")
        if len(decoded) >= 8 and decoded.isprintable():
            forms.add(decoded)
    except (binascii.Error, ValueError):
        pass
    needles = [_Needle(f, re.escape(f), len(f)) for f in forms if f] + _base64_cores(raw)
    return list({n.pattern: n for n in needles}.values())  # the two base64 alphabets agree on most values


def _utf8(s: str) -> bytes:
    return s.encode("utf-8", errors="surrogatepass")


class Redactor:
    """The run's values, in every recognised form, each replaced by ``[secret NAME]``."""

    def __init__(self, values: dict[str, str]) -> None:
        text: list[tuple[_Needle, str]] = []
        data: list[tuple[bytes, bytes, bytes, int]] = []  # literal, pattern, mark, span
        for name, value in values.items():
            mark = f"[secret {name}]"
            for n in text_forms(value):
                text.append((n, mark))
                data.append((_utf8(n.literal), _utf8(n.pattern), _utf8(mark), len(_utf8(n.literal)) + 2))
            for codec in _WIDE:  # the mark in the same encoding: the rest of the text still decodes
                wide = value.encode(codec, errors="surrogatepass")
                data.append((wide, re.escape(wide), mark.encode(codec), len(wide)))
        self._text = sorted(text, key=lambda t: -t[0].span)  # longest first where two start at one place
        self._data = sorted(data, key=lambda d: -d[3])
        self.lookahead = max((d[3] for d in self._data), default=0)  # bytes past a cut that hold a whole value

    def __bool__(self) -> bool:
        return bool(self._text)

    def text(self, s: str) -> str:
        present = [(n.pattern, mark) for n, mark in self._text if n.literal in s]
        if not present:
            return s
        rx = re.compile("|".join(f"({p})" for p, _ in present))
        return rx.sub(lambda m: present[(m.lastindex or 1) - 1][1], s)

    def data(self, b: bytes) -> bytes:
        return self.cut(b, len(b))

    def cut(self, b: bytes, limit: int) -> bytes:
        """``b[:limit]`` redacted, where a value that starts before ``limit`` is removed whole. ``b`` must hold
        ``lookahead`` bytes past ``limit`` (or all there is): then no value is ever cut in two."""
        present = [(p, mark) for literal, p, mark, _ in self._data if literal in b]
        if not present:
            return b[:limit]
        rx = re.compile(b"|".join(b"(" + p + b")" for p, _ in present))
        out, pos = [], 0
        for m in rx.finditer(b):
            if m.start() >= limit:
                break
            out += [b[pos : m.start()], present[(m.lastindex or 1) - 1][1]]
            pos = m.end()
        if pos < limit:
            out.append(b[pos:limit])
        return b"".join(out)
