"""Logging for the host side: the library is silent unless its application asks; the CLI prints for people.

- **The library** logs to the standard logger ``toolcage`` (``logging.getLogger("toolcage")``),
  which has a NullHandler: nothing reaches the application's stderr until the application
  configures logging (``logging.basicConfig()`` shows warnings such as
  ``WARNING:toolcage:run.kept container=toolcage-…``; each record carries the event's fields in
  ``record.toolcage``). An application that configured structlog gets the events through its
  structlog instead.
- **The command line** calls :func:`configure`: warnings and errors are one stderr line each in the
  documented form, ``toolcage: warning: run.kept container=…``; ``-v``/``-vv`` add info and debug
  lines as plain text.

Log fields carry strings from inside the sandbox (worker stderr with -vv, egress targets and
methods, error messages): every line is escaped (runner.textsafe) before anything prints it,
and JSON lines are ASCII with every control character escaped.

structlog loads with the first record someone wants, not with toolcage (issue 40: it and the asyncio
it imports were about 45 ms of every ``toolcage run``, which at its default level logs nothing). A
logger is a :class:`Logger` that asks, per record, whether anyone wants that level: the CLI's level, an
application's structlog configuration, or the standard logger ``toolcage``'s level, as structlog's
``filter_by_level`` asked first before.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, MutableMapping
from typing import Any

from toolcage import textsafe

LOGGER_NAME = "toolcage"
_STDLIB = logging.getLogger(LOGGER_NAME)  # (asked for each record's level: got once)
_STDLIB.addHandler(logging.NullHandler())  # a library prints nothing unasked


def _value(value: Any) -> str:
    text = value if isinstance(value, str) else textsafe.dumps(value, default=str)
    if isinstance(value, str) and (not value or any(c in value for c in ' "=\\') or textsafe.escape(value) != value):
        return textsafe.dumps(value)  # quoted, every control character escaped
    return textsafe.escape(text)


def line(event_dict: MutableMapping[str, Any]) -> str:
    """``event key=value ...``: one escaped line (a multi-line value, such as a traceback, is JSON-quoted)."""
    event = textsafe.escape(event_dict.pop("event", ""))
    fields = " ".join(f"{textsafe.escape(k)}={_value(v)}" for k, v in event_dict.items())
    return f"{event} {fields}" if fields else event


def _to_record(_logger: Any, _method: str, event_dict: MutableMapping[str, Any]) -> Any:
    """The last processor of the library's logger: a stdlib record whose message is the escaped line."""
    fields = dict(event_dict)
    fields.pop("event", None)
    return (line(event_dict),), {"extra": {"toolcage": fields}}


class _CliRenderer:
    """The CLI's stderr: ``toolcage: warning: …`` (or ``error``) for people; info and debug (-v, -vv)
    through structlog's console renderer, escaped."""

    def __init__(self) -> None:
        import structlog

        self._console = structlog.dev.ConsoleRenderer(colors=False)

    def __call__(self, logger: Any, method: str, event_dict: MutableMapping[str, Any]) -> str:
        if method in ("debug", "info"):
            return str(self._console(logger, method, textsafe.console_processor(logger, method, event_dict)))
        for key in ("timestamp", "level"):
            event_dict.pop(key, None)
        return f"toolcage: {'warning' if method == 'warning' else 'error'}: {line(event_dict)}"


_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING}
_LEVELS.update(error=logging.ERROR, exception=logging.ERROR, critical=logging.CRITICAL)


class _Cli:
    """What the command line asked for (:func:`configure`), applied to structlog when it loads."""

    level: int | None = None  # None: not the command line (a library in an application)
    as_json = False
    stream: Any = None  # stderr as it was when the CLI configured (a test's runner swaps it)
    pending = False  # structlog is not loaded yet: configure it when it is
    without_rich = False  # the command's own process: load structlog without rich (cli.startup)


def configure(verbose: int = 0, json_logs: bool | None = None) -> None:
    """The command line's logging, on stderr (stdout carries results and protocol)."""
    _Cli.level = logging.WARNING if verbose <= 0 else logging.INFO if verbose == 1 else logging.DEBUG
    _Cli.as_json = (not sys.stderr.isatty()) if json_logs is None else json_logs
    _Cli.stream = sys.stderr
    _Cli.pending = True
    if "structlog" in sys.modules:  # loaded already (an application, a test): configure it now
        _structlog()


