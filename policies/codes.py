"""The JSON-RPC error codes, once, for both sides of the wire.

The worker raises them (``worker.errors`` classes carry them); the runner reads them in
responses (the CLI's exit code, the audit log, ``doctor --probe``). Both import this table,
so a code cannot drift between the two. It lives in ``policies`` because that package is
the one both sides may import (it imports neither).
"""

from __future__ import annotations

from typing import Any

# JSON-RPC 2.0's own
PARSE_ERROR = -32700
INVALID_REQUEST = -32600  # also: a request line over the worker's limit
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603  # data carries an error id only; details are in the worker's log
REQUEST_CANCELLED = -32800  # LSP's: the call was cancelled (notifications/cancelled); its processes were killed

# toolcage's, in -32000..-32099
WORKER_ERROR = -32000
TOOL_ERROR = -32001  # the tool ran and reports a failure
PATH_ESCAPE = -32002  # a path resolves outside /workspace or /scratch
CALL_TIMEOUT = -32003  # an in-process handler overran its per-call timeout
SANDBOX_ENDED = -32004  # the runner's answer (serve, mcp wrap) for a request the sandbox or server will never answer
NO_SPACE = -32005  # scratch is full
EGRESS_DENIED = -32010  # the policy refuses the request; data.reason says why
FETCH_FAILED = -32011  # allowed, but the request failed
HANDLER_ERROR = -32020  # a connector's handler raised (data: type, traceback)
HANDLER_CRASHED = -32021  # a connector's handler died without an answer (data: exit code, signal, stderr)
HANDLER_OOM = -32022  # a connector's handler was killed by the memory limit
RESULT_TOO_LARGE = -32023  # a connector's result is larger than the output cap
CONFIG_ERROR = -32030  # sandbox.configure refused: a connector that cannot load, a tool name clash

# Codes that mean the caller asked wrongly (CLI exit 2), not that the tool failed (exit 1).
USAGE_CODES = frozenset({PARSE_ERROR, INVALID_REQUEST, METHOD_NOT_FOUND, INVALID_PARAMS})


def error_response(req_id: Any, code: int, message: str, data: Any = None) -> dict[str, Any]:
    """A JSON-RPC error response, built one way for every door (``data`` left out when None)."""
    err: dict[str, Any] = {"code": code, "message": message}
    if data is not None:
        err["data"] = data
    return {"jsonrpc": "2.0", "id": req_id, "error": err}


__all__ = [
    "CALL_TIMEOUT",
    "CONFIG_ERROR",
    "EGRESS_DENIED",
    "FETCH_FAILED",
    "HANDLER_CRASHED",
    "HANDLER_ERROR",
    "HANDLER_OOM",
    "INTERNAL_ERROR",
    "INVALID_PARAMS",
    "INVALID_REQUEST",
    "METHOD_NOT_FOUND",
    "NO_SPACE",
    "PARSE_ERROR",
    "PATH_ESCAPE",
    "REQUEST_CANCELLED",
    "RESULT_TOO_LARGE",
    "SANDBOX_ENDED",
    "TOOL_ERROR",
    "USAGE_CODES",
    "WORKER_ERROR",
    "error_response",
]
