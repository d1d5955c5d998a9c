"""download: a file or directory under /scratch or /workspace as a tar stream, in bounded chunks.

The first call (``path``) opens a stream and answers its first chunk; each later call (``stream``)
answers the next, until ``done``. The tar is written entry by entry from a generator (a header,
then the file read in 1 MiB pieces), so the host holds one chunk and the worker two (the one it answers and
the next, read on a thread while this one travels: the host finds it ready when it asks), whatever the size.
Every entry is opened beneath its root by descriptor and never through a symlink (worker.tools.paths,
``O_NOFOLLOW`` under ``os.fwalk``'s directory fds): a symlink is sent as a symlink, never followed,
and one swapped in mid-walk is skipped. FIFOs, sockets and devices are skipped and reported, and so is a
sparse file where the sandbox writes (its size far beyond its blocks: what leaves the sandbox is bounded
by what it may hold).
The host treats the stream as hostile anyway (toolcage.files.download).
"""

from __future__ import annotations

import base64
import errno
import hashlib
import itertools
import os
import secrets
import stat
import tarfile
import threading
from collections.abc import Generator, Iterator
from typing import Annotated, Any

from annotated_types import Ge, Le, MaxLen

from toolcage.worker.errors import BadParams, ToolError
from toolcage.worker.protocol import send_frame
from toolcage.worker.settings import SCRATCH, Settings
from toolcage.worker.tarheader import header
from toolcage.worker.tools import Tool
from toolcage.worker.tools._params import doc, params
from toolcage.worker.tools.files import _READ, _walk
from toolcage.worker.tools.paths import MAX_PATH, Located, locate, open_beneath, opened, path_data

MAX_CHUNK = 4 << 20  # raw bytes per answer (base64 makes it 5.3 MiB; the runner's line limit is 16x the output cap)
_PIECE = 1 << 20  # a file is read this much at a time
_MAX_STREAMS = 4  # open streams a worker keeps; the oldest is closed to make room
_MAX_SKIPPED = 100  # skipped entries named per answer (the count is always given)
_SPARSE_SLACK = 1 << 20  # a file may be this much larger than twice its blocks before it counts as sparse


@params
class DownloadParams:
    path: Annotated[str, MaxLen(MAX_PATH)] | None = doc(
        f"file or directory to send (opens a stream); relative to {SCRATCH}", None
    )
    stream: Annotated[str, MaxLen(64)] | None = doc("the stream id an earlier call answered: its next chunk", None)
    chunk_bytes: Annotated[int, Ge(1), Le(MAX_CHUNK)] = MAX_CHUNK
    frame: bool = doc(
        "send the chunk as a data frame before the answer (the protocol's data path), not as base64", False
    )
    paths: Annotated[tuple[Annotated[str, MaxLen(MAX_PATH)], ...], MaxLen(100_000)] | None = doc(
        "only these entries, relative to path (a directory), each by its own path in the tar (a directory "
        "is sent as one, not its contents); one that is missing is named in skipped",
        None,
    )


class _Stream:
    def __init__(self, gen: Generator[bytes, None, None]) -> None:
        self.raw = gen  # closed when the stream ends or is dropped: its fds go with it
        self.gen: Iterator[bytes] = gen
        self.left = b""  # what the last chunk did not take
        self.offset = 0
        self.skipped: list[dict[str, str]] = []
        self.skipped_count = 0
        self.lock = threading.Lock()  # one call (or read-ahead) at a time uses the generator
        self.ahead: _Ahead | None = None

    def skip(self, name: str, reason: str) -> None:
        self.skipped_count += 1
        if len(self.skipped) < _MAX_SKIPPED:
            self.skipped.append({"path": name, "reason": reason})

    def fill(self, limit: int) -> tuple[bytes, bool]:
        """The next ``limit`` bytes of the tar (fewer at its end) and whether it ended (lock held)."""
        buf = bytearray(self.left)
        done = False
        while len(buf) < limit:
            try:
                buf += next(self.gen)
            except StopIteration:
                done = True
                break
        data, self.left = bytes(buf[:limit]), bytes(buf[limit:])
        return data, done and not self.left

    def take(self, limit: int) -> tuple[bytes, bool]:
        """The next chunk: the one read ahead if there is one (its error raised here), else read now."""
        if self.ahead is not None:
            ahead, self.ahead = self.ahead, None
            data, done = ahead.result()
            if len(data) > limit:  # this call asks for less than the last did
                self.left, data, done = data[limit:] + self.left, data[:limit], False
            return data, done
        return self.fill(limit)

    def read_ahead(self, limit: int) -> None:
        """Read the next chunk on a thread while this one travels and the host writes it: its next call finds
        the chunk ready. One chunk ahead, no more."""
        self.ahead = _Ahead(self, limit)

    def close(self) -> None:
        ahead, self.ahead = self.ahead, None
        if ahead is not None:
            ahead.join()  # the generator is not closed under the thread that runs it
        self.raw.close()


