"""The explore tools (list_files, read_file, grep over /workspace and /scratch), write_file and remove
(/scratch, and /workspace when it is a writable copy: ``writable``).

One path rule for every tool (worker.tools.paths.locate): relative paths are relative to
/scratch, as in run_python; results name files by absolute path, so any can be passed back.
Every file is opened through a directory fd of its root, and read from the fd that was
opened: a symlink swapped in between a check and a use cannot redirect a read, a walk or a
write out of the roots.
"""

from __future__ import annotations

import base64
import contextlib
import errno
import os
import re
import shutil
import stat
from collections.abc import Generator, Iterator
from typing import Annotated, Any, Literal

from annotated_types import Ge, Le, MaxLen, MinLen

from toolcage.policies.gitignore import Rules, ignored, matches
from toolcage.worker.errors import BadParams, NoSpace, PathEscape, ToolError
from toolcage.worker.settings import SCRATCH, WORKSPACE, Settings
from toolcage.worker.tools import Tool
from toolcage.worker.tools._params import doc, params
from toolcage.worker.tools.names import from_wire
from toolcage.worker.tools.paths import (
    MAX_PATH,
    Located,
    dir_beneath,
    locate,
    open_beneath,
    opened,
    path_data,
    root_fd,
    translate,
)

_MAX_GREP_FILE = 8 * 1024 * 1024
_MAX_GITIGNORE = 1024 * 1024  # a .gitignore larger than this is read up to here

_Glob = Annotated[str, MinLen(1), MaxLen(MAX_PATH)]
_Globs = Annotated[tuple[_Glob, ...], MaxLen(256)]
_GITIGNORE_DOC = (
    "skip what the .gitignore files say git ignores (those of the directory, of its parents up to the "
    "root, and nested ones; an ignored directory is not entered) and .git itself"
)
_INCLUDE_DOC = (
    "globs, .gitignore syntax, relative to path (*.py matches at any depth, src/**/*.ts from path): "
    "only matching files are returned"
)
_EXCLUDE_DOC = (
    "globs, .gitignore syntax, relative to path (node_modules/, *.min.js): matches are skipped, directories not entered"
)

# said in every file tool's description (and run_python's): the rule an agent must not have to guess
PATH_RULE = (
    f"Paths: absolute under {WORKSPACE} (the project, read-only unless the run has a writable copy of it; "
    f"present only if the run has a workspace) or {SCRATCH} (writable); a relative path is relative to "
    f"{SCRATCH}, the working directory of run_python and run_shell. Results give absolute paths."
)


@params
class ListFilesParams:
    path: Annotated[str, MaxLen(MAX_PATH)] = doc(f"directory; relative to {SCRATCH}", WORKSPACE)
    recursive: bool = False
    max_entries: Annotated[int, Ge(1), Le(100_000)] = 1000
    gitignore: bool = doc(_GITIGNORE_DOC, False)
    include: _Globs = doc(_INCLUDE_DOC.replace("files", "entries"), ())
    exclude: _Globs = doc(_EXCLUDE_DOC, ())


@params
class ReadFileParams:
    path: Annotated[str, MaxLen(MAX_PATH)] = doc(f"file, e.g. {WORKSPACE}/README.md; relative to {SCRATCH}")
    offset: Annotated[int, Ge(0)] = doc("bytes to skip: into the file, or into the lines asked for", 0)
    max_bytes: Annotated[int, Ge(1)] | None = doc("default: the policy's output cap", None)
    # ints with defaults, not optional: a bad value is then named plainly ("must be greater than or equal to 1")
    start_line: Annotated[int, Ge(0)] = doc("first line to read, 1-based (lines end at \\n); 0: not by lines", 0)
    end_line: Annotated[int, Ge(0)] = doc("last line to read, inclusive; 0: to the end of the file", 0)


@params
class GrepParams:
    pattern: Annotated[str, MinLen(1), MaxLen(4096)] = doc("a Python regular expression, or text with fixed_string")
    path: Annotated[str, MaxLen(MAX_PATH)] = doc(f"file or directory to search; relative to {SCRATCH}", WORKSPACE)
    fixed_string: bool = False
    ignore_case: bool = False
    max_matches: Annotated[int, Ge(1), Le(100_000)] = 200
    gitignore: bool = doc(_GITIGNORE_DOC, False)
    include: _Globs = doc(_INCLUDE_DOC, ())
    exclude: _Globs = doc(_EXCLUDE_DOC, ())