def _apply_cli(structlog: Any) -> None:
    level = _Cli.level if _Cli.level is not None else logging.WARNING
    renderer: Any = structlog.processors.JSONRenderer(serializer=textsafe.dumps) if _Cli.as_json else _CliRenderer()
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        logger_factory=structlog.WriteLoggerFactory(file=_Cli.stream),
        wrapper_class=structlog.make_filtering_bound_logger(level),
        cache_logger_on_first_use=False,
    )


def _structlog() -> Any:
    """structlog, loaded now if it was not (without rich for the command's own process), and configured as
    the command line asked if it did."""
    if "structlog" not in sys.modules and _Cli.without_rich and "rich" not in sys.modules:
        # structlog's dev module imports rich, when installed, for pretty tracebacks toolcage never renders
        sys.modules["rich"] = None  # type: ignore[assignment]  # import rich -> ImportError, for structlog.dev only
        try:
            import structlog
        finally:
            del sys.modules["rich"]
    import structlog

    if _Cli.pending:
        _Cli.pending = False
        _apply_cli(structlog)
    return structlog


def _wanted(level: int) -> bool:
    """Whether a record at ``level`` goes anywhere: asked before structlog is loaded for it."""
    if _Cli.level is not None:
        return level >= _Cli.level
    # (another thread may be importing it: a module half made has no is_configured yet, and is not configured)
    is_configured = getattr(sys.modules.get("structlog"), "is_configured", None)
    if is_configured is not None and is_configured():
        return True  # the application's structlog decides
    return _STDLIB.isEnabledFor(level)


_library: Any = None


def _real(context: dict[str, Any]) -> Any:
    """The structlog logger a record goes through: the application's (or the CLI's) configuration if there
    is one, else one that logs to the standard logger ``toolcage``."""
    global _library
    structlog = _structlog()
    if structlog.is_configured():
        return structlog.get_logger(LOGGER_NAME).bind(**context)
    if _library is None:
        _library = structlog.wrap_logger(
            _STDLIB,
            processors=[
                structlog.stdlib.filter_by_level,  # first: a record no handler wants costs nothing more
                structlog.contextvars.merge_contextvars,
                structlog.processors.format_exc_info,
                _to_record,
            ],
            wrapper_class=structlog.stdlib.BoundLogger,
        )
    return _library.bind(**context)


class Logger:
    """A bound logger (``log.info("event", key=value)``, ``log.bind(key=value)``) that loads structlog only
    for a record someone wants; any other structlog method goes to the real logger."""

    __slots__ = ("_context",)

    def __init__(self, context: dict[str, Any]) -> None:
        self._context = context

    def bind(self, **more: Any) -> Logger:
        return Logger({**self._context, **more})

    def _log(self, method: str, event: Any, args: tuple[Any, ...], kw: dict[str, Any]) -> Any:
        if not _wanted(_LEVELS[method]):
            return None
        return getattr(_real(self._context), method)(event, *args, **kw)

    def _at(method: str) -> Callable[..., Any]:  # type: ignore[misc]  # (the class body's, removed below)
        def log(self: Logger, event: Any = None, *args: Any, **kw: Any) -> Any:
            return self._log(method, event, args, kw)

        log.__name__ = log.__qualname__ = method
        return log

    debug, info, warning, error, exception, critical = map(
        _at, ("debug", "info", "warning", "error", "exception", "critical")
    )
    warn = warning
    del _at

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name == "_context":  # copy and pickle probe the instance (and before
            raise AttributeError(name)  # _context is set): never load structlog, nor recurse, for them
        return getattr(_real(self._context), name)


def get_logger(**context: Any) -> Logger:
    """The app's structlog logger if it (or the CLI) configured structlog; else one that logs to the
    standard logger ``toolcage``, silent until the application configures logging. Either way structlog
    loads with the first record that goes somewhere."""
    return Logger(context)
