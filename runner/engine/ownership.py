"""Who owns a run: a process, named so that a reaper can tell whether it still lives.

A hostname names no process: compose services with ``hostname:``, CI jobs in containers, VMs that
share one ``DOCKER_HOST`` and every runner in a container share theirs, and a pid means something
only in its own PID namespace of one boot of one kernel. So an owner is recorded as its pid and
start time (a reused pid is not the owner) *and* the namespace those are valid in: the kernel's
boot id, the PID namespace, and the time namespace (the start time a reader sees depends on it).
A reaper checks an owner only when its own namespace key is the same; anything else it leaves
until the run's deadline (toolcage.lifecycle.reaper).
"""

from __future__ import annotations

import os
import socket


def process_start_ticks(pid: int | str) -> str:
    """The kernel's start time of ``pid`` (or "self") in clock ticks since boot ("" if unknown)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            stat = f.read()
    except OSError:
        return ""
    # the command name (field 2) may contain spaces and parentheses: split after the last ')'
    fields = stat.rsplit(")", 1)[-1].split()
    return fields[19] if len(fields) > 19 else ""


def _read(path: str) -> str:
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            return f.read().strip()
    except OSError:
        return ""


def _ns(kind: str) -> str:
    """The inode of this process's namespace of ``kind`` ("" when the kernel does not say)."""
    try:
        return str(os.stat(f"/proc/self/ns/{kind}").st_ino)
    except OSError:
        return ""


PROC_PID_INIT_INO = 0xEFFFFFFC  # the kernel's fixed inode for the initial PID namespace


def in_initial_pid_namespace() -> bool:
    """Whether this process is in the machine's own PID namespace (whose init never exits), not a container's."""
    return _ns("pid") == str(PROC_PID_INIT_INO)


def proc_is_ours() -> bool:
    """Whether /proc numbers processes as this process's PID namespace does (``unshare --pid``
    without ``--mount-proc`` leaves the parent's /proc: /proc/<pid> is then someone else)."""
    try:
        return os.readlink("/proc/self") == str(os.getpid())
    except OSError:
        return False


def namespace_key() -> str:
    """``boot_id/pid-namespace/time-namespace``: where a pid and a start time mean one process.
    Empty when any part is unknown, or /proc is another namespace's: then no owner can be checked."""
    boot, pid_ns = _read("/proc/sys/kernel/random/boot_id"), _ns("pid")
    if not boot or not pid_ns or not proc_is_ours():
        return ""
    return f"{boot}/{pid_ns}/{_ns('time') or '-'}"


def owner() -> tuple[str, str]:
    """(``host:pid``, start ticks) of this process; the host is for people, the namespace key
    (:func:`namespace_key`, its own label) is what a reaper goes by."""
    return f"{socket.gethostname()}:{os.getpid()}", process_start_ticks("self")


def identity() -> dict[str, str]:
    """This process as a remover names itself in the audit log."""
    host_pid, started = owner()
    return {"remover": host_pid, "remover_started": started, "remover_ns": namespace_key()}
