"""The runner against a worker that misbehaves: garbage, an endless line, silence. No hang, bounded memory."""

from __future__ import annotations

import sys
import time

import pytest

from toolcage import ProtocolError, Sandbox, SandboxTimeout
from toolcage.backends import process as backends

FAKES = {
    "garbage": "import sys\nfor line in sys.stdin:\n    print('this is not json', flush=True)\n",
    "endless_line": "import sys\nsys.stdin.readline()\nwhile True:\n    sys.stdout.write('x' * 65536)\n",
    "silent": "import sys, time\nfor line in sys.stdin:\n    time.sleep(3600)\n",
    "deaf": "import time\ntime.sleep(3600)\n",  # never reads its stdin: the pipe fills up
    # answers the first request, then floods well-formed answers nobody asked for (a forger's flood)
    "unsolicited": (
        "import json, sys\nline = sys.stdin.readline()\n"
        "print(json.dumps({'jsonrpc': '2.0', 'result': 'pong', 'id': json.loads(line)['id']}), flush=True)\n"
        "flood = json.dumps({'jsonrpc': '2.0', 'result': 'x' * (4 << 20), 'id': 1}) + '\\n'\n"
        "while True:\n    sys.stdout.write(flood)\n"
    ),
    "malformed_error": (
        "import json, sys\nfor line in sys.stdin:\n"
        "    print(json.dumps({'jsonrpc': '2.0', 'error': 'boom', 'id': json.loads(line)['id']}), flush=True)\n"
    ),
}


@pytest.mark.parametrize(
    ("fake", "error", "reason"),
    [
        ("garbage", ProtocolError, "not JSON"),
        ("endless_line", ProtocolError, "longer than"),
        ("silent", SandboxTimeout, "did not answer"),
        ("malformed_error", ProtocolError, "malformed response"),
    ],
)
def test_hostile_worker(monkeypatch: pytest.MonkeyPatch, fake: str, error: type[Exception], reason: str) -> None:
    """Each misbehaviour ends the call with a clear sandbox error, promptly."""
    monkeypatch.setattr(backends, "LOCAL_WORKER_ARGV", [sys.executable, "-c", FAKES[fake]])
    t = time.monotonic()
    with Sandbox(sandbox="none", audit=False) as sb, pytest.raises(error, match=reason):
        sb.call("ping", timeout=2)
    assert time.monotonic() - t < 15
    assert sb._run.session.parser is not None and len(sb._run.session.parser._buf) <= sb._run.session.parser.max_line


def test_unsolicited_flood_kills_the_sandbox(monkeypatch: pytest.MonkeyPatch) -> None:
    """Well-formed answers to no pending call break the stream at the first one: the worker is killed at
    once (even while no call waits) and the next call says why; nothing of the flood is kept."""
    monkeypatch.setattr(backends, "LOCAL_WORKER_ARGV", [sys.executable, "-c", FAKES["unsolicited"]])
    with Sandbox(sandbox="none", audit=False) as sb:
        assert sb.call("ping", timeout=5).result == "pong"
        assert sb._run.session.parser is not None and isinstance(sb._run.backend, backends.ProcessBackend)
        assert sb._run.backend.proc is not None
        sb._run.backend.proc.wait(timeout=10)  # killed by the runner, not by us
        with pytest.raises(ProtocolError, match="answer to no pending call"):
            sb.call("ping", timeout=2)
        parser = sb._run.session.parser
        assert parser.messages.qsize() <= 2 and len(parser._buf) == 0  # Broken, then EOF


def test_worker_that_stops_reading_cannot_hold_the_caller(monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker that stops reading its stdin (stuck, or thrashing at its memory limit) ends a call with a large
    request at the call's timeout: the write is bounded too (it blocked until the container died)."""
    monkeypatch.setattr(backends, "LOCAL_WORKER_ARGV", [sys.executable, "-c", FAKES["deaf"]])
    with Sandbox(sandbox="none", audit=False) as sb:
        t = time.monotonic()
        with pytest.raises(SandboxTimeout, match="did not answer"):
            sb.call("write_file", {"path": "big", "content": "A" * (8 << 20)}, timeout=2)
        assert time.monotonic() - t < 6
