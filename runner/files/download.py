"""Files out of a sandbox: ``Sandbox.download`` fetches the worker's tar stream and extracts it safely.

Threat: every byte of the stream is chosen by code in the sandbox. Each chunk comes as its answer's
data frame (toolcage.worker.protocol: raw bytes beside the JSON, not base64 inside it), taken by the
transport only for a call that asked for one and only up to FRAME_MAX; the runner holds one at a time (the
worker reads the next one ahead while this one travels: toolcage.worker.tools.download); a stream that passes
its caps or stalls is stopped. The entries are checked and extracted by
toolcage.files.safetar into a staging directory inside ``local_dir``, renamed into place only when the
whole stream was good: a failure leaves nothing under a final name (nor the directory, if the download
made it).
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import hashlib
import io
import os
import shutil
import tarfile
import tempfile
from collections.abc import Callable, Iterator
from typing import IO, TYPE_CHECKING, Any, cast

from toolcage.files import safetar
from toolcage.files.outbound import safe_name as safe_name  # re-exported: the doors that read names use it
from toolcage.files.safetar import _MAX_SKIPPED, DownloadError, DownloadLimit, DownloadResult, DownloadUsage, show
from toolcage.policies import codes
from toolcage.textsafe import escape
from toolcage.worker.protocol import FRAME_MAX

if TYPE_CHECKING:
    from toolcage.results import CallResult

DEFAULT_MAX_BYTES = 4 << 30  # file content a download may write when no policy says more (Sandbox: out_bound)
DEFAULT_MAX_FILES = 100_000  # entries (files, directories, links) a download may make
MAX_CHUNK = FRAME_MAX  # raw bytes one answer may carry (the worker sends at most 4 MiB)
_WIDE = 1 << 20  # a file at least this large is read from the chunks themselves (_Chunks.content)
_MAX_EMPTY = 16  # the worker always sends data or ends the stream: more empty chunks than this is a stall


Call = Callable[[dict[str, Any]], "CallResult"]  # one ``download`` call


def _answer(res: CallResult, first: bool) -> dict[str, Any]:
    """A call's result, or the error it means: the first call's tool error is the caller's bad input."""
    if res.ok and isinstance(res.result, dict):
        return res.result
    err = res.error or {}
    msg = escape(str(err.get("message", res.status)))
    if err.get("code") == codes.METHOD_NOT_FOUND:
        raise DownloadError("download: this worker image has no download tool; rebuild it (toolcage image build)")
    if first and res.status == "error":
        raise DownloadUsage(f"download: {msg}", **({"data": err["data"]} if isinstance(err.get("data"), dict) else {}))
    raise DownloadError(f"download failed ({res.status}): {msg}; nothing was kept")


def refused_param(res: CallResult, name: str) -> bool:
    """The answer of a worker from before the parameter ``name`` (a download's ``frame``, an upload's ``native``):
    its strict params refuse it by name."""
    err = res.error or {}
    data = err.get("data")
    return (
        err.get("code") == codes.INVALID_PARAMS
        and isinstance(data, list)
        and any(isinstance(d, dict) and d.get("field") == name for d in data)
    )