class _Ahead:
    """One chunk read on a thread of its own (:meth:`_Stream.read_ahead`)."""

    def __init__(self, st: _Stream, limit: int) -> None:
        self._st, self._limit = st, limit
        self._out: tuple[bytes, bool] = (b"", False)
        self._exc: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="download-ahead", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._out = self._st.fill(self._limit)
        except BaseException as exc:  # raised by the call that takes the chunk
            self._exc = exc

    def join(self) -> None:
        self._thread.join()

    def result(self) -> tuple[bytes, bool]:
        self._thread.join()
        if self._exc is not None:
            raise self._exc
        return self._out


_streams: dict[str, _Stream] = {}
_lock = threading.Lock()


def _sparse(fd: int, fst: os.stat_result) -> int | None:
    """The bytes a file holds on disk if it is sparse (its size far beyond them: more than twice, plus 1 MiB)
    on a place the sandbox can write, else None. Threat: ``truncate -s 1G`` costs a 64 MiB scratch nothing
    and the host 1 GiB of zeros on its disk; what leaves is bounded by what the sandbox may hold. A
    read-only mount (the host's own workspace) is sent as it is: the sandbox did not make it. gVisor's
    tmpfs counts a hole's blocks as held (and has no SEEK_HOLE), so a file larger than all its file system
    holds is sparse too."""
    if fst.st_size <= _SPARSE_SLACK:
        return None
    try:
        vfs = os.fstatvfs(fd)
    except OSError:
        return None
    if vfs.f_flag & os.ST_RDONLY:
        return None
    held = min(fst.st_blocks * 512, (vfs.f_blocks - vfs.f_bfree) * vfs.f_frsize)
    return held if fst.st_size > 2 * held + _SPARSE_SLACK else None


def _file(st: _Stream, name: str, fd: int) -> Iterator[bytes]:
    """One regular file's entry: its header, then exactly the size it had when opened (a file that
    shrank is padded with zeros and reported; one that grew is cut). A sparse file is skipped."""
    fst = os.fstat(fd)
    held = _sparse(fd, fst)
    if held is not None:
        st.skip(name, f"sparse: {fst.st_size} bytes, {held} on disk")
        return
    yield header(name, tarfile.REGTYPE, fst.st_mode, fst.st_mtime, fst.st_size)
    sent = 0
    while sent < fst.st_size:
        piece = os.pread(fd, min(_PIECE, fst.st_size - sent), sent)
        if not piece:
            st.skip(name, "shrank while it was read: padded with zeros")
            piece = bytes(min(_PIECE, fst.st_size - sent))
        sent += len(piece)
        yield piece
    if fst.st_size % tarfile.BLOCKSIZE:
        yield bytes(tarfile.BLOCKSIZE - fst.st_size % tarfile.BLOCKSIZE)


def _entry(st: _Stream, name: str, dfd: int, base: str) -> Iterator[bytes]:
    """The entry for ``base`` in the directory ``dfd``, named ``name`` in the archive."""
    try:
        lst = os.stat(base, dir_fd=dfd, follow_symlinks=False)
    except OSError as exc:
        st.skip(name, f"cannot stat: {exc.strerror}")
        return
    if stat.S_ISDIR(lst.st_mode):
        yield header(name, tarfile.DIRTYPE, lst.st_mode, lst.st_mtime)
    elif stat.S_ISLNK(lst.st_mode):
        try:
            target = os.readlink(base, dir_fd=dfd)
        except OSError as exc:
            st.skip(name, f"cannot read the link: {exc.strerror}")
            return
        yield header(name, tarfile.SYMTYPE, 0o777, lst.st_mtime, linkname=target)
    elif stat.S_ISREG(lst.st_mode):
        try:
            # O_NOFOLLOW: a file swapped for a symlink after it was listed is skipped, not followed
            fd = os.open(base, _READ | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dfd)
        except OSError as exc:
            st.skip(name, f"cannot open: {exc.strerror}")
            return
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                st.skip(name, "not a regular file any more")
                return
            yield from _file(st, name, fd)
        finally:
            os.close(fd)
    else:
        st.skip(name, "not a file, directory or symlink (a FIFO, socket or device)")


def _tar(st: _Stream, fd: int, top: str) -> Iterator[bytes]:
    """The whole tar: a file as ``top``; a directory's contents by their paths beneath it."""
    fst = os.fstat(fd)
    if stat.S_ISREG(fst.st_mode):
        yield from _file(st, top, fd)
    elif stat.S_ISDIR(fst.st_mode):
        for dirpath, dirnames, filenames, dfd in _walk(fd):
            for base in sorted(dirnames + filenames):
                yield from _entry(st, os.path.normpath(os.path.join(dirpath, base)), dfd, base)
    else:
        st.skip(top, "not a file or directory")
    yield bytes(2 * tarfile.BLOCKSIZE)


