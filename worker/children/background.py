"""Processes that live across calls: started in the background with an id, on pipes or a terminal.

Every other process a call starts dies when its call ends (``worker.children.sweep``). A background process
(the ``proc_*`` tools, ``worker.tools.background``) is registered here before its call's sweep runs, and the
sweep then kills every process but the registered ones and what they started: under runc, the processes of
its session (the leader is started in a session of its own, and a process can join no other session: a
process of another call cannot pass for one of its); under gVisor, the processes of its PID namespace (the
leader starts through ``worker.children.nsinit --bg``, whose keeper stays PID 1 there while anything runs in
it; no process can enter another PID namespace). A background process that leaves its session under runc
(``setsid``, as a daemon does) is no longer told apart from a call's leftovers: it ends at the next sweep.
Under gVisor it stays in its namespace and lives on.

Bounds (everything here is fed by the sandbox): at most ``MAX_LIVE`` processes running and ``MAX_KEPT``
entries in all (the oldest ended ones are forgotten first); the last ``KEEP_BYTES`` of each one's output
(stdout and stderr together, in the order they came, or the terminal's bytes) are kept, and a reader behind
that is told how much it missed (``dropped``). One thread reads every process's output. The whole lives in
the worker, inside the sandbox's memory limit.

Nothing outlives the run: the container's end ends every process, and the runner's going away kills them
(``worker.tools.proc.kill_all_children``).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import selectors
import signal
import struct
import subprocess
import termios
import threading
import time
from collections.abc import Iterator
from typing import Any

from toolcage.worker import logs
from toolcage.worker.children import namespaces, sweep

MAX_LIVE = 64  # running at once (Codex's and the OpenAI Agents SDK's limit)
MAX_KEPT = 128  # entries kept, ended ones included (past this, the oldest ended one is forgotten)
KEEP_BYTES = 1 << 20  # output kept per process
READ_MAX = 1 << 20  # one read returns at most this much
_POLL_S = 0.1  # how often the reader looks for processes that ended


class Proc:
    """One background process: its leader, its output, and how it ended."""

    def __init__(self, pid: int, popen: subprocess.Popen[bytes], out_fd: int, in_fd: int | None, info: dict[str, Any]):
        self.id = 0
        self.pid = pid
        self.popen = popen
        self.out_fd = out_fd  # the pipe of stdout and stderr, or the terminal's master
        self.in_fd = in_fd  # its stdin (the master too, for a terminal); None once closed
        self.info = info  # command, argv, pty, cwd, name
        self.started_at = time.time()
        self.ended_at: float | None = None
        self.status: int | None = None  # the leader's wait status
        self.kept = bytearray()
        self.start = 0  # the offset of kept[0] in the whole output
        self.eof = False  # the output is closed (every holder of the pipe or terminal is gone)
        self.ns: str | None = None  # under gVisor: its PID namespace (readlink of /proc/PID/ns/pid)
        self.keeper = 0  # under gVisor: PID 1 of that namespace, as the worker sees it
        self.killed = False
        self.gone = False  # ended, and nothing it started is left (set by alive())
        self.write_lock = threading.Lock()

    @property
    def end(self) -> int:
        return self.start + len(self.kept)

    @property
    def running(self) -> bool:
        return self.status is None

    def exit_fields(self) -> dict[str, Any]:
        if self.status is None:
            return {"state": "running", "exit_code": None, "signal": None}
        code = os.waitstatus_to_exitcode(self.status)
        sig = -code if code < 0 else None
        return {
            "state": "exited",
            "exit_code": code,
            "signal": signal.Signals(sig).name if sig else None,
        }

    def describe(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "pid": self.pid,
            **self.info,
            **self.exit_fields(),
            "started_at": round(self.started_at, 3),
            "ended_at": None if self.ended_at is None else round(self.ended_at, 3),
            "output_bytes": self.end,
            "stdin_open": self.in_fd is not None,
        }


_lock = threading.Condition()  # guards everything below; notified on any output or end
_procs: dict[int, Proc] = {}
_next_id = 1
_by_pid: dict[int, Proc] = {}
_reader: threading.Thread | None = None
_sel: selectors.DefaultSelector | None = None
_wake_r, _wake_w = -1, -1


class Refused(Exception):
    """A background process cannot be started or reached now (the message says why)."""


def alive() -> list[Proc]:
    """Background processes with a process left: the leader runs, or something it started does (in its
    session or namespace). One found with none is marked gone: no process can join either later."""
    with _lock:
        candidates = [p for p in _procs.values() if not p.killed and not p.gone]
    found = []
    for p in candidates:
        if p.running or members(p):
            found.append(p)
        else:
            p.gone = True
    return found


def any_kept() -> bool:
    """Whether the sweep must tell processes apart (some background process still has processes)."""
    return bool(alive())


def get(proc_id: int) -> Proc:
    with _lock:
        p = _procs.get(proc_id)
    if p is None:
        raise Refused(f"no background process {proc_id} (proc_list names them)")
    return p


def all_procs() -> list[Proc]:
    with _lock:
        return list(_procs.values())


def register(popen: subprocess.Popen[bytes], out_fd: int, in_fd: int | None, info: dict[str, Any]) -> Proc:
    """A process just started (its leader ``popen``): kept from now on, its output read."""
    global _next_id
    proc = Proc(popen.pid, popen, out_fd, in_fd, info)
    os.set_blocking(out_fd, False)
    with _lock:
        proc.id = _next_id
        _next_id += 1
        _procs[proc.id] = proc
        _by_pid[proc.pid] = proc
        _prune()
    _ensure_reader()
    assert _sel is not None
    _sel.register(out_fd, selectors.EVENT_READ, proc)
    _wake()
    return proc


def room() -> None:
    """Refuse a new process when MAX_LIVE run already."""
    with _lock:
        running = sum(1 for p in _procs.values() if p.running)
    if running >= MAX_LIVE:
        raise Refused(f"{running} background processes run already (at most {MAX_LIVE}): kill one first")


def _prune() -> None:
    """(Under the lock.) Forget the oldest ended entries past MAX_KEPT."""
    ended = sorted((p for p in _procs.values() if not p.running and p.eof), key=lambda p: p.ended_at or 0)
    while len(_procs) > MAX_KEPT and ended:
        old = ended.pop(0)
        del _procs[old.id]


def set_namespace(proc: Proc, keeper: int) -> None:
    """Under gVisor: the process's PID namespace, read off its keeper (PID 1 there)."""
    try:
        ns = os.readlink(f"/proc/{keeper}/ns/pid")
    except OSError:
        ns = None  # the namespace is gone already (everything in it ended): nothing to keep
    with _lock:
        proc.keeper, proc.ns = keeper, ns


