"""The one module that imports jsonrpcserver: validate params, call the tool, map errors to codes.

jsonrpcserver answers an unexpected exception with ``str(exc)`` in the error data; every
handler is wrapped here so that never happens: the exception is logged on stderr with an
error id and the caller gets -32603 with that id only. Its core pipeline is loaded
without the package ``__init__`` (nor oslash's; see ``worker._lean``), with a request validator that
implements jsonrpcserver's own request schema in plain Python. A request the pipeline could answer only one way
(most calls) is answered by its own ``call`` and ``to_response`` without the rest of it (``Dispatcher._direct``).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import json
import os
import signal
import sys
import time
import types
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from toolcage.policies import codes, contract
from toolcage.worker import _lean, calls, logs
from toolcage.worker.errors import CallTimeout, ConfigError, WorkerError
from toolcage.worker.protocol import progress_token, valid_request
from toolcage.worker.secrets import STORE
from toolcage.worker.settings import Settings
from toolcage.worker.tools import Catalog, Tool

if TYPE_CHECKING:
    from toolcage.worker.connectors.host import Connectors

_lean.bare_package("jsonrpcserver")
_lean.bare_package("oslash")  # its __init__ imports every monad it has (~35 ms here); the pipeline needs Either
from jsonrpcserver.dispatcher import call as call_method  # noqa: E402
from jsonrpcserver.dispatcher import dispatch_to_response_pure, to_response  # noqa: E402
from jsonrpcserver.request import Request  # noqa: E402
from jsonrpcserver.response import serialize_error, serialize_success  # noqa: E402
from jsonrpcserver.result import Error, Result, Success  # noqa: E402
from jsonrpcserver.sentinels import NOCONTEXT  # noqa: E402
from oslash.either import Left  # noqa: E402

_TOO_LONG = codes.error_response(None, codes.INVALID_REQUEST, "Invalid request", "request line too long")


def validate_request(deserialized: Any) -> Any:
    """jsonrpcserver's request-schema.json, in Python: one request or a non-empty batch."""
    if isinstance(deserialized, list):
        if not deserialized or not all(valid_request(r) for r in deserialized):
            raise ValueError("invalid batch")
    elif not valid_request(deserialized):
        raise ValueError("invalid request")
    return deserialized


_UNPARSABLE = object()
_REQUEST_KEYS = frozenset(("jsonrpc", "method", "params", "id"))
_NAME_MAX = 64  # a method name longer than this gets no "did you mean" (tool names are short)
_CANCELLED = Error(codes.REQUEST_CANCELLED, "Request cancelled", None)


def _progress_token(msg: dict[str, Any]) -> str | int | None:
    """MCP's ``params._meta.progressToken``, taken out of the params (no tool has a ``_meta`` field)."""
    params = msg.get("params")
    token = progress_token(params)
    if isinstance(params, dict):
        params.pop("_meta", None)
    return token


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


def _serialize(response: Any) -> Any:
    """jsonrpcserver's serializer, plus what the runner audits about a call (``WithMeta``) as a
    ``toolcage`` member of the answer, which the runner takes off before anyone sees it.
    Every string of the answer has the run's secrets redacted."""
    # only a connector's answer carries a WithMeta: until connectors are loaded there is none to look for
    connectors = sys.modules.get("toolcage.worker.connectors.host")
    WithMeta: Any = connectors.WithMeta if connectors is not None else ()
    meta = None
    if isinstance(response, Left):
        err = response._error
        if isinstance(err.data, WithMeta):
            meta, err = err.data.meta, err._replace(data=err.data.value)
        out = serialize_error(err)
    else:
        ok = response._value
        if isinstance(ok.result, WithMeta):
            meta, ok = ok.result.meta, ok._replace(result=ok.result.value)
        out = serialize_success(ok)
    if meta is not None:
        out["toolcage"] = meta
    return STORE.redact(out)


