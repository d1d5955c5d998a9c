"""A client that reuses one progress token on two requests in flight, on `toolcage serve` and `toolcage mcp
serve` (real engine, raw JSON-RPC lines): a client error, answered on the request that reused it; the run
and the other request go on."""

from __future__ import annotations

import json
import queue
import subprocess
import sys
import threading
import time
from typing import Any

import pytest

from tests.helpers import ROOT

pytestmark = pytest.mark.usefixtures("no_leaks")

SLOW = "import time\nfor i in range(6):\n    print(f'slow {i}', flush=True)\n    time.sleep(0.4)\n"
QUICK = "print('quick', flush=True)"
INIT = {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}


class Lines:
    """A CLI process spoken to in JSON lines; its stdout read on a thread."""

    def __init__(self, *args: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "toolcage.cli", *args],
            cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )  # fmt: skip
        self.got: queue.Queue[dict[str, Any] | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.got.put(json.loads(line))
        self.got.put(None)

    def send(self, msg: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write((json.dumps({"jsonrpc": "2.0", **msg}) + "\n").encode())
        self.proc.stdin.flush()

    def until(self, ids: set[Any], timeout: float = 60) -> tuple[dict[Any, dict[str, Any]], list[dict[str, Any]]]:
        """The answers to ``ids``, and every notification that came before the last of them."""
        answers: dict[Any, dict[str, Any]] = {}
        notes: list[dict[str, Any]] = []
        end = time.monotonic() + timeout
        while set(answers) != ids:
            msg = self.got.get(timeout=max(0.01, end - time.monotonic()))
            assert msg is not None, f"ended before answering {ids - set(answers)}: {answers}"
            if "method" in msg:
                notes.append(msg)
            elif msg.get("id") in ids:
                answers[msg["id"]] = msg
        return answers, notes

    def close(self) -> tuple[int, str]:
        assert self.proc.stdin is not None and self.proc.stdout is not None and self.proc.stderr is not None
        self.proc.stdin.close()
        try:
            code = self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.terminate()
            code = self.proc.wait(30)
        err = self.proc.stderr.read().decode("utf-8", "replace")
        self.proc.stdout.close()
        self.proc.stderr.close()
        return code, err


def test_serve_refuses_a_progress_token_in_use_and_the_run_goes_on() -> None:
    """`toolcage serve`: a second request reusing the progress token of one still running is answered -32602
    at once (it used to be forwarded, and when either ended the other's progress broke the stream: the
    sandbox was killed); the first call streams all its progress and succeeds, and so does a later call."""
    s = Lines("serve")
    try:
        meta = {"_meta": {"progressToken": "same"}}
        s.send({"id": 1, "method": "run_python", "params": {"code": SLOW, **meta}})
        s.send({"id": 2, "method": "run_python", "params": {"code": QUICK, **meta}})
        answers, notes = s.until({1, 2})
        s.send({"id": 3, "method": "run_python", "params": {"code": "print('after')"}})
        later, _ = s.until({3})
    finally:
        code, err = s.close()
    assert answers[2].get("error", {}).get("code") == -32602, (answers, err[-2000:])
    assert "progress token" in answers[2]["error"]["message"]
    assert answers[1].get("result", {}).get("exit_code") == 0, (answers[1], err[-2000:])
    streamed = "".join(n["params"].get("message", "") for n in notes if n["method"] == "notifications/progress")
    assert streamed == "".join(f"slow {i}\n" for i in range(6)) == answers[1]["result"]["stdout"]
    assert later[3]["result"]["stdout"] == "after\n", (later, err[-2000:])
    assert code == 0, err[-2000:]


def test_mcp_serve_refuses_a_progress_token_in_use() -> None:
    """`toolcage mcp serve`: tools/call reusing the progress token of a call still running is answered -32602
    (progress for two calls under one token cannot be told apart); the first call and the session go on."""
    s = Lines("mcp", "serve")
    try:
        s.send({"id": 0, "method": "initialize", "params": INIT})
        s.until({0})
        s.send({"method": "notifications/initialized"})
        meta = {"_meta": {"progressToken": "same"}}
        s.send({"id": 1, "method": "tools/call", "params": {"name": "run_python", "arguments": {"code": SLOW}, **meta}})
        time.sleep(0.5)
        s.send(
            {"id": 2, "method": "tools/call", "params": {"name": "run_python", "arguments": {"code": QUICK}, **meta}}
        )
        answers, notes = s.until({1, 2})
        s.send(
            {"id": 3, "method": "tools/call", "params": {"name": "run_python", "arguments": {"code": QUICK}, **meta}}
        )
        later, _ = s.until({3})  # the token is free again once the first call is answered
    finally:
        code, err = s.close()
    assert answers[2].get("error", {}).get("code") == -32602, (answers, err[-2000:])
    assert "progress token" in answers[2]["error"]["message"]
    assert answers[1]["result"]["structuredContent"]["stdout"] == "".join(f"slow {i}\n" for i in range(6))
    assert all(n["params"]["progressToken"] == "same" for n in notes if n["method"] == "notifications/progress")
    assert later[3]["result"]["structuredContent"]["stdout"] == "quick\n", later
    assert code == 0, err[-2000:]