@params
class WriteFileParams:
    path: Annotated[str, MaxLen(MAX_PATH)] = doc(f"file under {SCRATCH}; relative to {SCRATCH}")
    content: str = doc("the file's content, as text or base64")
    encoding: Literal["utf-8", "base64"] = "utf-8"
    append: bool = False


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "dir"
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISLNK(mode):
        return "symlink"
    return "other"


# O_NONBLOCK: a FIFO planted under a root must not hang the call at open(); O_NOCTTY: a tty
# must not become the worker's controlling terminal
_READ = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY


class _Filter:
    """Which entries a walk skips: .gitignore (``gitignore``), ``include`` and ``exclude`` globs.

    .gitignore paths are matched relative to the root (/workspace, /scratch), so the files of
    the walk's parents apply; the globs relative to the walk's top. ``stack`` of a directory is
    the .gitignore files above it (shallowest first); the walk adds its own when it enters it.
    """

    def __init__(self, loc: Located, gitignore: bool, include: tuple[str, ...], exclude: tuple[str, ...]) -> None:
        self.gitignore = gitignore
        self.include = Rules(include) if include else None
        self.exclude = Rules(exclude) if exclude else None
        self.top = "" if loc.rel == "." else loc.rel
        self.pending: dict[str, tuple[Rules, ...]] = {}
        if gitignore:
            self.pending[""] = self._parents(loc)

    @property
    def active(self) -> bool:
        return self.gitignore or self.include is not None or self.exclude is not None

    def _parents(self, loc: Located) -> tuple[Rules, ...]:
        """The .gitignore files of the root and of each directory down to (not including) the top."""
        if loc.real is None or not self.top:
            return ()
        parts = self.top.split("/")
        stack: list[Rules] = []
        with root_fd(loc.real) as rfd:
            for depth in range(len(parts)):
                base = "/".join(parts[:depth])
                try:
                    fd = open_beneath(rfd, os.path.join(base, ".gitignore") if base else ".gitignore", _READ)
                except OSError:
                    continue
                try:
                    rules = _load_rules(fd, base)
                finally:
                    os.close(fd)
                if rules is not None:
                    stack.append(rules)
        return tuple(stack)

    def enter(self, rel: str, dfd: int) -> tuple[Rules, ...]:
        """The .gitignore stack in force inside the directory ``rel`` (relative to the top)."""
        stack = self.pending.pop(rel, ())
        if not self.gitignore:
            return stack
        try:
            fd = os.open(".gitignore", _READ | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dfd)
        except OSError:
            return stack
        try:
            own = _load_rules(fd, self._rooted(rel))
        finally:
            os.close(fd)
        return stack if own is None else (*stack, own)

    def _rooted(self, rel: str) -> str:
        if not self.top:
            return rel
        return f"{self.top}/{rel}" if rel else self.top

    def skip(self, stack: tuple[Rules, ...], rel: str, is_dir: bool) -> bool:
        """Whether ``rel`` (relative to the top) is neither returned nor, for a directory, entered."""
        if self.gitignore:
            if rel.rsplit("/", 1)[-1] == ".git":  # the repository (a file in a worktree or submodule)
                return True
            if stack and ignored(stack, self._rooted(rel), is_dir):
                return True
        return self.exclude is not None and matches(self.exclude, rel, is_dir)

    def wanted(self, rel: str, is_dir: bool) -> bool:
        """Whether ``include`` (if given) lets ``rel`` be returned; directories are still entered."""
        return self.include is None or matches(self.include, rel, is_dir)


def _load_rules(fd: int, base: str) -> Rules | None:
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        return None
    data = _read_fd(fd, _MAX_GITIGNORE)
    return Rules(data.decode("utf-8", errors="surrogateescape").split("\n"), base)


def _walk(fd: int, filt: _Filter | None = None) -> Iterator[tuple[str, list[str], list[str], int]]:
    """os.fwalk from an open directory fd, never following symlinks: a directory swapped for a
    symlink mid-walk is not entered (fwalk compares the opened fd with the lstat it listed).
    With a filter, skipped directories are taken out of the walk (never entered) and skipped
    files out of the names; ``dirpath`` is relative to the top ("" for the top itself)."""
    walker: Generator[tuple[str, list[str], list[str], int], None, None]
    walker = os.fwalk(".", dir_fd=fd, follow_symlinks=False)  # type: ignore[assignment]
    with contextlib.closing(walker):
        for dirpath, dirnames, filenames, dfd in walker:
            rel = "" if dirpath == "." else dirpath[2:]
            if filt is not None and filt.active:
                stack = filt.enter(rel, dfd)
                prefix = f"{rel}/" if rel else ""
                dirnames[:] = [d for d in dirnames if not filt.skip(stack, prefix + d, True)]
                filenames[:] = [f for f in filenames if not filt.skip(stack, prefix + f, False)]
                if filt.gitignore:
                    for d in dirnames:
                        filt.pending[prefix + d] = stack
            dirnames.sort()
            filenames.sort()
            yield rel, dirnames, filenames, dfd


