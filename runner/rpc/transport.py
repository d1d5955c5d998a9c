"""Byte streams to and from a worker, treated as hostile: bounded lines, bounded memory.

Every transport feeds one parser: the container's attach socket (``toolcage.engine.attach``: Docker
multiplexes stdout and stderr into 8-byte-header frames) and a local subprocess's pipes
(``toolcage.backends.process``, ``--sandbox none``). A reader thread turns stdout into JSON messages on
a queue and keeps only the tail of stderr.
"""

from __future__ import annotations

import json
import queue
import select
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

from toolcage.policies.contract import PROGRESS
from toolcage.policies.contract import id_key as id_key  # for session.py until it imports the contract
from toolcage.worker.protocol import (
    BAD_FRAME,
    FRAME_MARK,
    FRAME_MAX,
    Framed,
    LineSplitter,
    progress_token,
    valid_request,
)

STDERR_TAIL_BYTES = 64 * 1024
EOF_MARK = object()
DROP = "drop"  # StreamParser._claim: a message allowed but over its budget (not queued, not a violation)


class Transport(Protocol):
    """What a backend hands the session: bytes in, and a reader thread feeding the parser."""

    def send(self, data: bytes, until: float | None = None) -> None:
        """Write all of ``data``; TimeoutError if the worker has not taken it by the monotonic time ``until``."""
        ...

    def close_stdin(self) -> None: ...

    def close(self) -> None: ...


class Broken:
    """Queued when the stream can no longer be trusted (garbage, oversized line)."""

    def __init__(self, reason: str) -> None:
        self.reason = reason