# ---- the output -------------------------------------------------------------------------------


def _ensure_reader() -> None:
    global _reader, _sel, _wake_r, _wake_w
    with _lock:
        if _reader is not None:
            return
        _sel = selectors.DefaultSelector()
        _wake_r, _wake_w = os.pipe()
        os.set_blocking(_wake_r, False)
        os.set_blocking(_wake_w, False)
        _sel.register(_wake_r, selectors.EVENT_READ, None)
        _reader = threading.Thread(target=_read_loop, name="background", daemon=True)
        _reader.start()


def _wake() -> None:
    with contextlib.suppress(BlockingIOError, OSError):
        os.write(_wake_w, b"x")


def _read_loop() -> None:
    assert _sel is not None
    while True:
        try:
            events = _sel.select(_POLL_S)
        except OSError:
            time.sleep(_POLL_S)
            continue
        for key, _ in events:
            proc = key.data
            if proc is None:
                with contextlib.suppress(BlockingIOError, OSError):
                    os.read(_wake_r, 4096)
                continue
            try:
                chunk = os.read(proc.out_fd, 65536)
            except BlockingIOError:
                continue
            except OSError:  # EIO: a terminal whose every holder is gone
                chunk = b""
            if chunk:
                _append(proc, chunk)
            else:
                _close_output(proc)
        _collect()