def list_files(s: Settings, p: ListFilesParams) -> dict[str, Any]:
    loc = locate(p.path, s.workspace, s.scratch)
    entries: list[dict[str, Any]] = []
    truncated = False
    with opened(loc, _READ | os.O_DIRECTORY) as fd:
        filt = _Filter(loc, p.gitignore, p.include, p.exclude)
        for dirpath, dirnames, filenames, dfd in _walk(fd, filt):
            dirs = set(dirnames)
            for name in sorted(dirnames + filenames):
                if not filt.wanted(f"{dirpath}/{name}" if dirpath else name, name in dirs):
                    continue
                try:
                    lst = os.stat(name, dir_fd=dfd, follow_symlinks=False)
                except OSError:
                    continue
                if len(entries) >= p.max_entries:
                    truncated = True
                    break
                entries.append({"path": loc.show(dirpath, name), "type": _kind(lst.st_mode), "size": lst.st_size})
            if truncated or not p.recursive:
                break
    return {"path": loc.shown, "entries": entries, "truncated": truncated}


def _encode(data: bytes) -> tuple[str, str]:
    if b"\x00" in data:
        return base64.b64encode(data).decode("ascii"), "base64"
    try:
        return data.decode("utf-8"), "utf-8"
    except UnicodeDecodeError:
        return base64.b64encode(data).decode("ascii"), "base64"


def _read_fd(fd: int, limit: int, offset: int = 0) -> bytes:
    chunks: list[bytes] = []
    got = 0
    while got < limit:
        chunk = os.pread(fd, min(limit - got, 1 << 20), offset + got)
        if not chunk:
            break
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


_CHUNK = 1 << 20


def _skip_lines(fd: int, count: int, pos: int = 0) -> tuple[int, int]:
    """Scan from byte ``pos`` past ``count`` newlines: (the byte after the last, newlines passed);
    fewer passed means the file ended first. Memory: one chunk."""
    passed = 0
    while passed < count:
        chunk = os.pread(fd, _CHUNK, pos)
        if not chunk:
            break
        need = count - passed
        n = chunk.count(b"\n")
        if n < need:
            passed += n
            pos += len(chunk)
            continue
        i = -1
        for _ in range(need):
            i = chunk.index(b"\n", i + 1)
        return pos + i + 1, count
    return pos, passed


def _read_lines(fd: int, p: ReadFileParams, limit: int) -> tuple[bytes, dict[str, Any]]:
    """Lines start_line..end_line (``offset`` bytes into them), up to ``limit`` bytes; cut after
    the last whole line when the cap falls inside the range (unless it holds no whole line)."""
    start = p.start_line or 1
    if p.end_line and p.end_line < start:
        problem = f"end_line ({p.end_line}) is before start_line ({start})"
        raise BadParams(f"invalid params: {problem}", [{"field": "end_line", "error": problem}])
    begin, passed = _skip_lines(fd, start - 1)
    if passed < start - 1:  # the file has fewer lines
        return b"", {"start_line": start, "end_line": start - 1}
    first = start  # the line at which the content begins
    if p.offset:
        skipped = _read_fd(fd, p.offset, begin)
        first += skipped.count(b"\n")
        begin += len(skipped)
    data = _read_fd(fd, limit + 1, begin)
    if p.end_line:
        left = p.end_line - first + 1  # lines still wanted
        if left <= 0:
            data = b""
        else:
            end, got = _skip_lines_in(data, left)
            if got == left:
                data = data[:end]
    truncated = len(data) > limit
    if truncated:
        data = data[:limit]
        cut = data.rfind(b"\n")
        if cut != -1:
            data = data[: cut + 1]
    last = first + data.count(b"\n") - (1 if data.endswith(b"\n") else 0)
    return data, {"start_line": first, "end_line": last if data else first - 1, "truncated": truncated}


def _skip_lines_in(data: bytes, count: int) -> tuple[int, int]:
    i = -1
    for got in range(count):
        i = data.find(b"\n", i + 1)
        if i == -1:
            return len(data), got
    return i + 1, count


