"""The data path (issue 40): bulk bytes as data frames beside the JSON (toolcage.worker.protocol), both ends.

The runner's side is where the threat is: every byte the worker sends is the sandbox's. A frame is taken only
as the answer to a request that asked for one, at most FRAME_MAX, of the size the answer names; anything else
breaks the stream (the sandbox is killed), and a refused header never makes the runner allocate its size.
"""

from __future__ import annotations

import json
import os
import tracemalloc
from typing import Any

import pytest

from toolcage.rpc.session import encode_request
from toolcage.rpc.transport import Broken, StreamParser
from toolcage.worker import protocol
from toolcage.worker.protocol import BAD_FRAME, FRAME_MAX, Framed, LineSplitter


def pieces(data: bytes, size: int) -> list[bytes]:
    return [data[i : i + size] for i in range(0, len(data), size)]


@pytest.mark.parametrize("view", [False, True], ids=["bytes", "memoryview"])
@pytest.mark.parametrize("size", [1, 7, 4096, 1 << 20])
def test_a_frame_rides_with_the_line_after_it_whatever_the_pieces(size: int, view: bool) -> None:
    """The same lines and frame whether the reader hands bytes or views of its one buffer (the attach
    reader does, and writes over that buffer after each call: nothing of a view may be kept)."""
    frame = os.urandom(100_000) + b"\n=12\n{"  # raw bytes may hold newlines and what looks like headers
    stream = b'{"a":1}\n=%d\n' % len(frame) + frame + b'{"b":2}\n{"c":3}\n'
    split = LineSplitter(1 << 16, FRAME_MAX)
    lines = []
    buf = bytearray(size)
    for piece in pieces(stream, size):
        if view:
            buf[: len(piece)] = piece
            lines += split.feed(memoryview(buf)[: len(piece)])
            buf[:] = b"\xff" * size  # the reader's next recv
        else:
            lines += split.feed(piece)
    assert lines == [b'{"a":1}', b'{"b":2}', b'{"c":3}']
    assert [type(x) for x in lines] == [bytes, Framed, bytes]
    assert lines[1].frame == frame  # type: ignore[union-attr]


@pytest.mark.parametrize(
    "header", [b"=", b"=x", b"=-1", b"= 5", b"=99999999999", b"=%d" % (FRAME_MAX + 1), b"=0x10"], ids=repr
)
def test_a_bad_header_is_reported_and_nothing_is_allocated(header: bytes) -> None:
    split = LineSplitter(1 << 16, FRAME_MAX)
    assert list(split.feed(header + b"\n{}\n")) == [BAD_FRAME, b"{}"]
    assert split.raw is None


def test_a_second_header_before_the_line_is_bad() -> None:
    split = LineSplitter(1 << 16, FRAME_MAX)
    assert list(split.feed(b"=1\nx=1\ny{}\n")) == [BAD_FRAME, b"y{}"]


def test_without_frames_a_header_is_a_line_like_any() -> None:
    assert list(LineSplitter(1 << 16).feed(b"=5\nabcde\n")) == [b"=5", b"abcde"]


def test_a_frame_before_a_line_too_long_goes_with_it() -> None:
    split = LineSplitter(16, FRAME_MAX)
    got = list(split.feed(b"=2\nab" + b"x" * 40 + b"\n{}\n"))
    assert got == [None, b"{}"] and type(got[1]) is bytes


def test_encode_request_sends_bytes_as_the_frame() -> None:
    line = encode_request("r1", "upload", {"stream": "s", "frame": b"\x00\n\xff", "done": True})
    header, rest = line.split(b"\n", 1)
    assert header == b"=3" and rest[:3] == b"\x00\n\xff"
    assert json.loads(rest[3:])["params"] == {"stream": "s", "frame": 3, "done": True}
    assert encode_request("r1", "download", {"frame": True}).startswith(b"{")


def answer(req_id: str, **result: Any) -> bytes:
    return json.dumps({"jsonrpc": "2.0", "id": req_id, "result": result}).encode() + b"\n"


def parser() -> tuple[StreamParser, list[str]]:
    broken: list[str] = []
    return StreamParser(1 << 20, on_broken=broken.append), broken


def test_the_answer_a_call_asked_for_carries_its_bytes() -> None:
    p, broken = parser()
    p.expect("r1", frame=True)
    p.stdout(b"=5\nhello" + answer("r1", frame=5, done=True))
    msg = p.messages.get_nowait()
    assert msg["result"] == {"frame": b"hello", "done": True} and broken == []
    assert p._lines.frames == 0  # the last framed call answered: a header is no longer taken