class _Chunks:
    """The worker's stream as a file tarfile's stream mode reads (``read(n)``, a record at a time): one chunk
    held at a time, every answer checked. No buffered reader in between: the chunk is copied once, by
    tarfile. (Asking for the next chunk on a thread while this one is written was measured and left out:
    the worker reads ahead already, so the answer is ready when asked for: 100 MiB, 0.54 s with, 0.50 s
    without, 8 pairs.)"""

    def __init__(self, call: Call, first: dict[str, Any], raw_cap: int, result: DownloadResult) -> None:
        self._call, self._first, self._cap, self._result = call, first, raw_cap, result
        self._buf = memoryview(b"")
        self._stream: str | None = None
        self._done = False
        self._empty = 0  # empty chunks in a row (a worker that never ends the stream)
        self._framed = True  # until the worker says it takes no data frames
        self.total = 0

    def read(self, size: int = -1) -> memoryview:
        """Up to ``size`` bytes, as a view of the chunk: tarfile's stream reader joins what it reads into
        bytes at once (its one copy; the view is not kept)."""
        while not self._buf and not self._done:
            self._buf = memoryview(self._next())
        n = len(self._buf) if size < 0 else min(size, len(self._buf))
        out = self._buf[:n]
        self._buf = self._buf[n:]
        return out

    def content(self, tf: tarfile.TarFile, m: tarfile.TarInfo) -> Callable[[int], bytes | memoryview] | None:
        """A large entry's content read from the chunks themselves, as views: no copy on the host but the
        write's. tarfile's stream mode would join the pieces into bytes and slice them, then ``extractfile``
        copy them again (three copies of each byte of a 100 MiB download). Its stream (``pos``, ``buf``: what
        it read from here and holds) is kept as tarfile keeps it, so the entries after this one are read as
        they would be, whether or not the caller reads it all (tarfile's ``next`` skips the rest through
        ``pos`` and ``buf`` as it would its own). None (read it through tarfile) where the stream is not one
        of those."""
        stream: Any = tf.fileobj
        if not (
            m.isreg() and m.size >= _WIDE and isinstance(getattr(stream, "pos", None), int)
            and isinstance(getattr(stream, "buf", None), bytes)
        ):  # fmt: skip
            return None
        stream.seek(m.offset_data)  # forward only: at the content already, right after its header
        left = m.size

        def read(n: int) -> bytes | memoryview:
            nonlocal left
            n = min(n, left)
            if not n:
                return b""  # its end: the next chunk is not asked for here
            if stream.buf:  # what tarfile read past the header: its own first
                out: bytes | memoryview = stream.buf[:n]
                stream.buf = stream.buf[len(out) :]
            else:
                out = self.read(n)  # a view of the chunk, up to n (less at the chunk's end)
            left -= len(out)
            stream.pos += len(out)
            return out

        return read

    def _next(self) -> bytes | bytearray:
        first = self._stream is None
        # the chunk comes as the answer's data frame (toolcage.worker.protocol): the transport checked its size;
        # a worker from before frames (an image derived from an older worker image) refuses the parameter, and
        # its chunks come as base64 with a sha256, as they always did
        params = self._first if first else {"stream": self._stream}
        res = self._call({**params, "frame": True} if self._framed else params)
        if first and self._framed and refused_param(res, "frame"):
            self._framed = False
            res = self._call(params)
        ans = _answer(res, first)
        try:
            if self._framed:
                frame = ans["frame"]
                ok = isinstance(frame, bytes | bytearray) and isinstance(ans["done"], bool)
                data = frame if isinstance(frame, bytes | bytearray) else b""
            else:
                data = base64.b64decode(ans["data"], validate=True)
                ok = hashlib.sha256(data).hexdigest() == ans["sha256"] and isinstance(ans["done"], bool)
            stream, skipped, count = (
                str(ans["stream"]),
                list(ans.get("skipped") or ()),
                int(ans.get("skipped_count", 0)),
            )
        except (KeyError, TypeError, ValueError, binascii.Error):
            raise DownloadError("download: the worker sent a malformed chunk") from None
        if not ok or len(data) > MAX_CHUNK:
            raise DownloadError("download: the worker sent a malformed chunk (or one too large); nothing was kept")
        self._stream, self._done = stream, ans["done"]
        self._empty = 0 if data or self._done else self._empty + 1
        if self._empty > _MAX_EMPTY:
            raise DownloadError(f"download: the worker sent {_MAX_EMPTY} empty chunks in a row; nothing was kept")
        for item in skipped[:_MAX_SKIPPED]:
            if isinstance(item, dict):
                self._result.skip(str(item.get("path", "?")), f"in the sandbox: {escape(item.get('reason', '?'))}")
        self._result.skipped_count += max(count - min(len(skipped), _MAX_SKIPPED), 0)
        self.total += len(data)
        if self.total > self._cap:
            raise DownloadLimit(f"download: the stream passed {self._cap} bytes, more than its caps allow")
        return data


def out_bound(limits: Any) -> int:
    """The file content that can leave a sandbox of these ``limits`` (a policy's): what its scratch tmpfs and
    its workspace copy's tmpfs may hold. Threat: a sandbox-chosen byte count (a sparse file, a stream that
    never ends) on the host's disk. The worker skips a sparse file, but the runner does not trust it to:
    this is the default ``max_bytes`` of a download, a snapshot and a persisted workspace, instead of a fixed
    4 or 16 GiB. A read-only workspace's own files are the host's: pass ``max_bytes`` to take more of them."""
    return int(limits.scratch) + int(limits.workspace_copy)


def _raw_cap(max_bytes: int, max_files: int) -> int:
    """The most tar a stream within the caps can be: the content, a PAX header and padding per entry."""
    return max_bytes + (max_files + 2) * 4 * tarfile.BLOCKSIZE + (4 << 20)


# what tarfile raises on a broken stream (RecursionError: a PAX header nested in PAX headers)
_BROKEN = (tarfile.TarError, RecursionError, EOFError, UnicodeError, OverflowError, ValueError)


def _broken(exc: BaseException, door: str = "") -> DownloadError:
    """The error of a stream that broke (one of ``_BROKEN``), wherever it broke; ``door``: the message's head."""
    return DownloadError(f"{door}the sandbox sent a broken tar stream ({escape(type(exc).__name__)}); nothing was kept")


