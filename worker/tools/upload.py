"""Files into a sandbox: the worker half of ``Sandbox.upload`` (the host writes the tar: toolcage.files.upload).

A call with ``path`` (a directory under /scratch, or under /workspace when the run has a writable
copy of it) opens a stream; each later call brings the next chunk of a tar (a data frame, or base64 with
its sha256) and ``done`` on the last. Each chunk is handed to a thread that extracts from them, entry by
entry, into a staging directory on the target's own file system (at most two chunks in memory: one
waits while the one before it is extracted, so the call answers at once; nothing spooled: an upload
takes its size in space, not twice it); at ``done`` the staging is renamed into place: a failure leaves
nothing under a final name, and the staging is removed.

Checked here, whoever wrote the tar: absolute names, ``..``, hard links, devices, FIFOs and unknown
entry types are refused, as is any entry under (or named like) a symlink or file the archive made;
everything is opened by directory fd with ``O_NOFOLLOW``, so a symlink already in /scratch is never
written through either. setuid, setgid and sticky bits are cleared. A full root is a clear error (-32005).
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import errno
import hashlib
import io
import os
import queue
import secrets
import shutil
import stat
import tarfile
import threading
import zlib
from typing import TYPE_CHECKING, Annotated, Any, cast

from annotated_types import Ge, Le, MaxLen

from toolcage.worker.errors import NoSpace, ToolError
from toolcage.worker.protocol import FRAME_MAX, NAMES_MAX, incoming
from toolcage.worker.settings import SCRATCH, WORKSPACE, Settings
from toolcage.worker.tools import Tool, untar
from toolcage.worker.tools._params import doc, params
from toolcage.worker.tools.files import full_message, writable
from toolcage.worker.tools.paths import MAX_PATH, Located, Parents, dir_beneath, locate

if TYPE_CHECKING:
    from collections.abc import Callable

MAX_CHUNK = 4 << 20  # raw bytes per call (base64 makes it 5.3 MiB, under the worker's 16 MiB request line)
_PIECE = 1 << 20
_INFLATED = 4 << 20  # a deflated chunk is handed to the extractor this much at a time
_MAX_STREAMS = 4
_STAGE = ".toolcage-upload-"


@params
class UploadParams:
    path: Annotated[str, MaxLen(MAX_PATH)] | None = doc(
        f"directory under {SCRATCH} (or a writable {WORKSPACE}) to extract into (made if missing; opens a stream)",
        None,
    )
    stream: Annotated[str, MaxLen(64)] | None = doc("the stream id the opening call answered", None)
    data: Annotated[str, MaxLen(4 * MAX_CHUNK // 3 + 8)] = doc("the next chunk of the tar, base64", "")
    sha256: Annotated[str, MaxLen(64)] = doc("sha256 of the chunk's raw bytes", "")
    frame: Annotated[int, Ge(0), Le(FRAME_MAX)] | None = doc(
        "the chunk came as the data frame before this request, of this many bytes (in place of data and sha256)",
        None,
    )
    done: bool = doc("the last chunk: extract and move into place", False)
    abort: bool = doc("drop the stream and what it extracted so far (the host could not finish it)", False)
    base: bool = doc(f"the run's copy of the workspace itself, into {WORKSPACE} (at start or resume)", False)
    deflated: bool = doc("this chunk is zlib-compressed (a native stream only: the opening answer says deflate)", False)
    native: bool = doc(
        "with base: the tar is the runner's own walk of the workspace, extracted by the runtime's GNU tar "
        "(worker.tools.untar); ignored where the runtime has none",
        False,
    )
    listed: bool = doc(
        "with native: the runner names the tar's files and symlinks itself, after the tar (calls with names), "
        "so GNU tar need not (the opening answer says listed when the stream takes them)",
        False,
    )
    names: bool = doc(
        "this chunk is not tar but the next part of the names of the tar's files and symlinks, \\0-separated "
        "(a listed stream only, after the last chunk of the tar)",
        False,
    )


def _refuse(name: str, why: str) -> ToolError:
    return ToolError(f"upload refused: {name!r} {why}; nothing was kept", {"path": name})


class Extractor:
    """Extracts a tar's entries beneath the directory fd ``root`` (the staging directory)."""

    def __init__(self, root: int) -> None:
        self.root = root
        self.kinds: dict[str, str] = {}  # every path the archive made: "dir", "file" or "link"
        self.dir_modes: list[tuple[list[str], int]] = []
        self.files = self.dirs = self.symlinks = self.bytes = 0
        self._parents = Parents(root, create=True)  # the last entry's parent, kept for the next entries

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
        pfd = self._parents.fd(parts[:-1])  # kept open for the entries after it (a tar lists a directory's together)
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

    def close(self) -> None:
        self._parents.close()

    def write(self, tf: tarfile.TarFile, m: tarfile.TarInfo, pfd: int, name: str) -> None:
        src = tf.extractfile(m)
        assert src is not None
        fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=pfd)
        try:  # os.write, not a buffered file object: most files of a tree are small, one write each
            left = m.size
            while left:
                piece = src.read(min(_PIECE, left))
                if not piece:
                    raise _refuse(m.name, "ends before its size")
                view = memoryview(piece)
                while view:
                    view = view[os.write(fd, view) :]
                left -= len(piece)
            os.fchmod(fd, m.mode & 0o777)  # & 0o777: setuid, setgid and sticky cleared
            os.utime(fd, (m.mtime, m.mtime))
        finally:
            os.close(fd)
        self.files += 1
        self.bytes += m.size

    def finish(self) -> None:
        for parts, mode in reversed(self.dir_modes):
            pfd = dir_beneath(self.root, parts[:-1], create=False)
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
    finally:
        ex.close()
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


