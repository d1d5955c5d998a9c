"""Progress and cancel: the worker's channel and call state, the runner's parser and session, and
both ends together through a local worker (``--sandbox none``; the real engine is in
tests/integration/test_mcp_serve.py)."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from toolcage import Cancel, Sandbox
from toolcage.rpc.transport import StreamParser
from toolcage.worker import calls
from toolcage.worker.protocol import Channel


def _line(obj: Any) -> bytes:
    return json.dumps(obj).encode() + b"\n"


CANCEL = {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": "a"}}


@pytest.fixture(autouse=True)
def _fresh_calls(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(calls, "_local", __import__("threading").local())
    monkeypatch.setattr(calls, "_running", {})
    monkeypatch.setattr(calls, "_early", type(calls._early)())
    monkeypatch.setattr(calls, "_send", None)
    monkeypatch.setattr(calls, "_channel", None)


# the worker ---------------------------------------------------------------------------------
def test_a_cancel_is_acted_on_when_read_not_queued_behind_its_call() -> None:
    """A request and its cancel in one read: the cancel is handled at once (the call is refused
    when it starts), the request stays queued; a request that merely mentions 'cancel' is a request."""
    r, w = os.pipe()
    ch = Channel(r, os.open(os.devnull, os.O_WRONLY))
    calls.attach(ch)
    mention = {"jsonrpc": "2.0", "method": "run_python", "params": {"code": "# notifications/cancelled"}, "id": "b"}
    os.write(w, _line({"jsonrpc": "2.0", "method": "ping", "id": "a"}) + _line(CANCEL) + _line(mention))
    os.close(w)
    lines = list(ch.lines())
    assert [json.loads(x)["id"] for x in lines if x] == ["a", "b"]
    assert calls.begin("a", None).cancelled
    calls.end()
    assert not calls.begin("b", None).cancelled


def test_cancel_kills_the_running_group_and_marks_the_call() -> None:
    import subprocess

    child = subprocess.Popen(["sleep", "30"], start_new_session=True)
    call = calls.begin("x", None)
    call.pgid = child.pid
    calls.cancel("y")  # another id: nothing happens to this call
    assert not call.cancelled and child.poll() is None
    calls.cancel("x")
    assert call.cancelled
    assert child.wait(timeout=5) == -9
    calls.end()


def test_cancel_message_shapes() -> None:
    assert calls.cancel_message(CANCEL) == "a"
    assert calls.cancel_message({"jsonrpc": "2.0", "method": "$/cancelRequest", "params": {"id": 7}}) == 7
    assert calls.cancel_message({**CANCEL, "id": 1}) is None  # a request, not a notification
    assert calls.cancel_message({"method": "notifications/cancelled", "params": {"requestId": [1]}}) is None
    assert calls.cancel_message({"method": "notifications/cancelled"}) is None


def test_progress_is_strictly_increasing_coalesced_capped_and_flushed() -> None:
    sent: list[dict[str, Any]] = []
    calls._send = lambda s: sent.append(json.loads(s))
    call = calls.begin(1, "tok")
    call.report(2, 10, "two")
    call.report(1, 10, "back")  # not increasing: dropped
    call.report(float("nan"), None, "x")  # not a number: dropped
    call.report(True, None, "x")
    call.report(3, "many", "x")
    call.report(5, None, "m" * 10_000)
    assert [p["params"]["progress"] for p in sent] == [2, 5]
    assert sent[0]["method"] == "notifications/progress" and sent[0]["params"]["progressToken"] == "tok"
    assert len(sent[1]["params"]["message"]) == 4096

    sent.clear()
    call = calls.begin(2, "tok2")
    euro = "€".encode()
    call.output("stdout", b"a" + euro[:1], room=100)  # a character cut in two: nothing garbled
    call.output("stdout", euro[1:] + b"b", room=100)
    call.output("stdout", b"0123456789", room=3)  # the cap: only what is kept is streamed
    calls.end()  # the rest goes out before the answer
    text = "".join(p["params"]["message"] for p in sent)
    assert text == "a€b012"
    progress = [p["params"]["progress"] for p in sent]
    assert progress == sorted(set(progress)) and progress[-1] == len("a€b012".encode())

    sent.clear()
    call = calls.begin(3, None)  # no token: nothing is sent
    call.output("stdout", b"x", room=10)
    call.report(1, None, None)
    calls.end()
    assert sent == []


# the runner ---------------------------------------------------------------------------------
def _progress(token: Any, n: float) -> bytes:
    return _line(
        {"jsonrpc": "2.0", "method": "notifications/progress", "params": {"progressToken": token, "progress": n}}
    )


def test_parser_lets_progress_through_only_for_a_pending_call_that_asked() -> None:
    broken: list[str] = []
    p = StreamParser(1 << 20, on_broken=broken.append)
    p.expect("r1", "r1")
    p.stdout(_progress("r1", 1))
    assert p.messages.get_nowait()["params"]["progress"] == 1
    p.stdout(_line({"jsonrpc": "2.0", "result": 1, "id": "r1"}))
    p.messages.get_nowait()
    p.stdout(_progress("r1", 2))  # after the answer
    assert broken and "progress for no pending call" in broken[0]

    broken.clear()
    p = StreamParser(1 << 20, on_broken=broken.append)
    p.expect("r2")  # no token registered
    p.stdout(_progress("r2", 1))
    assert broken

    broken.clear()
    p = StreamParser(1 << 20, on_broken=broken.append)
    p.expect("r3", "r3")
    p.stdout(_line({"jsonrpc": "2.0", "method": "notifications/message", "params": {}}))
    assert broken and "not progress" in broken[0]


def test_parser_drops_progress_over_its_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(StreamParser, "PROGRESS_MAX", 3)
    broken: list[str] = []
    p = StreamParser(1 << 20, on_broken=broken.append)
    p.expect("r", "r")
    for i in range(10):
        p.stdout(_progress("r", i + 1))
    assert p.messages.qsize() == 3 and not broken


def test_parser_registers_a_forwarded_lines_token() -> None:
    p = StreamParser(1 << 20)
    p.expect_answer_to(_line({"jsonrpc": "2.0", "method": "x", "params": {"_meta": {"progressToken": 5}}, "id": 1}))
    p.stdout(_progress(5, 1))
    assert not p.broken and p.messages.qsize() == 1


# both ends, through a local worker --------------------------------------------------------------
SLOW = "import time\nfor i in range(3):\n    print(i, flush=True)\n    time.sleep(0.3)\n"


def test_sandbox_call_streams_and_cancels(tmp_path: Path) -> None:
    with Sandbox(sandbox="none", workspace=str(tmp_path), audit=False) as sb:
        seen: list[dict[str, Any]] = []
        res = sb.call("run_python", {"code": SLOW}, on_progress=seen.append)
        assert res.ok and "".join(p["message"] for p in seen) == "0\n1\n2\n" and len(seen) >= 2

        cancel = Cancel()
        timer = threading.Timer(0.5, cancel.cancel)
        timer.start()
        t0 = time.monotonic()
        res = sb.call("run_python", {"code": "import time; time.sleep(30)", "timeout_s": 60}, cancel=cancel)
        took = time.monotonic() - t0
        assert res.status == "cancelled" and res.error is not None and res.error["code"] == -32800
        assert took < 2.0, took
        assert sb.call("ping").ok  # the sandbox goes on

        cancel.cancel()  # after the answer: nothing happens
        early = Cancel()
        early.cancel()
        res = sb.call("run_python", {"code": "open('ran', 'w')"}, cancel=early)
        assert res.status == "cancelled"
        assert (
            not sb.call("run_python", {"code": "import os; print(os.path.exists('ran'))"})
            .result["stdout"]
            .startswith("True")
        )


def test_async_sandbox_cancels_the_call_when_its_task_is_cancelled(tmp_path: Path) -> None:
    import asyncio

    from toolcage import AsyncSandbox

    async def main() -> tuple[float, bool]:
        async with AsyncSandbox(sandbox="none", workspace=str(tmp_path), audit=False) as sb:
            t0 = time.monotonic()
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(sb.call("run_python", {"code": "import time; time.sleep(30)"}), 0.5)
            res = await sb.call("ping")  # waits for the cancelled call's answer: only as long as its kill takes
            return time.monotonic() - t0, res.ok

    took, ok = asyncio.run(main())
    assert ok and took < 2.5, took


def test_requests_queued_mid_call_are_bounded() -> None:
    """Requests pipelined behind a running call are read (to find a cancel) only up to a bound;
    past it they stay in the pipe, so a flood cannot grow the worker's memory."""
    r, w = os.pipe()
    ch = Channel(r, os.open(os.devnull, os.O_WRONLY))
    calls.attach(ch)
    calls.begin("running", None)
    big = _line({"jsonrpc": "2.0", "method": "ping", "params": {"pad": "x" * 60_000}, "id": 1})
    writer = threading.Thread(target=lambda: [os.write(w, big) for _ in range(40)], daemon=True)
    writer.start()
    while calls.control_fd() is not None:
        import select

        if select.select([r], [], [], 2)[0]:
            calls.read_control()
        else:
            break
    assert calls.control_fd() is None and calls.QUEUE_MAX_BYTES < ch.queued_bytes < calls.QUEUE_MAX_BYTES + 300_000
    calls.end()
