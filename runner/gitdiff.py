"""A diff in git's format, from bytes: what ``git apply`` takes, binary files and symlinks included.

Text files (valid UTF-8, no NUL byte) get unified hunks with three lines of context and git's
``\\ No newline at end of file``; anything else a ``GIT binary patch`` (the new content as a zlib
``literal``, base85, and the old one as its reverse, so ``git apply -R`` works too), with the full
``index`` line of blob ids that ``git apply`` requires before it applies one. Modes are git's three:
``100644``, ``100755`` and ``120000`` (a symlink, whose content is its target). Names are quoted as
git quotes them (C escapes, octal for bytes that are not printable ASCII), so a name with a newline
or a control character cannot start a line of its own. Pure functions: no file system, no git.
"""

from __future__ import annotations

import base64
import difflib
import hashlib
import zlib
from dataclasses import dataclass

FILE, EXEC, LINK = "100644", "100755", "120000"
_NULL = "0" * 40
_ESC = {7: "\\a", 8: "\\b", 9: "\\t", 10: "\\n", 11: "\\v", 12: "\\f", 13: "\\r", 34: '\\"', 92: "\\\\"}


@dataclass(frozen=True)
class Side:
    """One side of a change: a file's (or a symlink's target's) bytes and its git mode."""

    data: bytes
    mode: str = FILE


def blob_id(data: bytes) -> str:
    """The git blob id (SHA-1) of ``data``."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data, usedforsecurity=False).hexdigest()


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


def _is_text(data: bytes) -> bool:
    if b"\0" in data:
        return False
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _lines(data: bytes) -> list[bytes]:
    """Lines as git counts them: each ends at ``\n`` (a ``\r`` is part of its line)."""
    parts = data.split(b"\n")
    lines = [p + b"\n" for p in parts[:-1]]
    if parts[-1]:
        lines.append(parts[-1])
    return lines


def _hunks(old: bytes, new: bytes, a: str, b: str) -> list[str]:
    out = []
    lines = difflib.diff_bytes(
        difflib.unified_diff,
        _lines(old),
        _lines(new),
        a.encode(),
        b.encode(),
        n=3,
        lineterm=b"\n",
    )
    for i, line in enumerate(lines):
        if i < 2:  # the ---/+++ lines: written by the caller (quoted, or /dev/null)
            continue
        text = line.decode("utf-8")
        if text.startswith("@@"):
            out.append(text if text.endswith("\n") else text + "\n")
        elif text.endswith("\n"):
            out.append(text)
        else:
            out.append(text + "\n\\ No newline at end of file\n")
    return out


def _base85_lines(data: bytes) -> list[str]:
    packed = zlib.compress(data, 9)
    out = []
    for i in range(0, len(packed), 52):
        piece = packed[i : i + 52]
        n = len(piece)
        head = chr(ord("A") + n - 1) if n <= 26 else chr(ord("a") + n - 27)
        out.append(head + base64.b85encode(piece, pad=True).decode("ascii") + "\n")
    return out


def _binary(old: bytes, new: bytes) -> list[str]:
    return [
        "GIT binary patch\n",
        f"literal {len(new)}\n",
        *_base85_lines(new),
        "\n",
        f"literal {len(old)}\n",
        *_base85_lines(old),
        "\n",
    ]


def file_diff(path: bytes, old: Side | None, new: Side | None) -> str:
    """The diff of one path from ``old`` to ``new`` (None: absent on that side); "" when they are equal."""
    if old == new:
        return ""
    a, b = quote(path, "a/"), quote(path, "b/")
    if old is not None and new is not None and (old.mode == LINK) != (new.mode == LINK):
        # a file became a symlink or back: git writes a deletion and a creation
        return file_diff(path, old, None) + file_diff(path, None, new)
    head = [f"diff --git {a} {b}\n"]
    old_data = old.data if old is not None else b""
    new_data = new.data if new is not None else b""
    old_id = blob_id(old_data) if old is not None else _NULL
    new_id = blob_id(new_data) if new is not None else _NULL
    if old is None:
        assert new is not None
        head.append(f"new file mode {new.mode}\n")
        head.append(f"index {old_id}..{new_id}\n")
    elif new is None:
        head.append(f"deleted file mode {old.mode}\n")
        head.append(f"index {old_id}..{new_id}\n")
    else:
        if old.mode != new.mode:
            head += [f"old mode {old.mode}\n", f"new mode {new.mode}\n"]
        if old_data == new_data:
            return "".join(head)  # a mode change alone
        head.append(f"index {old_id}..{new_id}\n" if old.mode != new.mode else f"index {old_id}..{new_id} {new.mode}\n")
    if old_data == new_data:  # an empty file made or removed
        return "".join(head)
    if _is_text(old_data) and _is_text(new_data):
        head.append(f"--- {a if old is not None else '/dev/null'}\n")
        head.append(f"+++ {b if new is not None else '/dev/null'}\n")
        return "".join(head + _hunks(old_data, new_data, "a", "b"))
    return "".join(head + _binary(old_data, new_data))


__all__ = ["EXEC", "FILE", "LINK", "Side", "blob_id", "file_diff", "quote"]
