"""Hostile-input handling of worker output: Docker demultiplexing, line caps, garbage."""

from __future__ import annotations

import socket
import struct

from toolcage.engine.attach import DockerAttachTransport
from toolcage.rpc.transport import EOF_MARK, Broken, StreamParser


def frame(stream: int, data: bytes) -> bytes:
    return struct.pack(">BxxxI", stream, len(data)) + data


def drain(parser: StreamParser) -> list[object]:
    out = []
    while not parser.messages.empty():
        out.append(parser.messages.get())
    return out


def attached(*ids: int) -> tuple[socket.socket, StreamParser, DockerAttachTransport]:
    """A reader on one end of a socket pair (the test writes Docker frames to the other), awaiting ``ids``."""
    a, b = socket.socketpair()
    parser = StreamParser(max_line=1 << 20)
    for req_id in ids:
        parser.expect(req_id)
    t = DockerAttachTransport(b, parser)
    t.start()
    return a, parser, t


def test_demux_splits_streams_and_reassembles_lines() -> None:
    """stdout frames become JSON messages even when a line spans frames; stderr is kept as a tail."""
    a, parser, t = attached(1, 2)
    a.sendall(frame(1, b'{"id": 1, "res') + frame(2, b"log line\n") + frame(1, b'ult": 2}\n{"id": 2, "result": 3}\n'))
    a.close()
    t._thread.join(5)
    t.close()
    msgs = drain(parser)
    assert msgs[:2] == [{"id": 1, "result": 2}, {"id": 2, "result": 3}]
    assert msgs[2] is EOF_MARK
    assert parser.stderr_tail() == "log line\n"


def test_oversized_line_breaks_stream() -> None:
    """A line over the cap is refused without buffering it all."""
    parser = StreamParser(max_line=1000)
    for _ in range(100):
        parser.stdout(b"x" * 100)
    msgs = drain(parser)
    assert len(msgs) == 1 and isinstance(msgs[0], Broken) and "longer than" in msgs[0].reason
    assert len(parser._buf) == 0


def test_garbage_breaks_stream() -> None:
    """A line that is not JSON marks the stream broken; nothing after it is trusted."""
    parser = StreamParser(max_line=1000)
    parser.stdout(b'not json\n{"id": 1, "result": 1}\n')
    msgs = drain(parser)
    assert len(msgs) == 1 and isinstance(msgs[0], Broken)


def test_stderr_tail_is_bounded() -> None:
    """Only the last 64 KiB of stderr are kept."""
    parser = StreamParser(max_line=1000)
    for _ in range(1000):
        parser.stderr(b"y" * 1024)
    assert parser._err_size <= 64 * 1024 + 1024


def test_demux_survives_arbitrary_chunking() -> None:
    """Headers and payloads split at every possible byte boundary still demultiplex exactly."""
    import time

    payload = (
        frame(2, b"err\n") + frame(1, b'{"id": 1, "result": "' + b"x" * 70000 + b'"}\n') + frame(1, b'{"id": 2}\n')
    )
    a, parser, t = attached(1, 2)
    for i in range(0, len(payload), 7):  # 7-byte writes: headers straddle recv boundaries
        a.sendall(payload[i : i + 7])
        if i % 7000 == 0:
            time.sleep(0.001)
    a.close()
    t._thread.join(5)
    t.close()
    msgs = drain(parser)
    assert msgs[0] == {"id": 1, "result": "x" * 70000} and msgs[1] == {"id": 2} and msgs[2] is EOF_MARK
    assert parser.stderr_tail() == "err\n"


