"""The runner against a worker that misbehaves: garbage, an endless line, silence. No hang, bounded memory."""

from __future__ import annotations

import sys
import time

import pytest

from runner import ProtocolError, Sandbox, SandboxTimeout
from runner import sandbox as sandbox_mod

FAKES = {
    "garbage": "import sys\nfor line in sys.stdin:\n    print('this is not json', flush=True)\n",
    "endless_line": "import sys\nsys.stdin.readline()\nwhile True:\n    sys.stdout.write('x' * 65536)\n",
    "silent": "import sys, time\nfor line in sys.stdin:\n    time.sleep(3600)\n",
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
    monkeypatch.setattr(sandbox_mod, "LOCAL_WORKER_ARGV", [sys.executable, "-c", FAKES[fake]])
    t = time.monotonic()
    with Sandbox(sandbox="none", audit=False) as sb, pytest.raises(error, match=reason):
        sb.call("ping", timeout=2)
    assert time.monotonic() - t < 15
    assert sb._parser is not None and len(sb._parser._buf) <= sb._parser.max_line
