"""``.gitignore`` matching in pure Python, shared by the file tools and the host's workspace copy (no git is assumed).

The rules git documents (gitignore(5)), for the cases repositories use:

- blank lines and ``#`` lines are skipped; trailing spaces are dropped unless escaped (``\\ ``);
  ``\\#`` and ``\\!`` start a pattern with a literal ``#`` or ``!``;
- ``!pat`` re-includes what an earlier pattern ignored (but nothing under an ignored
  directory: the walk never enters one, as git never does);
- ``dir/`` matches directories only;
- a pattern with a ``/`` at its start or in its middle is anchored to the directory of its
  ``.gitignore``; one without matches a name at any depth below it;
- ``*`` and ``?`` never match ``/``, ``[a-z]`` / ``[!a-z]`` are classes; ``**/x``, ``x/**`` and
  ``a/**/b`` span directories; any other ``**`` is a ``*``;
- the last matching line of a file wins; a deeper ``.gitignore`` wins over a shallower one.

A :class:`Rules` compiles one file's lines into two regexes (for files, for directories), each
an alternation of every line, last line first, so one ``fullmatch`` finds the deciding line.
The same syntax serves the tools' ``include`` and ``exclude`` globs.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

_POSIX = {
    "alnum": "a-zA-Z0-9",
    "alpha": "a-zA-Z",
    "digit": "0-9",
    "lower": "a-z",
    "upper": "A-Z",
    "space": " \\t\\n\\r\\f\\v",
    "xdigit": "0-9a-fA-F",
    "punct": re.escape("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~"),
}
_NEVER = "(?!)"


def _class(pat: str, i: int) -> tuple[str, int]:
    """The regex for the bracket expression starting at ``pat[i] == "["``, and the index after it."""
    j = i + 1
    negate = j < len(pat) and pat[j] in "!^"
    if negate:
        j += 1
    items: list[str] = []
    first = True
    while j < len(pat):
        c = pat[j]
        if c == "]" and not first:
            body = "".join(items)
            return (f"[^/{body}]" if negate else f"(?!/)[{body}]"), j + 1
        first = False
        if c == "[" and pat.startswith("[:", j):
            end = pat.find(":]", j + 2)
            if end != -1 and pat[j + 2 : end] in _POSIX:
                items.append(_POSIX[pat[j + 2 : end]])
                j = end + 2
                continue
        if c == "\\" and j + 1 < len(pat):
            j += 1
            c = pat[j]
        if j + 2 < len(pat) and pat[j + 1] == "-" and pat[j + 2] != "]":
            hi = pat[j + 2]
            if hi == "\\" and j + 3 < len(pat):
                hi = pat[j + 3]
                j += 1
            items.append(f"{re.escape(c)}-{re.escape(hi)}")
            j += 3
            continue
        items.append(re.escape(c))
        j += 1
    return _NEVER, len(pat)  # no closing "]": git's wildmatch matches nothing


def translate(pat: str) -> str:
    """The regex (for ``fullmatch`` on a ``/``-joined path) of one glob, already stripped of
    ``!``, a trailing ``/`` and a leading ``/``."""
    out: list[str] = []
    i, n = 0, len(pat)
    while i < n:
        c = pat[i]
        if c == "*":
            j = i
            while j < n and pat[j] == "*":
                j += 1
            stars = j - i
            at_start = i == 0 or pat[i - 1] == "/"
            at_end = j == n or pat[j] == "/"
            if stars >= 2 and at_start and at_end:
                if j == n:  # "x/**" (or "**" alone): everything inside
                    out.append(".*")
                else:  # "**/x", "a/**/b": zero or more directories
                    out.append("(?:.*/)?")
                    j += 1
            else:
                out.append("[^/]*")
            i = j
            continue
        if c == "?":
            out.append("[^/]")
        elif c == "[":
            rx, i = _class(pat, i)
            out.append(rx)
            continue
        elif c == "\\" and i + 1 < n:
            i += 1
            out.append(re.escape(pat[i]))
        else:
            out.append(re.escape(c))
        i += 1
    return "".join(out)


def parse_line(line: str) -> tuple[str, bool, bool] | None:
    """(regex, negated, directory-only) of one ``.gitignore`` line; None for a blank or comment."""
    line = line.rstrip("\n").rstrip("\r")
    if not line or line.startswith("#"):
        return None
    # trailing spaces go unless escaped
    stripped = line.rstrip(" ")
    if stripped != line and stripped.endswith("\\") and (len(stripped) - len(stripped.rstrip("\\"))) % 2 == 1:
        stripped += " "
    line = stripped
    negated = line.startswith("!")
    if negated:
        line = line[1:]
    dir_only = line.endswith("/")
    line = line.rstrip("/")
    if not line:
        return None
    anchored = "/" in line
    line = line.lstrip("/")
    if not line:
        return None
    rx = translate(line)
    return (rx if anchored else "(?:.*/)?" + rx), negated, dir_only


class Rules:
    """One ``.gitignore`` (or one list of globs), for paths relative to its directory ``base``
    (``""`` for the top of the walk, else ``"a/b"``)."""

    __slots__ = ("_dirs", "_files", "_negated_dirs", "_negated_files", "base")

    def __init__(self, lines: Iterable[str], base: str = "") -> None:
        self.base = base
        parsed = [r for r in (parse_line(x) for x in lines) if r is not None]
        self._files, self._negated_files = self._compile([r for r in parsed if not r[2]])
        self._dirs, self._negated_dirs = self._compile(parsed)

    @staticmethod
    def _compile(parsed: Sequence[tuple[str, bool, bool]]) -> tuple[re.Pattern[str] | None, list[bool]]:
        if not parsed:
            return None, []
        last_first = list(reversed(parsed))
        rx = re.compile("|".join(f"({r})" for r, _, _ in last_first), re.DOTALL)
        return rx, [neg for _, neg, _ in last_first]

    def decide(self, rel: str, is_dir: bool) -> bool | None:
        """True (ignored), False (re-included by ``!``) or None (no line matches) for ``rel``,
        a path relative to this file's directory."""
        rx, negated = (self._dirs, self._negated_dirs) if is_dir else (self._files, self._negated_files)
        if rx is None:
            return None
        m = rx.fullmatch(rel)
        if m is None:
            return None
        return not negated[(m.lastindex or 1) - 1]