def _append(proc: Proc, chunk: bytes) -> None:
    with _lock:
        proc.kept += chunk
        over = len(proc.kept) - KEEP_BYTES
        if over > 0:
            del proc.kept[:over]
            proc.start += over
        _lock.notify_all()


def _close_output(proc: Proc) -> None:
    assert _sel is not None
    with contextlib.suppress(KeyError, ValueError):
        _sel.unregister(proc.out_fd)
    with _lock:
        proc.eof = True
        fd, proc.out_fd = proc.out_fd, -1
        if proc.in_fd == fd:  # a terminal: its master is its stdin too
            proc.in_fd = None
        _lock.notify_all()
    with contextlib.suppress(OSError):
        os.close(fd)


def _collect() -> None:
    """Look for leaders that ended (their status, unless the sweep's reaper took it: see ``reaped``)."""
    for proc in [p for p in all_procs() if p.running]:
        try:
            pid, status = os.waitpid(proc.pid, os.WNOHANG)
        except ChildProcessError:
            continue  # reaped elsewhere: reaped() was told
        if pid:
            reaped(pid, status)


def reaped(pid: int, status: int) -> bool:
    """A child the worker reaped (here, or in the sweep's reaper): True if it was a background leader."""
    with _lock:
        proc = _by_pid.pop(pid, None)
        if proc is None:
            return False
        proc.status = status
        proc.ended_at = time.time()
        proc.popen.returncode = os.waitstatus_to_exitcode(status)  # never waited for again by Popen
        _lock.notify_all()
    with contextlib.suppress(Exception):
        from toolcage.worker.children import memguard

        memguard.release(pid)
    logs.info("background.ended", id=proc.id, pid=pid, **proc.exit_fields())
    return True


# ---- reading -----------------------------------------------------------------------------------


def read(proc: Proc, since: int, max_bytes: int) -> dict[str, Any]:
    """(Under the lock.) The output from ``since`` (bytes the window no longer holds are ``dropped``), at most
    ``max_bytes``, never cutting a UTF-8 character in two while more may come; the next cursor."""
    begin = max(since, proc.start)
    dropped = begin - since if since < proc.start else 0
    data = bytes(proc.kept[begin - proc.start : begin - proc.start + max_bytes])
    more = begin + len(data) < proc.end or not proc.eof
    if more and data:
        data = data[: _whole(data)]
    return {"data": data, "cursor": begin + len(data), "dropped": dropped}


def _whole(data: bytes) -> int:
    """The length of ``data`` without an incomplete UTF-8 character at its end (at most 3 bytes go)."""
    for back in range(1, min(4, len(data)) + 1):
        b = data[-back]
        if b & 0xC0 != 0x80:  # the start of the last character (or ASCII)
            need = 1 if b < 0x80 else 2 if b >> 5 == 0b110 else 3 if b >> 4 == 0b1110 else 4 if b >> 3 == 0b11110 else 1
            return len(data) - back if need > back else len(data)
    return len(data)


_closing = False  # the run is ending (its runner closed the channel or went away): no wait goes on


def shutdown() -> None:
    """The run is ending: every wait answers now (the worker exits once every call has answered)."""
    global _closing
    with _lock:
        _closing = True
        _lock.notify_all()


def closing() -> bool:
    return _closing


def wait(predicate: Any, timeout: float, cancelled: Any) -> bool:
    """Wait until ``predicate()`` (called under the lock) is true, ``timeout`` passes, ``cancelled()``, or the
    run ends."""
    deadline = time.monotonic() + timeout
    with _lock:
        while True:
            if predicate():
                return True
            left = deadline - time.monotonic()
            if left <= 0 or cancelled() or _closing:
                return False
            _lock.wait(min(left, 0.1))


@contextlib.contextmanager
def locked() -> Iterator[None]:
    with _lock:
        yield


