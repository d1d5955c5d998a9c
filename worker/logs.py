"""Worker logging: JSON lines on stderr (stdout carries the protocol), one per event.

Written with ``json`` directly, not structlog: importing structlog costs ~50 ms of CPU in a
1-CPU container (it pulls in asyncio and logging), which landed on whichever request
arrived first after the worker's first idle moment. The lines keep structlog's shape
(``event``, ``level``, ``timestamp``, ``component``, the bound context) and every secret value
is redacted. Info events are queued and written when the worker is idle (no request for
50 ms), at EOF, and at once for warnings and errors. A sandbox killed right after its last
call may lose its last info lines; the runner's own ``run.finished`` line still records the run.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

_pending: list[tuple[str, str, dict[str, Any]]] = []
_context: dict[str, Any] = {"component": "worker"}


def bind(**kw: Any) -> None:
    _context.update(kw)


def _stamp(kw: dict[str, Any]) -> dict[str, Any]:
    now = time.time()
    kw.setdefault("timestamp", time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + f".{int(now % 1 * 1e6):06d}Z")
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


def _render(level: str, event: str, kw: dict[str, Any]) -> bytes:
    from toolcage.worker.secrets import STORE  # no secret value reaches the log, whoever put it in an event

    record = {**_context, **kw, "event": event, "level": level}
    return json.dumps(STORE.redact(record), default=repr).encode("utf-8", errors="backslashreplace") + b"\n"


def flush() -> None:
    """Write every queued event (one write, so lines never interleave with a child's)."""
    if not _pending:
        return
    data = b"".join(_render(*_pending.pop(0)) for _ in range(len(_pending)))
    view = memoryview(data)
    while view:
        try:
            n = os.write(2, view)
        except InterruptedError:
            continue
        except OSError:
            return  # no log stream left: the answers matter more than the log
        view = view[n:]