def _closest(name: Any, names: list[str]) -> list[str]:
    """The tools a mistyped name most likely meant (difflib's ratio over 0.6, best first); none for a
    name that is not a short string, which no tool name is close to (nor worth comparing)."""
    if not isinstance(name, str) or not 0 < len(name) <= _NAME_MAX:
        return []
    import difflib  # only for a call to a name that is not there

    return difflib.get_close_matches(name, names, n=3)


def _not_found(err: Any, names: list[str]) -> Any:
    """jsonrpcserver's "Method not found" answer (code and data, the name asked for, unchanged), naming
    in its message the closest tools when some are close: a typo should not need a tools.list to fix."""
    close = _closest(err.data, names)
    if not close:
        return err
    return err._replace(message=f"Method not found: {err.data!r}; did you mean {' or '.join(map(repr, close))}?")


def _signed(fn: Callable[..., Result]) -> Callable[..., Result]:
    """``fn`` with its signature worked out once: jsonrpcserver checks every call's arguments with
    ``inspect.signature(method).bind(...)``, which costs ~25 us per call when the signature is made
    anew, and takes one already made from ``__signature__``. The check itself is unchanged."""
    sig = inspect.signature(fn)
    if not isinstance(fn, types.FunctionType):  # a bound method takes no attributes: a function around it
        method = fn

        def fn(*args: Any, **kwargs: Any) -> Result:
            return method(*args, **kwargs)

    fn.__signature__ = sig  # type: ignore[attr-defined]
    # what jsonrpcserver's check (sig.bind) would say, worked out once for Dispatcher._direct: bound with no
    # arguments at all, and with any keyword arguments (only *args and **kwargs, so any names bind)
    params = sig.parameters.values()
    fn._binds_nothing = all(p.default is not p.empty or p.kind in _VARIADIC for p in params)  # type: ignore[attr-defined]
    fn._binds_any_names = (  # type: ignore[attr-defined]
        all(p.kind in _VARIADIC for p in params) and any(p.kind is p.VAR_KEYWORD for p in params)
    )
    return fn


_VARIADIC = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)


def _no_background_beside(tool: str) -> None:
    """Threat: a background process (worker.children.background) reading a connector's memory, which may hold
    the run's secrets, through /proc (the same uid). Under runc a connector therefore runs with no background
    process alive; under gVisor each lives in a PID namespace of its own, where it cannot name the handler."""
    from toolcage.worker.children import namespaces

    background = sys.modules.get("toolcage.worker.children.background")
    if background is None or namespaces.enabled() or not background.any_kept():
        return
    from toolcage.worker.errors import ToolError

    running = [p.id for p in background.alive()]
    raise ToolError(
        f"the connector {tool} runs alone (it may hold the run's secrets), and background processes {running} "
        "are alive: proc_kill them first",
        {"background": running},
    )