# ---- input and signals -------------------------------------------------------------------------


def write(proc: Proc, data: bytes, eof: bool) -> int:
    """Write all of ``data`` to its stdin (a terminal: as keystrokes), then close stdin if ``eof`` (a terminal
    gets its EOF character instead: its master is its output too). Never blocks the worker for long: a
    process that reads nothing fills its pipe, and the write gives up after a few seconds."""
    with proc.write_lock:
        fd = proc.in_fd
        if fd is None:
            raise Refused(f"process {proc.id} has no stdin open (started with stdin=false, or closed)")
        pty = bool(proc.info.get("pty"))
        if eof and pty:
            data += b"\x04"
        view = memoryview(data)
        deadline = time.monotonic() + 5.0
        written = 0
        os.set_blocking(fd, False)
        while written < len(view):
            try:
                written += os.write(fd, view[written : written + 65536])
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise Refused(f"process {proc.id} reads no input: {written} of {len(view)} bytes written") from None
                time.sleep(0.005)
            except OSError as exc:  # EPIPE, EIO: it closed its stdin or ended
                raise Refused(f"process {proc.id} takes no more input ({exc.strerror})") from None
        if eof and not pty:
            with _lock:
                proc.in_fd = None
            os.close(fd)
        return written


def resize(proc: Proc, rows: int, cols: int) -> None:
    if not proc.info.get("pty"):
        raise Refused(f"process {proc.id} has no terminal (started with pty=false)")
    if proc.out_fd < 0:
        raise Refused(f"process {proc.id} has no terminal any more (everything on it has ended)")
    fcntl.ioctl(proc.out_fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
    proc.info["rows"], proc.info["cols"] = rows, cols


def send_signal(proc: Proc, sig: int) -> None:
    """To its leader's process group (a terminal's foreground job gets keystrokes' signals from the terminal);
    under gVisor, whose launcher passes nothing on, to every process of its namespace but the keeper."""
    if not proc.running:
        raise Refused(f"process {proc.id} has ended")
    if namespaces.enabled() and proc.keeper:
        for pid in members(proc):
            if pid != proc.keeper and pid != proc.pid:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, sig)
        return
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(proc.pid, sig)


def kill(proc: Proc) -> None:
    """Kill it and everything it started that is still its (its session, or its PID namespace)."""
    with _lock:
        proc.killed = True
    for _ in range(50):
        pids = members(proc)
        if not pids:
            break
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.002)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(proc.pid, signal.SIGKILL)


def kill_all() -> None:
    for proc in all_procs():
        if not proc.killed:
            kill(proc)


# ---- who is whose ------------------------------------------------------------------------------


def _keys() -> tuple[set[int], set[str], set[int]]:
    with _lock:
        kept = [p for p in _procs.values() if not p.killed]
    return {p.pid for p in kept}, {p.ns for p in kept if p.ns}, {p.keeper for p in kept if p.keeper}


def keeper_of(pids: set[int], nss: set[str], keepers: set[int]) -> Any:
    """A function telling whether a pid belongs to a background process (see the module's docstring)."""
    gvisor = namespaces.enabled()

    def belongs(pid: int) -> bool:
        if pid in pids or pid in keepers:
            return True
        if gvisor:
            try:
                return os.readlink(f"/proc/{pid}/ns/pid") in nss
            except OSError:
                return False
        st = sweep.stat_of(pid)
        return st is not None and st[1] in pids

    return belongs


def kept() -> Any:
    """The sweep's test: does this pid belong to a background process that is not killed?"""
    return keeper_of(*_keys())


def members(proc: Proc) -> list[int]:
    """Every live process of ``proc`` (its leader, its session or namespace)."""
    test = keeper_of({proc.pid}, {proc.ns} if proc.ns else set(), {proc.keeper} if proc.keeper else set())
    me = os.getpid()
    try:
        names = os.listdir("/proc")
    except OSError:
        return [proc.pid]
    return [int(n) for n in names if n.isdigit() and int(n) != me and test(int(n))]
