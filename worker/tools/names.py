"""File names on the wire: a name that is not valid UTF-8 is sent quoted, and taken back quoted.

Python reads such a name with lone surrogates (``name_\\udcff``); JSON-encoded, those are
unpaired ``\\udcff`` escapes that strict parsers (Go, serde_json) refuse, with the whole response.
So a path whose bytes are not UTF-8 is shown as git and GNU tools show it: in double quotes,
``\\xHH`` for each byte that does not decode, ``\\\\`` and ``\\"`` for a backslash and a quote,
every other character as itself: ``"/workspace/name_\\xff\\xfe.txt"``. Every other path is shown
as it is (no result path is quoted unless it must be). A result path always starts with ``/``,
so the quoted form always starts with ``"/``: a path given to a tool that starts with ``"/`` and
ends with ``"`` is read back this way (a relative path whose first directory is named ``"`` is
written ``./"/...``). Escapes make the quoting unambiguous: a name that really contains ``\\xff``
as four characters is shown as itself when it is UTF-8, and as ``\\\\xff`` inside quotes.
"""

from __future__ import annotations

import os
import re

from toolcage.worker.errors import BadParams

_ESCAPE = re.compile(r'\\(?:x([0-9a-fA-F]{2})|(["\\]))|(\\|")')


def to_wire(path: str) -> str:
    """``path`` as results and errors show it: itself if it is UTF-8 text, else quoted."""
    try:
        path.encode("utf-8")
        return path
    except UnicodeEncodeError:
        pass
    out = []
    for c in path:
        if "\udc80" <= c <= "\udcff":  # an undecodable byte, as os.fsdecode (surrogateescape) keeps it
            out.append(f"\\x{ord(c) - 0xDC00:02x}")
        elif c in '\\"':
            out.append("\\" + c)
        elif "\ud800" <= c <= "\udfff":  # a lone surrogate no file name can hold (given by a client)
            out.append(f"\\u{ord(c):04x}")
        else:
            out.append(c)
    return '"' + "".join(out) + '"'


def is_quoted(path: str) -> bool:
    return len(path) >= 3 and path.startswith('"/') and path.endswith('"')


def from_wire(path: str) -> str:
    """The path a tool was given, with a quoted name (:func:`to_wire`) turned back into the name
    the file system holds (undecodable bytes as surrogates, as Python names files)."""
    if not is_quoted(path):
        return path
    body = path[1:-1]
    raw = bytearray()
    pos = 0
    try:
        for m in _ESCAPE.finditer(body):
            raw += os.fsencode(body[pos : m.start()])
            if m.group(3) is not None:
                what = "a backslash that starts no escape" if m.group(3) == "\\" else "a double quote"
                raise _bad(
                    f"is quoted (it starts with '\"/' and ends with '\"'), but character {m.start() + 2} is "
                    f'{what}: inside the quotes write \\\\ for \\, \\" for ", \\xHH for a byte'
                )
            raw += bytes([int(m.group(1), 16)]) if m.group(1) is not None else m.group(2).encode()
            pos = m.end()
        raw += os.fsencode(body[pos:])
    except UnicodeEncodeError:
        raise _bad("is not valid text (a lone surrogate)") from None
    return os.fsdecode(bytes(raw))


def _bad(problem: str) -> BadParams:
    return BadParams(f"invalid params: path {problem}", [{"field": "path", "error": problem}])


__all__ = ["from_wire", "is_quoted", "to_wire"]
