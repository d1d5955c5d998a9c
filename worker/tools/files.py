"""The explore tools (list_files, read_file, grep over /workspace and /scratch) and write_file (/scratch only).

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
import stat
from collections.abc import Generator, Iterator
from typing import Annotated, Any, Literal

from annotated_types import Ge, Le, MaxLen, MinLen

from toolcage.worker.errors import BadParams, NoSpace, PathEscape, ToolError
from toolcage.worker.settings import SCRATCH, WORKSPACE, Settings
from toolcage.worker.tools import Tool
from toolcage.worker.tools._params import doc, params
from toolcage.worker.tools.names import from_wire
from toolcage.worker.tools.paths import MAX_PATH, Located, locate, opened, path_data, root_fd, translate

_MAX_GREP_FILE = 8 * 1024 * 1024

# said in every file tool's description (and run_python's): the rule an agent must not have to guess
PATH_RULE = (
    f"Paths: absolute under {WORKSPACE} (the project, read-only; present only if the run has a "
    f"workspace) or {SCRATCH} (writable); a relative path is relative to {SCRATCH}, the working "
    f"directory of run_python and run_shell. Results give absolute paths."
)


@params
class ListFilesParams:
    path: Annotated[str, MaxLen(MAX_PATH)] = doc(f"directory; relative to {SCRATCH}", WORKSPACE)
    recursive: bool = False
    max_entries: Annotated[int, Ge(1), Le(100_000)] = 1000


@params
class ReadFileParams:
    path: Annotated[str, MaxLen(MAX_PATH)] = doc(f"file, e.g. {WORKSPACE}/README.md; relative to {SCRATCH}")
    offset: Annotated[int, Ge(0)] = 0
    max_bytes: Annotated[int, Ge(1)] | None = doc("default: the policy's output cap", None)


@params
class GrepParams:
    pattern: Annotated[str, MinLen(1), MaxLen(4096)] = doc("a Python regular expression, or text with fixed_string")
    path: Annotated[str, MaxLen(MAX_PATH)] = doc(f"file or directory to search; relative to {SCRATCH}", WORKSPACE)
    fixed_string: bool = False
    ignore_case: bool = False
    max_matches: Annotated[int, Ge(1), Le(100_000)] = 200


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


def _walk(fd: int) -> Iterator[tuple[str, list[str], list[str], int]]:
    """os.fwalk from an open directory fd, never following symlinks: a directory swapped for a
    symlink mid-walk is not entered (fwalk compares the opened fd with the lstat it listed)."""
    walker: Generator[tuple[str, list[str], list[str], int], None, None]
    walker = os.fwalk(".", dir_fd=fd, follow_symlinks=False)  # type: ignore[assignment]
    with contextlib.closing(walker):
        for dirpath, dirnames, filenames, dfd in walker:
            dirnames.sort()
            filenames.sort()
            yield dirpath, dirnames, filenames, dfd


def list_files(s: Settings, p: ListFilesParams) -> dict[str, Any]:
    loc = locate(p.path, s.workspace, s.scratch)
    entries: list[dict[str, Any]] = []
    truncated = False
    with opened(loc, _READ | os.O_DIRECTORY) as fd:
        for dirpath, dirnames, filenames, dfd in _walk(fd):
            for name in sorted(dirnames + filenames):
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


def read_file(s: Settings, p: ReadFileParams) -> dict[str, Any]:
    loc = locate(p.path, s.workspace, s.scratch)
    limit = min(p.max_bytes or s.policy.limits.output_cap, s.policy.limits.output_cap)
    with opened(loc, _READ) as fd:
        st = os.fstat(fd)  # the file that was opened, not whatever the name points at now
        if not stat.S_ISREG(st.st_mode):
            raise ToolError(f"not a regular file: {loc.shown!r}", path_data(loc))
        data = _read_fd(fd, limit + 1, p.offset)
    truncated = len(data) > limit
    content, encoding = _encode(data[:limit])
    size = st.st_size
    return {"path": loc.shown, "size": size, "content": content, "encoding": encoding, "truncated": truncated}


_BINARY = 0  # the line number _grep_fd gives a binary file that matches (real lines count from 1)


def _grep_fd(fd: int, rx: re.Pattern[str]) -> Iterator[tuple[int, str]]:
    """(line number, text) of each matching line; one (_BINARY, "") for a binary file (a NUL in its
    first 8 KiB, as GNU grep decides) that matches: its "lines" are not text worth returning."""
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_size > _MAX_GREP_FILE:
        return
    data = _read_fd(fd, _MAX_GREP_FILE + 1)
    if len(data) > _MAX_GREP_FILE:
        return  # grew past the cap
    text = data.decode("utf-8", errors="replace")
    if b"\x00" in data[:8192]:
        if any(rx.search(line) for line in text.replace("\x00", "\n").splitlines()):
            yield _BINARY, ""
        return
    for lineno, line in enumerate(text.splitlines(), 1):
        if rx.search(line):
            yield lineno, line[:1000]


def _grep_files(loc: Located, fd: int) -> Iterator[tuple[tuple[str, ...], int]]:
    """(path parts, fd) of every file to search under an opened fd; each fd is closed after use."""
    if not stat.S_ISDIR(os.fstat(fd).st_mode):
        yield (), fd
        return
    for dirpath, _dirs, filenames, dfd in _walk(fd):
        for name in filenames:
            try:
                # O_NOFOLLOW: a file swapped for a symlink after it was listed is skipped, not followed
                ffd = os.open(name, _READ | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dfd)
            except OSError:
                continue
            try:
                yield (dirpath, name), ffd
            finally:
                os.close(ffd)


def grep(s: Settings, p: GrepParams) -> dict[str, Any]:
    loc = locate(p.path, s.workspace, s.scratch)
    flags = re.IGNORECASE if p.ignore_case else 0
    try:
        rx = re.compile(re.escape(p.pattern) if p.fixed_string else p.pattern, flags)
    except re.error as exc:
        raise BadParams(f"invalid regular expression: {exc}", {"pattern": p.pattern}) from None
    matches: list[dict[str, Any]] = []
    binary: list[str] = []  # binary files that match, by name only (GNU grep: "Binary file X matches")
    out_bytes = 0
    cap = s.policy.limits.output_cap
    with opened(loc, _READ) as fd:
        for parts, ffd in _grep_files(loc, fd):
            try:
                found = list(_grep_fd(ffd, rx))
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


def _write_target(s: Settings, path: str) -> Located:
    """Where write_file writes ``path``: a file beneath /scratch, by the same rule as the readers."""
    loc = locate(path, s.workspace, s.scratch)
    if loc.name != SCRATCH:
        raise PathEscape(
            f"{loc.shown!r} is in the workspace, which is read-only: write_file writes under {SCRATCH} "
            f"(a relative path lands there)",
            path_data(loc, allowed=[SCRATCH]),
        )
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
    with root_fd(s.scratch) as rfd:
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
                raise NoSpace(f"scratch is full (limits.scratch): {loc.shown!r}", path_data(loc)) from None
            if exc.errno == errno.ELOOP:
                raise ToolError(f"refusing to write through a symlink: {loc.shown!r}", path_data(loc)) from None
            raise (
                translate(exc, loc)
                if exc.errno in (errno.ENAMETOOLONG, errno.ENOTDIR)
                else ToolError(f"cannot write {loc.shown!r}: {exc.strerror}", path_data(loc))
            ) from None
    return {"path": loc.shown, "bytes_written": len(data)}


TOOLS = [
    Tool(
        "list_files",
        f"List a directory (default {WORKSPACE}), optionally recursive. {PATH_RULE}",
        ListFilesParams,
        list_files,
    ),
    Tool("read_file", f"Read a file, up to the output cap. {PATH_RULE}", ReadFileParams, read_file),
    Tool(
        "grep",
        f"Search text files under a directory (default {WORKSPACE}) or one file for a regex or fixed string. "
        f"A binary file (a NUL byte in its first 8 KiB) that matches is named in binary_matches, without "
        f"lines; read it with read_file. {PATH_RULE}",
        GrepParams,
        grep,
    ),
    Tool(
        "write_file",
        f"Write a file under {SCRATCH}, the only writable place (parents are created). {PATH_RULE}",
        WriteFileParams,
        write_file,
    ),
]
