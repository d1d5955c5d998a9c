"""Make strings that came from inside a sandbox safe to show on an operator's terminal.

Threat: the sandbox chooses egress targets and methods, error messages, worker stderr
lines, audit fields. Printed raw, control sequences erase or forge lines (``\\x1b[2K\\r``,
``\\r``, ``\\n``), retitle the terminal or write to its clipboard (OSC ``\\x1b]...\\x07``),
drive it through the one-byte CSI ``\\x9b``, and bidi overrides (``\\u202e``) reorder what
the operator reads. Every human-facing renderer (console logs, ``audit``, ``ps``,
``doctor``, ``gc``, CLI error lines) passes text through :func:`escape`; JSON output goes
through :func:`dumps`, which keeps it JSON and ASCII.
"""

from __future__ import annotations

import json
import re
from collections.abc import MutableMapping
from typing import Any

# C0, DEL, C1 (CSI U+009B, OSC U+009D, ...), the bidi marks, embeddings, overrides and isolates,
# and the Unicode line and paragraph separators
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def _visible(m: re.Match[str]) -> str:
    c = ord(m.group())
    return f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}"


def escape(value: object) -> str:
    """``value`` as text with every control character shown as a visible escape (``\\x1b``, ``\\u202e``)."""
    return _UNSAFE.sub(_visible, value if isinstance(value, str) else str(value))


def escape_lines(text: str) -> str:
    """Like :func:`escape`, but keeps the line breaks of text we laid out ourselves (tracebacks),
    each line indented: an exception message cannot start a line that looks like a log line."""
    return "\n".join("  " + escape(line) for line in text.split("\n"))


def dumps(obj: Any, **kw: Any) -> str:
    """json.dumps with ``ensure_ascii`` (C1 and bidi become ``\\uXXXX``) and DEL escaped too."""
    kw["ensure_ascii"] = True
    return json.dumps(obj, **kw).replace("\x7f", "\\u007f")  # DEL only occurs inside JSON strings


def console_processor(_logger: Any, _name: str, event_dict: MutableMapping[str, Any]) -> dict[str, Any]:
    """structlog processor for the console renderer: keys and text values are escaped; other
    values keep their type when their repr (what the renderer prints) is already clean, else
    they are replaced by their escaped repr."""
    out: dict[str, Any] = {}
    for key, value in event_dict.items():
        if key == "exception" and isinstance(value, str):
            out[key] = escape_lines(value)
        elif isinstance(value, str):
            out[escape(key)] = escape(value)
        elif value is None or isinstance(value, bool | int | float):
            out[escape(key)] = value
        else:
            r = repr(value)
            out[escape(key)] = value if not _UNSAFE.search(r) else escape(r)
    return out


__all__ = ["console_processor", "dumps", "escape", "escape_lines"]
