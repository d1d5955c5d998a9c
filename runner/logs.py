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
"""

from __future__ import annotations

import logging
import sys
from collections.abc import MutableMapping
from typing import Any

import structlog

from toolcage import textsafe

LOGGER_NAME = "toolcage"
logging.getLogger(LOGGER_NAME).addHandler(logging.NullHandler())  # a library prints nothing unasked


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
        self._console = structlog.dev.ConsoleRenderer(colors=False)

    def __call__(self, logger: Any, method: str, event_dict: MutableMapping[str, Any]) -> str:
        if method in ("debug", "info"):
            return str(self._console(logger, method, textsafe.console_processor(logger, method, event_dict)))
        for key in ("timestamp", "level"):
            event_dict.pop(key, None)
        return f"toolcage: {'warning' if method == 'warning' else 'error'}: {line(event_dict)}"


def configure(verbose: int = 0, json_logs: bool | None = None) -> None:
    """The command line's logging, on stderr (stdout carries results and protocol)."""
    level = logging.WARNING if verbose <= 0 else logging.INFO if verbose == 1 else logging.DEBUG
    as_json = (not sys.stderr.isatty()) if json_logs is None else json_logs
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer(serializer=textsafe.dumps) if as_json else _CliRenderer()
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        logger_factory=structlog.WriteLoggerFactory(file=sys.stderr),
        wrapper_class=structlog.make_filtering_bound_logger(level),
        cache_logger_on_first_use=False,
    )


_library: Any = None


def get_logger(**context: Any) -> Any:
    """The app's structlog logger if it (or the CLI) configured structlog; else one that logs to the
    standard logger ``toolcage``, silent until the application configures logging."""
    global _library
    if structlog.is_configured():
        return structlog.get_logger(LOGGER_NAME).bind(**context)
    if _library is None:
        _library = structlog.wrap_logger(
            logging.getLogger(LOGGER_NAME),
            processors=[
                structlog.stdlib.filter_by_level,  # first: a record no handler wants costs nothing more
                structlog.contextvars.merge_contextvars,
                structlog.processors.format_exc_info,
                _to_record,
            ],
            wrapper_class=structlog.stdlib.BoundLogger,
        )
    return _library.bind(**context)
