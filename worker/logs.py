"""structlog set-up for the worker: JSON lines on stderr, because stdout carries the protocol."""

from __future__ import annotations

import logging
import sys

import structlog


def configure(run_id: str) -> None:
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            structlog.processors.JSONRenderer(),
        ],
        logger_factory=structlog.WriteLoggerFactory(file=sys.stderr),
        wrapper_class=structlog.make_filtering_bound_logger(logging.INFO),
        cache_logger_on_first_use=True,
    )
    structlog.contextvars.bind_contextvars(run_id=run_id, component="worker")
    # jsonrpcserver logs through stdlib logging; keep it on stderr too
    logging.basicConfig(stream=sys.stderr, level=logging.WARNING)
