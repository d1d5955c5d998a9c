"""Worker logging: structlog JSON lines on stderr (stdout carries the protocol), imported late.

Why late: importing structlog costs ~140 ms of CPU in a 1-CPU container (it pulls in
asyncio), which would land on every run's first response. Events are queued and written
through structlog when the worker is idle (no request for 50 ms), at EOF, and at once
for errors. A sandbox killed right after its last call may lose its last info lines;
the runner's own ``run.finished`` line still records the run.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Mapping, MutableMapping
from typing import Any

_pending: list[tuple[str, str, dict[str, Any]]] = []
_context: dict[str, Any] = {}
_logger: Any = None


def bind(**kw: Any) -> None:
    _context.update(kw)


def _stamp(kw: dict[str, Any]) -> dict[str, Any]:
    kw.setdefault(
        "timestamp", time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime()) + f".{int(time.time() % 1 * 1e6):06d}Z"
    )
    return kw


def info(event: str, **kw: Any) -> None:
    _pending.append(("info", event, _stamp(kw)))


def warning(event: str, **kw: Any) -> None:
    _pending.append(("warning", event, _stamp(kw)))
    flush()


def exception(event: str, **kw: Any) -> None:
    import traceback

    kw["exception"] = traceback.format_exc(limit=20)
    _pending.append(("error", event, _stamp(kw)))
    flush()


def _redact(logger: Any, method: str, event: MutableMapping[str, Any]) -> Mapping[str, Any]:
    """No secret value reaches the log, whoever put it in an event (a handler's log line, an error)."""
    from toolcage.worker.secrets import STORE

    redacted: Mapping[str, Any] = STORE.redact(event)
    return redacted


def _configure() -> Any:
    import logging

    import structlog

    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            _redact,
            structlog.processors.JSONRenderer(),
        ],
        logger_factory=structlog.WriteLoggerFactory(file=sys.stderr),
        wrapper_class=structlog.make_filtering_bound_logger(logging.INFO),
        cache_logger_on_first_use=True,
    )
    structlog.contextvars.bind_contextvars(component="worker", **_context)
    return structlog.get_logger()


def flush() -> None:
    """Write every queued event through structlog (importing it on first use)."""
    global _logger
    if not _pending:
        return
    if _logger is None:
        _logger = _configure()
    while _pending:
        level, event, kw = _pending.pop(0)
        getattr(_logger, level)(event, **kw)