@pytest.mark.parametrize(
    "case",
    ["unasked", "other_call", "progress", "size_differs", "size_missing", "too_large", "error_answer", "batch"],
)
def test_a_hostile_frame_breaks_the_stream(case: str) -> None:
    """What a worker in the sandbox's hands could send: each breaks the stream (the runner kills the sandbox)."""
    p, broken = parser()
    p.expect("plain")
    p.expect("framed", progress_token="tok", frame=True)
    frame = b"=3\nabc"
    data = {
        "unasked": frame + answer("plain", ok=True),
        "other_call": frame + answer("plain", frame=3),
        "progress": frame
        + json.dumps(
            {"jsonrpc": "2.0", "method": "notifications/progress", "params": {"progressToken": "tok"}}
        ).encode()
        + b"\n",
        "size_differs": frame + answer("framed", frame=4),
        "size_missing": frame + answer("framed", done=True),
        "too_large": b"=%d\n" % (FRAME_MAX + 1),
        "error_answer": frame
        + json.dumps({"jsonrpc": "2.0", "id": "framed", "error": {"code": 1, "message": "x"}}).encode()
        + b"\n",
        "batch": frame + b"[" + answer("framed", frame=3).strip() + b"]\n",
    }[case]
    p.stdout(data)
    assert len(broken) == 1, case
    assert isinstance(p.messages.get_nowait(), Broken)


def test_no_header_is_taken_while_no_call_asked_for_a_frame() -> None:
    """The header's size is never allocated for a stream where no frame may come (8 MiB claimed, 0 held)."""
    p, broken = parser()
    p.expect("plain")
    tracemalloc.start()
    try:
        p.stdout(b"=%d\n" % FRAME_MAX + b"x" * 100)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert broken and peak < 1 << 20


def test_the_worker_side_hands_the_frame_to_its_call_and_back() -> None:
    """serve_framed: the call sees its request's frame; the frame it sends goes before its answer, never a batch's."""
    line = Framed(b"{}")
    line.frame = b"in"

    def handle() -> str:
        assert protocol.incoming() == b"in"
        protocol.send_frame(b"out")
        return '{"jsonrpc": "2.0"}'

    assert protocol.serve_framed(line, handle) == ('{"jsonrpc": "2.0"}', b"out")
    assert protocol.incoming() is None  # cleared for the thread's next call
    assert protocol.serve_framed(b"[]", lambda: (protocol.send_frame(b"x"), "[{}]")[1]) == ("[{}]", None)


def test_the_channel_writes_a_frame_and_its_answer_together(tmp_path: Any) -> None:
    r, w = os.pipe()
    try:
        ch = protocol.Channel(os.open(os.devnull, os.O_RDONLY), w)
        ch.send('{"x": 1}', b"\x00" * 10)
        assert os.read(r, 100) == b"=10\n" + b"\x00" * 10 + b'{"x": 1}\n'
    finally:
        os.close(r)
        os.close(w)


def test_a_worker_from_before_frames_gets_base64_both_ways(tmp_path: Any) -> None:
    """An image derived from an older worker image: its upload stream does not say ``frames`` and its download
    refuses the ``frame`` parameter by name. Both still work, as base64 with a sha256."""
    import base64
    import hashlib
    import io
    import tarfile

    from toolcage.files import download as transfer
    from toolcage.files import upload
    from toolcage.results import CallResult

    sent: list[dict[str, Any]] = []

    def old_upload(params: dict[str, Any]) -> CallResult:
        sent.append(params)
        if "path" in params:
            return CallResult("ok", "upload", "r", result={"stream": "s", "received": 0, "done": False})
        assert (
            "frame" not in params and hashlib.sha256(base64.b64decode(params["data"])).hexdigest() == params["sha256"]
        )
        return CallResult("ok", "upload", "r", result={"stream": "s", "done": params["done"], "files": 1})

    src = tmp_path / "src"
    src.mkdir()
    (src / "a.txt").write_text("hello")
    assert upload.upload(old_upload, src, "/scratch/in").files == 1 and len(sent) >= 2

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        info = tarfile.TarInfo("a.txt")
        info.size = 5
        tf.addfile(info, io.BytesIO(b"hello"))
    raw = buf.getvalue()
    asked: list[dict[str, Any]] = []

    def old_download(params: dict[str, Any]) -> CallResult:
        asked.append(params)
        if "frame" in params:
            err = {"code": -32602, "message": "Invalid params", "data": [{"field": "frame", "error": "unknown field"}]}
            return CallResult("error", "download", "r", error=err)
        res = {"stream": "s", "data": base64.b64encode(raw).decode(), "sha256": hashlib.sha256(raw).hexdigest()}
        return CallResult("ok", "download", "r", result={**res, "done": True})

    transfer.download(old_download, "/scratch/a.txt", tmp_path / "out")
    assert (tmp_path / "out" / "a.txt").read_text() == "hello"
    assert [("frame" in p) for p in asked] == [True, False]  # asked once, then as the old worker takes it
