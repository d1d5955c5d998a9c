"""``toolcage serve --pool N``: every JSON-RPC request on stdin runs in a fresh sandbox from a warm pool.

Nothing of one request reaches the next (scratch, processes, secrets in memory: each request's
sandbox is adopted from the pool, used once and removed). Up to N requests run at once, each
answered when it ends (JSON-RPC matches answers by id); ``notifications/cancelled`` (or LSP's
``$/cancelRequest``) cancels one in flight. A batch is refused: each of its requests would run in
a sandbox of its own, which is not what a client sending a batch means.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, BinaryIO

from toolcage.errors import SandboxError, ToolcageError
from toolcage.policies.codes import INVALID_PARAMS, INVALID_REQUEST, PARSE_ERROR, SANDBOX_ENDED, error_response
from toolcage.policies.contract import CANCEL_METHODS, cancel_target, id_key
from toolcage.rpc.session import Cancel
from toolcage.sandbox import Sandbox
from toolcage.servers.serve import _lines


def _error(code: int, message: str, req_id: Any, data: Any = None) -> dict[str, Any]:
    return error_response(req_id, code, message, data)


class FreshPerRequest:
    def __init__(self, make_sandbox: Callable[[], Sandbox], outfile: BinaryIO, workers: int) -> None:
        self.make_sandbox, self.outfile = make_sandbox, outfile
        self._out = threading.Lock()
        self._cancels: dict[str, Cancel] = {}
        self._live: set[Sandbox] = set()
        self._lock = threading.Lock()
        self._executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="toolcage-serve-pool")

    def write(self, msg: dict[str, Any]) -> None:
        data = json.dumps(msg).encode() + b"\n"
        with self._out:
            self.outfile.write(data)
            self.outfile.flush()

    def handle(self, line: bytes) -> None:
        try:
            msg = json.loads(line)
        except ValueError:
            return self.write(_error(PARSE_ERROR, "Parse error", None))
        if isinstance(msg, list):
            return self.write(_error(INVALID_REQUEST, "Invalid request", None, "batches are not taken with --pool"))
        if not isinstance(msg, dict) or not isinstance(msg.get("method"), str) or msg.get("jsonrpc") != "2.0":
            req_id = msg.get("id") if isinstance(msg, dict) else None
            return self.write(_error(INVALID_REQUEST, "Invalid request", req_id))
        params = msg.get("params")
        if msg["method"] in CANCEL_METHODS:
            target = cancel_target(msg)  # the worker's own parse: a malformed cancel cancels nothing
            with self._lock:
                cancel = None if target is None else self._cancels.get(id_key(target))
            if cancel is not None:
                cancel.cancel()
            return None
        if params is not None and not isinstance(params, dict):
            return self.write(_error(INVALID_PARAMS, "Invalid params", msg.get("id"), "params must be a JSON object"))
        cancel = Cancel()
        if "id" in msg:
            with self._lock:
                self._cancels[id_key(msg["id"])] = cancel
        self._executor.submit(self._run, msg, cancel)
        return None

    def _run(self, msg: dict[str, Any], cancel: Cancel) -> None:
        req_id, answered = msg.get("id"), "id" in msg
        try:
            sb = self.make_sandbox()
            with self._lock:
                self._live.add(sb)
            try:
                with sb:
                    r = sb.call(msg["method"], msg.get("params"), cancel=cancel)
            finally:
                with self._lock:
                    self._live.discard(sb)
            out = {"jsonrpc": "2.0", "id": req_id}
            out.update({"error": r.error} if r.error is not None else {"result": r.result})
        except SandboxError as exc:
            out = _error(SANDBOX_ENDED, exc.message, req_id, {"status": exc.status, "reason": exc.reason})
        except ToolcageError as exc:  # could not start one (the image removed, Docker gone)
            out = _error(SANDBOX_ENDED, exc.message, req_id, {"status": exc.status, "reason": exc.reason})
        finally:
            with self._lock:
                self._cancels.pop(id_key(req_id), None)
        if answered:
            try:
                self.write(out)
            except OSError:
                pass  # nobody reads our stdout any more

    def interrupt(self) -> None:
        with self._lock:
            live = list(self._live)
        for sb in live:
            sb.interrupt()

    def finish(self) -> None:
        self._executor.shutdown(wait=True)


def bridge_fresh(make_sandbox: Callable[[], Sandbox], infile: BinaryIO, outfile: BinaryIO, workers: int) -> None:
    """Serve until stdin EOF, then wait for every request in flight to be answered."""
    serve = FreshPerRequest(make_sandbox, outfile, workers)
    try:
        for line in _lines(infile.fileno()):
            if line.strip():
                serve.handle(line)
        serve.finish()
    except BaseException:  # KeyboardInterrupt, or SystemExit from the CLI's signal handler
        serve.interrupt()
        raise