def test_answer_to_no_pending_call_breaks_stream() -> None:
    """Threat: forged answers. An id nobody waits for, a second answer to the same id, a notification,
    or anything while nothing is pending breaks the stream and calls on_broken (which kills the sandbox)."""
    cases = {
        "idle": (b'{"jsonrpc": "2.0", "result": 1, "id": "a"}\n', []),
        "unknown id": (b'{"jsonrpc": "2.0", "result": 1, "id": "b"}\n', ["a"]),
        "notification": (b'{"jsonrpc": "2.0", "method": "x"}\n', ["a"]),
        "twice": (b'{"jsonrpc": "2.0", "result": 1, "id": "a"}\n' * 2, ["a"]),
        "null id": (b'{"jsonrpc": "2.0", "error": {"code": 1, "message": "m"}, "id": null}\n', ["a"]),
        "batch": (b'[{"jsonrpc": "2.0", "result": 1, "id": "a"}]\n', ["a"]),
    }
    for name, (data, pending) in cases.items():
        seen: list[str] = []
        parser = StreamParser(max_line=1000, on_broken=seen.append)
        for req_id in pending:
            parser.expect(req_id)
        parser.stdout(data)
        msgs = drain(parser)
        assert isinstance(msgs[-1], Broken), name
        assert seen and "sandbox sent" in seen[0], (name, seen)


def test_flood_of_valid_answers_is_bounded() -> None:
    """A flood of well-formed answers queues at most the pending ones, then nothing more is parsed."""
    parser = StreamParser(max_line=1 << 20)
    parser.expect(7)
    line = b'{"jsonrpc": "2.0", "result": "' + b"x" * 1000 + b'", "id": 7}\n'
    for _ in range(10_000):
        parser.stdout(line)
    msgs = drain(parser)
    assert msgs[0]["id"] == 7 and isinstance(msgs[1], Broken) and len(msgs) == 2


def test_serve_expectations_follow_the_workers_rules() -> None:
    """For raw lines (serve): an id is answered with that id, garbage with id null, a batch with a list,
    a notification with nothing."""
    parser = StreamParser(max_line=1000)
    parser.expect_answer_to(b'{"jsonrpc": "2.0", "method": "ping", "id": 5}')
    parser.expect_answer_to(b"not json")
    parser.expect_answer_to(b'[{"jsonrpc": "2.0", "method": "ping", "id": 6}]')
    parser.expect_answer_to(b'{"jsonrpc": "2.0", "method": "ping"}')
    parser.stdout(
        b'{"jsonrpc": "2.0", "result": "pong", "id": 5}\n'
        b'{"jsonrpc": "2.0", "error": {"code": -32700, "message": "Parse error"}, "id": null}\n'
        b'[{"jsonrpc": "2.0", "result": "pong", "id": 6}]\n'
    )
    assert not parser.broken and len(drain(parser)) == 3
    parser.stdout(b'{"jsonrpc": "2.0", "result": "pong", "id": 5}\n')
    assert parser.broken


def test_a_request_over_the_workers_line_limit_is_refused_before_sending() -> None:
    """Session.request over MAX_REQUEST_BYTES raises BadToolCall: nothing sent, no answer expected."""
    import time

    import pytest

    from toolcage.errors import BadToolCall
    from toolcage.rpc.session import Session
    from toolcage.worker.protocol import MAX_REQUEST_BYTES

    sent: list[bytes] = []

    class Recorder:
        def send(self, data: bytes, until: float | None = None) -> None:
            sent.append(data)

        def close_stdin(self) -> None: ...

        def close(self) -> None: ...

    session = Session(max_line=1 << 20)
    session.connect(Recorder())
    with pytest.raises(BadToolCall) as info:
        session.request("run_python", {"code": "#" * MAX_REQUEST_BYTES}, time.monotonic() + 1)
    assert info.value.exit_code == 2 and info.value.details["limit_bytes"] == MAX_REQUEST_BYTES
    assert sent == [] and session.parser.outstanding() == 0
    with pytest.raises(BadToolCall):
        session.send_now("run_python", {"code": "#" * MAX_REQUEST_BYTES}, time.monotonic() + 1)
    assert sent == [] and session.parser.outstanding() == 0
