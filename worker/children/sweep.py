"""Nothing survives its call: kill every other process of the sandbox and clear what it left in IPC.

Threat: tool code that double-forks, calls ``setsid``, stops itself or leaves zombies, so
that something of it outlives the call (to read the next request, answer in the worker's
place, or wait for a secret), or that parks data in ``/dev/shm``, ``/dev/mqueue`` or System
V IPC for a later call. In a container the worker is PID 1 of the sandbox's PID namespace:
``kill(-1, SIGKILL)`` from it reaches every other process of the namespace at once (the
kernel walks the task list under a lock that ``fork`` also takes, and a fork racing a
fatal signal is abandoned), and every orphan is re-parented to it, so it can reap them.
Outside a container (``--sandbox none``) none of this runs: ``kill(-1)`` there would hit
the user's own processes.
"""

from __future__ import annotations

import _thread
import contextlib
import ctypes
import os
import signal
import stat
import sys
import threading
import time
from typing import TYPE_CHECKING, Any

from toolcage.policies import contract

if TYPE_CHECKING:
    from collections.abc import Iterator

_IPC_RMID = 0
_IPC_TABLES = (("/proc/sysvipc/shm", "shmctl"), ("/proc/sysvipc/msg", "msgctl"), ("/proc/sysvipc/sem", "semctl"))
_IPC_DIRS = ("/dev/shm", "/dev/mqueue")


# Processes of the worker's own that no call started (the zygote): not counted as a call's survivors.
# A pid leaves the set when a sweep reaps it, so its owner never signals a pid that is no longer its.
EXEMPT: set[int] = set()


def active() -> bool:
    """Whether this process is the sandbox's init (PID 1 in a toolcage container)."""
    return os.getpid() == 1 and os.environ.get(contract.ENV_IN_CONTAINER) == "1"


def others() -> list[int]:
    """Every process of the namespace but this one (zombies included). Reading /proc needs a free
    file descriptor: callers that must not fail (the sweep) do not depend on it, see kill_others."""
    me = os.getpid()
    return [int(p) for p in os.listdir("/proc") if p.isdigit() and int(p) != me and int(p) not in EXEMPT]


def _count_others() -> int | None:
    try:
        return len(others())
    except OSError:  # EMFILE, ENOMEM: tool code may have exhausted what the worker holds
        return None


def reap(exclude: frozenset[int] = frozenset()) -> int:
    """Collect exited orphans (re-parented to PID 1); never a child in ``exclude``. Returns how many."""
    n = 0
    if not exclude:
        while True:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return n
            if pid == 0:
                return n
            EXEMPT.discard(pid)
            _reaped(pid, _)
            n += 1
    # during a call: only zombies that are ours and not the call's own child, so its exit status stays ours
    try:
        pids = others()
    except OSError:
        return n  # no descriptor left to read /proc: the sweep at the end of the call does not need one
    for pid in pids:
        if pid in exclude or not _is_zombie_child(pid):
            continue
        with contextlib.suppress(ChildProcessError):
            got, status = os.waitpid(pid, os.WNOHANG)
            if got:
                EXEMPT.discard(pid)
                _reaped(pid, status)
                n += 1
    return n


def _reaped(pid: int, status: int) -> None:
    """A background process's leader reaped here: its registry gets the status (worker.children.background)."""
    background = sys.modules.get("toolcage.worker.children.background")
    if background is not None:
        background.reaped(pid, status)


