"""One JSON-RPC session with a worker: each answer goes to the request that asked for it.

Both ``Sandbox.call`` and ``toolcage serve`` talk through it. Requests the runner makes
carry 64 random bits of id and wait on a slot of their own, so concurrent callers each
get their own answer; lines ``serve`` forwards as they are come back, in order, through
the parser's bounded queue. The parser (``transport.StreamParser``) refuses anything
nobody waits for, so no slot or queue entry exists without a request behind it.
"""

from __future__ import annotations

import json
import queue
import secrets
import threading
import time
from dataclasses import dataclass
from typing import Any, Literal

import jsonrpcclient

from toolcage.transport import EOF_MARK, Broken, StreamParser, Transport, id_key


@dataclass(frozen=True)
class Ended:
    """No answer will come: the stream ended (``eof``), broke (``broken``) or the wait ran out (``timeout``)."""

    how: Literal["eof", "broken", "timeout"]
    reason: str = ""


class _Slot:
    """Where the reader thread leaves the answer to one pending request."""

    __slots__ = ("answer", "event")

    def __init__(self) -> None:
        self.event = threading.Event()
        self.answer: dict[str, Any] | None = None


class Session:
    def __init__(self, max_line: int, on_stderr_line: Any = None, on_broken: Any = None, redact: Any = None) -> None:
        self.parser = StreamParser(max_line, on_stderr_line, on_broken, deliver=self._route, redact=redact)
        self._slots: dict[str, _Slot] = {}
        self._lock = threading.Lock()
        self._end: Ended | None = None
        self._transport: Transport | None = None
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
                slot.event.set()
            return False
        if not isinstance(item, dict) or "id" not in item:
            return False
        with self._lock:
            waiter = self._slots.get(id_key(item["id"]))
        if waiter is None:
            return False  # an answer to a forwarded line
        waiter.answer = item
        waiter.event.set()
        return True

    # requests the runner makes ----------------------------------------------------------
    def request(self, method: str, params: dict[str, Any] | None, until: float) -> dict[str, Any] | Ended:
        """Send one request and wait (until the monotonic time ``until``) for its own answer."""
        # unguessable ids: a forged answer would have to know the id of the call it answers
        req_id = secrets.token_hex(8)
        key, slot = id_key(req_id), _Slot()
        with self._lock:
            if self._end is not None:
                return self._end
            self._slots[key] = slot
        try:
            self.parser.expect(req_id)  # before sending: the answer may come at once
            line = (json.dumps(jsonrpcclient.request(method, params=params or None, id=req_id)) + "\n").encode()
            self._send(line, until)  # bounded too: a worker that stops reading cannot hold the caller
            if not slot.event.wait(max(until - time.monotonic(), 0)):
                return Ended("timeout")
            return slot.answer if slot.answer is not None else (self._end or Ended("eof"))
        finally:
            with self._lock:
                self._slots.pop(key, None)
            self.last_activity = time.monotonic()

    # lines forwarded as they are (`toolcage serve`) ----------------------------------------
    def forward(self, line: bytes) -> None:
        """Send one raw request line (the worker validates it); its answer comes from :meth:`next_forwarded`."""
        self.parser.expect_answer_to(line)
        self._send(line)

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

    def _send(self, line: bytes, until: float | None = None) -> None:
        assert self._transport is not None
        self.last_activity = time.monotonic()
        try:
            self._transport.send(line, until)
        except OSError:
            pass  # the worker is gone (the reader reports how it ended) or took too long (the wait times out)
