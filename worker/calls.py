"""The call in progress: its progress notifications and its cancellation.

Calls that run code may run concurrently, each on its own thread (``worker.__main__``, up to the
policy's ``limits.concurrency``); the others run on the main thread. Each thread knows its own
call (``current()``), and every call in flight is registered by id. A ``notifications/cancelled``
(MCP) or ``$/cancelRequest`` (LSP) naming a call kills its process group the moment it is read:
by the main thread's loop, or, while the main thread itself runs a call's child, by
``proc.run_child`` watching the channel. The call then answers ``-32800 RequestCancelled`` (the
runner drops that answer when its caller asked for MCP's "no response").

Progress follows MCP's shape, ``notifications/progress {progressToken, progress, total?,
message?}``, sent only for a request whose params carried ``_meta.progressToken``, with
``progress`` strictly increasing and none after the answer: ``run_python``/``run_shell`` output
as it comes (``progress`` = bytes streamed so far, coalesced, never more than the output cap),
and a connector's ``ctx.progress`` reports.
"""

from __future__ import annotations

import codecs
import json
import math
import os
import signal
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from toolcage.policies.contract import CANCEL_METHODS, PROGRESS, cancel_target, id_key
from toolcage.worker.protocol import QUEUE_MAX_BYTES

_FLUSH_EVERY_S = 0.1  # output is sent at most this often...
_FLUSH_BYTES = 64 * 1024  # ...or when this much is waiting
_MESSAGE_MAX = 4096  # a connector's progress message is cut to this
_EARLY_MAX = 64  # cancels for requests not started yet that are remembered

_send: Callable[[str], None] | None = None  # the channel's writer (see attach)
_channel: Any = None


_key = id_key  # the runner's key for the same id: one canonical form on both sides


