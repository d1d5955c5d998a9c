"""Protect the worker process from the code it runs (same uid, so the kernel needs telling)."""

from __future__ import annotations

import ctypes
import resource
import sys

_PR_GET_DUMPABLE = 3
_PR_SET_DUMPABLE = 4


def make_non_dumpable() -> bool:
    """Threat: tool code ptrace-ing the worker or opening /proc/<worker>/fd/* to forge responses.

    A non-dumpable process cannot be ptraced or have its /proc fds opened by another
    process of the same uid without CAP_SYS_PTRACE (which the container does not have).
    """
    if not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    return bool(libc.prctl(_PR_GET_DUMPABLE, 0, 0, 0, 0) == 0)  # read back: trust the kernel's answer


def as_init() -> None:
    """The worker is PID 1 of the sandbox. The kernel delivers to an init, from inside its
    namespace, only signals it handles; Python handles SIGINT (KeyboardInterrupt), so tool code
    could stop the worker with it. A no-op handler (not SIG_IGN, which children would inherit
    across exec) keeps the worker running."""
    import signal

    signal.signal(signal.SIGINT, lambda _signum, _frame: None)
