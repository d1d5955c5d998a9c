"""The worker's own run deadline: after it (plus a grace, so the runner's kill is seen first) the
worker kills every child and exits, so an orphaned sandbox (its runner SIGKILLed) still ends.

Armed at start from ``TOOLCAGE_DEADLINE``; a pooled sandbox is started before its run exists,
so its run's deadline comes later, over the protocol, when a run adopts it (``sandbox.configure``'s
``deadline``). A deadline can only be brought forward, never pushed back.
"""

from __future__ import annotations

import _thread
import os
import time

from toolcage.policies.contract import EXIT_DEADLINE, GRACE_S

_LOCK = _thread.allocate_lock()  # _thread, not threading: its import is on every first answer
_ARMED: list[float] = []  # the earliest deadline armed so far (epoch seconds)


def _expire() -> None:
    from toolcage.worker.tools.proc import kill_all_children

    os.write(2, b'{"event": "worker.deadline", "level": "warning", "component": "worker"}\n')
    kill_all_children()
    os._exit(EXIT_DEADLINE)


def arm(raw: str | float | None) -> bool:
    """Exit at ``raw`` (epoch seconds) + the grace, unless an earlier deadline is armed already.
    False when ``raw`` is not a finite number (nothing armed)."""
    if raw is None or raw == "" or isinstance(raw, bool):
        return False
    try:
        at = float(raw)
    except ValueError:
        return False
    if at != at or at in (float("inf"), float("-inf")):
        return False
    with _LOCK:
        if _ARMED and _ARMED[0] <= at:
            return True  # an earlier one already holds
        _ARMED[:] = [at]

    _start(max(at + GRACE_S - time.time(), 0.0))
    return True


def _wait(delay: float) -> None:  # a later deadline's thread may still sleep: the earliest one fires first
    time.sleep(delay)
    _expire()


def _start(delay: float) -> None:
    _thread.start_new_thread(_wait, (delay,))  # such threads never hold up the worker's exit
