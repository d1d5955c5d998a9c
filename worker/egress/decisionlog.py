"""The egress proxy's decision stream: one JSON line per decision on stdout, read live by the runner.

Threat: hiding egress from the audit log. The runner attaches to the proxy's stdout and
writes each decision to the audit log as it arrives, so records cannot be rotated away
(they never depend on the container's json-file log) and survive a runner that is
killed later. Long fields are cut here, so one client cannot make a record huge; the
event loop never blocks on stdout: records go through a bounded queue to a writer
thread, and when it is full the drop is counted and reported as ``egress.dropped``.
"""

from __future__ import annotations

import contextlib
import json
import queue
import threading
import time
from typing import Any, TextIO

MAX_FIELD = 512
MAX_ITEMS = 16
QUEUE_SIZE = 1024


def clip(value: Any) -> Any:
    """Strings longer than MAX_FIELD are cut, with a marker saying how much; lists are capped."""
    if isinstance(value, str) and len(value) > MAX_FIELD:
        return f"{value[:MAX_FIELD]}…[truncated {len(value) - MAX_FIELD} chars]"
    if isinstance(value, list | tuple):
        return [clip(v) for v in value[:MAX_ITEMS]]
    return value


class DecisionLog:
    """Bounded, non-blocking JSON-lines writer; ``emit`` never waits for the reader."""

    def __init__(self, out: TextIO, run_id: str, size: int = QUEUE_SIZE) -> None:
        self._out = out
        self._run_id = run_id
        self._queue: queue.Queue[dict[str, Any] | None] = queue.Queue(maxsize=size)
        self._lock = threading.Lock()
        self._dropped = 0
        self._thread = threading.Thread(target=self._write, name="toolcage-decisions", daemon=True)
        self._thread.start()

    def emit(self, event: str, **fields: Any) -> None:
        record = {k: clip(v) for k, v in fields.items()}
        record.update(event=event, run_id=self._run_id, component="egress-proxy", timestamp=time.time())
        try:
            self._queue.put_nowait(record)
        except queue.Full:
            with self._lock:
                self._dropped += 1

    def emit_surely(self, event: str, timeout: float = 5.0, **fields: Any) -> None:
        """As ``emit``, but waits for room rather than drop it: the answer to a runner's control line (a flood of
        refusals never hides that a policy change took effect)."""
        record = {k: clip(v) for k, v in fields.items()}
        record.update(event=event, run_id=self._run_id, component="egress-proxy", timestamp=time.time())
        with contextlib.suppress(queue.Full):
            self._queue.put(record, timeout=timeout)

    def _take_dropped(self) -> int:
        with self._lock:
            n, self._dropped = self._dropped, 0
        return n

    def _line(self, record: dict[str, Any]) -> None:
        self._out.write(json.dumps(record, default=str) + "\n")
        self._out.flush()

    def _write(self) -> None:
        while True:
            try:
                record = self._queue.get(timeout=0.5)
            except queue.Empty:
                record = {}
            dropped = self._take_dropped()
            if dropped:
                self._line(
                    {
                        "event": "egress.dropped",
                        "count": dropped,
                        "run_id": self._run_id,
                        "component": "egress-proxy",
                        "timestamp": time.time(),
                    }
                )
            if record is None:
                return
            if record:
                self._line(record)

    def close(self, timeout: float = 2.0) -> None:
        """Write what is queued, then stop the writer."""
        try:
            self._queue.put(None, timeout=timeout)
        except queue.Full:
            return
        self._thread.join(timeout)