class _Feed(io.RawIOBase):
    """The chunks the calls hand over, read as one file by the extractor thread. At most one waits
    (``queue.Queue(1)``) beside the one being extracted: a call hands its chunk over and answers at once,
    so the next chunk travels while this one is extracted (a pipe made each call wait for its own chunk
    to be written out), and the worker holds two chunks at most."""

    def __init__(self) -> None:
        self.chunks: queue.Queue[bytes | None] = queue.Queue(maxsize=1)
        self._buf = memoryview(b"")
        self._eof = False

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        while not self._buf:
            if self._eof:
                return 0
            item = self.chunks.get()
            if item is None:
                self._eof = True
                return 0
            self._buf = memoryview(item)
        n = min(len(b), len(self._buf))
        b[:n] = self._buf[:n]
        self._buf = self._buf[n:]
        return n


class _Stream:
    """One upload: its tar is extracted as it arrives, by a thread reading the chunks the calls hand over
    (``_Feed``), into a staging directory on the target's own file system (renamed into place at ``done``)."""

    def __init__(self, s: Settings, loc: Located, base: bool, native: bool = False, listed: bool = False) -> None:
        self.root_path = s.real_root(loc.name)
        self.target, self.shown, self.root_name, self.base = loc.rel, loc.shown, loc.name, base
        self.native = base and native and loc.name == WORKSPACE and untar.available()
        self.listed = self.native and listed  # the runner names the entries (write_names): GNU tar need not
        self.names: bytearray | None = None  # what it named so far (from its first names call: the tar ended)
        self.id = secrets.token_hex(8)
        self.stage_name = f"{_STAGE}{self.id}"
        self.root = os.open(self.root_path, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.mkdir(self.stage_name, 0o700, dir_fd=self.root)
            self.stage = os.open(
                self.stage_name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=self.root
            )
        except BaseException:
            os.close(self.root)
            raise
        self.feed = _Feed()
        self.ended = False  # the end (or an abort) was handed to the extractor
        self.received = 0
        self.result: Extractor | untar.Result | None = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._extract, daemon=True, name=f"upload-{self.id}")
        self.thread.start()

    def _extract(self) -> None:
        try:
            if self.native:
                stage = os.path.join(self.root_path, self.stage_name)
                self.result = untar.extract(
                    io.BufferedReader(self.feed, _PIECE), stage, self.root_name, verbose=not self.listed
                )
                return
            self.result = extract(io.BufferedReader(self.feed, _PIECE), self.stage)
        except BaseException as exc:  # reported by the call that writes next, or by done
            self.error = exc

    def _hand(self, item: bytes | None) -> bool:
        """Give the extractor ``item`` (None: the end); False if it stopped (its error says why)."""
        while self.thread.is_alive():
            try:
                self.feed.chunks.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def write(self, data: bytes) -> None:
        if self.names is not None:
            raise ToolError("upload: a chunk of the tar after its names; nothing was kept", {})
        if self.error is not None or not self._hand(data):  # the extractor stopped: its error says why
            self.thread.join()
            raise self._failure()
        self.received += len(data)

    def write_names(self, data: bytes) -> None:
        """The next part of the runner's names of the tar's files and symlinks (a listed stream: the tar ended)."""
        if not self.listed:
            raise ToolError("upload: names on a stream that did not offer to take them; nothing was kept", {})
        if self.names is None:
            self.names = bytearray()
        if len(self.names) + len(data) > NAMES_MAX:  # (100,000 files of a repository: about 5 MiB)
            raise ToolError(f"upload: more than {NAMES_MAX >> 20} MiB of names; nothing was kept", {})
        self.names += data

    def write_deflated(self, data: bytes, write: Callable[[bytes], None] | None = None) -> None:
        """A zlib-compressed chunk, handed to ``write`` (the extractor's, by default) in pieces of at most
        ``_INFLATED`` bytes (a chunk that inflates to far more than it is never sits whole in memory)."""
        if not self.native:
            raise ToolError("upload: a deflated chunk on a stream that did not offer it; nothing was kept", {})
        write = self.write if write is None else write
        z = zlib.decompressobj()
        try:
            piece = z.decompress(data, _INFLATED)
            while piece:
                write(piece)
                piece = z.decompress(z.unconsumed_tail, _INFLATED) if z.unconsumed_tail else b""
        except zlib.error:
            raise ToolError("upload: a deflated chunk does not inflate; nothing was kept", {}) from None
        if not z.eof or z.unused_data:
            raise ToolError("upload: a deflated chunk is not one whole zlib stream; nothing was kept", {})

    def _failure(self) -> BaseException:
        exc = self.error
        if isinstance(exc, OSError):
            return _full(exc, self.root_name)
        return exc if exc is not None else ToolError("upload: the tar stream ended early; nothing was kept", {})

    def finish(self) -> Extractor | untar.Result:
        """The end of the tar: wait for the extractor, then its result (or its error)."""
        self.ended = True
        self._hand(None)
        self.thread.join()
        if self.error is not None or self.result is None:
            raise self._failure()
        return self.result

    def close(self) -> None:
        if not self.ended:
            self.ended = True
            self._hand(None)  # the extractor sees the end of a short tar and stops
        self.thread.join()
        with contextlib.suppress(OSError):
            os.close(self.stage)
        shutil.rmtree(os.path.join(self.root_path, self.stage_name), ignore_errors=True)
        with contextlib.suppress(OSError):
            os.close(self.root)


