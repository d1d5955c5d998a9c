"""``toolcage serve``: relay newline-delimited JSON-RPC between our stdio and one sandbox.

Every response is parsed (bounded) by the sandbox's stream parser and re-serialised, so
a compromised worker cannot write arbitrary bytes to the caller's stdout.
"""

from __future__ import annotations

import json
import threading
import time
from typing import Any, BinaryIO

from toolcage.errors import ProtocolError, SandboxTimeout
from toolcage.sandbox import Sandbox
from toolcage.transport import EOF_MARK, Broken

MAX_REQUEST_LINE = 16 * 1024 * 1024
DRAIN_ID = "toolcage.serve.drain"


class _Pending:
    """Requests seen on the way in, so responses can be audited as calls (method, params digest, duration)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.calls: dict[str, tuple[str, Any, float]] = {}

    def saw_request(self, line: bytes) -> None:
        try:
            msg = json.loads(line)
        except ValueError:
            return
        for req in msg if isinstance(msg, list) else [msg]:
            if isinstance(req, dict) and "id" in req and isinstance(req.get("method"), str):
                with self.lock:
                    self.calls[json.dumps(req["id"])] = (req["method"], req.get("params"), time.monotonic())

    def answered(self, sb: Sandbox, msg: Any) -> None:
        for resp in msg if isinstance(msg, list) else [msg]:
            if not isinstance(resp, dict):
                continue
            with self.lock:
                seen = self.calls.pop(json.dumps(resp.get("id")), None)
            if seen is None:
                continue
            method, params, t0 = seen
            sb.record_call(method, params if isinstance(params, dict) else {"params": params}, resp, t0)


def _pump_requests(sb: Sandbox, infile: BinaryIO, pending: _Pending) -> None:
    try:
        while True:
            line = infile.readline(MAX_REQUEST_LINE + 1)
            if not line:
                break
            if len(line) > MAX_REQUEST_LINE and not line.endswith(b"\n"):
                # too long: drop the rest of it; the worker answers the stub with -32700
                while True:
                    more = infile.readline(MAX_REQUEST_LINE)
                    if not more or more.endswith(b"\n"):
                        break
                line = b"{\n"
            pending.saw_request(line)
            sb.send_raw(line if line.endswith(b"\n") else line + b"\n")
    except OSError:
        pass
    finally:
        # Do not close the worker's stdin yet: a closed stdin mid-call means "the runner is gone"
        # to the worker, which then kills what it runs. Ask for a marker answer instead; the
        # worker answers in order, so once the marker is back every request has been answered.
        sb.send_raw((json.dumps({"jsonrpc": "2.0", "method": "ping", "id": DRAIN_ID}) + "\n").encode())


def bridge(sb: Sandbox, infile: BinaryIO, outfile: BinaryIO) -> None:
    """Run until stdin EOF has been answered, the worker exits, or the run deadline."""
    pending = _Pending()
    t = threading.Thread(target=_pump_requests, args=(sb, infile, pending), name="toolcage-serve-stdin", daemon=True)
    t.start()
    while True:
        msg = sb.receive()
        if msg is EOF_MARK:
            sb.check_exit()
            return
        if isinstance(msg, Broken):
            raise ProtocolError(f"protocol error: {msg.reason}")
        if msg is None:
            raise SandboxTimeout("run deadline reached")
        if isinstance(msg, dict) and msg.get("id") == DRAIN_ID:
            sb.finish_input()  # everything answered: now the worker may see EOF and exit
            continue
        outfile.write(json.dumps(msg).encode() + b"\n")
        outfile.flush()
        pending.answered(sb, msg)
