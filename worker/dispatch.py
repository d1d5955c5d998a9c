"""The worker's JSON-RPC 2.0 core: parse, validate, call the tool, map errors to codes.

It was jsonrpcserver's pipeline until the worker's start-up became the issue: importing
``jsonrpcserver.dispatcher`` and its ``oslash`` monads cost ~45 ms of CPU in a 1-CPU
container, on every run's first answer, and ``inspect.signature(...).bind`` per call. The
wire behaviour is the same (its request schema, parse error, invalid request, method not
found, invalid params, notifications unanswered, batches answered as batches, ``data``
omitted when absent). An unexpected exception is never answered with ``str(exc)``: it is
logged on stderr with an error id and the caller gets -32603 with that id only.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, NamedTuple

from toolcage.policies import codes
from toolcage.worker import calls, logs
from toolcage.worker.errors import CallTimeout, WorkerError
from toolcage.worker.protocol import valid_request
from toolcage.worker.secrets import STORE
from toolcage.worker.settings import Settings
from toolcage.worker.tools import Catalog, Tool

if TYPE_CHECKING:
    from toolcage.worker.connectors import Connectors

_NODATA: Any = object()  # "data" is left out of the error (JSON-RPC makes it optional)


class Success(NamedTuple):
    result: Any


class Error(NamedTuple):
    code: int
    message: str
    data: Any = _NODATA


Result = Success | Error


class _Method(NamedTuple):
    fn: Callable[..., Result]
    takes_params: bool  # False: called with no arguments; any params are -32602


_INVALID = {
    "jsonrpc": "2.0",
    "error": {
        "code": codes.INVALID_REQUEST,
        "message": "Invalid request",
        "data": "The request failed schema validation",  # jsonrpcserver's words, kept
    },
    "id": None,
}
_TOO_LONG = {
    "jsonrpc": "2.0",
    "error": {"code": codes.INVALID_REQUEST, "message": "Invalid request", "data": "request line too long"},
    "id": None,
}


_CANCELLED = Error(codes.REQUEST_CANCELLED, "Request cancelled", None)
_PONG = Success("pong")


def _progress_token(msg: dict[str, Any]) -> str | int | None:
    """MCP's ``params._meta.progressToken``, taken out of the params (no tool has a ``_meta`` field)."""
    params = msg.get("params")
    if not isinstance(params, dict) or "_meta" not in params:
        return None
    meta = params.pop("_meta")
    token = meta.get("progressToken") if isinstance(meta, dict) else None
    return token if type(token) in (str, int) else None


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


def _serialize(result: Result, req_id: Any) -> dict[str, Any]:
    """One answer, plus what the runner audits about a call (``WithMeta``) as a ``toolcage``
    member, which the runner takes off before anyone sees it. Every string of the answer has
    the run's secrets redacted."""
    # only a connector's answer carries a WithMeta: until connectors are loaded there is none to look for
    connectors = sys.modules.get("toolcage.worker.connectors")
    with_meta: Any = connectors.WithMeta if connectors is not None else ()
    meta = None
    out: dict[str, Any]
    if isinstance(result, Error):
        data = result.data
        if isinstance(data, with_meta):
            meta, data = data.meta, data.value
        error: dict[str, Any] = {"code": result.code, "message": result.message}
        if data is not _NODATA:
            error["data"] = data
        out = {"jsonrpc": "2.0", "error": error, "id": req_id}
    else:
        value = result.result
        if isinstance(value, with_meta):
            meta, value = value.meta, value.value
        out = {"jsonrpc": "2.0", "result": value, "id": req_id}
    if meta is not None:
        out["toolcage"] = meta
    return STORE.redact(out) if STORE else out


def _no_params_error(params: Any) -> str | None:
    """What ``inspect.signature(f).bind(...)`` says when a method that takes nothing is given params."""
    if isinstance(params, list) and params:
        return "too many positional arguments"
    if isinstance(params, dict) and params:
        return f"got an unexpected keyword argument '{next(iter(params))}'"
    return None


