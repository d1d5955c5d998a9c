"""Files into a sandbox: the worker half of ``Sandbox.upload`` (the host writes the tar: toolcage.upload).

A call with ``path`` (a directory under /scratch; /workspace is read-only) opens a stream; each
later call brings the next base64 chunk of a tar (with its sha256) and ``done`` on the last. The
chunks are spooled to a file in /scratch (one chunk in memory at a time); at ``done`` the tar is
extracted, entry by entry, into a staging directory next to the target, then renamed into place:
a failure leaves nothing under a final name, and the spool and the staging are removed.

Checked here, whoever wrote the tar: absolute names, ``..``, hard links, devices, FIFOs and unknown
entry types are refused, as is any entry under (or named like) a symlink or file the archive made;
everything is opened by directory fd with ``O_NOFOLLOW``, so a symlink already in /scratch is never
written through either. setuid, setgid and sticky bits are cleared. A full /scratch is a clear error.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import errno
import hashlib
import os
import secrets
import shutil
import stat
import tarfile
import threading
from typing import Annotated, Any, cast

from annotated_types import MaxLen

from toolcage.worker.errors import ToolError
from toolcage.worker.settings import SCRATCH, WORKSPACE, Settings
from toolcage.worker.tools import Tool
from toolcage.worker.tools._params import doc, params
from toolcage.worker.tools.paths import MAX_PATH, locate

MAX_CHUNK = 4 << 20  # raw bytes per call (base64 makes it 5.3 MiB, under the worker's 16 MiB request line)
_PIECE = 1 << 20
_MAX_STREAMS = 4
_STAGE = ".toolcage-upload-"


@params
class UploadParams:
    path: Annotated[str, MaxLen(MAX_PATH)] | None = doc(
        f"directory under {SCRATCH} to extract into (made if missing; opens a stream)", None
    )
    stream: Annotated[str, MaxLen(64)] | None = doc("the stream id the opening call answered", None)
    data: Annotated[str, MaxLen(4 * MAX_CHUNK // 3 + 8)] = doc("the next chunk of the tar, base64", "")
    sha256: Annotated[str, MaxLen(64)] = doc("sha256 of the chunk's raw bytes", "")
    done: bool = doc("the last chunk: extract and move into place", False)
    abort: bool = doc("drop the stream and what it spooled (the host could not finish it)", False)


def _refuse(name: str, why: str) -> ToolError:
    return ToolError(f"upload refused: {name!r} {why}; nothing was kept", {"path": name})


def _dir_fd(root: int, parts: list[str], create: bool) -> int:
    """An fd of ``parts`` beneath ``root`` (made when ``create``), never through a symlink."""
    fd = os.open(".", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=root)
    try:
        for part in parts:
            if create:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, 0o700, dir_fd=fd)
            nxt = os.open(part, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            os.close(fd)
            fd = nxt
    except BaseException:
        os.close(fd)
        raise
    return fd


class Extractor:
    """Extracts a tar's entries beneath the directory fd ``root`` (the staging directory)."""

    def __init__(self, root: int) -> None:
        self.root = root
        self.kinds: dict[str, str] = {}  # every path the archive made: "dir", "file" or "link"
        self.dir_modes: list[tuple[list[str], int]] = []
        self.files = self.dirs = self.symlinks = self.bytes = 0

    def parts(self, m: tarfile.TarInfo) -> list[str] | None:
        name = m.name
        if name.startswith("/"):
            raise _refuse(name, "is an absolute path")
        parts = [p for p in name.split("/") if p not in ("", ".")]
        if ".." in parts:
            raise _refuse(name, "climbs out with '..'")
        if not parts:
            if m.isdir():
                return None  # "./": the target itself
            raise _refuse(name, "has no name")
        for i in range(1, len(parts)):
            kind = self.kinds.get("/".join(parts[:i]))
            if kind not in (None, "dir"):
                raise _refuse(name, f"would be written through a {'symlink' if kind == 'link' else 'file'}")
        if "/".join(parts) in self.kinds:
            raise _refuse(name, "comes twice in the archive")
        return parts

    def member(self, tf: tarfile.TarFile, m: tarfile.TarInfo) -> None:
        if m.islnk():
            raise _refuse(m.name, "is a hard link (an upload takes none)")
        if m.ischr() or m.isblk():
            raise _refuse(m.name, "is a device node")
        if m.isfifo():
            raise _refuse(m.name, "is a FIFO")
        if m.sparse is not None or not (m.isreg() or m.isdir() or m.issym()):
            raise _refuse(m.name, f"has an entry type an upload does not take ({m.type!r})")
        parts = self.parts(m)
        if parts is None:
            return
        for i in range(1, len(parts)):
            self.kinds.setdefault("/".join(parts[:i]), "dir")
        key = "/".join(parts)
        pfd = _dir_fd(self.root, parts[:-1], create=True)
        try:
            if m.issym():
                self.kinds[key] = "link"
                os.symlink(m.linkname, parts[-1], dir_fd=pfd)  # made as is: nothing is ever written through it
                self.symlinks += 1
            elif m.isdir():
                self.kinds[key] = "dir"
                with contextlib.suppress(FileExistsError):
                    os.mkdir(parts[-1], 0o700, dir_fd=pfd)
                self.dir_modes.append((parts, (m.mode & 0o777) | 0o700))
                self.dirs += 1
            else:
                self.kinds[key] = "file"
                self.write(tf, m, pfd, parts[-1])
        finally:
            os.close(pfd)

    def write(self, tf: tarfile.TarFile, m: tarfile.TarInfo, pfd: int, name: str) -> None:
        src = tf.extractfile(m)
        assert src is not None
        fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=pfd)
        with os.fdopen(fd, "wb") as out:
            left = m.size
            while left:
                piece = src.read(min(_PIECE, left))
                if not piece:
                    raise _refuse(m.name, "ends before its size")
                out.write(piece)
                left -= len(piece)
            os.fchmod(out.fileno(), m.mode & 0o777)  # & 0o777: setuid, setgid and sticky cleared
            os.utime(out.fileno(), (m.mtime, m.mtime))
        self.files += 1
        self.bytes += m.size

    def finish(self) -> None:
        for parts, mode in reversed(self.dir_modes):
            pfd = _dir_fd(self.root, parts[:-1], create=False)
            try:
                os.chmod(parts[-1], mode, dir_fd=pfd)
            finally:
                os.close(pfd)


