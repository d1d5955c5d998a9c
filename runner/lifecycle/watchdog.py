"""The runner's two clocks on a run: the hard deadline (``timeouts.run_s``) and the idle timeout (``timeouts.idle_s``).

One thread per run sleeps until the next moment either could expire and calls back once,
with which one did. Idle time runs only while no answer is owed, so a long call is never idle.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Literal

Expiry = Literal["run", "idle"]


class Watchdog:
    def __init__(
        self,
        deadline: float,
        idle_s: float,
        busy: Callable[[], bool],
        last_activity: Callable[[], float],
        on_expire: Callable[[Expiry], None],
    ) -> None:
        self.deadline, self.idle_s = deadline, idle_s  # deadline: a time.monotonic() value
        self._busy, self._last_activity, self._on_expire = busy, last_activity, on_expire
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="toolcage-watchdog", daemon=True)

    def start(self) -> Watchdog:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _watch(self) -> None:
        while True:
            now = time.monotonic()
            if now >= self.deadline:
                return self._on_expire("run")
            busy = self._busy()
            idle_at = (now if busy else self._last_activity()) + self.idle_s
            if not busy and now >= idle_at:
                return self._on_expire("idle")
            if self._stop.wait(min(self.deadline, idle_at) - now):
                return None
