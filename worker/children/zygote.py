"""The worker's side of the zygote (``worker/children/zygote_main.py``): start it, check it, fork a call from it.

Why: a ``run_python`` child spends ~20 ms starting an interpreter; a fork of a ready one takes
about 1 ms. The fast path serves ``run_python`` only, only in a container (the worker is PID 1,
so the forked child is re-parented to it and swept like any other), only when the call would
run ``python3 -c code`` with the zygote's very environment, and never under
``unsafe_background_processes`` (processes of an earlier call could then tamper with it between
the checks and the fork). Anything else, and any doubt about the zygote, takes the subprocess
path; the zygote is then killed and started again while the worker is idle.

Threat: a call reaching the next one through the zygote. A child of the sandbox user can still
kill or stop it, or change what the kernel lets any same-uid process change of another: its
limits (prlimit), nice value, CPU affinity, scheduling policy and I/O priority, all of which a
fork would inherit (toolcage's seccomp profile now refuses those calls on any process but the
caller itself; the check stays, for a profile an operator replaced). Before every fork the
worker checks each of them against its own (what a subprocess child would inherit) and that
the zygote still runs; on any difference it is discarded.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import json
import os
import resource
import signal
import subprocess
import sys
import time
from typing import Any

from toolcage.policies import contract
from toolcage.worker.children import namespaces, sweep
from toolcage.worker.protocol import readable

_READY_S = 5.0  # the zygote's own start-up
_REPLY_S = 1.0  # one fork; a zygote that does not answer in time is discarded (stopped?)
_PIPE_SIZE = 1 << 20
_IOPRIO_GET = {"x86_64": 252, "aarch64": 31}.get(os.uname().machine)  # (platform.machine(): 3 ms to import)
_RLIMITS = tuple(getattr(resource, n) for n in dir(resource) if n.startswith("RLIMIT_"))


class Spawned:
    """What ``proc.run_child`` needs of a ``subprocess.Popen``: a pid and the parent's ends of the pipes."""

    def __init__(self, pid: int, stdin: Any, stdout: Any, stderr: Any) -> None:
        self.pid = pid
        self.stdin = stdin
        self.stdout = stdout
        self.stderr = stderr
        self.returncode: int | None = None


