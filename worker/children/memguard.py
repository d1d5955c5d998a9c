"""Under gVisor: past the sandbox's memory limit one process ends, chosen as Linux's OOM killer would.

Why: gVisor's kernel (the sentry) keeps every page of the sandbox's memory in one file that the host
charges to the container's cgroup. At that cgroup's limit the host's OOM killer kills the sentry, and
with it the worker and every call (the run ended as SandboxOOM). gVisor has no OOM killer of its own,
and its cgroupfs does not enforce a memory limit (runsc 20240729: a child cgroup's
``memory.limit_in_bytes`` is kept and ignored). So the runner gives a gVisor container's host cgroup
a headroom above the policy's memory for the sentry itself (``toolcage.engine.hostconfig``), and this guard, while
a call runs, reads the sandbox's own usage (gVisor's ``memory.usage_in_bytes``: every page it holds,
tmpfs and cached files included, as the host cgroup counts them) every few milliseconds.

Past the policy's memory it kills one process of the calls it watches with SIGKILL, the one the
kernel's OOM killer would pick under runc (``oom_badness``): resident pages plus ``oom_score_adj``
thousandths of the budget, so the process that set the highest ``oom_score_adj`` goes first, else the
biggest. As under runc, the call goes on: a test suite whose one test forks a memory hog gets its
report back, the hog dead of SIGKILL (tests/security/test_oom_child.py). When the victim is the call's
main process the call ends as ``oom_killed`` (the worker reads that from :func:`release` as it reads
the cgroup's ``oom_kill`` counter under runc), and its PID namespace ends with it.

Threat: gVisor lets an unprivileged process lower its own ``oom_score_adj`` (to -1000: never chosen),
which the host kernel refuses without CAP_SYS_RESOURCE. A call that made itself immune would have the
guard kill nothing, and the host's limit end every call. So a value below the worker's own (what every
call starts with) counts as the worker's.

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
RATE = 4 << 30  # bytes per second
INTERVAL_S = (0.005, 0.1)
# after a kill the victim's memory is freed as it dies. A call's first process takes its whole PID
# namespace with it, which outlasts the reaping of that first process: after such a kill no second victim
# until the usage is back under the budget, or this long. Any other victim (a child of a call that forks
# several allocators) frees its memory as it dies: the next victim may be chosen as soon as it is dead,
# as the other allocators go on growing meanwhile (a fixed second let three of them reach the host's limit).
# gVisor frees a dead process's pages a few ms after it shows as a zombie (5-15 ms measured here): dead, its
# memory counts as freed once the usage fell by half of what it held, or _FREED_S after it was seen dead.
# And never a victim while the usage is falling: a call that ended (its PID namespace torn down) gives its pages
# back over tens of ms, and a bystander chosen meanwhile (the only call left) died for memory it never held; seen
# in 3 of 12 runs of a forked bomb beside a sleeper (tests/integration/test_gvisor.py). An allocator still
# growing stops the fall, so the next victim is chosen then.
# Nor, once a victim was killed and until the usage is back under the budget, a victim of another call for a
# usage that stands still: only when it grew GROW past its lowest since the kill (someone allocates now), as
# the kernel's OOM killer runs only when an allocation fails. Under CI's load a dead call's pages took more
# than _SETTLE_S to come back, with the usage flat meanwhile, and the sleeper beside it was killed.
# The same growth ends the wait after a call's first process was killed, for the processes of that call alone:
# someone allocates now, its namespace's other processes when gVisor is slow to end them, and a second is too
# long then (a forked bomb in a loaded full run reached the host's limit, the sentry exiting 2).
_SETTLE_S = 1.0
_FREED_S = 0.15
GROW = 16 << 20
PAGE = os.sysconf("SC_PAGE_SIZE")

_lock = threading.Condition()
_watched: set[int] = set()  # the process group of every live call
_budget = 0  # the policy's memory
_killed: set[int] = set()  # groups a process of which the guard killed, until their call collects the status
_kills = 0  # processes killed so far (what the cgroup's oom_kill counter counts under runc)
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


def kills() -> int:
    """How many processes the guard has killed (0 but under gVisor), as ``memory.events``' oom_kill counts."""
    return _kills


def release(pgid: int) -> bool:
    """Stop guarding ``pgid`` (reaped); whether the guard killed a process of it. The worker reads the
    call as oom_killed only if its main process died of SIGKILL too, as it reads the cgroup's counter
    under runc: a child the guard killed leaves its call going on."""
    with _lock:
        _watched.discard(pgid)
        if pgid in _killed:
            _killed.discard(pgid)
            return True
        return False