_streams: dict[str, _Stream] = {}
_lock = threading.Lock()


def _full(exc: OSError, root: str = SCRATCH) -> ToolError:
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return NoSpace(f"upload: {full_message(root)}; nothing was kept", {"reason": f"{root.strip('/')}_full"})
    return ToolError(f"upload: {exc.strerror}; nothing was kept", {})


def _open(s: Settings, path: str, base: bool, native: bool = False, listed: bool = False) -> dict[str, Any]:
    loc = locate(path, s.workspace, s.scratch)
    writable(s, loc, "upload")
    if base and (loc.name not in (WORKSPACE, *s.image_roots) or loc.rel != "."):
        raise ToolError(
            f"upload: base is for the workspace copy itself ({WORKSPACE}) or a writable path of the image",
            {"path": path},
        )
    try:
        st = _Stream(s, loc, base, native, listed)
    except OSError as exc:
        raise _full(exc, loc.name) from None
    with _lock:
        while len(_streams) >= _MAX_STREAMS:
            _streams.pop(next(iter(_streams))).close()
        _streams[st.id] = st
    # it takes data frames (a runner asks), and on a native stream deflated chunks (worker.tools.untar: the copy
    # of a tree of small files is mostly the tar's headers and padding)
    return {
        "stream": st.id, "received": 0, "done": False, "frames": True,
        **({"deflate": True} if st.native else {}), **({"listed": True} if st.listed else {}),
    }  # fmt: skip