class Zygote:
    def __init__(self, env: dict[str, str], cwd: str) -> None:
        self.env = dict(env)
        self.cwd = cwd
        import socket  # here, made while the worker is idle: a cold sandbox's first call does not import it

        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        with open(os.path.join(os.path.dirname(__file__), "zygote_main.py"), encoding="utf-8") as f:
            source = f.read()
        # its end of the socket keeps its number in the zygote (pass_fds): the program is told which
        source = source.replace("_CTL = 3  # fd", f"_CTL = {theirs.fileno()}  # fd", 1)
        source = source.replace("_CWD = None  # cwd", f"_CWD = {cwd!r}  # cwd", 1)
        if namespaces.enabled():  # each fork enters namespaces of its own, as nsinit does for a subprocess
            with open(namespaces.NSINIT, encoding="utf-8") as f:
                source = source.replace("_NAMESPACES = None  # nsinit", f"_NAMESPACES = {f.read()!r}", 1)
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", source],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                cwd=cwd,
                env=self.env,
                start_new_session=True,
                close_fds=True,
                pass_fds=(theirs.fileno(),),
            )
        finally:
            theirs.close()
        self.sock = ours
        self.pid = self.proc.pid
        self.ready = False
        self.ahead: tuple[int, Any] | None = None  # with namespaces: the next call's process, made ahead (pid, socket)
        self.pending = False  # one asked of the zygote ahead, its reply not read yet
        sweep.EXEMPT.add(self.pid)  # not a survivor of a call; if the sweep kills and reaps it, it says so

    # ------------------------------------------------------------------------------------------
    def alive(self) -> bool:
        """Running (not exited, not stopped), answering, and unchanged by anyone."""
        if not _running(self.pid):
            return False
        if not self.ready:
            if not readable([self.sock.fileno()], _READY_S) or self.sock.recv(16) != b"R":
                return False
            self.ready = True
        return untouched(self.pid)

    def make_ahead(self, wake: int) -> bool:
        """With namespaces (gVisor), while the worker is idle: have the zygote make the next call's process
        (zygote_main._prepare), so that a call pays neither of its forks. Every wait here also watches ``wake``
        (the channel): True as soon as it is readable, a request waits (a reply still to come is then taken by
        the next fork, or before the next sweep: collect). The channel is never left unread for the zygote."""
        if self.ahead is not None or self.pid not in sweep.EXEMPT:
            return False
        if not self.ready:
            got = readable([self.sock.fileno(), wake], _READY_S)
            if wake in got:
                return True
            if not got or not self.alive():  # (alive() reads the ready byte at once now, or finds it gone)
                return False
        if not self.pending:
            self.sock.send(b"P")
            self.pending = True
        if wake in readable([self.sock.fileno(), wake], _REPLY_S):
            return True
        self.collect(0)
        return False

    def collect(self, timeout: float) -> None:
        """Read the zygote's reply to a process asked of it ahead, if one is awaited (waiting up to ``timeout``):
        before the zygote's next fork (the reply would be read as the fork's), and before a sweep counts the
        sandbox's processes (the process made ahead is none of a call's). Raises OSError when the zygote cannot
        be trusted to answer in order any more: it is then discarded."""
        if not self.pending:
            return
        if not readable([self.sock.fileno()], timeout):
            if timeout:
                raise OSError(errno.ETIMEDOUT, "the zygote made no process ahead in time")
            return
        import socket  # (loaded by __init__)

        self.pending = False
        msg, fds, _flags, _addr = socket.recv_fds(self.sock, 16, 1)
        if msg == b"E" and not fds:
            return  # it could not fork now (the pids limit, filled by what runs in the background): next time
        if len(msg) != 8 or len(fds) != 1:
            for fd in fds:
                os.close(fd)
            raise OSError(errno.EPROTO, "the zygote made no process ahead")
        pid = int.from_bytes(msg, "little")
        sweep.EXEMPT.add(pid)  # it runs no call's code yet: no survivor of one (a sweep that kills it says so)
        self.ahead = (pid, socket.socket(fileno=fds[0]))

    def _take_ahead(self, kind: bytes, fds: list[int]) -> int | None:
        """Hand the call's kind and descriptors to the process made ahead, if it still waits untouched: its pid,
        or None (dropped: the zygote forks the call's process)."""
        if self.ahead is None:
            return None
        pid, sock = self.ahead
        self.ahead = None
        try:
            if _running(pid) and untouched(pid):
                import socket  # (loaded by __init__)

                socket.send_fds(sock, [kind], fds)
                sweep.EXEMPT.discard(pid)  # the call's process now: its end and its sweep are the call's
                return pid
        except OSError:
            pass
        finally:
            sock.close()  # (dropped: it sees EOF and exits, and is reaped as an orphan)
        _drop(pid)
        return None

    def spawn(self, source: bytes, stdin: bool, argv: bool = False, with_env: bool = False) -> Spawned | None:
        """A fresh child running ``source`` (``argv``: exec'ing the NUL-separated argv it is), or None
        (the caller takes the subprocess path)."""
        code_r, code_w = os.pipe()
        fds: list[int] = [code_r, code_w]
        try:
            with contextlib.suppress(OSError):
                fcntl.fcntl(code_w, fcntl.F_SETPIPE_SZ, _PIPE_SIZE)
            os.set_blocking(code_w, False)
            try:
                written = os.write(code_w, source) if source else 0
            except BlockingIOError:
                written = -1
            if written != len(source):
                return None  # larger than the pipe holds: the child would wait on us
            os.close(code_w)
            fds.remove(code_w)
            if stdin:
                in_r, in_w = os.pipe()
                fds += [in_r, in_w]
            else:
                in_r, in_w = os.open(os.devnull, os.O_RDONLY), -1
                fds.append(in_r)
            out_r, out_w = os.pipe()
            err_r, err_w = os.pipe()
            fds += [out_r, out_w, err_r, err_w]
            kind = b"E" if with_env else b"X" if argv else b"F"
            import socket  # (loaded by __init__)

            self.collect(_REPLY_S)
            pid = self._take_ahead(kind, [code_r, in_r, out_w, err_w])
            if pid is None:
                socket.send_fds(self.sock, [kind], [code_r, in_r, out_w, err_w])
                if not readable([self.sock.fileno()], _REPLY_S):
                    return None
                reply = self.sock.recv(16)
                if len(reply) != 8:
                    return None
                pid = int.from_bytes(reply, "little")
            for fd in (code_r, in_r, out_w, err_w):
                os.close(fd)
                fds.remove(fd)
            for fd in (out_r, err_r, in_w):
                if fd >= 0:
                    fds.remove(fd)
            return Spawned(
                pid,
                os.fdopen(in_w, "wb", buffering=0) if in_w >= 0 else None,
                os.fdopen(out_r, "rb", buffering=0),
                os.fdopen(err_r, "rb", buffering=0),
            )
        finally:
            for fd in fds:
                with contextlib.suppress(OSError):
                    os.close(fd)

    def kill(self) -> None:
        with contextlib.suppress(OSError):
            self.collect(0)  # a process made ahead whose reply came: dropped below like any
        if self.ahead is not None:
            pid, sock = self.ahead
            self.ahead = None
            sock.close()
            _drop(pid)
        if self.pid in sweep.EXEMPT:  # else reaped already: the pid is not ours to signal
            # its process group: the zygote, and a middle process making a call's process now (its child has a
            # group of its own by the time anyone knows its pid, and ends when its socket's other end closes)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.pid, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(self.pid, 0)
            sweep.EXEMPT.discard(self.pid)
            _reap_group(self.pid)
        self.sock.close()