class _Content(io.RawIOBase):
    """An entry's content as :func:`members` hands it out (``read``: a piece of at most n bytes, empty at its
    end): read by the caller, outside the generator, so a stream that breaks meanwhile (the worker ends it
    inside the content) raises tarfile's ReadError there; it is a DownloadError here, as everywhere else a
    stream breaks (a helper session's attack: ``read_files``, snapshots and diffs raised tarfile's own
    error)."""

    def __init__(self, read: Callable[[int], bytes | memoryview]) -> None:
        self._read = read

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        piece = self._piece(len(b))
        b[: len(piece)] = piece
        return len(piece)

    def read(self, size: int | None = -1) -> bytes:
        """``size`` bytes, fewer only at the content's end, as a buffered file reads (tarfile's
        ``copyfileobj`` takes a short read for a stream cut short); a piece ends at a chunk's end."""
        if size is None or size < 0:
            return self.readall()
        pieces, got = [], 0
        while got < size and (piece := self._piece(size - got)):
            pieces.append(piece)
            got += len(piece)
        return b"".join(pieces)

    def _piece(self, size: int) -> bytes | memoryview:
        try:
            return self._read(size)
        except _BROKEN as exc:
            raise _broken(exc) from None


def members(
    call: Call, first: dict[str, Any], *, max_bytes: int, max_files: int, result: DownloadResult
) -> Iterator[tuple[str, tarfile.TarInfo, IO[bytes]]]:
    """The worker's tar stream (``first``: the opening call's params) as ``(name, entry, content)``, entry
    by entry, never written to disk: a name is normalised and refused if it is absolute, climbs with
    ``..`` or is too long; only files, directories and symlinks are taken. ``content`` reads a file's
    bytes (read it before the next entry; a short read means a broken stream). For the host's own
    archives and diffs."""
    reader = _Chunks(call, first, _raw_cap(max_bytes, max_files), result)
    entries = total = 0
    seen: set[bytes] = set()  # 16-byte digests of the names: a 4 KB path costs the host 16 bytes, not 4 KB
    try:
        with tarfile.open(  # safetar.Info: a PAX header too large to hold is refused before it is read
            fileobj=cast(IO[bytes], reader), mode="r|", tarinfo=safetar.Info, encoding="utf-8", errors="surrogateescape"
        ) as tf:
            while (m := tf.next()) is not None:
                cast(Any, tf).members.clear()
                entries += 1
                if entries > max_files:
                    raise DownloadLimit(f"stopped: more than {max_files} entries (max_files)")
                name = safe_name(m.name)
                digest = hashlib.blake2b(os.fsencode(name), digest_size=16).digest() if name is not None else b""
                if name is None or digest in seen:
                    raise DownloadError(
                        f"refused: the entry '{show(m.name)}' is absolute, climbs with '..', "
                        "is too long or comes twice; nothing was kept"
                    )
                seen.add(digest)
                if m.sparse is not None or not (m.isreg() or m.isdir() or m.issym()):
                    raise DownloadError(f"refused: '{show(m.name)}' is not a file, directory or symlink")
                src: IO[bytes] = io.BytesIO()
                if m.isreg():
                    total += m.size
                    if total > max_bytes:
                        raise DownloadLimit(f"stopped: more than {max_bytes} bytes of files (max_bytes)")
                    read = reader.content(tf, m)
                    if read is None:
                        got = tf.extractfile(m)
                        assert got is not None
                        read = got.read
                    src = cast(IO[bytes], _Content(read))
                yield name, m, src
    except _BROKEN as exc:
        raise _broken(exc) from None


def download(
    call: Call,
    remote: str,
    local_dir: str | os.PathLike[str],
    *,
    max_bytes: int = DEFAULT_MAX_BYTES,
    max_files: int = DEFAULT_MAX_FILES,
) -> DownloadResult:
    """Fetch ``remote`` (a file or directory in the sandbox) into ``local_dir`` (made if missing): a
    directory's contents, or the file by its own name. Refuses or skips what is unsafe (module doc)."""
    local = os.path.abspath(os.fspath(local_dir))
    made = not os.path.lexists(local)
    try:
        os.makedirs(local, exist_ok=True)
    except OSError as exc:
        raise DownloadUsage(f"download: cannot use '{show(local)}' as the target directory: {exc.strerror}") from None
    result = DownloadResult(local)
    staging = tempfile.mkdtemp(prefix=".toolcage-download-", dir=local)
    try:
        reader = _Chunks(call, {"path": remote}, _raw_cap(max_bytes, max_files), result)
        ex = safetar.Extractor(staging, local, max_bytes, max_files, result, reader.content)
        try:
            try:
                with tarfile.open(
                    fileobj=cast(IO[bytes], reader),
                    mode="r|",
                    tarinfo=safetar.Info,
                    encoding="utf-8",
                    errors="surrogateescape",
                ) as tf:
                    while (m := tf.next()) is not None:
                        cast(Any, tf).members.clear()  # stream mode keeps every header: a million would stay in memory
                        ex.member(tf, m)  # (a large file's content: reader.content)
            except _BROKEN as exc:
                raise _broken(exc, "download: ") from None
            ex.finish()
        finally:
            ex.close()
        safetar.merge(staging, local)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        if made:
            with contextlib.suppress(OSError):
                os.rmdir(local)  # made for this download, and it failed: leave no empty directory either
        raise
    shutil.rmtree(staging, ignore_errors=True)
    return result


__all__ = ["DownloadError", "DownloadLimit", "DownloadResult", "DownloadUsage", "download", "out_bound", "show"]