class Dispatcher:
    """Turns one request line into one response line (or "" for notifications)."""

    def __init__(self, settings: Settings, catalog: Catalog) -> None:
        self.settings = settings
        self.catalog = catalog
        self._connectors: Connectors | None = None
        self.methods: dict[str, _Method] = {n: _Method(self._wrap(n), True) for n in catalog.names()}
        self.methods["tools.list"] = _Method(self._tools_list, False)
        self.methods["ping"] = _Method(lambda: _PONG, False)
        self.methods["sandbox.usage"] = _Method(self._usage, False)
        self.methods["sandbox.configure"] = _Method(self._configure, True)

    @property
    def connectors(self) -> Connectors:
        """Loaded on first use: a run without connectors never imports them."""
        if self._connectors is None:
            from toolcage.worker.connectors import Connectors

            self._connectors = Connectors(self.settings)
        return self._connectors

    def _configure(self, *args: Any, **kwargs: Any) -> Result:
        """Once, from the runner: the run's secrets and connector sources (it imports the sources
        in a child, so it ends like a call that ran code: with the sweep)."""
        if args:
            return Error(codes.INVALID_PARAMS, "Invalid params", "params must be a JSON object of named fields")
        try:
            answer = self.connectors.configure(kwargs, self.catalog.names())
        except WorkerError as exc:
            return Error(exc.code, exc.message, exc.data)
        finally:
            if self.connectors.sources:
                self._after_code("sandbox.configure")
        for name, info in self.connectors.tools.items():
            self.catalog.add(
                Tool(
                    name,
                    info["description"],
                    None,
                    self._connector_handler(name),
                    in_process_timeout=False,
                    runs_code=True,
                    info=functools.partial(self.connectors.describe_one, name),
                )
            )
            self.methods[name] = _Method(self._wrap(name), True)
        return Success(answer)

    @staticmethod
    def _usage() -> Result:
        from toolcage.worker.usage import usage

        return Success(usage())

    def _tools_list(self) -> Result:
        """Every tool with its schema; the connectors' schemas are made on first ask (a loading child)."""
        if self._connectors is not None:  # never loaded: this run has no connectors
            try:
                ran = self._connectors.ensure_schemas()
            except WorkerError as exc:
                self._after_code("tools.list")
                return Error(exc.code, exc.message, exc.data)
            if ran:
                self._after_code("tools.list")
        return Success(self.catalog.describe())

    def _connector_handler(self, name: str) -> Callable[[Settings, Any], Any]:
        def handler(_settings: Settings, params: Any) -> Any:
            return self.connectors.call(name, params)

        return handler

    def _wrap(self, name: str) -> Callable[..., Result]:
        def method(*args: Any, **kwargs: Any) -> Result:
            if args:
                return Error(codes.INVALID_PARAMS, "Invalid params", "params must be a JSON object of named fields")
            started = time.monotonic()
            outcome = "ok"
            try:
                if calls.cancelled():  # cancelled before it started
                    outcome = "cancelled"
                    return _CANCELLED
                tool = self.catalog.get(name)
                params = tool.validate(kwargs)
                try:
                    if tool.in_process_timeout:
                        with _alarm(self.settings.policy.timeouts.call_s):
                            result = tool.handler(self.settings, params)
                    else:
                        result = tool.handler(self.settings, params)
                finally:
                    if tool.runs_code:
                        self._after_code(name)
                if calls.cancelled():
                    outcome = "cancelled"
                    return _CANCELLED
                return Success(result)
            except WorkerError as exc:
                if calls.cancelled():  # its processes were killed: that is why it failed
                    outcome = "cancelled"
                    return _CANCELLED
                outcome = type(exc).__name__
                if exc.meta is None:
                    return Error(exc.code, exc.message, exc.data)
                from toolcage.worker.connectors import WithMeta

                return Error(exc.code, exc.message, WithMeta(exc.data, exc.meta))
            except Exception:
                error_id = os.urandom(6).hex()
                outcome = "internal_error"
                # logging may itself fail (no descriptor left, a lazy import): the answer must still
                # carry the error id only, never jsonrpcserver's str(exc) fallback
                with contextlib.suppress(Exception):
                    logs.exception("call.crashed", tool=name, error_id=error_id)
                return Error(codes.INTERNAL_ERROR, "Internal error", {"error_id": error_id})
            finally:
                logs.info(
                    "call.finished",
                    tool=name,
                    outcome=outcome,
                    duration_ms=round((time.monotonic() - started) * 1000, 3),
                )

        return method

    def _after_code(self, tool: str) -> None:
        """Nothing survives its call (unless the policy says unsafe_background_processes): every
        other process of the sandbox is killed and what it left in IPC is removed, before the
        answer goes out."""
        from toolcage.worker import sweep

        if sweep.active() and not self.settings.policy.unsafe_background_processes:
            try:
                swept = sweep.after_call()
            except BaseException:
                # fail closed: no answer may go out while the call's processes might live on; as
                # PID 1 our exit ends every process of the sandbox, and the runner sees a crash
                os.write(2, b'{"event": "worker.sweep_failed", "level": "error", "component": "worker"}\n')
                os._exit(70)
            if swept["killed"] or swept["left"] or swept["ipc_removed"]:
                logs.info("call.swept", tool=tool, **swept)

    def handle(self, line: bytes | None) -> str:
        """One request line in, one response line out ("" when nothing must be sent)."""
        if line is None:
            return json.dumps(_TOO_LONG)
        try:
            msg = json.loads(line)
        except (ValueError, RecursionError) as exc:  # RecursionError: nesting deeper than the parser goes
            error = {"code": codes.PARSE_ERROR, "message": "Parse error", "data": str(exc)}
            return json.dumps({"jsonrpc": "2.0", "error": error, "id": None})
        if isinstance(msg, dict):
            cancelled_id = calls.cancel_message(msg)
            if cancelled_id is not None:  # read between calls (mid-call, the channel acts on it itself)
                calls.cancel(cancelled_id)
                return ""
        if isinstance(msg, list):
            batch = msg if msg and all(valid_request(r) for r in msg) else None
        else:
            batch = [msg] if valid_request(msg) else None
        if batch is None:
            return json.dumps(_INVALID)
        answers = [a for a in (self._one(r) for r in batch) if a is not None]
        if not answers:
            return ""  # notifications only
        return json.dumps(answers if isinstance(msg, list) else answers[0])

    def _one(self, msg: dict[str, Any]) -> dict[str, Any] | None:
        """Call one (valid) request; its answer, or None for a notification."""
        token = _progress_token(msg)
        is_call = "id" in msg
        if is_call:
            calls.begin(msg["id"], token)
        try:
            result = self._call(msg["method"], msg.get("params"))
        finally:
            calls.end()
        return _serialize(result, msg["id"]) if is_call else None

    def _call(self, name: str, params: Any) -> Result:
        method = self.methods.get(name)
        if method is None:
            return Error(codes.METHOD_NOT_FOUND, "Method not found", name)
        if not method.takes_params:
            problem = _no_params_error(params)
            if problem is not None:
                return Error(codes.INVALID_PARAMS, "Invalid params", problem)
            args: list[Any] = []
            kwargs: dict[str, Any] = {}
        else:
            args = params if isinstance(params, list) else []
            kwargs = params if isinstance(params, dict) else {}
        try:
            return method.fn(*args, **kwargs)
        except Exception:  # the wrapped tools catch their own: this is ping, usage, tools.list, configure
            error_id = os.urandom(6).hex()
            with contextlib.suppress(Exception):
                logs.exception("call.crashed", tool=name, error_id=error_id)
            return Error(codes.INTERNAL_ERROR, "Internal error", {"error_id": error_id})