def read_file(s: Settings, p: ReadFileParams) -> dict[str, Any]:
    loc = locate(p.path, s.workspace, s.scratch)
    limit = min(p.max_bytes or s.policy.limits.output_cap, s.policy.limits.output_cap)
    lines: dict[str, Any] = {}
    with opened(loc, _READ) as fd:
        st = os.fstat(fd)  # the file that was opened, not whatever the name points at now
        if not stat.S_ISREG(st.st_mode):
            raise ToolError(f"not a regular file: {loc.shown!r}", path_data(loc))
        if p.start_line == 0 and p.end_line == 0:  # no lines asked for: bytes, as ever
            data = _read_fd(fd, limit + 1, p.offset)
            truncated = len(data) > limit
            data = data[:limit]
        else:
            data, lines = _read_lines(fd, p, limit)
            truncated = lines.pop("truncated", False)
    content, encoding = _encode(data)
    size = st.st_size
    return {
        "path": loc.shown,
        "size": size,
        "content": content,
        "encoding": encoding,
        "truncated": truncated,
        **lines,
    }


_BINARY = 0  # the line number _grep_text gives a binary file that matches (real lines count from 1)

# a pattern with these may match a line alone but not the same line inside the whole text (a
# negative look-around sees the neighbouring line; \A, \Z and possessive or atomic groups do
# not backtrack the same way): such a pattern is tried line by line on every file
_LINE_ONLY = re.compile(r"\(\?<?!|\\[AZz]|\(\?>|[*+?}]\+")


def _grep_text(data: bytes, rx: re.Pattern[str], whole: re.Pattern[str] | None) -> list[tuple[int, str]]:
    """(line number, text) of each matching line; [(_BINARY, "")] for a binary file (a NUL in its
    first 8 KiB, as GNU grep decides) that matches: its "lines" are not text worth returning.
    Lines end at "\\n" (a "\\r" before it is dropped), as GNU grep and read_file's start_line count them.
    ``whole`` (the pattern with re.MULTILINE, when :data:`_LINE_ONLY` allows) is first tried on the
    whole text: one search rules out a file that has no match, which most files are."""
    text = data.decode("utf-8", errors="replace")
    if data.find(b"\x00", 0, 8192) != -1:
        if any(rx.search(line) for line in text.replace("\x00", "\n").splitlines()):
            return [(_BINARY, "")]
        return []
    if b"\r" in data:
        text = text.replace("\r\n", "\n")
    if whole is not None and whole.search(text) is None:
        return []
    return [(n, line[:1000]) for n, line in enumerate(text.split("\n"), 1) if rx.search(line)]


def _read_small(fd: int) -> bytes | None:
    """A regular file's bytes, None if it is not one or is over _MAX_GREP_FILE; one read for a small file."""
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_size > _MAX_GREP_FILE:
        return None
    want = st.st_size + 1  # one more: a short read is the end of the file
    data = os.pread(fd, want, 0)
    if len(data) == want:  # it grew since fstat
        data += _read_fd(fd, _MAX_GREP_FILE + 1 - len(data), len(data))
        if len(data) > _MAX_GREP_FILE:
            return None
    return data


def grep(s: Settings, p: GrepParams) -> dict[str, Any]:
    loc = locate(p.path, s.workspace, s.scratch)
    flags = re.IGNORECASE if p.ignore_case else 0
    source = re.escape(p.pattern) if p.fixed_string else p.pattern
    try:
        rx = re.compile(source, flags)
        whole = None if _LINE_ONLY.search(source) else re.compile(source, flags | re.MULTILINE)
    except re.error as exc:
        raise BadParams(f"invalid regular expression: {exc}", {"pattern": p.pattern}) from None
    matches: list[dict[str, Any]] = []
    binary: list[str] = []  # binary files that match, by name only (GNU grep: "Binary file X matches")
    out_bytes = 0
    cap = s.policy.limits.output_cap
    # O_NOFOLLOW: a file swapped for a symlink after it was listed is skipped, not followed
    flags_open = _READ | os.O_NOFOLLOW | os.O_CLOEXEC
    with opened(loc, _READ) as fd:
        is_dir = stat.S_ISDIR(os.fstat(fd).st_mode)
        files = _grep_walk(loc, fd, p, flags_open) if is_dir else iter([((), fd)])
        for parts, ffd in files:
            try:
                data = _read_small(ffd)
                if data is None:
                    continue
                found = _grep_text(data, rx, whole)
            except OSError:
                continue
            for lineno, text in found:
                path = loc.show(*parts)
                out_bytes += len(path) + len(text) + 64
                if len(matches) + len(binary) >= p.max_matches or out_bytes > cap:
                    return {"matches": matches, "binary_matches": binary, "truncated": True}
                if lineno == _BINARY:
                    binary.append(path)
                else:
                    matches.append({"path": path, "line": lineno, "text": text})
    return {"matches": matches, "binary_matches": binary, "truncated": False}