class Call:
    """One request being served."""

    __slots__ = (
        "_decoders", "_last_flush", "_pending", "_stream", "cancelled", "key", "pgid", "progress", "streamed", "token",
    )  # fmt: skip

    def __init__(self, req_id: Any, token: str | int | None) -> None:
        self.key = _key(req_id)
        self.token = token
        self.cancelled = False
        self.pgid: int | None = None  # the process group running for it now
        self.progress = 0.0  # the last progress value sent
        self.streamed = 0  # output bytes sent
        self._pending = bytearray()  # output of one stream not sent yet
        self._stream = "stdout"
        self._last_flush = time.monotonic()
        self._decoders: dict[str, codecs.IncrementalDecoder] = {}

    def kill(self) -> None:
        if self.pgid is not None:
            try:
                os.killpg(self.pgid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass

    # progress ------------------------------------------------------------------------------
    def _notify(self, progress: float, total: float | None, message: str | None, stream: str | None = None) -> None:
        if self.token is None or _send is None or not progress > self.progress:
            return  # MCP: progress strictly increases
        self.progress = progress
        params: dict[str, Any] = {"progressToken": self.token, "progress": progress}
        if total is not None:
            params["total"] = total
        if message is not None:
            params["message"] = message
        if stream is not None:
            params["stream"] = stream  # output's stream (stdout or stderr): beside MCP's fields, which ignore it
        from toolcage.worker.secrets import STORE

        _send(json.dumps(STORE.redact({"jsonrpc": "2.0", "method": PROGRESS, "params": params})))

    def report(self, progress: Any, total: Any, message: Any) -> None:
        """A connector's ``ctx.progress``: checked (finite numbers, a bounded string) and sent."""
        if not _number(progress) or (total is not None and not _number(total)):
            return
        from toolcage.worker.secrets import STORE

        # redacted before the cut: a cut through an exposed value would leave a part that no longer matches
        text = STORE.clip(message, _MESSAGE_MAX) if isinstance(message, str) else None
        self._notify(float(progress), None if total is None else float(total), text)

    def output(self, stream: str, chunk: bytes, room: int) -> None:
        """Output of the call's child (what it keeps of it: at most ``room`` more bytes)."""
        if self.token is None or room <= 0:
            return
        if stream != self._stream:
            self.flush()  # each stream decodes on its own (a character may span two of its chunks)
            self._stream = stream
        self._pending += chunk[:room]
        if len(self._pending) >= _FLUSH_BYTES or time.monotonic() - self._last_flush >= _FLUSH_EVERY_S:
            self.flush()

    def flush_due(self) -> None:
        """Output that has waited its interval goes now, new output or not: a line followed by silence
        (a prompt, a first line before a long sleep) is not held back until the next one, or the answer."""
        if self._pending and time.monotonic() - self._last_flush >= _FLUSH_EVERY_S:
            self.flush()

    def flush(self, final: bool = False) -> None:
        """Send the output waiting (all of it when ``final``: before the answer goes out)."""
        self._last_flush = time.monotonic()
        if not self._pending:
            return
        decoder = self._decoders.setdefault(self._stream, codecs.getincrementaldecoder("utf-8")("replace"))
        text = decoder.decode(bytes(self._pending), final=final)
        self.streamed += len(self._pending)
        self._pending.clear()
        if text:
            self._notify(float(self.streamed), None, text, self._stream)


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


_local = threading.local()  # .call: the call this thread serves
_running: dict[str, Call] = {}  # every call in flight, by id (cancels look them up from any thread)
_lock = threading.Lock()
_early: OrderedDict[str, None] = OrderedDict()  # cancelled before they started


def current() -> Call | None:
    """The call this thread is serving, if any."""
    return getattr(_local, "call", None)


def begin(req_id: Any, token: str | int | None) -> Call:
    call = Call(req_id, token)
    with _lock:
        if call.key in _early:
            del _early[call.key]
            call.cancelled = True
        _running[call.key] = call
    _local.call = call
    return call


def end() -> None:
    call = current()
    if call is not None:
        call.flush(final=True)
        with _lock:
            if _running.get(call.key) is call:
                del _running[call.key]
    _local.call = None


def cancelled() -> bool:
    call = current()
    return call is not None and call.cancelled


cancel_message = cancel_target  # the id a cancel notification names (policies.contract), or None


def attach(channel: Any) -> None:
    """The worker's protocol channel: progress is written to it, cancels are read from it."""
    global _send, _channel
    _channel, _send = channel, channel.send
    channel.on_control = on_control_line


def on_control_line(line: bytes) -> bool:
    """A line read from the channel: act on it now if it is a cancel (True), else leave it queued."""
    try:
        msg = json.loads(line)
    except ValueError:
        return False
    req_id = cancel_message(msg)
    if req_id is None:
        return False
    cancel(req_id)
    return True


def control_fd() -> int | None:
    """While a call runs: the fd to watch for its cancel (None: nothing to watch)."""
    if current() is None or _channel is None or _channel.at_eof or _channel.queued_bytes > QUEUE_MAX_BYTES:
        return None  # (requests that queue up behind a call stay in the pipe past this: back-pressure)
    if threading.current_thread() is not threading.main_thread():
        return None  # the main thread's loop reads the channel meanwhile
    return int(_channel.fd_in)


def read_control() -> None:
    """The channel is readable mid-call: read it (requests are queued, cancels acted on)."""
    if _channel is not None:
        _channel.read_some()


def cancel(req_id: Any) -> None:
    """Cancel the call with this id: kill its processes now if it runs, or refuse it when it starts."""
    key = _key(req_id)
    with _lock:
        call = _running.get(key)
        if call is None:
            _early[key] = None
            while len(_early) > _EARLY_MAX:
                _early.popitem(last=False)
            return
        call.cancelled = True
    call.kill()


__all__ = [
    "CANCEL_METHODS", "Call", "attach", "begin", "cancel", "cancel_message", "cancelled", "control_fd", "current",
    "end", "on_control_line", "read_control",
]  # fmt: skip
