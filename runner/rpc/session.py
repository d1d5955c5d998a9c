"""One JSON-RPC session with a worker: each answer goes to the request that asked for it.

Both ``Sandbox.call`` and ``toolcage serve`` talk through it. Requests the runner makes
carry 64 random bits of id and wait on a slot of their own, so concurrent callers each
get their own answer; answers to lines ``serve`` forwards come back as the worker sends them, through
the parser's bounded queue. The parser (``transport.StreamParser``) refuses anything
nobody waits for, so no slot or queue entry exists without a request behind it.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Literal

import jsonrpcclient

from toolcage.errors import BadToolCall
from toolcage.policies import codes
from toolcage.rpc.transport import EOF_MARK, Broken, StreamParser, Transport, id_key
from toolcage.worker.protocol import FRAME_MARK, FRAME_MAX, MAX_REQUEST_BYTES

_INLINE_SEND = 64 * 1024  # request lines up to this are written from the event loop itself
CANCEL_SEND_S = 1.0  # a cancel that the worker does not take in this time is dropped (its call times out as usual)
PREFACE_SEND_S = 10.0  # the worker reads its preface first thing: a stdin buffer's worth goes at once


def _cancelled_answer(req_id: str) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "error": {"code": codes.REQUEST_CANCELLED, "message": "Request cancelled"}, "id": req_id}


def encode_request(req_id: str, method: str, params: dict[str, Any] | None) -> bytes:
    """One request line, refused on the host when the worker could not take it. Params whose ``frame`` is
    bytes send them as the line's data frame (toolcage.worker.protocol: the data path), ``frame`` then its size.

    Threat: a request over the worker's line limit (``MAX_REQUEST_BYTES``, the constant the worker's
    reader uses) is answered with id null, which the runner cannot tie to any call: the stream
    breaks and the sandbox is killed, with a misleading error. It is a params error instead,
    before anything is sent, and the sandbox goes on."""
    frame = params.get("frame") if params else None
    if not isinstance(frame, bytes | bytearray | memoryview):
        frame = None
    if frame is not None:  # the data path: the bytes go as a frame, not in JSON
        if len(frame) > FRAME_MAX:
            raise BadToolCall(f"a data frame is at most {FRAME_MAX} bytes", tool=method)
        params = {**(params or {}), "frame": len(frame)}
    line = json.dumps(jsonrpcclient.request(method, params=params or None, id=req_id))  # ASCII: len is bytes
    if len(line) > MAX_REQUEST_BYTES:
        raise BadToolCall(
            f"the request for {method} is {len(line) / (1 << 20):.1f} MiB; a request may be at most"
            f" {MAX_REQUEST_BYTES >> 20} MiB (the worker's line limit). Pass large data as a file instead"
            " (--workspace, or write it to /scratch in pieces)",
            tool=method,
            request_bytes=len(line),
            limit_bytes=MAX_REQUEST_BYTES,
        )
    if frame is not None:
        return b"".join((b"=%d\n" % len(frame), frame, line.encode(), b"\n"))
    return (line + "\n").encode()


def check_request_size(method: str, params: dict[str, Any] | None) -> None:
    """BadToolCall if a call with these params would be over the line limit (``precheck``: before a
    container starts), with room for the id and the progress token the runner adds."""
    encode_request("0" * 16, method, {**(params or {}), "_meta": {"progressToken": "0" * 16}})


@dataclass(frozen=True)
class Ended:
    """No answer will come: the stream ended (``eof``), broke (``broken``) or the wait ran out (``timeout``)."""

    how: Literal["eof", "broken", "timeout"]
    reason: str = ""


OnProgress = Callable[[dict[str, Any]], None]


class Cancel:
    """Cancels a call from another thread: ``sb.call(..., cancel=c)``, then ``c.cancel()``.

    The worker kills the call's processes at once and the call returns with status
    ``cancelled``; the sandbox stays usable. Cancelled before it is sent, the call is never
    sent; after its answer came, cancelling does nothing. One Cancel is for one call."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._cancelled = False
        self._send: Callable[[str | None], None] | None = None

    @property
    def cancelled(self) -> bool:
        return self._cancelled

    def cancel(self, reason: str | None = None) -> None:
        with self._lock:
            if self._cancelled:
                return
            self._cancelled, send = True, self._send
        if send is not None:
            send(reason)

    def _bind(self, send: Callable[[str | None], None] | None) -> bool:
        """The call is about to be sent (``send``: how to cancel it) or has ended (None); False:
        it was cancelled already."""
        with self._lock:
            self._send = send
            return not self._cancelled


