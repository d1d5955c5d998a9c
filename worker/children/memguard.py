"""Under gVisor: the call that takes the sandbox past its memory limit ends, not the whole sandbox.

Why: gVisor's kernel (the sentry) keeps every page of the sandbox's memory in one file that the host
charges to the container's cgroup. At that cgroup's limit the host's OOM killer kills the sentry, and
with it the worker and every call (the run ended as SandboxOOM). gVisor has no OOM killer of its own,
and its cgroupfs does not enforce a memory limit (runsc 20240729: a child cgroup's
``memory.limit_in_bytes`` is kept and ignored). So the runner gives a gVisor container's host cgroup
a headroom above the policy's memory for the sentry itself (``toolcage.engine.hostconfig``), and this guard, while
a call runs, reads the sandbox's own usage (gVisor's ``memory.usage_in_bytes``: every page it holds,
tmpfs and cached files included, as the host cgroup counts them) every few milliseconds. Past the
policy's memory it kills the call that holds the most (its process group, as the worker kills a call
at its timeout), as the kernel's OOM killer picks the largest process under runc; that call reports
``oom_killed``.

The host's limit still bounds the whole: memory no call holds (the worker's, tmpfs pages) or a guard
starved of CPU meets it, and the run ends as SandboxOOM, as before. Tool code cannot reach the guard:
it runs in PID namespaces of its own (``worker.children.namespaces``).
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time

from toolcage.worker import logs
from toolcage.worker.children import namespaces

USAGE = "/sys/fs/cgroup/memory/memory.usage_in_bytes"  # gVisor's cgroupfs (v1 layout): the whole sandbox
# How often: sooner the nearer the usage is to the budget, as if it grew at RATE (one process here
# allocated ~400 MiB/s under gVisor; RATE leaves room for several): 5 ms apart near it, 100 ms far
# below (a read costs ~0.1 ms of the sandbox's CPU)
RATE = 2 << 30  # bytes per second
INTERVAL_S = (0.005, 0.1)
# after a kill the victim's memory is freed as it dies, which outlasts the reaping of its first process
# (the rest of its PID namespace dies after it): no second victim until the usage is back under the
# budget, or this long
_SETTLE_S = 1.0

_lock = threading.Condition()
_watched: set[int] = set()  # the process group of every live call
_budget = 0  # the policy's memory
_killed: set[int] = set()  # groups the guard killed, until their call collects the status
_peak = 0
_thread: threading.Thread | None = None


def enabled() -> bool:
    """Only under gVisor (the runner turns the tool namespaces on there), where the usage file reads."""
    return namespaces.enabled() and usage() is not None


def usage() -> int | None:
    """Bytes the sandbox's kernel holds now (None: no such file, not gVisor's cgroupfs)."""
    global _peak
    try:
        with open(USAGE, "rb", buffering=0) as f:
            n = int(f.read(32))
    except (OSError, ValueError):
        return None
    _peak = max(_peak, n)
    return n


def peak() -> int | None:
    """The highest usage seen so far (gVisor's cgroupfs keeps no peak of its own); None but under gVisor."""
    if not namespaces.enabled():
        return None
    usage()
    return _peak or None


def watch(pgid: int, budget: int) -> None:
    """Guard the call whose process group is ``pgid`` (its leader is the call's first process) against
    the sandbox going past ``budget`` bytes (the policy's memory)."""
    global _thread, _budget
    with _lock:
        _watched.add(pgid)
        _budget = budget
        if _thread is None:
            thread = threading.Thread(target=_run, name="memguard", daemon=True)
            try:
                thread.start()
            except RuntimeError as exc:  # no thread to be had now (a fork bomb at the pids limit): next call
                logs.warning("memguard.not_started", error=str(exc))
            else:
                _thread = thread
        _lock.notify()


def release(pgid: int) -> bool:
    """Stop guarding ``pgid`` (reaped); whether the guard killed it (its call ends as oom_killed)."""
    with _lock:
        _watched.discard(pgid)
        if pgid in _killed:
            _killed.discard(pgid)
            return True
        return False


def _run() -> None:
    settle_until = 0.0
    while True:
        with _lock:
            while not _watched:
                _lock.wait()
            budget = _budget
        used = usage()
        if used is None:  # unreadable for now: the host's limit still holds meanwhile
            time.sleep(INTERVAL_S[0])
            continue
        now = time.monotonic()
        if used <= budget:
            settle_until = 0.0  # the last victim's memory is free
        elif now >= settle_until:
            try:
                victim = _victim()
            except (OSError, ValueError, IndexError) as exc:  # never the end of the guard
                logs.warning("memguard.failed", error=f"{type(exc).__name__}: {exc}")
                victim = None
            if victim is not None:
                with _lock:
                    _killed.add(victim)
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(victim, signal.SIGKILL)
                logs.info("memguard.killed", pgid=victim, usage_bytes=used, limit_bytes=budget)
                settle_until = now + _SETTLE_S
        time.sleep(min(INTERVAL_S[1], max(INTERVAL_S[0], (budget - used) / RATE)))


def _victim() -> int | None:
    """The watched call whose processes hold the most resident memory (the only one, without a look)."""
    with _lock:
        groups = [g for g in _watched if g not in _killed]
    if len(groups) <= 1:
        return groups[0] if groups else None
    parent, rss = _processes()
    held = {g: 0 for g in groups}
    for pid, size in rss.items():
        p, seen = pid, 0
        while p > 1 and p not in held and seen < 64:  # up the tree to the call's first process
            p, seen = parent.get(p, 0), seen + 1
        if p in held:
            held[p] += size
    return max(held, key=lambda g: held[g])


def _processes() -> tuple[dict[int, int], dict[int, int]]:
    """Every process's parent and resident pages, from /proc (the worker sees every PID namespace's)."""
    parent: dict[int, int] = {}
    rss: dict[int, int] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        pid = int(name)
        parent[pid] = int(fields[1])  # after the name: state, ppid, ... rss is field 24 (index 21 here)
        rss[pid] = int(fields[21]) if len(fields) > 21 else 0
    return parent, rss
