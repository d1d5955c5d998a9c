"""Protect and frame the protocol stream: newline-delimited JSON on private file descriptors.

Threat: tool code (a handler's ``print``, a child that floods stdout, code that reads
stdin) corrupting the JSON-RPC framing. At start-up the worker moves the protocol to
private, close-on-exec descriptors and points fd 0 at /dev/null and fd 1 at stderr, so
nothing but :class:`Channel` can ever write a response or read a request.

The data path (issue 40): bulk bytes (an upload's or a download's chunk) travel as a **data frame**
beside the JSON, not as base64 inside it. A frame is a line ``=<size>`` (no JSON text starts with
``=``) followed by exactly ``size`` raw bytes, and it belongs to the message line right after it: the
request whose params say ``"frame": size`` (the worker hands the bytes to that call: :func:`incoming`),
or the answer whose result says so (a call that asked for one with ``"frame": true``: :func:`send_frame`).
A frame is at most ``FRAME_MAX`` bytes; the runner takes one only in the answer to a request that asked
for it (``toolcage.rpc.transport``), so the sandbox cannot use frames to make the runner hold more.
"""

from __future__ import annotations

import os
import select
import sys
import threading
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

MAX_REQUEST_BYTES = 16 * 1024 * 1024
FRAME_MAX = 8 << 20  # raw bytes one data frame may carry (either way)
# the names of a workspace copy's files an upload stream takes after its tar (worker.tools.upload, ``listed``):
# a runner offers them only when they fit, and otherwise lets GNU tar name the entries as it makes them
NAMES_MAX = 64 << 20
FRAME_MARK = b"="
_REQUEST_KEYS = frozenset(("jsonrpc", "method", "params", "id"))


class Framed(bytes):
    """A message line that came right after a data frame: the frame's bytes ride along as ``frame`` (the
    buffer they were read into, not a copy of it: a frame of 4 MiB is copied once on its way in, not twice)."""

    frame: bytes | bytearray = b""


BAD_FRAME = Framed(b"=")  # LineSplitter: a frame header that is not ``=<digits>`` or is over its cap


def frame_size(line: bytes, cap: int) -> int | None:
    """The size a frame header line announces, or None when it is malformed or over ``cap``."""
    digits = line[1:]
    if not digits.isdigit() or len(digits) > 10:
        return None
    size = int(digits)
    return size if size <= cap else None


class LineSplitter:
    """Cuts a byte stream into newline-terminated lines without ever holding more than
    ``max_line`` bytes: a longer line is reported once, as ``None``, and the rest of it is
    dropped up to its newline. Shared by both ends of the channel (the worker reading
    requests, the runner reading the worker's and the egress proxy's output).

    With ``frames`` (a cap in bytes) it also takes data frames (the module's note): the frame's bytes
    are read raw into one buffer of the announced size and the next line comes out as :class:`Framed`
    carrying them; a bad header comes out as ``BAD_FRAME``. Without, a ``=`` line is a line like any."""

    def __init__(self, max_line: int, frames: int = 0) -> None:
        self.max_line = max_line
        self.frames = frames
        self.buf = bytearray()  # the unfinished line (never over max_line)
        self.skipping = False  # inside a line already reported as too long
        self.raw: bytearray | None = None  # the frame being read (its announced size, allocated once)
        self.raw_got = 0
        self.frame: bytes | bytearray | None = None  # a whole frame, waiting for its line

    def feed(self, data: bytes | memoryview) -> Iterator[bytes | None]:
        """The lines ``data`` completes. A memoryview (of a reader's buffer, valid only during the call) is
        copied only into a frame's buffer or as lines, never kept."""
        start = 0
        while True:
            if self.raw is not None:
                take = min(len(self.raw) - self.raw_got, len(data) - start)
                self.raw[self.raw_got : self.raw_got + take] = memoryview(data)[start : start + take]
                self.raw_got += take
                start += take
                if self.raw_got < len(self.raw):
                    return
                self.frame, self.raw = self.raw, None
            if isinstance(data, memoryview):  # lines are looked for in bytes: what is left of it, copied once
                data, start = bytes(data[start:]), 0
            nl = data.find(b"\n", start)
            if not self.skipping:
                self.buf += data[start:] if nl < 0 else data[start:nl]
                if len(self.buf) > self.max_line:
                    self.buf.clear()
                    self.skipping = True
                    yield None
            if nl < 0:
                return
            start = nl + 1
            if self.skipping:
                self.skipping = False
                self.frame = None  # the line it belonged to is gone
            else:
                line = bytes(self.buf)
                self.buf.clear()
                if self.frames and line[:1] == FRAME_MARK:
                    size = None if self.frame is not None else frame_size(line, self.frames)
                    if size is None:
                        self.frame = None
                        yield BAD_FRAME
                    else:
                        self.raw, self.raw_got = bytearray(size), 0
                    continue
                if self.frame is not None:
                    framed = Framed(line)
                    framed.frame, self.frame = self.frame, None
                    line = framed
                yield line


