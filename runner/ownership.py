"""Who owns a run: host, pid and the process's start time (a reused pid is not the owner)."""

from __future__ import annotations

import os
import socket


def process_start_ticks(pid: int) -> str:
    """The kernel's start time of ``pid`` in clock ticks since boot ("" if unknown)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            stat = f.read()
    except OSError:
        return ""
    # the command name (field 2) may contain spaces and parentheses: split after the last ')'
    fields = stat.rsplit(")", 1)[-1].split()
    return fields[19] if len(fields) > 19 else ""


def owner() -> tuple[str, str]:
    """(``host:pid``, start ticks) of this process."""
    pid = os.getpid()
    return f"{socket.gethostname()}:{pid}", process_start_ticks(pid)