class StreamParser:
    """Splits worker stdout into JSON messages (queued) and keeps the last bytes of stderr.

    Threat: whatever runs in the container forging answers or flooding the runner. Only a
    message the runner is waiting for is queued: a response whose id belongs to a pending
    request (ids are random, see ``Session.request`` in rpc/session.py), or, for ``toolcage serve``, an answer
    to a line that could carry no id, or a ``notifications/progress`` whose token a pending
    request registered (at most PROGRESS_MAX of them per request; more are dropped). Anything
    else (an unknown or repeated id, another notification, anything while nothing is pending)
    breaks the stream, and ``on_broken`` kills the sandbox. So the queue never holds more than
    the pending calls and their progress, and it is bounded besides: when it is full the reader
    stops reading (back-pressure on the worker).

    ``deliver`` (the session's router) sees every item first, on the reader thread; what it
    takes (an answer a caller waits for) is not queued.
    """

    QUEUE_MAX = 64
    PROGRESS_MAX = 20_000  # progress notifications one request may get (the worker coalesces output)

    def __init__(
        self,
        max_line: int,
        on_stderr_line: Any = None,
        on_broken: Any = None,
        deliver: Callable[[Any], bool] | None = None,
        redact: Callable[[Any], Any] | None = None,
    ) -> None:
        self.max_line = max_line
        self._deliver = deliver
        # the run's secret values out of every message and stderr line, before anyone sees them
        self._redact = redact or (lambda x: x)
        self.messages: queue.Queue[Any] = queue.Queue(maxsize=self.QUEUE_MAX)
        self._lines = LineSplitter(max_line)
        self._err: deque[bytes] = deque()
        self._err_size = 0
        self._err_partial = bytearray()
        self._on_stderr_line = on_stderr_line
        self._on_broken = on_broken
        self._lock = threading.Lock()
        self._pending: dict[str, int] = {}  # canonical JSON of an id -> how many answers it may get
        self._tokens: dict[str, int] = {}  # progress token -> how many notifications it may still get
        self._token_of: dict[str, str] = {}  # id -> the progress token its request registered
        self._unidentified = 0  # answers with id null still owed (serve: lines that carried no usable id)
        self._batches = 0  # batch answers still owed (serve)
        self._framed: set[str] = set()  # ids whose answer may come with a data frame
        self.closed = False
        self.broken = False

    # what the runner is waiting for ------------------------------------------------------
    def expect(self, req_id: Any, progress_token: Any = None, frame: bool = False) -> None:
        """A request with this id is about to be sent: its answer may come (and, with a
        ``progress_token``, progress notifications until then; with ``frame``, a data frame before it, of at
        most FRAME_MAX bytes: toolcage.worker.protocol)."""
        key = id_key(req_id)
        with self._lock:
            self._pending[key] = self._pending.get(key, 0) + 1
            if frame:
                self._framed.add(key)
                self._lines.frames = FRAME_MAX  # a frame header is taken (and its buffer made) only while one may come
            if progress_token is not None:
                token = id_key(progress_token)
                self._tokens[token] = self.PROGRESS_MAX
                self._token_of[key] = token

    def outstanding(self) -> int:
        """How many answers the worker still owes (0: idle)."""
        with self._lock:
            return sum(self._pending.values()) + self._unidentified + self._batches

    def expect_unidentified(self) -> None:
        with self._lock:
            self._unidentified += 1

    def expect_batch(self) -> None:
        with self._lock:
            self._batches += 1

    def expect_answer_to(self, line: bytes) -> None:
        """Register what the worker will answer to one raw request line (``toolcage serve``),
        following the worker's own rules: a request with an id gets that id back, a
        notification nothing, an unreadable or invalid line an answer with id null, a batch
        one list (unless it holds only notifications)."""
        try:
            msg = json.loads(line)
        except ValueError:
            self.expect_unidentified()
            return
        if isinstance(msg, list):
            if not msg or not all(valid_request(r) for r in msg):
                self.expect_unidentified()
            elif any("id" in r for r in msg):
                self.expect_batch()
            return
        if not valid_request(msg) or msg.get("id", 0) is None:
            self.expect_unidentified()
        elif "id" in msg:
            self.expect(msg["id"], progress_token(msg.get("params")))

    def _claim(self, msg: Any) -> str | None:
        """Consume the expectation this message answers; the reason it answers none otherwise."""
        with self._lock:
            if isinstance(msg, list):
                if self._batches <= 0:
                    return "a batch answer that no batch request asked for"
                self._batches -= 1
                return None
            if "id" not in msg:
                return self._claim_progress(msg)
            if msg["id"] is None:
                if self._unidentified <= 0:
                    return "an answer with id null that no request asked for"
                self._unidentified -= 1
                return None
            key = id_key(msg["id"])
            left = self._pending.get(key, 0)
            if left <= 0:
                return f"an answer to no pending call (id {key[:40]})"
            if left == 1:
                del self._pending[key]
                self._framed.discard(key)
                if not self._framed:
                    self._lines.frames = 0
                token = self._token_of.pop(key, None)
                if token is not None:
                    self._tokens.pop(token, None)  # none may come after the answer
            else:
                self._pending[key] = left - 1
            return None

    def _take_frame(self, msg: Any, frame: bytes | bytearray) -> bool:
        """A data frame came before ``msg``: it must be the answer to a request that asked for one, whose
        result's ``frame`` gives the frame's size; the bytes take its place (``result["frame"]``)."""
        result = msg.get("result") if isinstance(msg, dict) else None
        if not isinstance(result, dict) or type(result.get("frame")) is not int or result["frame"] != len(frame):
            return False
        with self._lock:
            if type(msg.get("id")) not in (str, int) or id_key(msg["id"]) not in self._framed:
                return False
        result["frame"] = frame
        return True

    def _claim_progress(self, msg: dict[str, Any]) -> str | None:
        """A progress notification for a pending request that asked for it (lock held)."""
        params = msg.get("params")
        token = params.get("progressToken") if isinstance(params, dict) else None
        if msg.get("method") != PROGRESS or type(token) not in (str, int):
            return "a notification that is not progress"
        key = id_key(token)
        left = self._tokens.get(key)
        if left is None:
            return "progress for no pending call that asked for it"
        if left <= 0:
            return DROP
        self._tokens[key] = left - 1
        return None

    # the streams ---------------------------------------------------------------------------
    def stdout(self, data: bytes | memoryview) -> None:
        if self.broken:
            return
        for line in self._lines.feed(data):
            if line is None:
                self._break(f"the worker sent a line longer than {self.max_line} bytes")
                return
            if line is BAD_FRAME or line[:1] == FRAME_MARK:  # (taken as a line: no call may get a frame now)
                self._break("the sandbox sent a data frame no call asked for, or one that is too large")
                return
            if not line.strip():
                continue
            try:
                msg = json.loads(line)
            except ValueError:
                self._break("the worker sent a line that is not JSON")
                return
            if not isinstance(msg, dict | list):
                self._break("the worker sent JSON that is not a JSON-RPC message")
                return
            msg = self._redact(msg)
            if isinstance(line, Framed) and not self._take_frame(msg, line.frame):
                self._break("the sandbox sent a data frame with a message that cannot carry it")
                return
            unexpected = self._claim(msg)
            if unexpected is DROP:
                continue
            if unexpected is not None:
                self._break(f"the sandbox sent {unexpected}")
                return
            self._put(msg)

    @property
    def _buf(self) -> bytearray:
        """The unfinished line held now (tests check it stays bounded)."""
        return self._lines.buf

    def _put(self, item: Any) -> None:
        """Queue, waiting while the queue is full (the reader then stops reading: back-pressure)."""
        if self._deliver is not None and self._deliver(item):
            return
        while not self.closed:
            try:
                self.messages.put(item, timeout=0.5)
                return
            except queue.Full:
                continue

    def _break(self, reason: str) -> None:
        self.broken = True
        self._lines.buf.clear()
        if self._on_broken is not None:
            self._on_broken(reason)
        self._put(Broken(reason))

    def stderr(self, data: bytes) -> None:
        self._err.append(data)
        self._err_size += len(data)
        while self._err_size > STDERR_TAIL_BYTES and len(self._err) > 1:
            self._err_size -= len(self._err.popleft())
        if self._on_stderr_line is not None:
            self._err_partial += data
            *lines, rest = self._err_partial.split(b"\n")
            self._err_partial = bytearray(rest[-STDERR_TAIL_BYTES:])
            for ln in lines:
                # redacted before the cut: a cut through a value would leave a part that no longer matches
                self._on_stderr_line(str(self._redact(ln.decode("utf-8", errors="replace")))[:4096])

    def stderr_tail(self, limit: int = 4096) -> str:
        return str(self._redact(b"".join(self._err).decode("utf-8", errors="replace")))[-limit:]

    def eof(self) -> None:
        self._put(EOF_MARK)

    def close(self) -> None:
        """The runner is done: stop waiting for room in the queue."""
        self.closed = True


def write_until(fd: int, data: bytes, until: float | None, write: Callable[[memoryview], int]) -> None:
    """Threat: a worker that stops reading (stuck, or thrashing at its memory limit) must not hold
    the caller past its own deadline: a blocking write of a large request would.

    ``write`` does not block: it is tried first, and only when the worker's side is full does the
    caller wait for room (a call's line nearly always fits at once: one syscall, not a poll and a write)."""
    view = memoryview(data)
    poller = None
    while view:
        try:
            view = view[write(view) :]
            continue
        except BlockingIOError:
            pass
        if poller is None:
            poller = select.poll()
            poller.register(fd, select.POLLOUT)
        wait_ms = None if until is None else max(until - time.monotonic(), 0) * 1000
        if not poller.poll(wait_ms):
            raise TimeoutError("the worker did not take the request in time")