def valid_request(obj: Any) -> bool:
    """One JSON-RPC 2.0 request as jsonrpcserver's request schema defines it (shared with the
    runner, which must know which lines will be answered and with which id)."""
    if not isinstance(obj, dict) or not obj.keys() <= _REQUEST_KEYS:
        return False
    if obj.get("jsonrpc") != "2.0" or not isinstance(obj.get("method"), str):
        return False
    if "params" in obj and not isinstance(obj["params"], list | dict):
        return False
    return "id" not in obj or obj["id"] is None or type(obj["id"]) in (str, int, float)


def readable(fds: list[int], timeout_s: float | None) -> list[int]:
    """Which of ``fds`` are readable (or closed), waiting up to ``timeout_s`` (None: forever). poll(2),
    not select(2): no FD_SETSIZE limit, and gVisor's seccomp (runsc --oci-seccomp) refuses select."""
    poller = select.poll()
    for fd in fds:
        poller.register(fd, select.POLLIN)
    return [fd for fd, _ in poller.poll(None if timeout_s is None else timeout_s * 1000)]


def progress_token(params: Any) -> str | int | None:
    """MCP's ``params._meta.progressToken`` (a string or an integer, never a bool), or None. Shared
    by the worker (which streams progress under it) and the runner (which lets that progress through)."""
    meta = params.get("_meta") if isinstance(params, dict) else None
    token = meta.get("progressToken") if isinstance(meta, dict) else None
    return token if type(token) in (str, int) else None


def _size(line: bytes | None) -> int:
    """What a queued line holds: its bytes and its frame's."""
    return len(line or b"") + len(getattr(line, "frame", b""))


_frames = threading.local()  # the data frames of the call this thread serves (Loop sets and clears them)


def incoming() -> bytes | bytearray | None:
    """The data frame that came with the request this thread is serving (None: none came)."""
    return getattr(_frames, "incoming", None)


def send_frame(data: bytes) -> int:
    """Send ``data`` as the data frame of the answer this thread is making; its size, for the result's
    ``frame`` (the runner checks the two agree)."""
    _frames.outgoing = data
    return len(data)


def serve_framed(line: bytes | None, handle: Callable[[], str]) -> tuple[str, bytes | None]:
    """``handle()`` with the line's frame as :func:`incoming`; its response and the frame it sends (if any).
    A frame belongs to one call's answer: a batch's answer never carries one."""
    _frames.incoming, _frames.outgoing = getattr(line, "frame", None), None
    try:
        response = handle()
        frame = _frames.outgoing
    finally:
        _frames.incoming = _frames.outgoing = None
    return response, (frame if response[:1] == "{" else None)


_CHUNK = 256 * 1024
QUEUE_MAX_BYTES = 1 << 20  # requests read and queued; beyond it the channel is not read (back-pressure)
_CONTROL_HINT = b"ancel"  # every control method has it (notifications/cancelled, $/cancelRequest): a cheap pre-check