def _run() -> None:
    global _kills
    settle_until = 0.0
    # the last victim while its memory's release is awaited: (pid, the usage when it was killed, its resident
    # bytes, when it was seen dead); None when there is none or it was a call's first process (wait that out)
    dying: list[float] | None = None
    floor = _adj(os.getpid()) or 0  # every call starts with the worker's own oom_score_adj
    last = 0  # the usage at the last reading
    # the last victim's call, when, and the lowest usage since: within _SETTLE_S of a kill the next victim is
    # of that call while it has a process left; of another call only if the usage grew GROW past that low
    # (someone allocates now), never for the pages a dead call still gives back, however long that takes
    last_group, killed_at, low = 0, 0.0, 0
    after_kill = False  # a victim was killed since the usage was last under the budget
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
        falling, last, low = used < last, used, min(low, used)
        if used <= budget:
            settle_until, dying, after_kill = 0.0, None, False  # the last victim's memory is free
        elif falling:
            pass  # memory is being given back (a dead call's, whose namespace gVisor frees over tens of ms): no victim
        elif (waited := now >= settle_until or (dying is not None and _freed(dying, used, now))) or (
            dying is None and after_kill and used > low + GROW
        ):
            try:
                recent = now - killed_at < _SETTLE_S
                victim = _victim(budget, floor, last_group) if recent else None
                # another call's only once the wait is over (a dying namespace's survivors go first: the kernel,
                # too, chooses no second victim while the first one's memory is being freed), and for growth
                if victim is None and waited and (not after_kill or used > low + GROW):
                    victim = _victim(budget, floor)
            except (OSError, ValueError, IndexError) as exc:  # never the end of the guard
                logs.warning("memguard.failed", error=f"{type(exc).__name__}: {exc}")
                victim = None
            if victim is not None:
                pid, group, rss = victim
                with _lock:
                    _killed.add(group)
                    _kills += 1
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)  # that process only, as the kernel's OOM killer
                logs.info("memguard.killed", pid=pid, pgid=group, usage_bytes=used, limit_bytes=budget)
                settle_until, last_group, killed_at, low = now + _SETTLE_S, group, now, used
                after_kill = True
                dying = None if pid == group else [pid, used, rss * PAGE, 0.0]
        time.sleep(min(INTERVAL_S[1], max(INTERVAL_S[0], (budget - used) / RATE)))


def _victim(budget: int, floor: int, only: int = 0) -> tuple[int, int, int] | None:
    """(pid, its call's group, its resident pages) of the process Linux's OOM killer would choose among the
    watched calls' (``oom_badness``: resident pages + oom_score_adj * the budget's pages / 1000), or None.
    ``only``: among that call's processes alone."""
    with _lock:
        groups = set(_watched)
    if only:
        groups &= {only}
    if not groups:
        return None
    procs = _processes()
    total = budget // PAGE
    call: dict[int, int | None] = {}
    best: tuple[int, int, int, int] | None = None  # (points, rss, pid, group)
    for pid, (_, rss) in procs.items():
        group = _call_of(pid, procs, groups, call)
        if group is None:
            continue
        adj = _adj(pid)
        if adj is None:  # gone meanwhile
            continue
        points = rss + max(adj, floor) * total // 1000
        if best is None or (points, rss) > best[:2]:
            best = (points, rss, pid, group)
    return (best[2], best[3], best[1]) if best is not None else None


def _call_of(pid: int, procs: dict[int, tuple[int, int]], groups: set[int], seen: dict[int, int | None]) -> int | None:
    """The watched call ``pid`` belongs to (up the tree to the call's first process), or None."""
    path: list[int] = []
    p = pid
    while p not in seen and len(path) < 64:
        if p in groups:
            seen[p] = p
            break
        path.append(p)
        parent = procs.get(p, (0, 0))[0]
        if parent <= 1:
            seen[p] = None
            break
        p = parent
    found = seen.get(p)
    for q in path:
        seen[q] = found
    return found


def _freed(dying: list[float], used: int, now: float) -> bool:
    """Whether the non-first victim ``dying`` (see _run) is dead and its memory back (the usage fell by half of
    what it held, or it has been dead _FREED_S)."""
    pid, used_then, held, dead_at = dying
    if not dead_at:
        if _alive(int(pid)):
            return False
        dying[3] = dead_at = now
    return used <= used_then - held / 2 or now - dead_at >= _FREED_S


def _alive(pid: int) -> bool:
    """Whether ``pid`` still holds its memory (neither gone nor a zombie)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in (b"Z", b"X")


def _adj(pid: int) -> int | None:
    """The process's oom_score_adj (gVisor's procfs keeps it, and computes no oom_score of its own)."""
    try:
        with open(f"/proc/{pid}/oom_score_adj", "rb") as f:
            return int(f.read(16))
    except (OSError, ValueError):
        return None


def _processes() -> dict[int, tuple[int, int]]:
    """Every live process's parent and resident pages, from /proc (the worker sees every PID namespace's)."""
    procs: dict[int, tuple[int, int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if len(fields) <= 21 or fields[0] in (b"Z", b"X"):  # a zombie holds no memory: never the victim
            continue
        # after the name: state, ppid, ... rss is field 24 (index 21 here)
        procs[int(name)] = (int(fields[1]), int(fields[21]))
    return procs
