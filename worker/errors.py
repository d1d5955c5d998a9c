"""Worker-side error tree; each class carries its JSON-RPC error code.

    WorkerError (-32000)
    ├── ToolError (-32001)          the tool ran and reports a failure (file not found, ...)
    │   ├── PathEscape (-32002)     a path resolves outside /workspace or scratch
    │   └── NoSpace (-32005)        scratch is full
    ├── CallTimeout (-32003)        an in-process handler overran its per-call timeout
    ├── RequestTooLarge (-32600)    a request line longer than the worker accepts
    └── BadParams (-32602)          params do not match the tool's schema

Unexpected exceptions never cross the wire as text: they are logged with an error id
and answered with -32603 and that id.
"""

from __future__ import annotations

from typing import Any


class WorkerError(Exception):
    code = -32000

    def __init__(self, message: str, data: Any = None) -> None:
        super().__init__(message)
        self.message = message
        self.data = data


class ToolError(WorkerError):
    code = -32001


class PathEscape(ToolError):
    code = -32002


class NoSpace(ToolError):
    code = -32005


class CallTimeout(WorkerError):
    code = -32003


class RequestTooLarge(WorkerError):
    code = -32600


class BadParams(WorkerError):
    code = -32602
