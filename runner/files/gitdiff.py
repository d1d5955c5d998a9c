"""git's names in a diff, for the runner that reads git's own output (toolcage.files.gitplumb makes the diff).

Modes are git's three: ``100644``, ``100755`` and ``120000`` (a symlink, whose content is its target).
Names are quoted as git quotes them with ``core.quotePath`` (C escapes, octal for bytes that are not
printable ASCII), so a name with a newline or a control character cannot start a line of its own; the
runner matches each ``diff --git`` line of git's patch to its path by this quoting. The line diff that
lived here (difflib over every line held as a Python object, quadratic) was the host's cost the
sandbox chose (issue 34): git's xdiff in a bounded child process does it now. Pure functions.
"""

from __future__ import annotations

FILE, EXEC, LINK = "100644", "100755", "120000"
_ESC = {7: "\\a", 8: "\\b", 9: "\\t", 10: "\\n", 11: "\\v", 12: "\\f", 13: "\\r", 34: '\\"', 92: "\\\\"}


def quote(name: bytes, prefix: str) -> str:
    """``prefix`` + ``name`` as git writes a path in a diff: as is, or in double quotes with escapes."""
    full = prefix.encode() + name
    if all(0x20 <= b < 0x7F and b not in (0x22, 0x5C) for b in full):
        return full.decode("ascii")
    out = []
    for b in full:
        if b in _ESC:
            out.append(_ESC[b])
        elif 0x20 <= b < 0x7F:
            out.append(chr(b))
        else:
            out.append(f"\\{b:03o}")
    return '"' + "".join(out) + '"'


def header(name: bytes) -> bytes:
    """The ``diff --git`` line git writes for ``name`` (without its newline)."""
    return f"diff --git {quote(name, 'a/')} {quote(name, 'b/')}".encode("ascii")


__all__ = ["EXEC", "FILE", "LINK", "header", "quote"]
