"""``toolcage serve``: relay newline-delimited JSON-RPC between our stdio and one sandbox.

Every response is parsed (bounded) by the sandbox's stream parser and re-serialised, so
a compromised worker cannot write arbitrary bytes to the caller's stdout. When the run
ends early (deadline, idle timeout, crash, interrupt), every request still pending gets
a JSON-RPC error (``SANDBOX_ENDED``) saying why, so a client never waits for nothing. A request
that reuses the progress token of one still in flight is answered -32602 here and never sent:
the stream parser lets progress through by token, so the first answer would close the token
for both, and the other's next progress would break the stream and kill the sandbox.
"""

from __future__ import annotations

import json
import os
import secrets
import threading
import time
from collections.abc import Iterator
from typing import Any, BinaryIO

from toolcage import timing
from toolcage.errors import PolicyError, SandboxError, ToolcageError, UsageError
from toolcage.lifecycle import records
from toolcage.policies.codes import INTERNAL_ERROR, INVALID_PARAMS, SANDBOX_ENDED, error_response
from toolcage.policies.contract import NETWORK, PING, id_key
from toolcage.results import CallResult, from_response, without_meta
from toolcage.rpc.session import Ended
from toolcage.rpc.transport import Broken
from toolcage.sandbox import Sandbox
from toolcage.worker.protocol import MAX_REQUEST_BYTES, progress_token

MAX_REQUEST_LINE = MAX_REQUEST_BYTES  # the worker's own line limit: one constant for both ends
DRAIN_ID = "toolcage.serve.drain"  # and 64 random bits: a client's request may carry any id


class Forwarder:
    """Request lines forwarded as they are to one running Sandbox, and its answers back (``toolcage serve``):
    a line keeps the timing contract of a call (a child's timeout cut to the time left in the run), each
    answer is audited as a call, and the end of the run comes back as the error that ended it. Made once
    the sandbox has started (a pooled sandbox's run is its slot's from then on)."""

    def __init__(self, sb: Sandbox) -> None:
        self._run, self._settle = sb.run, sb.settle_configure
        self._update_network = sb.update_network

    def network(self, msg: dict[str, Any]) -> dict[str, Any]:
        """``sandbox.network`` from serve's client (the application that started serve, never the sandbox):
        ``{"network": {...}}``, a live policy change made here on the host (Sandbox.update_network); answered with
        the change, or an error saying why not. Never forwarded: the worker's copy follows the proxy's."""
        params = msg.get("params")
        if not isinstance(params, dict) or set(params) - {"network", "requested_by"} or "network" not in params:
            return error_response(msg.get("id"), INVALID_PARAMS, "params must be {network: {...}}")
        by = params.get("requested_by")
        try:
            change = self._update_network(params["network"], requested_by=f"serve:{by}"[:128] if by else None)
        except ToolcageError as exc:
            code = INVALID_PARAMS if isinstance(exc, PolicyError | UsageError) else INTERNAL_ERROR
            return error_response(msg.get("id"), code, exc.message)
        return {"jsonrpc": "2.0", "id": msg.get("id"), "result": change.to_dict()}

    def forward(self, line: bytes) -> None:
        """Send one raw request line; its answer comes from :meth:`next_answer`."""
        run = self._run
        if run.session is None or not run.session.connected:
            raise UsageError("the sandbox is not running")
        self._settle()
        call_s = run.options.policy.timeouts.call_s
        run.session.forward(timing.fit_line(line, call_s, run.deadline - time.monotonic()))

    def next_answer(self) -> Any:
        """Next answer to a forwarded line (dict or list); raises the SandboxError that ended the run, or
        returns None once the worker has exited cleanly after :meth:`finish_input`."""
        run = self._run
        assert run.session is not None
        while True:
            msg = run.session.next_forwarded(run.deadline + timing.DEADLINE_SLACK_S - time.monotonic())
            if msg is None:
                run.on_expire("run")
                raise run.explain_end(Ended("timeout"))
            if isinstance(msg, dict | list):
                return msg
            end = Ended("broken", msg.reason) if isinstance(msg, Broken) else Ended("eof")
            if end.how == "eof" and run.input_closed and run.dead is None:
                exc = run.explain_exit(clean_ok=True)
                if exc is None:
                    return None
                raise run.fail(exc)
            raise run.explain_end(end)

    def record(self, method: str, params: dict[str, Any] | None, response: dict[str, Any], t0: float) -> None:
        """Audit a forwarded call like any other."""
        run, wall_ms = self._run, round((time.monotonic() - t0) * 1000, 3)
        r = from_response(method, run.run_id, response, wall_ms) or CallResult(
            "error",
            method,
            run.run_id,
            error={"code": INTERNAL_ERROR, "message": "malformed response"},
            wall_ms=wall_ms,
        )
        run.calls += 1
        records.audit_call(run.options.audit, run.run_id, params, r)

    def answers_owed(self) -> int:
        """How many answers the worker still owes (calls in flight and forwarded lines)."""
        return self._run.session.parser.outstanding() if self._run.session is not None else 0

    def finish_input(self) -> None:
        """No more requests: close the worker's stdin so it exits after answering."""
        self._run.input_closed = True
        if self._run.session is not None:
            self._run.session.close_input()


