"""Async calls on one event loop share writes and wake-ups (toolcage.rpc.session): the lines of the tasks ready at
once go out in one write, in the order they were made, a cancel never overtakes the line it cancels, and the
timer that replaced asyncio.wait_for still ends a call nobody answers."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import struct
import threading
import time
from typing import Any

from toolcage.engine.attach import DockerAttachTransport
from toolcage.rpc.session import Ended, Session


def _frame(data: bytes) -> bytes:
    return struct.pack(">BxxxI", 1, len(data)) + data


class _Worker:
    """The far end of the attach socket: records what it reads, answers each request (unless told not to)."""

    def __init__(self, sock: socket.socket, answer: bool = True) -> None:
        self.sock, self.answer, self.got = sock, answer, b""
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def close(self) -> None:
        """Its end of the socket shut (which wakes its recv: a close would not) and closed, its thread joined."""
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.thread.join(5)
        self.sock.close()

    def _run(self) -> None:
        buf = b""
        while True:
            try:
                data = self.sock.recv(65536)
            except OSError:  # closed by close()
                return
            if not data:
                return
            self.got += data
            buf += data
            *lines, buf = buf.split(b"\n")
            for line in lines:
                msg = json.loads(line)
                if self.answer and "id" in msg:
                    reply = json.dumps({"jsonrpc": "2.0", "result": msg["method"], "id": msg["id"]}).encode()
                    self.sock.sendall(_frame(reply + b"\n"))


def _session(answer: bool = True) -> tuple[Session, _Worker, list[int]]:
    a, b = socket.socketpair()
    session = Session(max_line=1 << 20)
    transport = DockerAttachTransport(b, session.parser)
    writes: list[int] = []
    send = transport.send

    def counted(data: bytes, until: float | None = None) -> None:
        writes.append(len(data))
        send(data, until)

    transport.send = counted  # type: ignore[method-assign]
    session.connect(transport)
    transport.start()
    return session, _Worker(a, answer), writes


def test_gathered_calls_share_writes_and_each_gets_its_own_answer() -> None:
    session, worker, writes = _session()

    async def main() -> list[Any]:
        until = time.monotonic() + 10
        return await asyncio.gather(*(session.request_async(f"m{i}", None, until) for i in range(64)))

    answers = asyncio.run(main())
    assert [a["result"] for a in answers] == [f"m{i}" for i in range(64)]
    assert len(writes) <= 4, writes  # one write for the 64 lines made in one step of the loop (was 64)
    methods = [json.loads(line)["method"] for line in worker.got.splitlines()]
    assert methods == [f"m{i}" for i in range(64)]  # in the order they were made
    session.close()
    worker.close()


def test_a_cancel_goes_out_after_the_line_it_cancels() -> None:
    session, worker, _ = _session(answer=False)

    async def main() -> None:
        task = asyncio.ensure_future(session.request_async("slow", None, time.monotonic() + 10))
        await asyncio.sleep(0)  # the task has queued its line; the loop has not written it yet
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            pass

    asyncio.run(main())
    deadline = time.monotonic() + 5
    while worker.got.count(b"\n") < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    first, second = (json.loads(line) for line in worker.got.splitlines())
    assert first["method"] == "slow" and second["method"] == "notifications/cancelled"
    assert second["params"]["requestId"] == first["id"]
    session.close()
    worker.close()


def test_a_call_nobody_answers_times_out_at_its_deadline() -> None:
    session, worker, _ = _session(answer=False)

    async def main() -> tuple[Any, float]:
        t = time.monotonic()
        got = await session.request_async("never", None, t + 0.3)
        return got, time.monotonic() - t

    got, took = asyncio.run(main())
    assert isinstance(got, Ended) and got.how == "timeout", got
    assert 0.25 < took < 3, took
    session.close()
    worker.close()
