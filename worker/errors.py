"""Worker-side error tree; each class carries its JSON-RPC error code (from ``policies.codes``).

    WorkerError (-32000)
    ├── ToolError (-32001)          the tool ran and reports a failure (file not found, ...)
    │   ├── PathEscape (-32002)     a path resolves outside /workspace or scratch
    │   ├── NoSpace (-32005)        scratch is full
    │   ├── EgressDenied (-32010)   the policy refuses the request (data.reason says why)
    │   ├── FetchFailed (-32011)    the request was allowed but failed
    │   ├── HandlerFailed (-32020)  a connector's handler raised (or reported an error of its own)
    │   ├── HandlerCrashed (-32021) a connector's handler died without an answer
    │   ├── HandlerOOM (-32022)     ... killed by the memory limit
    │   └── ResultTooLarge (-32023) a connector's result is over the output cap
    ├── CallTimeout (-32003)        a handler overran its per-call timeout
    ├── ConfigError (-32030)        sandbox.configure refused (a connector cannot load, a name clash)
    └── BadParams (-32602)          params do not match the tool's schema

Unexpected exceptions never cross the wire as text: they are logged with an error id
and answered with -32603 and that id.
"""

from __future__ import annotations

from typing import Any

from toolcage.policies import codes


class WorkerError(Exception):
    code = codes.WORKER_ERROR
    # what the runner audits about the call that failed (a connector's fetches), sent beside the error
    meta: dict[str, Any] | None = None

    def __init__(self, message: str, data: Any = None) -> None:
        super().__init__(message)
        self.message = message
        self.data = data


class ToolError(WorkerError):
    code = codes.TOOL_ERROR


class PathEscape(ToolError):
    code = codes.PATH_ESCAPE


class NoSpace(ToolError):
    code = codes.NO_SPACE


class EgressDenied(ToolError):
    """The policy refuses this request (the reason says which rule or check)."""

    code = codes.EGRESS_DENIED


class FetchFailed(ToolError):
    """The request was allowed but failed (connection refused, TLS, timeout, bad response)."""

    code = codes.FETCH_FAILED


class CallTimeout(WorkerError):
    code = codes.CALL_TIMEOUT


class BadParams(WorkerError):
    code = codes.INVALID_PARAMS


class HandlerFailed(ToolError):
    """A connector's handler raised; the code is the one it reported, if it may report it."""

    code = codes.HANDLER_ERROR


class HandlerCrashed(ToolError):
    code = codes.HANDLER_CRASHED


class HandlerOOM(ToolError):
    code = codes.HANDLER_OOM


class ResultTooLarge(ToolError):
    code = codes.RESULT_TOO_LARGE


class ConfigError(WorkerError):
    code = codes.CONFIG_ERROR
