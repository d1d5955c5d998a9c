"""The worker's serving loop: requests in the order read, calls that run code on threads beside each other.

A request for a tool that runs code in a child (``run_python``, ``run_shell``, a connector) gets a
thread of its own, up to the policy's ``limits.concurrency`` in flight; the answers go out as
each call ends, matched by id. Everything else (``ping``, ``tools.list``, the file tools,
``sandbox.configure``, batches, notifications, lines that are not JSON) is served on the main
thread, in order; those that start a connector's child (its calls, which may hold the run's
secrets, ``sandbox.configure``, the first ``tools.list``) first wait until no code call is in
flight, so they run alone, after the sweep. Calls that wait on a background process (``proc_read`` with a
timeout, ``proc_wait``) get a thread of their own too, up to ``WAITS_MAX``, whatever the concurrency.
With ``concurrency: 1`` every request is served on
the main thread, one after another, as the worker always did.

While calls run on their threads the main thread keeps reading the channel: a cancel acts the
moment it is read (``worker.calls``), requests queue up to ``protocol.QUEUE_MAX_BYTES`` and wait
for a free slot, and past that bound the channel is not read (back-pressure on the runner).
"""

from __future__ import annotations

import _thread
import os
import threading
from collections.abc import Callable
from typing import Any

from toolcage.worker.protocol import readable, serve_framed

WAITS_MAX = 16  # calls waiting on background processes at once (each a thread); more wait for a free one


def _end_waits() -> None:
    import sys

    background = sys.modules.get("toolcage.worker.children.background")
    if background is not None:
        background.shutdown()


class Loop:
    def __init__(self, channel: Any, dispatcher: Any, idle: Callable[[], bool]) -> None:
        self.channel = channel
        self.dispatcher = dispatcher
        self.idle = idle
        self.served = 0
        self._in_flight = 0
        self._waiting = 0  # calls that wait on a background process (never counted as code calls)
        self._lock = threading.Lock()
        self._wake_r, self._wake_w = os.pipe()  # a call's thread ended (close-on-exec, as os.pipe makes them)
        os.set_blocking(self._wake_w, False)

    def run(self) -> int:
        """Serve until the runner closes the channel and every call has answered; the count served."""
        channel = self.channel
        while True:
            got, line = channel.pop()
            if got:
                self._serve(line)
                continue
            in_flight = self._count()
            waiting = self._count(waiting=True)
            if channel.at_eof and not in_flight and not waiting:
                return self.served
            if channel.at_eof and waiting:
                _end_waits()  # the runner closed the channel: waits on background processes answer now
            if not in_flight and self.idle():  # logs, the zygote, the policy: only when nothing runs
                channel.read_some()  # idle saw the channel readable: no second poll to learn it again
                continue
            self._wait(read=channel.readable_soon)

    def _serve(self, line: bytes | None) -> None:
        self.served += 1
        msg = self.dispatcher.parse(line)
        kind = self.dispatcher.concurrent(msg)
        if kind == "waits":
            while self._count(waiting=True) >= WAITS_MAX:
                self._wait(read=self.channel.readable_soon)
            with self._lock:
                self._waiting += 1
            try:
                _thread.start_new_thread(self._call, (line, msg, True))
            except RuntimeError:
                self._call(line, msg, True)
            return
        if not kind:
            if self.dispatcher.alone(msg):
                while self._count():  # until every code call has ended (the last one out swept)
                    self._wait(read=self.channel.readable_soon)
            self._answer(line, msg)
            return
        limit = self.dispatcher.concurrency()
        while self._count() >= limit:
            self._wait(read=self.channel.readable_soon)  # cancels are read meanwhile
        with self._lock:
            self._in_flight += 1
        try:
            _thread.start_new_thread(self._call, (line, msg))
        except RuntimeError:
            # no thread to be had (tool code filled the pids limit): served here instead, like any
            # request with concurrency 1 (its own child will likely fail to start, and say so)
            self._call(line, msg)

    def _call(self, line: bytes | None, msg: Any, waiting: bool = False) -> None:
        try:
            self._answer(line, msg)
        finally:
            with self._lock:
                if waiting:
                    self._waiting -= 1
                else:
                    self._in_flight -= 1
            try:
                os.write(self._wake_w, b"x")
            except BlockingIOError:
                pass  # the main thread has wake-ups waiting already

    def _answer(self, line: bytes | None, msg: Any) -> None:
        """Serve one request and send its answer (with its data frame, when the call made one)."""
        response, frame = serve_framed(line, lambda: self.dispatcher.handle(line, msg))
        if response:
            self.channel.send(response, frame)

    def _count(self, waiting: bool = False) -> int:
        with self._lock:
            return self._waiting if waiting else self._in_flight

    def _wait(self, read: bool) -> None:
        """Until the channel is readable (when ``read``) or a call's thread ends."""
        fds = [self._wake_r, self.channel.fd_in] if read else [self._wake_r]
        ready = readable(fds, None)
        if self._wake_r in ready:
            os.read(self._wake_r, 4096)
        if self.channel.fd_in in ready:
            self.channel.read_some()