def ignored(stack: Sequence[Rules], path: str, is_dir: bool) -> bool:
    """Whether ``path`` (relative to the top of the walk) is ignored by the ``.gitignore`` files
    ``stack`` (shallowest first, each one's ``base`` an ancestor directory of ``path``)."""
    for rules in reversed(stack):
        rel = path[len(rules.base) + 1 :] if rules.base else path
        verdict = rules.decide(rel, is_dir)
        if verdict is not None:
            return verdict
    return False


def matches(rules: Rules, path: str, is_dir: bool) -> bool:
    """Whether a glob list (``include``/``exclude``) matches ``path``: any glob, no ``!``."""
    return rules.decide(path, is_dir) is True


__all__ = ["Rules", "ignored", "matches", "parse_line", "translate"]


MAX_FILE = 1 << 20  # the most of one .gitignore file that is read


def with_own(stack: tuple[Rules, ...], dir_fd: int, base: str) -> tuple[Rules, ...]:
    """``stack`` with the rules of the directory ``dir_fd``'s own .gitignore after it (``base``: that directory,
    relative to the root). Only a regular file counts: a symlink is not followed, a FIFO never opened for
    long (``O_NONBLOCK``); at most :data:`MAX_FILE` bytes of it are read."""
    import os
    import stat

    try:
        fd = os.open(".gitignore", os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError:
        return stack
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return stack
        data = os.read(fd, MAX_FILE)
    finally:
        os.close(fd)
    return (*stack, Rules(data.decode("utf-8", errors="surrogateescape").split("\n"), base))