def _grep_walk(loc: Located, fd: int, p: GrepParams, flags: int) -> Iterator[tuple[tuple[str, ...], int]]:
    """(path parts, fd) of every file to search under a directory fd; each fd is closed after use."""
    filt = _Filter(loc, p.gitignore, p.include, p.exclude)
    for dirpath, _dirs, filenames, dfd in _walk(fd, filt):
        for name in filenames:
            if filt.include is not None and not filt.wanted(f"{dirpath}/{name}" if dirpath else name, False):
                continue
            try:
                ffd = os.open(name, flags, dir_fd=dfd)
            except OSError:
                continue
            try:
                yield (dirpath, name), ffd
            finally:
                os.close(ffd)


def _parent_fd(rfd: int, parts: list[str]) -> int:
    """An fd of the directory ``parts`` beneath scratch, made as needed, never through a symlink."""
    fd = os.open(".", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=rfd)
    try:
        for part in parts:
            try:
                os.mkdir(part, dir_fd=fd)
            except FileExistsError:
                pass
            nxt = os.open(part, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            os.close(fd)
            fd = nxt
            mode = os.fstat(fd).st_mode
            if stat.S_ISLNK(mode):
                raise OSError(errno.ELOOP, "a symlink on the way")
            if not stat.S_ISDIR(mode):
                raise OSError(errno.ENOTDIR, os.strerror(errno.ENOTDIR))
    except BaseException:
        os.close(fd)
        raise
    return fd


def full_message(root: str) -> str:
    """What a full root is called, with the policy limit that sizes it."""
    if root == WORKSPACE:
        return f"{WORKSPACE} is full (limits.workspace_copy, the size of the workspace copy)"
    if root != SCRATCH:
        return f"{root} is full (writable_size, the size of each writable path of the image)"
    return f"{SCRATCH} is full (limits.scratch)"


def writable(s: Settings, loc: Located, tool: str) -> None:
    """Refuse ``loc`` unless it is under a root the run may write (/scratch; /workspace when it is a copy)."""
    if loc.name not in s.writable_roots:
        raise PathEscape(
            f"{loc.shown!r} is in the workspace, which is read-only: {tool} writes under {SCRATCH} "
            f"(a relative path lands there; a run with workspace_mode copy may write {WORKSPACE} too)",
            path_data(loc, allowed=list(s.writable_roots)),
        )


def _write_target(s: Settings, path: str) -> Located:
    """Where write_file writes ``path``: a file beneath a writable root, by the same rule as the readers."""
    loc = locate(path, s.workspace, s.scratch)
    writable(s, loc, "write_file")
    if loc.rel == "." or os.path.basename(from_wire(path)) in ("", ".", ".."):
        problem = f"is not a file name (resolved: {loc.shown!r})"
        raise BadParams(f"invalid params: path {problem}", [{"field": "path", "error": problem}])
    return loc


def write_file(s: Settings, p: WriteFileParams) -> dict[str, Any]:
    loc = _write_target(s, p.path)
    parent, name = os.path.split(loc.rel)
    try:
        data = base64.b64decode(p.content, validate=True) if p.encoding == "base64" else p.content.encode()
    except ValueError:
        raise BadParams("content is not valid base64", [{"field": "content", "error": "not base64"}]) from None
    # O_NOFOLLOW: a planted symlink cannot redirect the write; O_NONBLOCK: nor can a FIFO hang it
    flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    flags |= os.O_APPEND if p.append else os.O_TRUNC
    with root_fd(s.real_root(loc.name)) as rfd:
        try:
            pfd = _parent_fd(rfd, [x for x in parent.split("/") if x])
            try:
                fd = os.open(name, flags, 0o600, dir_fd=pfd)
            finally:
                os.close(pfd)
            try:
                if not stat.S_ISREG(os.fstat(fd).st_mode):
                    raise ToolError(f"not a regular file: {loc.shown!r}", path_data(loc))
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
            finally:
                os.close(fd)
        except OSError as exc:
            if exc.errno == errno.ENOSPC:
                raise NoSpace(f"{full_message(loc.name)}: {loc.shown!r}", path_data(loc)) from None
            if exc.errno == errno.ELOOP:
                raise ToolError(f"refusing to write through a symlink: {loc.shown!r}", path_data(loc)) from None
            raise (
                translate(exc, loc)
                if exc.errno in (errno.ENAMETOOLONG, errno.ENOTDIR)
                else ToolError(f"cannot write {loc.shown!r}: {exc.strerror}", path_data(loc))
            ) from None
    return {"path": loc.shown, "bytes_written": len(data)}


@params
class RemoveParams:
    paths: Annotated[tuple[Annotated[str, MaxLen(MAX_PATH)], ...], MinLen(1), MaxLen(10_000)] = doc(
        "files, symlinks or directories to remove (a symlink is removed, never followed)"
    )
    recursive: bool = doc("remove directories with what they hold (otherwise only empty ones)", False)
    missing_ok: bool = doc("a path that does not exist is not an error (it is listed in missing)", False)


def remove(s: Settings, p: RemoveParams) -> dict[str, Any]:
    """Remove each path (all checked before any is removed); by directory fd, never through a symlink."""
    locs = []
    for path in p.paths:
        loc = locate(path, s.workspace, s.scratch)
        writable(s, loc, "remove")
        if loc.rel == ".":
            raise BadParams(
                f"invalid params: refusing to remove {loc.shown}, a root itself",
                [{"field": "paths", "error": "is a root"}],
            )
        locs.append(loc)
    removed, missing = [], []
    for loc in locs:
        parent, name = os.path.split(loc.rel)
        try:
            with root_fd(s.real_root(loc.name)) as rfd:
                pfd = dir_beneath(rfd, [x for x in parent.split("/") if x], create=False)
                try:
                    st = os.stat(name, dir_fd=pfd, follow_symlinks=False)
                    if not stat.S_ISDIR(st.st_mode):
                        os.unlink(name, dir_fd=pfd)
                    elif p.recursive:
                        shutil.rmtree(name, dir_fd=pfd)  # fd-based: a symlink swapped in is removed, not followed
                    else:
                        os.rmdir(name, dir_fd=pfd)
                finally:
                    os.close(pfd)
        except FileNotFoundError:
            if not p.missing_ok:
                raise ToolError(f"no such file or directory: {loc.shown!r}", path_data(loc)) from None
            missing.append(loc.shown)
            continue
        except OSError as exc:
            if exc.errno == errno.ENOTEMPTY:
                raise ToolError(f"directory not empty: {loc.shown!r} (pass recursive: true)", path_data(loc)) from None
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                raise ToolError(f"cannot remove {loc.shown!r}: a symlink or file on the way", path_data(loc)) from None
            raise ToolError(f"cannot remove {loc.shown!r}: {exc.strerror}", path_data(loc)) from None
        removed.append(loc.shown)
    return {"removed": removed, "missing": missing}


TOOLS = [
    Tool(
        "remove",
        f"Remove files, symlinks or directories (recursive: with their contents) under {SCRATCH}, or under "
        f"{WORKSPACE} in a run with a writable copy of it; up to 10,000 paths in one call. {PATH_RULE}",
        RemoveParams,
        remove,
    ),
    Tool(
        "list_files",
        f"List a directory (default {WORKSPACE}), optionally recursive. gitignore: true skips what the "
        f"repository's .gitignore files ignore (an ignored directory is not entered, nor .git); include and "
        f"exclude take globs in .gitignore syntax. {PATH_RULE}",
        ListFilesParams,
        list_files,
    ),
    Tool(
        "read_file",
        f"Read a file, up to the output cap; start_line and end_line (1-based, inclusive) read those lines "
        f"(grep's line numbers), and the result says which lines it holds. {PATH_RULE}",
        ReadFileParams,
        read_file,
    ),
    Tool(
        "grep",
        f"Search text files under a directory (default {WORKSPACE}) or one file for a regex or fixed string. "
        f"A binary file (a NUL byte in its first 8 KiB) that matches is named in binary_matches, without "
        f"lines; read it with read_file. gitignore, include and exclude filter the files as in list_files. "
        f"{PATH_RULE}",
        GrepParams,
        grep,
    ),
    Tool(
        "write_file",
        f"Write a file under {SCRATCH} (or {WORKSPACE} in a run with a writable workspace copy); parents are "
        f"created. {PATH_RULE}",
        WriteFileParams,
        write_file,
    ),
]
