"""Protect the worker process from the code it runs (same uid, so the kernel needs telling)."""

from __future__ import annotations

import ctypes
import resource
import sys

_PR_SET_DUMPABLE = 4


def make_non_dumpable() -> bool:
    """Threat: tool code ptrace-ing the worker or opening /proc/<worker>/fd/* to forge responses.

    A non-dumpable process cannot be ptraced or have its /proc fds opened by another
    process of the same uid without CAP_SYS_PTRACE (which the container does not have).
    """
    if not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    ok = bool(libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0) == 0)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    return ok