def _running(pid: int) -> bool:
    """Whether ``pid``, a process of the worker's own (the zygote, the process made ahead), still runs: neither
    reaped by a sweep (its pid may be someone else's now), nor exited, nor stopped."""
    if pid not in sweep.EXEMPT:
        return False
    try:
        got, status = os.waitpid(pid, os.WNOHANG | os.WUNTRACED)
    except ChildProcessError:
        sweep.EXEMPT.discard(pid)
        return False
    if got and not os.WIFSTOPPED(status):
        sweep.EXEMPT.discard(pid)  # reaped just now: the pid is no longer ours
    return not got


def _reap_group(pgid: int, rounds: int = 20) -> None:
    """Reap what was left of the zygote's group (a middle process killed with it, re-parented to the worker as
    it died), so that no sweep counts it as a call's survivor. Only that group: never a call's process."""
    for _ in range(rounds):
        try:
            got, _status = os.waitpid(-pgid, os.WNOHANG)
        except ChildProcessError:
            return  # none left
        if not got:
            time.sleep(0.005)  # (dying, or not re-parented yet)


def _drop(pid: int) -> None:
    """Kill and reap a process made ahead that no call will use (while it is still ours to signal)."""
    if pid in sweep.EXEMPT:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)
        sweep.EXEMPT.discard(pid)


def untouched(pid: int) -> bool:
    """Whether ``pid`` has what a child of the worker inherits: the same limits, nice value, CPU
    affinity, scheduling policy and I/O priority (each settable by any process of the same uid)."""
    try:
        for r in _RLIMITS:
            if resource.prlimit(pid, r) != resource.getrlimit(r):
                return False
        if os.getpriority(os.PRIO_PROCESS, pid) != os.getpriority(os.PRIO_PROCESS, 0):
            return False
        if os.sched_getaffinity(pid) != os.sched_getaffinity(0):
            return False
        if os.sched_getscheduler(pid) != os.sched_getscheduler(0):
            return False
        theirs = _ioprio(pid)
        return theirs == -1 or theirs == _ioprio(0)
    except OSError:
        return False


_libc: Any = None


def _ioprio(pid: int) -> int:
    global _libc
    if _IOPRIO_GET is None:
        raise OSError("ioprio_get: unknown on this architecture")
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    value = int(_libc.syscall(_IOPRIO_GET, 1, pid))  # IOPRIO_WHO_PROCESS
    if value < 0:
        err = ctypes.get_errno()
        if err in (errno.ENOSYS, errno.EPERM) and pid != 0:
            # gVisor's kernel answers another process's I/O priority with EPERM; toolcage's seccomp
            # lets no process set another's (ioprio_set only on the caller), so there is nothing to see
            return -1
        raise OSError(err, "ioprio_get")
    return value