class _Pending:
    """Requests seen on the way in: to audit their answers as calls, and to answer them if the run ends first."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.calls: dict[str, tuple[Any, str, Any, float]] = {}
        self.tokens: dict[str, str] = {}  # progress token -> the call (its key in ``calls``) that holds it

    def saw_request(self, line: bytes) -> dict[str, Any] | None:
        """Note the line's requests; the error to answer instead of sending it, when it reuses a
        progress token still in use (only a single request registers one: a batch gets no progress)."""
        try:
            msg = json.loads(line)
        except ValueError:
            return None
        if isinstance(msg, dict) and msg.get("id") is not None and isinstance(msg.get("method"), str):
            token = progress_token(msg.get("params"))
            if token is not None:
                with self.lock:
                    holder = self.tokens.get(id_key(token))
                    if holder is not None:
                        why = f"progress token {token!r} is in use by request {holder[:40]}, still in progress"
                        return error_response(msg["id"], INVALID_PARAMS, why)
                    self.tokens[id_key(token)] = json.dumps(msg["id"])
        for req in msg if isinstance(msg, list) else [msg]:
            if isinstance(req, dict) and req.get("id") is not None and isinstance(req.get("method"), str):
                with self.lock:
                    self.calls[json.dumps(req["id"])] = (req["id"], req["method"], req.get("params"), time.monotonic())
        return None

    def answered(self, fw: Forwarder, msg: Any) -> None:
        for resp in msg if isinstance(msg, list) else [msg]:
            if not isinstance(resp, dict):
                continue
            with self.lock:
                seen = self.calls.pop(json.dumps(resp.get("id")), None)
                if seen is not None:
                    token = progress_token(seen[2])
                    if token is not None and self.tokens.get(id_key(token)) == json.dumps(resp.get("id")):
                        del self.tokens[id_key(token)]
            if seen is None:
                continue
            _, method, params, t0 = seen
            fw.record(method, params if isinstance(params, dict) else {"params": params}, resp, t0)

    def unanswered(self) -> list[Any]:
        with self.lock:
            ids = [req_id for req_id, *_ in self.calls.values()]
            self.calls.clear()
            self.tokens.clear()
        return ids


def _lines(fd: int) -> Iterator[bytes]:
    """Request lines from a raw fd, each at most MAX_REQUEST_LINE (+1, so a longer one is seen as such).

    os.read, not a buffered reader: this runs on a daemon thread that may still be blocked
    in it when the interpreter exits, and a BufferedReader's lock held at exit aborts the
    process (``Fatal Python error: _enter_buffered_busy``)."""
    buf = bytearray()
    skipping = False  # inside a line that is already too long: drop the rest of it
    while True:
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            break
        buf += chunk
        while True:
            nl = buf.find(b"\n")
            if nl < 0:
                if len(buf) > MAX_REQUEST_LINE:
                    if not skipping:
                        yield b"{\n"  # too long: the worker answers the stub with -32700
                    skipping, buf = True, bytearray()
                break
            line, buf = bytes(buf[: nl + 1]), buf[nl + 1 :]
            if skipping:
                skipping = False
                continue
            yield b"{\n" if len(line) > MAX_REQUEST_LINE + 1 else line
    if buf and not skipping:
        yield bytes(buf) + b"\n"


def _pump_requests(fw: Forwarder, infile: BinaryIO, outfile: _Out, pending: _Pending, drain_id: str) -> None:
    try:
        for line in _lines(infile.fileno()):
            if b'"sandbox.network"' in line:  # (a quick look first: every other line goes on unparsed)
                msg = _parsed(line)
                if isinstance(msg, dict) and msg.get("method") == NETWORK:
                    outfile.write(fw.network(msg))
                    continue
            refusal = pending.saw_request(line)
            if refusal is not None:
                outfile.write(refusal)
                continue
            fw.forward(line)
    except (OSError, SandboxError):
        return  # the run is over; the main loop reports why
    # Do not close the worker's stdin yet: a closed stdin mid-call means "the runner is gone"
    # to the worker, which then kills what it runs. Ask for a marker answer instead; once it is
    # back and no other answer is owed (calls that run code may still be running beside it, and
    # answer later), every request has been answered.
    fw.forward((json.dumps({"jsonrpc": "2.0", "method": PING, "id": drain_id}) + "\n").encode())


def _parsed(line: bytes) -> Any:
    try:
        return json.loads(line)
    except ValueError:
        return None


class _Out:
    """Our stdout, one whole line at a time: the answers (main loop) and the refusals (stdin thread)."""

    def __init__(self, outfile: BinaryIO) -> None:
        self._file, self._lock = outfile, threading.Lock()

    def write(self, msg: Any) -> None:
        with self._lock:
            self._file.write(json.dumps(msg).encode() + b"\n")
            self._file.flush()


def _answer_unanswered(outfile: _Out, pending: _Pending, exc: SandboxError) -> None:
    data = {"status": exc.status, "reason": exc.reason}
    for req_id in pending.unanswered():
        try:
            outfile.write(error_response(req_id, SANDBOX_ENDED, exc.message, data))
        except OSError:
            return  # nobody reads our stdout any more


def bridge(sb: Sandbox, infile: BinaryIO, stdout: BinaryIO) -> None:
    """Run until stdin EOF has been answered and the worker exited; raise the SandboxError that ended it otherwise."""
    fw, pending, outfile = Forwarder(sb), _Pending(), _Out(stdout)
    # unguessable: a client request with the marker's id would have its answer swallowed, and make serve
    # close the worker's stdin while the client still writes
    drain_id = f"{DRAIN_ID}.{secrets.token_hex(8)}"
    t = threading.Thread(
        target=_pump_requests, args=(fw, infile, outfile, pending, drain_id), name="toolcage-serve-stdin", daemon=True
    )
    t.start()
    drained = False
    try:
        while True:
            msg = fw.next_answer()
            if msg is None:
                return  # every request answered, the worker exited cleanly
            if isinstance(msg, dict) and msg.get("id") == drain_id:
                drained = True
            else:
                pending.answered(fw, msg)  # first: once the client has the answer, its token is free again
                outfile.write(without_meta(msg))
            if drained and not fw.answers_owed():
                drained = False
                sb.usage()  # for run.finished, while the worker still listens
                fw.finish_input()  # everything answered: now the worker may see EOF and exit
    except SandboxError as exc:
        _answer_unanswered(outfile, pending, exc)
        raise
    except BaseException:  # KeyboardInterrupt, or SystemExit from the CLI's signal handler
        _answer_unanswered(outfile, pending, sb.interrupt())
        raise
