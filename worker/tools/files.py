"""The explore tools (list_files, read_file, grep over /workspace and scratch) and write_file (scratch only).

Every file is opened through a directory fd of its root (worker.tools.paths), and read from
the fd that was opened: a symlink swapped in between a check and a use cannot redirect a
read, a walk or a write out of the roots.
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

from toolcage.worker.errors import BadParams, NoSpace, ToolError
from toolcage.worker.settings import Settings
from toolcage.worker.tools import Tool
from toolcage.worker.tools._params import doc, params
from toolcage.worker.tools.paths import MAX_PATH, Located, locate, opened, root_fd, translate

_MAX_GREP_FILE = 8 * 1024 * 1024


def _read_roots(s: Settings) -> tuple[str, ...]:
    return (s.workspace, s.scratch)


@params
class ListFilesParams:
    path: Annotated[str, MaxLen(MAX_PATH)] = doc("directory, relative to /workspace or absolute", ".")
    recursive: bool = False
    max_entries: Annotated[int, Ge(1), Le(100_000)] = 1000


@params
class ReadFileParams:
    path: Annotated[str, MaxLen(MAX_PATH)] = doc("file, relative to /workspace or absolute")
    offset: Annotated[int, Ge(0)] = 0
    max_bytes: Annotated[int, Ge(1)] | None = doc("default: the policy's output cap", None)


@params
class GrepParams:
    pattern: Annotated[str, MinLen(1), MaxLen(4096)] = doc("a Python regular expression, or text with fixed_string")
    path: Annotated[str, MaxLen(MAX_PATH)] = "."
    fixed_string: bool = False
    ignore_case: bool = False
    max_matches: Annotated[int, Ge(1), Le(100_000)] = 200


@params
class WriteFileParams:
    path: Annotated[str, MaxLen(MAX_PATH)] = doc("file path, relative to scratch or absolute under it")
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


def _label(s: Settings, loc: Located, *parts: str) -> str:
    """How a path is reported: relative to /workspace, absolute under scratch."""
    rel = loc.join(*parts)
    return rel if loc.root == s.workspace else os.path.normpath(os.path.join(loc.root, rel))


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
    loc = locate(p.path, _read_roots(s), s.workspace)
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
                entries.append({"path": _label(s, loc, dirpath, name), "type": _kind(lst.st_mode), "size": lst.st_size})
            if truncated or not p.recursive:
                break
    return {"path": _label(s, loc), "entries": entries, "truncated": truncated}


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
    loc = locate(p.path, _read_roots(s), s.workspace)
    limit = min(p.max_bytes or s.policy.limits.output_cap, s.policy.limits.output_cap)
    with opened(loc, _READ) as fd:
        st = os.fstat(fd)  # the file that was opened, not whatever the name points at now
        if not stat.S_ISREG(st.st_mode):
            raise ToolError(f"not a regular file: {p.path!r}", {"path": p.path})
        data = _read_fd(fd, limit + 1, p.offset)
    truncated = len(data) > limit
    content, encoding = _encode(data[:limit])
    size = st.st_size
    return {"path": _label(s, loc), "size": size, "content": content, "encoding": encoding, "truncated": truncated}


def _grep_fd(fd: int, rx: re.Pattern[str]) -> Iterator[tuple[int, str]]:
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_size > _MAX_GREP_FILE:
        return
    data = _read_fd(fd, _MAX_GREP_FILE + 1)
    if len(data) > _MAX_GREP_FILE or b"\x00" in data[:8192]:
        return  # grew past the cap, or binary
    for lineno, line in enumerate(data.decode("utf-8", errors="replace").splitlines(), 1):
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
    loc = locate(p.path, _read_roots(s), s.workspace)
    flags = re.IGNORECASE if p.ignore_case else 0
    try:
        rx = re.compile(re.escape(p.pattern) if p.fixed_string else p.pattern, flags)
    except re.error as exc:
        raise BadParams(f"invalid regular expression: {exc}", {"pattern": p.pattern}) from None
    matches: list[dict[str, Any]] = []
    out_bytes = 0
    cap = s.policy.limits.output_cap
    with opened(loc, _READ) as fd:
        for parts, ffd in _grep_files(loc, fd):
            try:
                found = list(_grep_fd(ffd, rx))
            except OSError:
                continue
            for lineno, text in found:
                out_bytes += len(text) + 64
                if len(matches) >= p.max_matches or out_bytes > cap:
                    return {"matches": matches, "truncated": True}
                matches.append({"path": _label(s, loc, *parts), "line": lineno, "text": text})
    return {"matches": matches, "truncated": False}


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


def write_file(s: Settings, p: WriteFileParams) -> dict[str, Any]:
    if os.path.basename(p.path) in ("", ".", ".."):
        raise BadParams(f"not a file name: {p.path!r}", {"path": p.path})
    loc = locate(p.path, (s.scratch,), s.scratch)
    if loc.rel == ".":
        raise BadParams(f"not a file name: {p.path!r}", {"path": p.path})
    parent, name = os.path.split(loc.rel)
    try:
        data = base64.b64decode(p.content, validate=True) if p.encoding == "base64" else p.content.encode()
    except ValueError:
        raise BadParams("content is not valid base64", {"path": p.path}) from None
    # O_NOFOLLOW: a planted symlink cannot redirect the write; O_NONBLOCK: nor can a FIFO hang it
    flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    flags |= os.O_APPEND if p.append else os.O_TRUNC
    with root_fd(loc.root) as rfd:
        try:
            pfd = _parent_fd(rfd, [x for x in parent.split("/") if x])
            try:
                fd = os.open(name, flags, 0o600, dir_fd=pfd)
            finally:
                os.close(pfd)
            try:
                if not stat.S_ISREG(os.fstat(fd).st_mode):
                    raise ToolError(f"not a regular file: {p.path!r}", {"path": p.path})
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
            finally:
                os.close(fd)
        except OSError as exc:
            if exc.errno == errno.ENOSPC:
                raise NoSpace("scratch is full (policy limits.scratch)", {"path": p.path}) from None
            if exc.errno == errno.ELOOP:
                raise ToolError(f"refusing to write through a symlink: {p.path!r}", {"path": p.path}) from None
            raise (
                translate(exc, loc)
                if exc.errno in (errno.ENAMETOOLONG, errno.ENOTDIR)
                else ToolError(f"cannot write {p.path!r}: {exc.strerror}", {"path": p.path})
            ) from None
    return {"path": _label(s, loc), "bytes_written": len(data)}


TOOLS = [
    Tool(
        "list_files",
        "List a directory under /workspace or scratch (optionally recursive).",
        ListFilesParams,
        list_files,
    ),
    Tool("read_file", "Read a file under /workspace or scratch, up to the output cap.", ReadFileParams, read_file),
    Tool("grep", "Search text files under /workspace or scratch for a regex or fixed string.", GrepParams, grep),
    Tool(
        "write_file", "Write a file into the scratch directory (the only writable place).", WriteFileParams, write_file
    ),
]
