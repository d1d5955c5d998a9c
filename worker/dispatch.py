"""The one module that imports jsonrpcserver: validate params, call the tool, map errors to codes.

jsonrpcserver answers an unexpected exception with ``str(exc)`` in the error data; every
handler is wrapped here so that never happens: the exception is logged on stderr with an
error id and the caller gets -32603 with that id only.
"""

from __future__ import annotations

import json
import signal
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import structlog
from jsonrpcserver import Error, Result, Success, dispatch
from pydantic import ValidationError

from worker.errors import CallTimeout, WorkerError
from worker.settings import Settings
from worker.tools import Tool, describe

log = structlog.get_logger()

_TOO_LONG = {"jsonrpc": "2.0", "error": {"code": -32600, "message": "Invalid request"}, "id": None}


def _param_errors(exc: ValidationError) -> list[dict[str, Any]]:
    return [{"field": ".".join(str(x) for x in e["loc"]), "error": e["msg"]} for e in exc.errors()]


@contextmanager
def _alarm(seconds: float) -> Iterator[None]:
    """Deadline for handlers that run in the worker itself (a child process has its own)."""

    def _fire(signum: int, frame: Any) -> None:
        raise CallTimeout(f"call exceeded its timeout of {seconds:g}s")

    old = signal.signal(signal.SIGALRM, _fire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


class Dispatcher:
    """Turns one request line into one response line (or none, for notifications)."""

    def __init__(self, settings: Settings, tools: dict[str, Tool]) -> None:
        self.settings = settings
        self.tools = tools
        self._listing: list[dict[str, Any]] | None = None
        self.methods: dict[str, Callable[..., Result]] = {n: self._wrap(t) for n, t in tools.items()}
        self.methods["tools.list"] = self._tools_list
        self.methods["ping"] = self._ping
        self.methods["sandbox.usage"] = self._usage

    def _tools_list(self) -> Result:
        if self._listing is None:
            self._listing = describe(self.tools)
        return Success(self._listing)

    def _ping(self) -> Result:
        return Success("pong")

    def _usage(self) -> Result:
        from worker.usage import usage

        return Success(usage())

    def _wrap(self, tool: Tool) -> Callable[..., Result]:
        settings = self.settings

        def method(*args: Any, **kwargs: Any) -> Result:
            if args:
                return Error(-32602, "Invalid params", "params must be a JSON object of named fields")
            try:
                params = tool.params.model_validate(kwargs)
            except ValidationError as exc:
                return Error(-32602, "Invalid params", _param_errors(exc))
            started = time.monotonic()
            outcome = "ok"
            try:
                if tool.in_process_timeout:
                    with _alarm(settings.policy.timeouts.call_s):
                        result = tool.handler(settings, params)
                else:
                    result = tool.handler(settings, params)
                return Success(result)
            except WorkerError as exc:
                outcome = type(exc).__name__
                return Error(exc.code, exc.message, exc.data)
            except Exception:
                error_id = uuid.uuid4().hex[:12]
                outcome = "internal_error"
                log.exception("call.crashed", tool=tool.name, error_id=error_id)
                return Error(-32603, "Internal error", {"error_id": error_id})
            finally:
                log.info(
                    "call.finished",
                    tool=tool.name,
                    outcome=outcome,
                    duration_ms=round((time.monotonic() - started) * 1000, 3),
                )

        return method

    def handle(self, line: bytes | None) -> str:
        """One request line in, one response line out ("" when nothing must be sent)."""
        if line is None:
            return json.dumps({**_TOO_LONG, "error": {**_TOO_LONG["error"], "data": "request line too long"}})
        return dispatch(line, methods=self.methods, deserializer=json.loads)  # type: ignore[arg-type]