class _Ids:
    """Request ids: 64 bits each from the OS's CSPRNG, read 512 ids at a time. One read per call cost a
    syscall that let go of the GIL, and the reader thread took it mid-call; ids read in bulk are as
    unguessable (a sandbox that sees its own ids learns nothing of the next), and a forked child reads
    its own. Each id is handed out once: a list iterator's ``next`` is atomic."""

    BULK = 512

    def __init__(self) -> None:
        self._it: Iterator[str] = iter(())
        os.register_at_fork(after_in_child=self._forget)

    def _forget(self) -> None:
        self._it = iter(())

    def __call__(self) -> str:
        for req_id in self._it:
            return req_id
        raw = os.urandom(8 * self.BULK).hex()
        self._it = it = iter([raw[i : i + 16] for i in range(0, len(raw), 16)])
        return next(it)


_new_id = _Ids()


class _Signal:
    """A one-shot ``threading.Event`` (``set``, ``is_set``, ``wait``) made of one held lock: the waiter blocks in
    the lock's C acquire and ``set`` releases it. A call makes one per request; an Event builds a Condition and
    its Python waiter list for it, and its ``set`` and ``wait`` run that Condition's Python on both threads."""

    __slots__ = ("_flag", "_lock")

    def __init__(self) -> None:
        self._flag = False
        self._lock = threading.Lock()
        self._lock.acquire()

    def is_set(self) -> bool:
        return self._flag

    def set(self) -> None:
        if self._flag:
            return
        self._flag = True
        with contextlib.suppress(RuntimeError):  # set twice at once: the other release won
            self._lock.release()

    def wait(self, timeout: float) -> bool:
        """True once set (at once if it was); False if ``timeout`` seconds passed first."""
        if self._flag:
            return True
        if self._lock.acquire(timeout=min(max(timeout, 0), threading.TIMEOUT_MAX)):
            with contextlib.suppress(RuntimeError):  # released again: every later wait passes at once
                self._lock.release()
            return True
        return self._flag


class _LoopWaker:
    """Runs functions on one event loop from the reader thread, many to one wake-up: the first one due schedules
    the loop's run of all of them (``call_soon_threadsafe``, a write to the loop's self-pipe); those that come
    before that run only join the list. 64 answers in one read of the attach stream wake the loop once, not 64
    times, and 64 ``settle`` callbacks run in one go."""

    __slots__ = ("_due", "_lock", "loop")

    def __init__(self, loop: Any) -> None:
        self.loop = loop
        self._due: list[Callable[[], None]] = []
        self._lock = threading.Lock()

    def __call__(self, fn: Callable[[], None]) -> None:  # any thread
        with self._lock:
            self._due.append(fn)
            first = len(self._due) == 1
        if first:
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits any more
                self.loop.call_soon_threadsafe(self._run)

    def _run(self) -> None:  # on the loop
        with self._lock:
            due, self._due = self._due, []
        for fn in due:
            fn()


class _Slot:
    """Where the reader thread leaves the answer to one pending request (and, for an async
    caller, ``notify`` wakes its event loop)."""

    __slots__ = ("answer", "event", "notify", "on_progress")

    def __init__(self, on_progress: OnProgress | None = None) -> None:
        self.event = _Signal()
        self.answer: dict[str, Any] | None = None
        self.on_progress = on_progress
        self.notify: Callable[[], None] | None = None

    def done(self) -> None:
        self.event.set()
        if self.notify is not None:
            self.notify()