class Dispatcher:
    """Turns one request line into one response line (or "" for notifications)."""

    def __init__(self, settings: Settings, catalog: Catalog) -> None:
        self.settings = settings
        self.catalog = catalog
        self._connectors: Connectors | None = None
        self._bare_configured = False  # configured with nothing but a deadline (see _configure)
        # tools.list's answer as it goes out, but for its id: (the catalog's list, the redaction, the line's head)
        self._listed: tuple[object, object, str] | None = None
        self.methods: dict[str, Callable[..., Result]] = {n: self._wrap(n) for n in catalog.names()}
        self.methods[contract.TOOLS_LIST] = _signed(self._tools_list)
        self.methods[contract.PING] = _signed(lambda: Success("pong"))
        self.methods[contract.USAGE] = _signed(self._usage)
        self.methods[contract.CONFIGURE] = _signed(self._configure)
        self.methods[contract.NETWORK] = _signed(self._network)

    @property
    def connectors(self) -> Connectors:
        """Loaded on first use: a run without connectors never imports them."""
        if self._connectors is None:
            from toolcage.worker.connectors.host import Connectors

            self._connectors = Connectors(self.settings)
        return self._connectors

    def warm(self) -> None:
        """While a pooled sandbox waits for its run: load what its ``sandbox.configure`` will need (the
        secrets' redaction, with ``html``, and the deadline's module: ~3 ms of the run's first answer when
        the configure itself imported them)."""
        from toolcage.worker import deadline, redaction  # noqa: F401

        if self._connectors is None:
            with contextlib.suppress(Exception):  # the configure call reports any failure itself
                self.connectors  # noqa: B018 - imported and made now, not on the run's path

    def _configure(self, *args: Any, **kwargs: Any) -> Result:
        """Once, from the runner: the run's secrets and connector sources (it imports the sources
        in a child, so it ends like a call that ran code: with the sweep), and for a pooled sandbox
        its run's deadline (epoch seconds; it can only come earlier than the one armed at start)."""
        if args:
            return Error(codes.INVALID_PARAMS, "Invalid params", "params must be a JSON object of named fields")
        if "deadline" in kwargs:
            from toolcage.worker import deadline

            if not deadline.arm(kwargs.pop("deadline")):
                return Error(codes.INVALID_PARAMS, "Invalid params", "deadline must be a number (epoch seconds)")
        if self._bare_configured:
            again = ConfigError("the sandbox is already configured")
            return Error(again.code, again.message, again.data)
        bare = set(kwargs) <= {"sources", "secrets"} and not kwargs.get("sources") and not kwargs.get("secrets")
        if bare and self._connectors is None and not self.settings.policy.secrets:
            # a pooled run with no secrets and no connectors (its deadline, and the runner's empty sources and
            # secrets): nothing to load, no child started, so neither the connectors' module nor a sweep (a burst
            # through a pool pays them per run; a slot of such a pool no longer loads them while it waits)
            self._bare_configured = True
            return Success({"tools": [], "secrets": []})
        try:
            # it imports the sources in a child, if there are any
            with self._running_code(contract.CONFIGURE, ran=lambda: bool(self.connectors.sources)):
                answer = self.connectors.configure(kwargs, self.catalog.names())
        except WorkerError as exc:
            return Error(exc.code, exc.message, exc.data)
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
                    alone=True,
                )
            )
            self.methods[name] = self._wrap(name)
        return Success(answer)

    def _network(self, *args: Any, **kwargs: Any) -> Result:
        """From the runner, at a live policy change (its egress proxy already enforces it): the run's new policy,
        which SafeFetch decides with from the next call on. Only the network may differ from the one in force."""
        from toolcage.policies import policy_from_json

        raw = kwargs.get("policy")
        if args or set(kwargs) != {"policy"} or not isinstance(raw, dict):
            return Error(codes.INVALID_PARAMS, "Invalid params", "params must be {policy: {...}}")
        try:
            new = policy_from_json(json.dumps(raw))
        except Exception as exc:
            return Error(codes.INVALID_PARAMS, "Invalid params", f"not a policy: {type(exc).__name__}")
        import dataclasses

        if dataclasses.replace(new, network=self.settings.policy.network) != self.settings.policy:
            return Error(codes.INVALID_PARAMS, "Invalid params", "only the network may change in a running sandbox")
        self.settings.replace_policy(new)
        return Success({"sha256": new.sha256()})

    @staticmethod
    def _usage() -> Result:
        from toolcage.worker.children.usage import usage

        return Success(usage())

    def _tools_list_line(self, msg: Any) -> str | None:
        """A plain ``tools.list`` (no params) answered from the line made for the last one, byte for byte what
        jsonrpcserver's path makes but for the id: the same catalog list and the same redaction (both objects
        change whenever what they hold does). 29 KB of JSON, made and redacted once instead of each time (the
        worker's ~0.2 ms of a ~0.7 ms round trip). None: any other request, or connectors' schemas not made yet."""
        if not (
            type(msg) is dict
            and msg.get("method") == contract.TOOLS_LIST
            and msg.get("jsonrpc") == "2.0"
            and msg.keys() <= _REQUEST_KEYS
            and msg.get("params", {}) in ({}, [])
            and type(msg.get("id")) in (int, str)
        ):
            return None
        if self._connectors is not None and not self._connectors.schemas_ready:
            return None  # made by a loading child, on the usual path (waits for code calls, maps its errors)
        described, redaction = self.catalog.describe(), STORE.redaction
        made = self._listed
        if made is None or made[0] is not described or made[1] is not redaction:
            head = json.dumps(STORE.redact({"jsonrpc": "2.0", "result": described}))[:-1] + ', "id": '
            made = self._listed = (described, redaction, head)
        return f"{made[2]}{json.dumps(msg['id'])}}}"

    def _tools_list(self) -> Result:
        """Every tool with its schema; the connectors' schemas are made on first ask (a loading child)."""
        if self._connectors is not None and not self._connectors.schemas_ready:  # made by a loading child
            try:
                with self._running_code(contract.TOOLS_LIST):
                    self._connectors.ensure_schemas()
            except WorkerError as exc:
                return Error(exc.code, exc.message, exc.data)
        return Success(self.catalog.describe())

    def _connector_handler(self, name: str) -> Callable[[Settings, Any], Any]:
        def handler(_settings: Settings, params: Any) -> Any:
            _no_background_beside(name)
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
                if tool.in_process_timeout:
                    with _alarm(self.settings.policy.timeouts.call_s):
                        result = tool.handler(self.settings, params)
                elif tool.runs_code:
                    with self._running_code(name):
                        result = tool.handler(self.settings, params)
                else:
                    result = tool.handler(self.settings, params)
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
                from toolcage.worker.connectors.host import WithMeta

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

        return _signed(method)

    @contextmanager
    def _running_code(self, tool: str, ran: Callable[[], bool] = lambda: True) -> Iterator[None]:
        """Around anything that may start a child: the last code call out sweeps (sweep.CodeCalls),
        unless ``ran`` says that no child was started after all."""
        from toolcage.worker.children.sweep import CODE_CALLS

        CODE_CALLS.enter()
        try:
            yield
        finally:
            if CODE_CALLS.leave():
                try:
                    if ran():
                        self._after_code(tool)
                finally:
                    CODE_CALLS.swept()

    def _after_code(self, tool: str) -> None:
        """Nothing survives its call (unless the policy says unsafe_background_processes): every
        other process of the sandbox is killed and what it left in IPC is removed, before the
        answer goes out (with calls in flight together: before the last one's answer)."""
        from toolcage.worker.children import sweep

        if sweep.active() and not self.settings.policy.unsafe_background_processes:
            zygote = sys.modules.get("toolcage.worker.children.zygote")  # (loaded with the first code call)
            if zygote is not None:
                zygote.settle()  # a process made ahead is known before the sweep counts: none of the call's
            try:
                swept = sweep.after_call()
            except BaseException:
                # fail closed: no answer may go out while the call's processes might live on; as
                # PID 1 our exit ends every process of the sandbox, and the runner sees a crash
                os.write(2, b'{"event": "worker.sweep_failed", "level": "error", "component": "worker"}\n')
                os._exit(contract.EXIT_SOFTWARE)
            if swept["killed"] or swept["left"] or swept["ipc_removed"]:
                logs.info("call.swept", tool=tool, **swept)

    def _answer(self, response: Any) -> Any:
        """One answer as it goes out (:func:`_serialize`); an unknown method's names the closest tools."""
        if isinstance(response, Left) and response._error.code == codes.METHOD_NOT_FOUND:
            response = Left(_not_found(response._error, self.catalog.names()))
        return _serialize(response)

    @staticmethod
    def parse(line: bytes | None) -> Any:
        """The request line as JSON (``_UNPARSABLE`` when it is not)."""
        if line is None:
            return _UNPARSABLE
        try:
            return json.loads(line)
        except ValueError:
            return _UNPARSABLE

    def concurrent(self, msg: Any) -> bool | str:
        """Whether this request may run on a thread of its own beside others: a call (with an id)
        of a tool that runs code in a child, when the policy allows more than one at a time; "waits"
        for a call that waits on a background process (a thread of its own whatever the concurrency).
        Anything else runs on the main thread, in order."""
        if not isinstance(msg, dict) or "id" not in msg or not isinstance(msg.get("method"), str):
            return False
        tool = self.catalog.find(msg["method"])
        if tool is not None and tool.waits:
            return "waits"
        return tool is not None and tool.runs_code and not tool.alone and self.concurrency() > 1

    def alone(self, msg: Any) -> bool:
        """Whether this request, served on the main thread, must first wait until no code call is in
        flight (and the sweep has run): a connector's call (it may hold the run's secrets), and what
        starts a connector child: ``sandbox.configure``, a ``tools.list`` that makes their schemas.
        A batch is served on the main thread as one request: it waits when any of its requests must
        (else a connector's call in a batch would run beside the code calls in flight)."""
        if isinstance(msg, list):
            return any(self.alone(m) for m in msg)
        if not isinstance(msg, dict) or not isinstance(msg.get("method"), str):
            return False
        method = msg["method"]
        if method == contract.CONFIGURE:
            return True
        if method == contract.TOOLS_LIST:
            return self._connectors is not None and not self._connectors.schemas_ready
        tool = self.catalog.find(method)
        return tool is not None and tool.alone

    def concurrency(self) -> int:
        return int(self.settings.policy.limits.concurrency)

    def _direct(self, msg: Any) -> tuple[Request, Callable[..., Result]] | None:
        """The request as jsonrpcserver's pipeline would make it, and its method, when that pipeline could only go
        one way: one
        valid request (not a batch, not a notification) for a method there is, whose params its check binds
        (none, or named ones for a method that takes any names). Its method is then called by jsonrpcserver's
        own ``call`` and answered by its ``to_response``, as the pipeline does, without the pipeline's
        deserializer, validator, monads and signature check per message (~20 µs of a ping's 32 on the host).
        None: anything else, which the whole pipeline serves (tests/unit/test_dispatch_direct.py holds the two
        to the same answers)."""
        if type(msg) is not dict or "id" not in msg or not valid_request(msg):
            return None
        method = self.methods.get(msg["method"])
        if method is None:
            return None
        params = msg.get("params", [])  # as jsonrpcserver's create_request
        if not params:
            if not getattr(method, "_binds_nothing", False):
                return None
        elif type(params) is not dict or not getattr(method, "_binds_any_names", False):
            return None
        return Request(msg["method"], params, msg["id"]), method

    def handle(self, line: bytes | None, msg: Any = None) -> str:
        """One request line in, one response line out ("" when nothing must be sent); ``msg``: the
        line already parsed (:meth:`parse`)."""
        if line is None:
            return json.dumps(_TOO_LONG)
        if msg is None:
            msg = self.parse(line)
        deserializer: Callable[[Any], Any] = json.loads
        if msg is _UNPARSABLE:
            msg = None  # jsonrpcserver answers the parse error
        else:
            deserializer = lambda _line: msg  # noqa: E731 - parsed once
        listed = self._tools_list_line(msg)
        if listed is not None:
            return listed
        if isinstance(msg, dict):
            cancelled_id = calls.cancel_message(msg)
            if cancelled_id is not None:  # read between calls (mid-call, the channel acts on it itself)
                calls.cancel(cancelled_id)
                return ""
            token = _progress_token(msg)
            if "id" in msg:
                calls.begin(msg["id"], token)
        try:
            direct = self._direct(msg)
            if direct is not None:
                request, method = direct
                response = self._answer(to_response(request, call_method(request, NOCONTEXT, method)))
            else:
                response = dispatch_to_response_pure(
                    deserializer=deserializer,
                    validator=validate_request,
                    methods=self.methods,
                    context=NOCONTEXT,
                    post_process=self._answer,
                    request=line,  # type: ignore[arg-type]
                )
        finally:
            calls.end()
        if response is None:
            return ""
        return json.dumps(response)