def _some(st: _Stream, s: Settings, loc: Located, fd: int, paths: tuple[str, ...]) -> Iterator[bytes]:
    """The tar of the entries ``paths`` (as the tools take paths) beneath the directory ``loc``, each
    named by its path relative to it; a directory is sent as one entry, not its contents."""
    top = "" if loc.rel == "." else loc.rel + "/"
    for given in paths:
        try:
            one = locate(given, s.workspace, s.scratch)
        except (ToolError, BadParams):
            st.skip(given, "not a valid path")
            continue
        if one.name != loc.name or not one.rel.startswith(top) or one.rel == loc.rel:
            st.skip(given, f"not beneath {loc.shown}")
            continue
        rel = one.rel[len(top) :]
        parent, base = os.path.split(rel)
        try:
            dfd = open_beneath(fd, parent or ".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError as exc:
            st.skip(given, "missing" if exc.errno == errno.ENOENT else f"cannot open its directory: {exc.strerror}")
            continue
        try:
            if _exists(dfd, base):
                yield from _entry(st, rel, dfd, base)
            else:
                st.skip(given, "missing")
        finally:
            os.close(dfd)
    yield bytes(2 * tarfile.BLOCKSIZE)


def _exists(dfd: int, name: str) -> bool:
    try:
        os.stat(name, dir_fd=dfd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    except OSError:
        return True  # _entry says why it cannot be read
    return True


def _open(s: Settings, path: str, paths: tuple[str, ...] | None = None) -> _Stream:
    loc = locate(path, s.workspace, s.scratch)
    holder: list[_Stream] = []

    def gen() -> Generator[bytes, None, None]:
        with opened(loc, _READ) as fd:
            if paths is not None:
                if not stat.S_ISDIR(os.fstat(fd).st_mode):
                    raise ToolError(f"paths needs a directory, and {loc.shown!r} is not one", path_data(loc))
                yield from _some(holder[0], s, loc, fd, paths)
                return
            yield from _tar(holder[0], fd, os.path.basename(loc.rel) if loc.rel != "." else loc.name.strip("/"))

    st = _Stream(gen())
    holder.append(st)
    try:
        first = next(st.gen)  # opens now: a missing path is this call's error, not a broken stream
    except StopIteration:  # pragma: no cover - _tar always ends with the end blocks
        first = b""
    except ToolError:
        raise
    except OSError as exc:
        st.close()
        raise ToolError(f"cannot read {loc.shown!r}: {exc.strerror}", path_data(loc)) from None
    st.gen = itertools.chain([first], st.gen)
    return st


def download(s: Settings, p: DownloadParams) -> dict[str, Any]:
    if (p.path is None) == (p.stream is None):
        raise ToolError("give either path (to open a stream) or stream (for its next chunk)", {})
    if p.path is not None:
        st = _open(s, p.path, p.paths)
        sid = secrets.token_hex(8)
        with _lock:
            while len(_streams) >= _MAX_STREAMS:
                _streams.pop(next(iter(_streams))).close()
            _streams[sid] = st
    else:
        sid = p.stream or ""
        with _lock:
            found = _streams.get(sid)
        if found is None:
            raise ToolError("unknown or finished stream (a worker keeps 4 open; the oldest is closed first)", {})
        st = found
    limit = min(p.chunk_bytes, 8 * s.policy.limits.output_cap)
    with st.lock:
        try:
            data, done = st.take(limit)
        except BaseException:
            with _lock:
                _streams.pop(sid, None)
            st.close()
            raise
        offset = st.offset
        st.offset += len(data)
        skipped, count = st.skipped, st.skipped_count  # taken before the read-ahead may skip more
        st.skipped, st.skipped_count = [], 0
        if not done:
            st.read_ahead(limit)
    if done:
        with _lock:
            _streams.pop(sid, None)
        st.close()
    chunk = (
        {"frame": send_frame(data)}
        if p.frame
        else {"data": base64.b64encode(data).decode("ascii"), "sha256": hashlib.sha256(data).hexdigest()}
    )
    return {
        "stream": sid,
        "offset": offset,
        **chunk,
        "done": done,
        "skipped": skipped,
        "skipped_count": count,
    }


TOOLS = [
    Tool(
        "download",
        f"Read a file or directory under /workspace or {SCRATCH} as a tar stream (PAX), in base64 chunks: "
        "call with path to open it, then with stream until done. Symlinks are sent as symlinks, never "
        "followed; FIFOs, sockets and devices are skipped and named in skipped. Hosts use "
        "Sandbox.download, which checks and extracts it.",
        DownloadParams,
        download,
    ),
]