def _finish(st: _Stream) -> dict[str, Any]:
    if st.listed and st.names is None:
        raise ToolError("upload: the stream offered to name its entries and named none; nothing was kept", {})
    try:
        ex = st.finish()
        parts = [p for p in st.target.split("/") if p not in ("", ".")]
        try:
            tfd = dir_beneath(st.root, parts, create=True)
        except OSError as exc:
            raise ToolError(f"upload: cannot use {st.shown} as the target directory: {exc.strerror}", {}) from None
        try:
            merge(st.stage, tfd, st.shown)
        finally:
            os.close(tfd)
    except OSError as exc:
        raise _full(exc, st.root_name) from None
    if st.base:
        from toolcage.worker.tools import workspace

        if st.names is not None:  # as the runner named them (listed)
            files = os.fsdecode(bytes(st.names))
        else:  # as the extraction made them: path -> "dir", "file" or "link"
            files = "\0".join(sorted(k for k, v in ex.kinds.items() if v != "dir"))
        workspace.record_base(files, st.root_name)
    return {
        "path": st.shown,
        "files": ex.files,
        "dirs": ex.dirs,
        "symlinks": ex.symlinks,
        "bytes": ex.bytes,
        "received": st.received,
        "done": True,
        **({"native": True} if st.native else {}),  # the runner counts the kinds it sent (untar.Result)
    }


def _chunk(p: UploadParams) -> bytes:
    """The call's chunk: its data frame (toolcage.worker.protocol), or its base64 ``data`` checked by ``sha256``."""
    if p.frame is not None:
        data = incoming()
        if data is None or len(data) != p.frame:
            raise ToolError("upload: the chunk's data frame is missing or not of its size; nothing was kept", {})
        return bytes(data)  # (the frame's buffer: its one copy here, where the splitter made it before)
    try:
        data = base64.b64decode(p.data, validate=True)
    except (binascii.Error, ValueError):
        raise ToolError("upload: a chunk is not base64; nothing was kept", {}) from None
    if hashlib.sha256(data).hexdigest() != p.sha256:
        raise ToolError("upload: a chunk does not match its sha256; nothing was kept", {})
    return data


def upload(s: Settings, p: UploadParams) -> dict[str, Any]:
    if (p.path is None) == (p.stream is None):
        raise ToolError("give either path (to open a stream) or stream (with its next chunk)", {})
    if p.path is not None:
        return _open(s, p.path, p.base, p.native, p.listed)
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
        if p.names:
            if p.deflated:
                st.write_deflated(_chunk(p), st.write_names)
            else:
                st.write_names(_chunk(p))
        elif p.deflated:
            st.write_deflated(_chunk(p))
        else:
            st.write(_chunk(p))
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
        f"Receive a tar (PAX) in base64 chunks and extract it into a directory under {SCRATCH} (or a "
        f"writable {WORKSPACE}): call with "
        "path to open a stream, then with stream, data and sha256 for each chunk (or a data frame: the "
        "protocol's data path), done on the last. Absolute "
        "names, '..', hard links, devices and writes through symlinks are refused; nothing is kept unless "
        "the whole tar was good. Hosts use Sandbox.upload.",
        UploadParams,
        upload,
    ),
]
