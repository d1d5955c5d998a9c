"""structlog set-up for the host side: logs on stderr (stdout carries results and protocol).

Log fields carry strings from inside the sandbox (worker stderr with -vv, egress targets and
methods, error messages): the console renderer only ever sees them escaped
(runner.textsafe), and JSON lines are ASCII with every control character escaped.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

import structlog

from toolcage import textsafe


def configure(verbose: int = 0, json_logs: bool | None = None) -> None:
    level = logging.WARNING if verbose <= 0 else logging.INFO if verbose == 1 else logging.DEBUG
    as_json = (not sys.stderr.isatty()) if json_logs is None else json_logs
    renderers: list[structlog.typing.Processor] = (
        [structlog.processors.JSONRenderer(serializer=textsafe.dumps)]
        if as_json
        else [textsafe.console_processor, structlog.dev.ConsoleRenderer(colors=False)]
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            *renderers,
        ],
        logger_factory=structlog.WriteLoggerFactory(file=sys.stderr),
        wrapper_class=structlog.make_filtering_bound_logger(level),
        cache_logger_on_first_use=False,
    )


_fallback: Any = None


def get_logger(**context: Any) -> Any:
    """The app's structlog logger if it configured structlog; else a private one that writes
    warnings and errors to stderr, never stdout (structlog's unconfigured default)."""
    global _fallback
    if structlog.is_configured():
        return structlog.get_logger("toolcage").bind(**context)
    if _fallback is None:
        _fallback = structlog.wrap_logger(
            structlog.WriteLogger(sys.stderr),
            processors=[
                structlog.processors.add_log_level,
                structlog.processors.TimeStamper(fmt="iso", utc=True),
                structlog.processors.JSONRenderer(serializer=textsafe.dumps),
            ],
            wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING),
        )
    return _fallback.bind(**context)