# the worker's one zygote ------------------------------------------------------------------------
_current: Zygote | None = None
_wanted: tuple[dict[str, str], str] | None = None  # (env, cwd) of the last fast-path call


def enabled() -> bool:
    return sweep.active() and os.environ.get(contract.ENV_ZYGOTE, "1") != "0" and _IOPRIO_GET is not None


def pid() -> int | None:
    return _current.pid if _current is not None else None


def ahead_pid() -> int | None:
    """The process made ahead for the next call, while it waits (under gVisor), else None."""
    z = _current
    return z.ahead[0] if z is not None and z.ahead is not None else None


def spawn_argv(
    argv: list[str], stdin: bool, env: dict[str, str], cwd: str, tool_env: dict[str, str] | None = None
) -> Spawned | None:
    """With tool namespaces (gVisor): exec ``argv`` from a fork of the zygote that entered them, instead
    of a subprocess through nsinit (an interpreter's start, ~30 ms there); None: use subprocess.
    ``tool_env``: a user's own image: the program's environment, handed to the exec (the zygote runs with
    ``env``, the worker's: the image's LD_PRELOAD never runs in it)."""
    if not namespaces.enabled() or any("\0" in a for a in argv):
        return None
    if tool_env is None:
        return spawn("\0".join(argv), stdin, env, cwd, argv=True)
    return spawn(json.dumps(tool_env) + "\n" + "\0".join(argv), stdin, env, cwd, argv=True, with_env=True)


def spawn(
    source: str, stdin: bool, env: dict[str, str], cwd: str, argv: bool = False, with_env: bool = False
) -> Spawned | None:
    """Fork a call's child from the zygote, if one is ready for this env and cwd; None: use subprocess."""
    global _current, _wanted
    _wanted = (dict(env), cwd)
    z = _current
    if z is None or z.env != env or z.cwd != cwd:
        discard()  # none yet (started when the worker is next idle) or for other settings
        return None
    try:
        data = source.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        return None  # as subprocess would fail on it: take that path, and its error
    if not z.alive():
        discard()
        return None
    try:
        child = z.spawn(data, stdin, argv, with_env)
    except OSError:
        child = None
    if child is None:
        discard()
    return child


def warm() -> None:
    """While the worker is idle: (re)start the zygote a fast-path call asked for."""
    global _current
    if _wanted is None or _current is not None:
        return
    env, cwd = _wanted
    if _user_site(env):
        return  # its .pth files and usercustomize would run in the zygote: the subprocess path serves
    try:
        _current = Zygote(env, cwd)
    except OSError:
        _current = None


def _user_site(env: dict[str, str]) -> bool:
    """Whether a ``python3`` with this env runs a user site-packages directory at start (``site``: its
    ``.pth`` files and ``usercustomize``). HOME is /scratch, where tool code writes: what it plants
    there must never run in the zygote, which lives outside any call (beside a connector's call)."""
    base = env.get("PYTHONUSERBASE") or os.path.join(env.get("HOME") or "/nonexistent", ".local")
    site_dir = os.path.join(base, "lib", f"python{sys.version_info[0]}.{sys.version_info[1]}", "site-packages")
    try:
        return os.path.isdir(site_dir)
    except (OSError, ValueError):
        return True


def make_ahead(wake: int) -> bool:
    """While the worker is idle, with namespaces (gVisor): the next call's process made ahead by the zygote
    (Zygote.make_ahead). True: ``wake`` (the channel) is readable, a request waits."""
    z = _current
    if z is None or not namespaces.enabled():
        return False
    try:
        return z.make_ahead(wake)
    except OSError:
        discard()
        return False


def settle() -> None:
    """Before a sweep counts the sandbox's processes: the reply about a process made ahead, if one is awaited,
    read (its pid exempt), so that it is never counted as a call's survivor (nor the zygote killed for it)."""
    z = _current
    if z is None or not z.pending:
        return
    try:  # (a sweep runs with no code call in flight: no fork of the zygote meanwhile)
        z.collect(_REPLY_S)
    except OSError:
        discard()


def discard() -> None:
    global _current
    if _current is not None:
        _current.kill()
        _current = None
