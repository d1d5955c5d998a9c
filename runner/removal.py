"""Removing a finished run's container (and its proxy, network, volume) off the caller's path.

``Sandbox.close()`` hands the removal to one background thread and returns: the 40-60 ms an
engine takes to delete a container no longer sit between a caller and its next step. Nothing
is lost by it: the removals still pending when the process exits are finished by an ``atexit``
hook, and if the process is SIGKILLed first, the run's owner labels let the reaper and
``toolcage gc`` remove what is left (the same as for a runner killed mid-run).
"""

from __future__ import annotations

import atexit
import os
import queue
import threading
from collections.abc import Callable

from toolcage import logs

EXIT_WAIT_S = 30.0  # at interpreter exit, how long pending removals may hold it


class _Remover:
    def __init__(self) -> None:
        self._jobs: queue.Queue[Callable[[], None]] = queue.Queue()
        self._pending = 0
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._pid = os.getpid()

    def schedule(self, job: Callable[[], None]) -> None:
        with self._cond:
            if self._thread is None or not self._thread.is_alive() or self._pid != os.getpid():
                self._pid = os.getpid()  # a forked child has no remover thread of its own yet
                self._thread = threading.Thread(target=self._run, name="toolcage-remover", daemon=True)
                self._thread.start()
            self._pending += 1
        self._jobs.put(job)

    def _run(self) -> None:
        while True:
            job = self._jobs.get()
            try:
                job()
            except Exception as exc:  # the reaper and gc remove what a failed removal leaves
                logs.get_logger().warning("run.remove_failed", error=type(exc).__name__, detail=str(exc)[:200])
            finally:
                with self._cond:
                    self._pending -= 1
                    self._cond.notify_all()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until every scheduled removal has run (True), or ``timeout`` passed (False)."""
        with self._cond:
            return self._cond.wait_for(lambda: self._pending == 0, timeout)


_REMOVER = _Remover()
schedule = _REMOVER.schedule


def wait_removed(timeout: float | None = None) -> bool:
    """Wait until the containers of closed sandboxes are removed (True), or ``timeout`` passed."""
    return _REMOVER.wait(timeout)


atexit.register(wait_removed, EXIT_WAIT_S)

__all__ = ["schedule", "wait_removed"]