def extract(fileobj: Any, root: int) -> Extractor:
    """Extract the tar read from ``fileobj`` beneath the directory fd ``root``."""
    ex = Extractor(root)
    try:
        with tarfile.open(fileobj=fileobj, mode="r|", encoding="utf-8", errors="surrogateescape") as tf:
            while (m := tf.next()) is not None:
                cast(Any, tf).members.clear()
                ex.member(tf, m)
    except (tarfile.TarError, EOFError, UnicodeError, ValueError, OverflowError) as exc:
        raise ToolError(f"upload: a broken tar stream ({type(exc).__name__}); nothing was kept", {}) from None
    ex.finish()
    return ex


def merge(src: int, dst: int, shown: str) -> None:
    """Move what the directory fd ``src`` holds into ``dst``: a file by rename, a directory merged;
    never through a symlink (a symlink at a name is replaced, or refused where a directory goes)."""
    for name in sorted(os.listdir(src)):
        s = os.stat(name, dir_fd=src, follow_symlinks=False)
        try:
            d = os.stat(name, dir_fd=dst, follow_symlinks=False)
        except FileNotFoundError:
            os.rename(name, name, src_dir_fd=src, dst_dir_fd=dst)
            continue
        if stat.S_ISDIR(s.st_mode) and stat.S_ISDIR(d.st_mode):
            sfd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=src)
            try:
                dfd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dst)
                try:
                    merge(sfd, dfd, f"{shown}/{name}")
                finally:
                    os.close(dfd)
            finally:
                os.close(sfd)
        elif stat.S_ISDIR(s.st_mode) or stat.S_ISDIR(d.st_mode):
            what = "file or symlink" if stat.S_ISDIR(s.st_mode) else "directory"
            raise ToolError(f"upload: {shown}/{name} exists as a {what}; move it away first", {})
        else:
            os.replace(name, name, src_dir_fd=src, dst_dir_fd=dst)


class _Stream:
    def __init__(self, scratch: str, target: str, shown: str) -> None:
        self.scratch, self.target, self.shown = scratch, target, shown
        self.id = secrets.token_hex(8)
        self.spool = os.path.join(scratch, f"{_STAGE}{self.id}.tar")
        self.fd = os.open(self.spool, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        self.received = 0

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.fd)
        with contextlib.suppress(OSError):
            os.unlink(self.spool)