def _is_zombie_child(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return False
    fields = stat[stat.rfind(b")") + 2 :].split()
    return fields[0] == b"Z" and fields[1] == str(os.getpid()).encode()


_SWEEP_LOCK = _thread.allocate_lock()  # the deadline and runner-gone watchers sweep from their own threads


def kill_others(rounds: int = 50) -> int:
    with _SWEEP_LOCK:
        return _kill_others(rounds)


def _kill_others(rounds: int) -> int:
    """SIGKILL every other process of the namespace and reap them; return how many were left behind.

    Threat: tool code that exhausts the worker's file descriptors (e.g. through the relay) so that
    the sweep cannot list /proc and the call answers while its processes live on. The sweep
    therefore needs no descriptor: ``kill(-1)`` answers ESRCH only when no other process (zombies
    included) is left in the namespace, and ``waitpid`` reaps without opening anything. /proc is
    read only to count, when it can be.
    """
    for round_ in range(rounds + 1):
        try:
            os.kill(-1, signal.SIGKILL)
        except ProcessLookupError:
            return 0  # nobody left to signal, not even a zombie
        reap()
        if round_ < rounds:
            time.sleep(0.002)  # processes being torn down still show for a moment
    left = _count_others()
    return 1 if left is None else left


def clear_ipc() -> int:
    """Remove every System V IPC object, POSIX shared memory file and message queue. Returns the count."""
    removed = 0
    libc = ctypes.CDLL(None, use_errno=True)
    for table, fn in _IPC_TABLES:
        try:
            with open(table, encoding="ascii") as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        ctl = getattr(libc, fn)
        for row in rows:
            cols = row.split()
            if len(cols) > 1 and cols[1].isdigit():
                # semctl takes a semnum before the command; the others take the command second
                args = (int(cols[1]), 0, _IPC_RMID) if fn == "semctl" else (int(cols[1]), _IPC_RMID, None)
                if ctl(*args) == 0:
                    removed += 1
    for d in _IPC_DIRS:
        try:
            names = os.listdir(d)
        except OSError:
            continue
        for name in names:
            path = os.path.join(d, name)
            with contextlib.suppress(OSError):
                if stat.S_ISDIR(os.lstat(path).st_mode):
                    # a directory, with whatever it holds (found by a red-team run: unlink refused it,
                    # and its files reached the next call); fd-based, never following a link out
                    import shutil  # (here: rarely needed, and the worker's start imports only its core)

                    shutil.rmtree(path, onerror=_writable_and_retry)
                else:
                    os.unlink(path)
                removed += 1
    return removed


def _writable_and_retry(fn: Any, path: str, _exc: Any) -> None:
    """rmtree's error hook: a directory the call made unreadable or unwritable (mode 000) is the
    sandbox user's own, so it is made writable and the step tried again (once; a second failure stays)."""
    import shutil

    with contextlib.suppress(OSError):
        os.chmod(os.path.dirname(path) or path, 0o700)
        if fn in (os.rmdir, os.unlink):
            fn(path)
        else:
            os.chmod(path, 0o700)
            shutil.rmtree(path, ignore_errors=True)


def kill_outside(kept: Any, rounds: int = 50) -> tuple[int, int] | None:
    """SIGKILL every other process of the namespace that ``kept(pid)`` does not claim (a background process's,
    worker.children.background), and reap them: (killed, left), or None when /proc cannot be read (no
    descriptor left): the caller then kills every process, the background ones too (fail closed).

    Threat: a process that forks as fast as it is killed. Each round kills every process it lists; a child
    forked meanwhile is listed in the next one (the pids limit bounds them). What no round ended is ``left``."""
    killed: set[int] = set()
    victims: list[int] = []
    for round_ in range(rounds + 1):
        try:
            victims = [pid for pid in others() if not kept(pid)]
        except OSError:
            return None
        if not victims:
            return len(killed), 0
        for pid in victims:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        killed.update(victims)
        reap()
        if round_ < rounds:
            time.sleep(0.002)
    return len(killed), len(victims)


def stat_of(pid: int) -> tuple[int, int] | None:
    """(ppid, session) of ``pid`` (None: gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return int(fields[1]), int(fields[3])


def _session(pid: int) -> int | None:
    st = stat_of(pid)
    return None if st is None else st[1]


def _from_the_engine() -> set[int]:
    """The sessions of processes the engine started in the sandbox from outside it (``docker exec``: the
    runner's relay of an exposed port), whose parent is outside the sandbox (ppid 0). No process of the
    sandbox can have that parent, nor join their sessions: they and theirs outlive a call's sweep. Empty
    when /proc cannot be read (the sweep then kills every process: fail closed)."""
    try:
        pids = others()
    except OSError:
        return set()
    found = set()
    for pid in pids:
        st = stat_of(pid)
        if st is not None and st[0] == 0:
            found.add(st[1])
    return found


def after_call() -> dict[str, int]:
    """What the worker runs when a call that ran tool code ends (PID 1 only). With background processes
    kept, every process but theirs; their IPC objects stay (a server may use /dev/shm). Processes the engine
    execs from outside (an exposed port's relay) are kept too."""
    background = sys.modules.get("toolcage.worker.children.background")
    kept_bg = background is not None and background.any_kept()
    engines = _from_the_engine()
    if kept_bg or engines:
        bg_kept = background.kept() if kept_bg and background is not None else (lambda pid: False)

        def kept(pid: int) -> bool:
            return bg_kept(pid) or _session(pid) in engines

        with _SWEEP_LOCK:
            done = kill_outside(kept)
        if done is not None:
            killed, left = done
            return {"killed": killed, "left": left, "ipc_removed": 0 if kept_bg else clear_ipc()}
        if background is not None:
            background.kill_all()  # fail closed: no telling them apart, so nothing is kept
    survivors = _count_others()
    left = kill_others() if survivors != 0 else 0
    if survivors is None:
        survivors = left
    return {"killed": survivors - left, "left": left, "ipc_removed": clear_ipc()}


class CodeCalls:
    """Calls that run code, counted: the sweep runs when the last one in flight ends, and no call
    starts a child while it runs. With calls running concurrently (``limits.concurrency``), what
    one left running is killed when the sandbox next has no code call in flight, before that
    last call's answer goes out; with one at a time, that is the end of every call, as before."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._active = 0
        self._sweeping = False
        self._starting = 0  # background processes being started outside a code call (starting())

    def enter(self) -> None:
        with self._cond:
            while self._sweeping:
                self._cond.wait()
            self._active += 1

    def leave(self) -> bool:
        """True for the last one out: it must sweep, then call :meth:`swept`."""
        with self._cond:
            self._active -= 1
            if self._active == 0:
                while self._starting:  # a process being started is registered (kept) before the sweep looks
                    self._cond.wait()
                self._sweeping = True
                return True
            return False

    @contextlib.contextmanager
    def starting(self) -> Iterator[None]:
        """A call that is no code call (``code_run``) starts a background process: never while the sweep
        runs, and the sweep waits until it is registered as kept."""
        with self._cond:
            while self._sweeping:
                self._cond.wait()
            self._starting += 1
        try:
            yield
        finally:
            with self._cond:
                self._starting -= 1
                self._cond.notify_all()

    def swept(self) -> None:
        with self._cond:
            self._sweeping = False
            self._cond.notify_all()


CODE_CALLS = CodeCalls()
