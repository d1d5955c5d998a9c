"""The explore tools (list_files, read_file, grep over /workspace and scratch) and write_file (scratch only)."""

from __future__ import annotations

import base64
import errno
import os
import re
import stat
from typing import Annotated, Any, Literal

from annotated_types import Ge, Le, MaxLen, MinLen

from worker.errors import BadParams, NoSpace, ToolError
from worker.settings import Settings
from worker.tools import Tool
from worker.tools._params import doc, params
from worker.tools.paths import confine, must_exist

_MAX_GREP_FILE = 8 * 1024 * 1024


def _read_roots(s: Settings) -> tuple[str, ...]:
    return (s.workspace, s.scratch)


@params
class ListFilesParams:
    path: str = doc("directory, relative to /workspace or absolute", ".")
    recursive: bool = False
    max_entries: Annotated[int, Ge(1), Le(100_000)] = 1000


@params
class ReadFileParams:
    path: str = doc("file, relative to /workspace or absolute")
    offset: Annotated[int, Ge(0)] = 0
    max_bytes: Annotated[int, Ge(1)] | None = doc("default: the policy's output cap", None)


@params
class GrepParams:
    pattern: Annotated[str, MinLen(1), MaxLen(4096)] = doc("a Python regular expression, or text with fixed_string")
    path: str = "."
    fixed_string: bool = False
    ignore_case: bool = False
    max_matches: Annotated[int, Ge(1), Le(100_000)] = 200


@params
class WriteFileParams:
    path: str = doc("file path, relative to scratch or absolute under it")
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


def _rel(path: str, s: Settings) -> str:
    for root in (s.workspace, s.scratch):
        if path == root or path.startswith(root + "/"):
            rel = os.path.relpath(path, root)
            return rel if root == s.workspace else os.path.join(s.scratch, rel)
    return path


def list_files(s: Settings, p: ListFilesParams) -> dict[str, Any]:
    root = confine(p.path, _read_roots(s), s.workspace)
    st = must_exist(root, p.path)
    if not stat.S_ISDIR(st.st_mode):
        raise ToolError(f"not a directory: {p.path!r}", {"path": p.path})
    if not os.access(root, os.R_OK | os.X_OK):
        raise ToolError(f"permission denied: {p.path!r} is not readable by the sandbox user", {"path": p.path})
    entries: list[dict[str, Any]] = []
    truncated = False
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        dirnames.sort()
        for name in sorted(dirnames + filenames):
            full = os.path.join(dirpath, name)
            try:
                lst = os.lstat(full)
            except OSError:
                continue
            if len(entries) >= p.max_entries:
                truncated = True
                break
            entries.append({"path": _rel(full, s), "type": _kind(lst.st_mode), "size": lst.st_size})
        if truncated or not p.recursive:
            break
    return {"path": _rel(root, s), "entries": entries, "truncated": truncated}


def _encode(data: bytes) -> tuple[str, str]:
    if b"\x00" in data:
        return base64.b64encode(data).decode("ascii"), "base64"
    try:
        return data.decode("utf-8"), "utf-8"
    except UnicodeDecodeError:
        return base64.b64encode(data).decode("ascii"), "base64"


def read_file(s: Settings, p: ReadFileParams) -> dict[str, Any]:
    path = confine(p.path, _read_roots(s), s.workspace)
    st = must_exist(path, p.path)
    if not stat.S_ISREG(st.st_mode):
        raise ToolError(f"not a regular file: {p.path!r}", {"path": p.path})
    limit = min(p.max_bytes or s.policy.limits.output_cap, s.policy.limits.output_cap)
    with open(path, "rb") as f:
        f.seek(p.offset)
        data = f.read(limit + 1)
    truncated = len(data) > limit
    content, encoding = _encode(data[:limit])
    return {"path": _rel(path, s), "size": st.st_size, "content": content, "encoding": encoding, "truncated": truncated}


def grep(s: Settings, p: GrepParams) -> dict[str, Any]:
    root = confine(p.path, _read_roots(s), s.workspace)
    must_exist(root, p.path)
    flags = re.IGNORECASE if p.ignore_case else 0
    try:
        rx = re.compile(re.escape(p.pattern) if p.fixed_string else p.pattern, flags)
    except re.error as exc:
        raise BadParams(f"invalid regular expression: {exc}", {"pattern": p.pattern}) from None
    matches: list[dict[str, Any]] = []
    out_bytes = 0
    cap = s.policy.limits.output_cap
    files = (
        [root]
        if os.path.isfile(root)
        else (os.path.join(d, f) for d, dirs, fs in os.walk(root) if not dirs.sort() for f in sorted(fs))
    )
    for path in files:
        try:
            if not stat.S_ISREG(os.lstat(path).st_mode) or os.path.getsize(path) > _MAX_GREP_FILE:
                continue
            with open(path, "rb") as f:
                data = f.read()
        except OSError:
            continue
        if b"\x00" in data[:8192]:
            continue  # binary file
        for lineno, line in enumerate(data.decode("utf-8", errors="replace").splitlines(), 1):
            if rx.search(line):
                text = line[:1000]
                out_bytes += len(text) + 64
                if len(matches) >= p.max_matches or out_bytes > cap:
                    return {"matches": matches, "truncated": True}
                matches.append({"path": _rel(path, s), "line": lineno, "text": text})
    return {"matches": matches, "truncated": False}


def write_file(s: Settings, p: WriteFileParams) -> dict[str, Any]:
    parent = confine(os.path.dirname(p.path) or ".", (s.scratch,), s.scratch)
    name = os.path.basename(p.path)
    if name in ("", ".", ".."):
        raise BadParams(f"not a file name: {p.path!r}", {"path": p.path})
    target = os.path.join(parent, name)
    try:
        data = base64.b64decode(p.content, validate=True) if p.encoding == "base64" else p.content.encode()
    except ValueError:
        raise BadParams("content is not valid base64", {"path": p.path}) from None
    flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | (os.O_APPEND if p.append else os.O_TRUNC)
    try:
        os.makedirs(parent, exist_ok=True)
        fd = os.open(target, flags, 0o600)  # O_NOFOLLOW: a planted symlink cannot redirect the write
        try:
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
        raise ToolError(f"cannot write {p.path!r}: {exc.strerror}", {"path": p.path}) from None
    return {"path": target, "bytes_written": len(data)}


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