class Channel:
    """Reads request lines from and writes response lines to the private protocol fds."""

    def __init__(self, fd_in: int, fd_out: int, max_line: int = MAX_REQUEST_BYTES) -> None:
        self._in = fd_in
        self._out = fd_out
        self._splitter = LineSplitter(max_line, FRAME_MAX)
        self._buf = bytearray(_CHUNK)
        self._view = memoryview(self._buf)
        self._queue: deque[bytes | None] = deque()  # lines read, not yet served
        self.queued_bytes = 0
        self._eof = False
        # a control line (a cancel) goes here the moment it is read, not behind the call it cancels
        self.on_control: Callable[[bytes], bool] | None = None
        self._send_lock = threading.Lock()  # answers and progress come from every call's thread

    @classmethod
    def claim_stdio(cls) -> Channel:
        """Move the protocol off fds 0/1 so handlers and children cannot touch it."""
        proto_in = os.dup(0)  # os.dup creates non-inheritable fds (PEP 446)
        proto_out = os.dup(1)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.close(devnull)
        os.dup2(2, 1)  # anything printed now lands in the log stream, not the protocol
        sys.stdin = open(os.devnull, encoding="utf-8")  # noqa: SIM115 - lives as long as the process
        sys.stdout = sys.stderr
        return cls(proto_in, proto_out)

    @property
    def fd_in(self) -> int:
        return self._in

    @property
    def at_eof(self) -> bool:
        return self._eof

    def lines(self, before_read: Callable[[], None] | None = None) -> Iterator[bytes | None]:
        """Yield each request line (without newline); ``None`` for a line that was too long.

        ``before_read`` runs before each blocking read, i.e. only when no complete
        request is buffered (the worker uses it to write logs while idle).
        """
        while True:
            while self._queue:
                line = self._queue.popleft()
                self.queued_bytes -= _size(line)
                yield line
            if self._eof:
                return
            if before_read is not None:
                before_read()
            self.read_some()

    def read_some(self) -> None:
        """One read (blocking unless the fd is readable): complete lines are queued, control lines
        handed to ``on_control`` at once. Also called while a call runs (``proc.run_child``)."""
        if self._eof:
            return
        # into one buffer kept for the channel's life: os.read(fd, _CHUNK) allocated (mmap), resized
        # (mremap) and freed (munmap) a 256 KiB object per request, three syscalls for each ping
        n = os.readv(self._in, (self._buf,))
        chunk = self._view[:n].tobytes()
        if not chunk:
            self._eof = True
            if self._splitter.buf and not self._splitter.skipping:
                self._route(bytes(self._splitter.buf))
            return
        for line in self._splitter.feed(chunk):
            self._route(line)

    def _route(self, line: bytes | None) -> None:
        if line is BAD_FRAME:
            line = None  # answered as a line the worker could not take (the runner never sends one)
        if line is not None and self.on_control is not None and _CONTROL_HINT in line and self.on_control(line):
            return
        self._queue.append(line)
        self.queued_bytes += _size(line)

    def send(self, line: str, frame: bytes | None = None) -> None:
        """Write one response line (JSON encoding guarantees it contains no raw newline), after its data
        frame when it has one: both in one go under the lock, so no other answer comes between them."""
        data = line.encode("utf-8") + b"\n"
        views = (
            [memoryview(data)]
            if frame is None
            else [memoryview(b"=%d\n" % len(frame)), memoryview(frame), memoryview(data)]
        )
        with self._send_lock:
            while views:
                n = os.writev(self._out, views)
                while views and n >= len(views[0]):
                    n -= len(views[0])
                    views.pop(0)
                if views:
                    views[0] = views[0][n:]

    def pop(self) -> tuple[bool, bytes | None]:
        """The next line read and not yet served, if any: (True, line), else (False, None)."""
        if not self._queue:
            return False, None
        line = self._queue.popleft()
        self.queued_bytes -= _size(line)
        return True, line

    @property
    def readable_soon(self) -> bool:
        """Whether reading more is allowed (not at EOF, and the lines queued are under the bound)."""
        return not self._eof and self.queued_bytes <= QUEUE_MAX_BYTES