_streams: dict[str, _Stream] = {}
_lock = threading.Lock()


def _full(exc: OSError) -> ToolError:
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return ToolError(
            f"upload: {SCRATCH} is full (raise limits.scratch in the policy); nothing was kept",
            {"reason": "scratch_full"},
        )
    return ToolError(f"upload: {exc.strerror}; nothing was kept", {})


def _open(s: Settings, path: str) -> dict[str, Any]:
    loc = locate(path, s.workspace, s.scratch)
    if loc.name == WORKSPACE:
        raise ToolError(f"{WORKSPACE} is read-only: upload into {SCRATCH} (e.g. {SCRATCH}/in)", {"path": path})
    try:
        st = _Stream(s.scratch, loc.rel, loc.shown)
    except OSError as exc:
        raise _full(exc) from None
    with _lock:
        while len(_streams) >= _MAX_STREAMS:
            _streams.pop(next(iter(_streams))).close()
        _streams[st.id] = st
    return {"stream": st.id, "received": 0, "done": False}


def _finish(st: _Stream) -> dict[str, Any]:
    root = os.open(st.scratch, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    stage_name = f"{_STAGE}{st.id}"
    try:
        os.mkdir(stage_name, 0o700, dir_fd=root)
        stage = os.open(stage_name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=root)
        try:
            os.lseek(st.fd, 0, os.SEEK_SET)
            with os.fdopen(os.dup(st.fd), "rb", buffering=_PIECE) as f:
                ex = extract(f, stage)
            os.close(st.fd)
            os.unlink(st.spool)  # before the rename: the space it held is free again
            parts = [p for p in st.target.split("/") if p not in ("", ".")]
            try:
                tfd = _dir_fd(root, parts, create=True)
            except OSError as exc:
                raise ToolError(f"upload: cannot use {st.shown} as the target directory: {exc.strerror}", {}) from None
            try:
                merge(stage, tfd, st.shown)
            finally:
                os.close(tfd)
        finally:
            os.close(stage)
    except OSError as exc:
        raise _full(exc) from None
    finally:
        shutil.rmtree(os.path.join(st.scratch, stage_name), ignore_errors=True)
        os.close(root)
    return {
        "path": st.shown,
        "files": ex.files,
        "dirs": ex.dirs,
        "symlinks": ex.symlinks,
        "bytes": ex.bytes,
        "received": st.received,
        "done": True,
    }


def upload(s: Settings, p: UploadParams) -> dict[str, Any]:
    if (p.path is None) == (p.stream is None):
        raise ToolError("give either path (to open a stream) or stream (with its next chunk)", {})
    if p.path is not None:
        return _open(s, p.path)
    with _lock:
        found = _streams.get(p.stream or "")
    if found is None:
        raise ToolError("unknown or finished upload stream (a worker keeps 4 open; the oldest is closed first)", {})
    st = found
    if p.abort:
        with _lock:
            _streams.pop(st.id, None)
        st.close()
        return {"stream": st.id, "done": True, "aborted": True}
    try:
        try:
            data = base64.b64decode(p.data, validate=True)
        except (binascii.Error, ValueError):
            raise ToolError("upload: a chunk is not base64; nothing was kept", {}) from None
        if hashlib.sha256(data).hexdigest() != p.sha256:
            raise ToolError("upload: a chunk does not match its sha256; nothing was kept", {})
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(st.fd, view) :]
        except OSError as exc:
            raise _full(exc) from None
        st.received += len(data)
        if not p.done:
            return {"stream": st.id, "received": st.received, "done": False}
        out = _finish(st)
    except BaseException:
        with _lock:
            _streams.pop(st.id, None)
        st.close()
        raise
    with _lock:
        _streams.pop(st.id, None)
    st.close()
    return {"stream": st.id, **out}


TOOLS = [
    Tool(
        "upload",
        f"Receive a tar (PAX) in base64 chunks and extract it into a directory under {SCRATCH}: call with "
        "path to open a stream, then with stream, data and sha256 for each chunk, done on the last. Absolute "
        "names, '..', hard links, devices and writes through symlinks are refused; nothing is kept unless "
        "the whole tar was good. Hosts use Sandbox.upload.",
        UploadParams,
        upload,
    ),
]