class Session:
    def __init__(self, max_line: int, on_stderr_line: Any = None, on_broken: Any = None, redact: Any = None) -> None:
        self.parser = StreamParser(max_line, on_stderr_line, on_broken, deliver=self._route, redact=redact)
        self._slots: dict[str, _Slot] = {}
        self._lock = threading.Lock()
        self._end: Ended | None = None
        self._transport: Transport | None = None
        self._waker: _LoopWaker | None = None  # the event loop async callers wait on (request_async)
        # request lines of async callers, written together once the loop has run every task ready (_send_soon)
        self._outbox: list[bytes] = []
        self._outbox_bytes = 0
        self._outbox_until = 0.0
        self._out_lock = threading.Lock()  # lines go out in the order they were sent or queued
        self.last_activity = time.monotonic()

    def connect(self, transport: Transport) -> None:
        self._transport = transport

    @property
    def connected(self) -> bool:
        return self._transport is not None

    def busy(self) -> bool:
        """Is any answer still owed (a call in progress, or a forwarded line unanswered)?"""
        return self.parser.outstanding() > 0

    # the reader thread ----------------------------------------------------------------
    def _route(self, item: Any) -> bool:
        """Hand an answer to its waiter (True: taken); the end of the stream wakes every waiter
        and is queued too, for ``serve``'s reader."""
        self.last_activity = time.monotonic()
        if item is EOF_MARK or isinstance(item, Broken):
            with self._lock:
                if self._end is None:
                    self._end = Ended("broken", item.reason) if isinstance(item, Broken) else Ended("eof")
                slots = list(self._slots.values())
            for slot in slots:
                slot.done()
            return False
        if not isinstance(item, dict):
            return False
        if "id" not in item:  # progress (the parser lets nothing else through): to the call that asked
            return self._progress(item)
        with self._lock:
            waiter = self._slots.get(id_key(item["id"]))
        if waiter is None:
            return False  # an answer to a forwarded line
        waiter.answer = item
        waiter.done()
        return True

    def _progress(self, item: dict[str, Any]) -> bool:
        params = item["params"]
        with self._lock:
            slot = self._slots.get(id_key(params["progressToken"]))  # the runner's token is the request id
        if slot is None or slot.on_progress is None:
            return False  # progress for a forwarded line: serve's reader passes it on
        try:
            slot.on_progress({k: v for k, v in params.items() if k != "progressToken"})
        except Exception:  # noqa: S110 - the caller's callback must not stop the reader thread
            pass
        return True

    # requests the runner makes ----------------------------------------------------------
    def request(
        self,
        method: str,
        params: dict[str, Any] | None,
        until: float,
        *,
        on_progress: OnProgress | None = None,
        cancel: Cancel | None = None,
    ) -> dict[str, Any] | Ended:
        """Send one request and wait (until the monotonic time ``until``) for its own answer.

        ``on_progress`` gets each progress notification's params (on the reader thread: keep it
        short); ``cancel`` can cancel the call from another thread."""
        req_id, key, slot = self._new_slot(on_progress)
        if slot is None:
            return self._end or Ended("eof")
        try:
            if cancel is not None and not cancel._bind(lambda reason: self._cancel(req_id, reason)):
                return _cancelled_answer(req_id)  # never sent
            self._send(self._request_line(req_id, method, params, on_progress), until)  # bounded: see _write_until
            if not slot.event.wait(max(until - time.monotonic(), 0)):
                return Ended("timeout")
            return slot.answer if slot.answer is not None else (self._end or Ended("eof"))
        finally:
            if cancel is not None:
                cancel._bind(None)
            with self._lock:
                self._slots.pop(key, None)
            self.last_activity = time.monotonic()

    def _new_slot(self, on_progress: OnProgress | None = None) -> tuple[str, str, _Slot | None]:
        # unguessable ids: a forged answer would have to know the id of the call it answers
        req_id = _new_id()
        key, slot = id_key(req_id), _Slot(on_progress)
        with self._lock:
            if self._end is not None:
                return req_id, key, None
            self._slots[key] = slot
        return req_id, key, slot

    def _request_line(
        self, req_id: str, method: str, params: dict[str, Any] | None, on_progress: OnProgress | None
    ) -> bytes:
        """The request's line, its answer (and progress, when asked for) expected before it is sent; a
        line over the worker's limit raises BadToolCall before anything is expected or sent."""
        if on_progress is not None:  # MCP's convention; the worker takes _meta out of the params
            params = {**(params or {}), "_meta": {"progressToken": req_id}}
        line = encode_request(req_id, method, params)
        # before sending: the answer may come at once (with a data frame only when the request asked for one)
        self.parser.expect(req_id, req_id if on_progress else None, frame=bool(params and params.get("frame") is True))
        return line

    async def request_async(
        self, method: str, params: dict[str, Any] | None, until: float, *, on_progress: OnProgress | None = None
    ) -> dict[str, Any] | Ended:
        """:meth:`request` for an event loop: no thread waits for the answer (the reader thread
        wakes the loop). Cancelling the awaiting task cancels the call in the worker (MCP's
        ``notifications/cancelled``); its -32800 answer is then taken and dropped."""
        import asyncio  # here: a program on an event loop has it already; a `toolcage run` never needs it

        loop = asyncio.get_running_loop()
        answered = loop.create_future()
        req_id, key, slot = self._new_slot(on_progress)
        if slot is None:
            return self._end or Ended("eof")

        def settle() -> None:
            if not answered.done():
                answered.set_result(None)

        waker = self._waker
        if waker is None or waker.loop is not loop:
            waker = self._waker = _LoopWaker(loop)
        slot.notify = functools.partial(waker, settle)  # on the reader thread
        sent = keep = False
        try:
            line = self._request_line(req_id, method, params, on_progress)
            if len(line) <= _INLINE_SEND:  # takes the socket's buffer at once (the worker reads ahead)
                self._send_soon(line, until, loop)
            else:
                # the answer is expected already: the line must go out whatever happens to this task (a
                # cancelled executor job would leave an answer owed forever), and a task cancelled while
                # it is written cancels the call once it is out (else it runs on and its answer is nobody's)
                state = {"out": False, "cancel": False}

                def send_long() -> None:
                    self._send(line, until)
                    with self._lock:
                        state["out"], cancel = True, state["cancel"]
                    if cancel:
                        self._cancel_sent(req_id, key, slot)

                try:
                    await asyncio.shield(loop.run_in_executor(None, send_long))
                except asyncio.CancelledError:
                    keep = True
                    slot.notify = lambda: self._drop_slot(key)
                    with self._lock:
                        state["cancel"], out = True, state["out"]
                    if out:
                        self._cancel_sent(req_id, key, slot)
                    raise
            sent = True
            # a timer that settles the same future, not asyncio.wait_for (a second future, a task step and a
            # done callback per call); the answer's arrival, not which of the two came first, decides
            timer = loop.call_later(max(until - time.monotonic(), 0), settle)
            try:
                await answered
            finally:
                timer.cancel()
            if not slot.event.is_set():
                return Ended("timeout")
            return slot.answer if slot.answer is not None else (self._end or Ended("eof"))
        except asyncio.CancelledError:
            if sent:
                slot.notify = lambda: self._drop_slot(key)  # its -32800 answer (or the end) takes the slot away
                if not slot.event.is_set():
                    keep = True
                    self._cancel(req_id, "cancelled by the caller")
            raise
        finally:
            if not keep:
                self._drop_slot(key)
            self.last_activity = time.monotonic()

    def _cancel_sent(self, req_id: str, key: str, slot: _Slot) -> None:
        """A call whose task was cancelled while its line was written: it is out now, cancel it (its
        -32800, or the answer that beat the cancel, takes the slot away: ``slot.notify``)."""
        if slot.event.is_set():
            self._drop_slot(key)
        else:
            self._cancel(req_id, "cancelled by the caller")

    def _drop_slot(self, key: str) -> None:
        with self._lock:
            self._slots.pop(key, None)

    def send_now(
        self, method: str, params: dict[str, Any] | None, until: float
    ) -> Callable[[], dict[str, Any] | Ended]:
        """Send one request now and return a function that waits (until ``until``) for its answer.

        A pooled sandbox's ``sandbox.configure`` goes out this way, and the run's first call right
        behind it: the worker serves configure on its main thread before it reads on, so the call
        runs after the configuration, and nobody waits a round trip for an answer that says nothing new."""
        req_id = _new_id()
        key, slot = id_key(req_id), _Slot()
        line = encode_request(req_id, method, params)
        with self._lock:
            if self._end is not None:
                end = self._end
                return lambda: end
            self._slots[key] = slot
        self.parser.expect(req_id)
        self._send(line, until)

        def wait() -> dict[str, Any] | Ended:
            try:
                if not slot.event.wait(max(until - time.monotonic(), 0)):
                    return Ended("timeout")
                return slot.answer if slot.answer is not None else (self._end or Ended("eof"))
            finally:
                with self._lock:
                    self._slots.pop(key, None)

        return wait

    def _cancel(self, req_id: str, reason: str | None) -> None:
        """MCP's cancel notification for a call in flight (the worker answers it with -32800)."""
        params: dict[str, Any] = {"requestId": req_id}
        if reason:
            params["reason"] = reason
        note = {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": params}
        self._send((json.dumps(note) + "\n").encode(), time.monotonic() + CANCEL_SEND_S)

    # lines forwarded as they are (`toolcage serve`) ----------------------------------------
    def forward(self, line: bytes) -> None:
        """Send one raw request line (the worker validates it); its answer comes from :meth:`next_forwarded`.
        A line that would read as a data frame's header (``=``: toolcage.worker.protocol) goes with a space
        before it: the worker answers it as the JSON it is not, instead of taking the lines after it as a frame."""
        self.parser.expect_answer_to(line)
        self._send(b" " + line if line[:1] == FRAME_MARK else line)

    def next_forwarded(self, timeout: float) -> Any:
        """The next answer to a forwarded line, EOF_MARK, a Broken, or None if ``timeout`` passed first."""
        try:
            return self.parser.messages.get(timeout=max(timeout, 0))
        except queue.Empty:
            return None

    # the end ------------------------------------------------------------------------------
    def close_input(self) -> None:
        """Close the worker's stdin: it exits after answering what it has read."""
        if self._transport is not None:
            self._transport.close_stdin()

    def close(self) -> None:
        self.parser.close()
        if self._transport is not None:
            self._transport.close()

    def preface(self, word: bytes) -> None:
        """Bytes before the protocol's first line, which the worker reads at its boot (a cached workspace copy's
        ``lay`` or ``fill``: toolcage.worker.copyfs); never after a request."""
        self._send(word, time.monotonic() + PREFACE_SEND_S)

    def _send(self, line: bytes, until: float | None = None) -> None:
        """Write ``line`` (after any lines queued by :meth:`_send_soon`, in one write)."""
        assert self._transport is not None
        self.last_activity = time.monotonic()
        with self._out_lock:
            queued = self._take_outbox()
            if queued is not None:
                line, until = queued[0] + line, queued[1] if until is None else min(until, queued[1])
            self._write(line, until)

    def _send_soon(self, line: bytes, until: float, loop: Any) -> None:
        """On an event loop: queue ``line`` to be written once the loop has run the tasks ready now, with every
        other line they queue, in one write (64 calls gathered: one syscall, and one wake-up of the engine's
        attach relay and of the worker, instead of 64 each). Past ``_INLINE_SEND`` bytes queued, written now."""
        with self._out_lock:
            self._outbox.append(line)
            self._outbox_bytes += len(line)
            first = len(self._outbox) == 1
            self._outbox_until = until if first else min(until, self._outbox_until)
            full = self._outbox_bytes >= _INLINE_SEND
        if full:
            self._flush_outbox()
        elif first:
            loop.call_soon(self._flush_outbox)

    def _flush_outbox(self) -> None:
        with self._out_lock:
            queued = self._take_outbox()
            if queued is not None:
                self.last_activity = time.monotonic()
                self._write(*queued)

    def _take_outbox(self) -> tuple[bytes, float] | None:
        """(Under ``_out_lock``.) The queued lines as one write and the earliest deadline among them, the queue
        emptied; None when nothing is queued."""
        if not self._outbox:
            return None
        data, until = b"".join(self._outbox), self._outbox_until
        self._outbox.clear()
        self._outbox_bytes = 0
        return data, until

    def _write(self, data: bytes, until: float | None) -> None:
        assert self._transport is not None
        try:
            self._transport.send(data, until)
        except OSError:
            pass  # the worker is gone (the reader reports how it ended) or took too long (the wait times out)
