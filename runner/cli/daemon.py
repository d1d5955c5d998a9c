"""``toolcage daemon start|stop|status``: a resident process that has imported what ``toolcage run`` needs,
and runs each ``toolcage run`` it is handed in a fork of itself (the client: ``toolcage.cli.entry``).

Each command runs in a process of its own, forked from the daemon when the client asks: it takes the
client's standard streams, working directory (as a descriptor), umask, environment and command line, and
runs ``toolcage.cli.main.main`` as the command's own process would. The daemon itself holds no thread, no
engine connection and no state of any command: it accepts, checks, forks and reaps.

- **Who may ask.** The socket lives in a directory of this user's that no one else may enter (0700), is
  itself 0600, and the daemon serves only a peer of its own uid (``SO_PEERCRED``). The client checks the
  same of the daemon (``toolcage.cli.entry``).
- **Whose rights.** A command runs with the daemon's rights, not its client's: so the daemon runs a
  client's commands only when that client's process is confined exactly as the daemon is (``peer_check``:
  capabilities, no_new_privs, seccomp, namespaces, root, cgroups, LSM label, limits). Without it, a process
  of this uid in a container, a sandbox or a hardened service could have a host command run unconfined
  (found by an attack on the first version, which checked the uid alone). Not seen: a Landlock domain,
  which /proc does not show.
- **Never stalled.** Requests are read as they come, beside one another, through the loop's selector: a
  client that sends nothing, or a byte at a time, holds only its own connection (5 s in all).
- **Which code runs.** The daemon declines a client of another install (its Python prefix, toolcage's
  directory or version differ: that client runs the command itself) and, once any toolcage module it
  loaded has changed on disk (an upgrade, an edit), declines every command and stops: a stale daemon
  never runs old code in place of the new.
- **Signals and ends.** A signal the client forwards (INT, TERM, HUP, QUIT) goes to the command's process;
  a client that goes away gets its command a SIGTERM (the sandbox is removed, as after a Ctrl-C); a daemon
  that dies takes its running commands with it the same way (``PR_SET_PDEATHSIG``). ``stop`` (or the
  daemon's own SIGTERM) stops taking commands at once and ends when the running ones have.
- **Bounded.** A request is at most 1 MiB (``entry.MAX_REQUEST``) and read within 5 s, at most 32 clients
  wait to be read (the oldest goes), and the log (``daemon.log`` beside the socket) starts again past 1 MiB.
"""

from __future__ import annotations

import array
import contextlib
import json
import os
import select
import selectors
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import click

from toolcage.cli import entry
from toolcage.cli.output import emit, use_json
from toolcage.errors import UsageError

READ_S = 5.0  # a client has this long to send its whole request
MAX_PENDING = 32  # clients whose request is still coming, at most (the oldest goes to make room)
START_S = 60.0  # `daemon start` waits this long for the new daemon to answer
LOG_MAX = 1 << 20
# what `toolcage run` imports, loaded once here (the rest it loads itself, in the command's process)
PRELOAD = (
    "toolcage.cli.main",
    "toolcage.cli.run",
    "toolcage.run",
    "toolcage.sandbox",
    "toolcage.backends.container",
    "toolcage.backends.gvisor",
    "toolcage.backends.process",
    "toolcage.engine.docker_adapter",
    "toolcage.engine.runtime",
    "toolcage.lifecycle.audit",
    "toolcage.lifecycle.audit_file",
    "toolcage.lifecycle.reaper",
    "toolcage.lifecycle.removal",
    "toolcage.lifecycle.watchdog",
    "toolcage.rpc.session",
    "toolcage.policies.loader",
    "toolcage.policies.bundled",
    "toolcage.interpreter",
    "toolcage.image.build",
    "toolcage.worker.tools",
    "toolcage.worker.tools.proc",
    "toolcage.precheck",
    "toolcage.telemetry",
    "toolcage.policies.overlay",
    "toolcage.worker.redaction",  # the call's result redacted (html.entities: 4.5 ms in each fork without it)
    "encodings.ascii",
    "netrc",
    "docker",
    "requests",
    "jsonrpcclient",
)


def _log(message: str) -> None:
    sys.stderr.write(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} [{os.getpid()}] {message}\n")
    sys.stderr.flush()


def package_files(modules: dict[str, Any], root: str) -> list[str]:
    """The files the loaded modules of the package at ``root`` were read from."""
    prefix = root.rstrip("/") + "/"
    found = {getattr(m, "__file__", None) for m in list(modules.values())}
    return sorted(p for p in found if isinstance(p, str) and p.startswith(prefix))


def code_stamp(files: list[str]) -> tuple[tuple[int, int], ...]:
    """What ``files`` are on disk now: (mtime, size) each, (-1, -1) for one gone."""
    out = []
    for path in files:
        try:
            st = os.stat(path)
        except OSError:
            out.append((-1, -1))
            continue
        out.append((st.st_mtime_ns, st.st_size))
    return tuple(out)


@dataclass
class _Pending:
    """A client whose request is still coming."""

    conn: socket.socket
    deadline: float  # monotonic: the whole request by then (READ_S after the connection)
    why: str  # "" when the daemon may run its commands, else why not (peer_check)
    buf: bytearray = field(default_factory=bytearray)
    fds: list[int] = field(default_factory=list)


# what a process's confinement is made of, read from /proc/PID (confinement): status lines, namespaces
# (Seccomp_filters: how many filters; one more is a tighter sandbox in the same mode)
_STATUS = frozenset(
    {"Uid", "Gid", "Groups", "CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb", "NoNewPrivs", "Seccomp"}
    | {"Seccomp_filters"}
)
_NAMESPACES = ("cgroup", "ipc", "mnt", "net", "pid", "time", "user", "uts")
SO_PEERPIDFD = 77  # Linux 6.5: a pidfd of the connecting process (the socket module names it from 3.13 only)


def confinement(pid: int | str) -> dict[str, str]:
    """Everything that confines process ``pid`` ("self": this one) beyond its uid: its ids and groups, its
    capability sets, no_new_privs, seccomp, its namespaces, its root directory (a chroot), its cgroups, its
    LSM label and its resource limits. A command the daemon runs has the daemon's: so only a client whose
    confinement is the same as the daemon's may have its commands run there."""
    base = f"/proc/{pid}"
    out: dict[str, str] = {}
    with open(f"{base}/status", encoding="utf-8", errors="replace") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in _STATUS:
                out[key] = " ".join(value.split())
    for ns in _NAMESPACES:
        with contextlib.suppress(FileNotFoundError):  # an older kernel has no time namespace
            out[f"namespace {ns}"] = os.readlink(f"{base}/ns/{ns}")
    st = os.stat(f"{base}/root")
    out["root directory"] = f"{st.st_dev}:{st.st_ino}"
    for name, path in (("cgroups", "cgroup"), ("resource limits", "limits"), ("LSM label", "attr/current")):
        try:
            with open(f"{base}/{path}", "rb") as f:
                out[name] = f.read(1 << 16).decode("utf-8", "replace")
        except OSError:
            out[name] = "-"
    return out


def peer_check(conn: socket.socket, mine: dict[str, str]) -> str:
    """ "" when the process at the other end of ``conn`` may have its commands run by the daemon: of this uid
    and confined exactly as the daemon is (else a confined process of this user, in a container, a sandbox
    or a hardened service, would have its command run with the daemon's rights). "uid" for another user's;
    otherwise what differs. The peer is read through a pidfd where the kernel gives one (SO_PEERPIDFD), and
    must still be that process once read, so a pid reused meanwhile is not mistaken for it."""
    pid, uid, _gid = entry.peer_cred(conn)  # the gids are among confinement()'s
    if uid != os.getuid():
        return "uid"
    if pid <= 0:
        return "its process is not visible from the daemon's PID namespace"
    try:
        pidfd = conn.getsockopt(socket.SOL_SOCKET, SO_PEERPIDFD)
    except OSError:
        pidfd = -1
    try:
        before = _started(pid)
        theirs = confinement(pid)
        if before != _started(pid) or (pidfd >= 0 and _exited(pidfd)):
            return "its process ended while it was checked"
    finally:
        if pidfd >= 0:
            os.close(pidfd)
    differ = [k for k in sorted(set(mine) | set(theirs)) if mine.get(k) != theirs.get(k)]
    return "its " + ", ".join(differ) + " differ from the daemon's" if differ else ""


def _started(pid: int) -> str:
    with open(f"/proc/{pid}/stat", "rb") as f:
        return f.read().rsplit(b")", 1)[-1].split()[19].decode()  # starttime: with the pid, one process


def _exited(pidfd: int) -> bool:
    poller = select.poll()
    poller.register(pidfd, select.POLLIN)
    return bool(poller.poll(0))


@dataclass
class _Command:
    pid: int
    conn: socket.socket  # its client's connection: signals come in on it, the exit status goes out


class Daemon:
    """The daemon's loop: one thread, a selector over the listening socket, the clients of running
    commands (their signals, their end) and a wake-up pipe for SIGCHLD and SIGTERM."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.install = entry.install()
        self.root = self.install[1]
        self.commands: dict[int, _Command] = {}
        self.served = 0
        self.stopping = False
        self.started = time.time()
        self.sel = selectors.DefaultSelector()
        self.listener: socket.socket | None = None
        self.inode = 0
        self.files: list[str] = []
        self.stamp: tuple[tuple[int, int], ...] = ()
        self.pending: dict[int, _Pending] = {}  # connections whose request is still coming, by descriptor
        self.confinement = confinement("self")

    # -- the loop -------------------------------------------------------------------------------------
    def serve(self) -> None:
        wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        signal.set_wakeup_fd(wake_w)
        for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: None)  # handled in the loop, woken by the pipe
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        self.files = package_files(sys.modules, self.root)
        self.stamp = code_stamp(self.files)
        self.listener = self._listen()
        self.sel.register(self.listener, selectors.EVENT_READ, "accept")
        self.sel.register(wake_r, selectors.EVENT_READ, "wake")
        _log(f"listening on {self.path} ({len(self.files)} toolcage modules loaded)")
        while not (self.stopping and not self.commands):
            waits = [p.deadline for p in self.pending.values()]
            timeout = max(0.0, min(waits) - time.monotonic()) if waits else None
            for key, _ in self.sel.select(timeout):
                try:
                    if key.data == "accept":
                        self._accept()
                    elif key.data == "wake":
                        self._woken(wake_r)
                    elif isinstance(key.data, _Pending):
                        self._on_request(key.data)
                    else:
                        self._from_client(key.data)
                except Exception as exc:  # one client's trouble never ends the daemon (nor its running commands)
                    _log(f"error: {type(exc).__name__}: {exc}")
            for late in [p for p in self.pending.values() if p.deadline <= time.monotonic()]:
                _log(f"a bad request: no whole request within {READ_S:.0f} s")
                self._drop_pending(late)
        _log("stopped")

    def _listen(self) -> socket.socket:
        bad = entry.unsafe_dir(self.path)  # `start` checked it; `python -m toolcage.cli.daemon PATH` may not have
        if bad:
            raise UsageError(f"the daemon's socket directory is not safe: {bad}")
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)  # a socket left by a daemon that died (its directory is this user's alone)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        old = os.umask(0o177)
        try:
            sock.bind(self.path)  # 0600
        finally:
            os.umask(old)
        sock.listen(64)
        self.inode = os.stat(self.path).st_ino
        return sock

    def _stop(self, why: str) -> None:
        if self.stopping:
            return
        self.stopping = True
        _log(f"stopping ({why}); {len(self.commands)} command(s) still running")
        if self.listener is not None:
            self.sel.unregister(self.listener)
            self.listener.close()
            self.listener = None
        with contextlib.suppress(OSError):
            if os.stat(self.path).st_ino == self.inode:  # not a newer daemon's socket
                os.unlink(self.path)

    def _woken(self, wake_r: int) -> None:
        with contextlib.suppress(BlockingIOError):
            got = os.read(wake_r, 512)
            if signal.SIGTERM in got or signal.SIGINT in got:
                self._stop("a signal")
        while self.commands:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            command = self.commands.pop(pid, None)
            if command is None:
                continue
            code = os.waitstatus_to_exitcode(status)
            self._send(command.conn, f"exit {code}" if code >= 0 else f"killed {-code}")
            self._drop(command)

    def _send(self, conn: socket.socket, line: str) -> None:
        with contextlib.suppress(OSError):
            conn.sendall(f"{line}\n".encode())

    def _drop(self, command: _Command) -> None:
        with contextlib.suppress(KeyError, ValueError):
            self.sel.unregister(command.conn)
        command.conn.close()

    def _from_client(self, command: _Command) -> None:
        """A forwarded signal, or the client's end (its command is told to stop)."""
        try:
            data = command.conn.recv(4096)
        except OSError:
            data = b""
        if not data:
            with contextlib.suppress(KeyError, ValueError):
                self.sel.unregister(command.conn)
            self._signal(command, signal.SIGTERM)
            return
        for line in data.decode("ascii", "replace").splitlines():
            kind, _, value = line.partition(" ")
            if kind == "signal" and value.isdigit() and int(value) in entry.FORWARDED:
                self._signal(command, int(value))

    def _signal(self, command: _Command, signum: int) -> None:
        if command.pid in self.commands:  # not reaped: the pid is still the command's
            with contextlib.suppress(ProcessLookupError):
                os.kill(command.pid, signum)

    # -- a client ---------------------------------------------------------------------------------------
    def _accept(self) -> None:
        """A new client: of this user and confined as the daemon is (see :func:`peer_check`), or refused; its
        request is then read as it comes, beside every other client's (never blocking the loop)."""
        assert self.listener is not None
        try:
            conn, _ = self.listener.accept()
        except OSError:
            return
        conn.setblocking(False)
        try:
            why = peer_check(conn, self.confinement)
        except OSError as exc:
            why = f"its process could not be inspected ({exc.strerror})"
        if why == "uid":
            _log("refused a client of another user")
            conn.close()
            return
        if len(self.pending) >= MAX_PENDING:  # the oldest waiting client makes room
            self._drop_pending(min(self.pending.values(), key=lambda p: p.deadline))
        pending = _Pending(conn, time.monotonic() + READ_S, why)
        self.pending[conn.fileno()] = pending
        self.sel.register(conn, selectors.EVENT_READ, pending)

    def _drop_pending(self, pending: _Pending) -> None:
        self.pending.pop(pending.conn.fileno(), None)
        with contextlib.suppress(KeyError, ValueError):
            self.sel.unregister(pending.conn)
        for fd in pending.fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        pending.fds.clear()
        pending.conn.close()

    def _on_request(self, pending: _Pending) -> None:
        """More of a request: once it is whole, answered (``ping``, ``stop``) or run (``run``)."""
        try:
            data, ancdata, flags, _ = pending.conn.recvmsg(1 << 16, socket.CMSG_SPACE(8 * array.array("i").itemsize))
        except BlockingIOError:
            return
        except OSError as exc:
            _log(f"a bad request: {exc}")
            self._drop_pending(pending)
            return
        for level, kind, raw in ancdata:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                got = array.array("i")
                got.frombytes(raw[: len(raw) - len(raw) % got.itemsize])
                pending.fds.extend(got)
        problem = ""
        if flags & socket.MSG_CTRUNC or len(pending.fds) > 4:
            problem = "too many descriptors"
        elif not data:
            problem = "the request ended early"
        pending.buf += data
        size = int.from_bytes(pending.buf[: entry.HEADER], "big") if len(pending.buf) >= entry.HEADER else 0
        if size > entry.MAX_REQUEST:
            problem = f"a request of {size} bytes"
        if problem:
            _log(f"a bad request: {problem}")
            self._drop_pending(pending)
            return
        if len(pending.buf) < entry.HEADER + size:  # (size is 0 until the header is whole)
            return  # more to come
        try:
            request = json.loads(pending.buf[entry.HEADER : entry.HEADER + size])
            if not isinstance(request, dict):
                raise ValueError("not a JSON object")
        except (ValueError, RecursionError) as exc:  # RecursionError: JSON nested past the parser's depth
            _log(f"a bad request: {type(exc).__name__}: {str(exc)[:200]}")
            self._drop_pending(pending)
            return
        self.pending.pop(pending.conn.fileno(), None)
        self.sel.unregister(pending.conn)
        conn, fds = pending.conn, pending.fds
        conn.setblocking(True)
        try:
            self._answer(conn, request, fds, pending.why)
        finally:
            for fd in fds:
                os.close(fd)

    def _answer(self, conn: socket.socket, request: dict[str, Any], fds: list[int], why: str) -> None:
        op = request.get("op")
        if op == "ping":  # a confined client may ask whether it would be served, and nothing more
            self._send(conn, "pong " + json.dumps({**self.status(), "serves_you": not why, "why_not": why}))
            conn.close()
        elif op in ("stop", "run") and why:
            self._send(conn, f"declined confined: {why}")
            conn.close()
        elif op == "stop":
            self._stop("asked")
            self._send(conn, "stopping " + json.dumps(self.status()))
            conn.close()
        elif op == "run":
            self._run(conn, request, fds)
        else:
            conn.close()

    def _run(self, conn: socket.socket, request: dict[str, Any], fds: list[int]) -> None:
        why = self._declined(request, fds)
        if why:
            self._send(conn, f"declined {why}")
            conn.close()
            return
        sys.stdout.flush()
        sys.stderr.flush()
        parent = os.getpid()
        try:
            pid = os.fork()
        except OSError as exc:  # out of processes or memory: the client runs the command itself
            self._send(conn, f"declined fork-failed {exc.errno}")
            conn.close()
            return
        if pid == 0:
            try:
                _become_command(request, fds, self, parent)
            except BaseException as exc:  # main() ends the process itself: this is a failure to get there
                with contextlib.suppress(BaseException):
                    os.write(2, f"toolcage: error: the daemon could not run the command: {exc!r}\n".encode())
            finally:
                os._exit(70)  # never back into the daemon's loop
        conn.settimeout(None)
        command = _Command(pid, conn)
        self.commands[pid] = command
        self.served += 1
        self._send(conn, f"started {pid}")
        self.sel.register(conn, selectors.EVENT_READ, command)

    def _declined(self, request: dict[str, Any], fds: list[int]) -> str:
        if self.stopping:
            return "stopping"
        if request.get("install") != self.install:
            return "another-install"
        if code_stamp(self.files) != self.stamp:
            self._stop("toolcage's code changed on disk")
            return "stale"
        argv, env = request.get("argv"), request.get("env")
        if not (isinstance(argv, list) and all(isinstance(a, str) for a in argv) and argv[:1] == ["run"]):
            return "bad-argv"
        if not (isinstance(env, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in env.items())):
            return "bad-env"
        if len(fds) != 4 or not isinstance(request.get("umask"), int):
            return "bad-request"
        return ""

    def status(self) -> dict[str, Any]:
        return {
            "pid": os.getpid(),
            "socket": self.path,
            "commands_running": len(self.commands),
            "commands_served": self.served,
            "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.started)),
            "version": self.install[2],
            "install": self.install[:2],  # its Python prefix and toolcage's directory
            "stale": code_stamp(self.files) != self.stamp,  # toolcage's code changed since it started
            "stopping": self.stopping,
        }


def _become_command(request: dict[str, Any], fds: list[int], daemon: Daemon, parent: int) -> None:
    """In the forked child: become the client's ``toolcage`` process, then run the command (never returns)."""
    os.setsid()  # not the daemon's process group: a signal to it is not for the command
    signal.set_wakeup_fd(-1)
    for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)
    _die_with_parent(parent)
    daemon.sel.close()
    for fd, target in zip(fds[:3], (0, 1, 2), strict=True):
        os.dup2(fd, target)  # inheritable, as a process's own standard streams are
    os.fchdir(fds[3])
    for name in os.listdir("/proc/self/fd"):  # the listener, other clients, the wake-up pipe: not the command's
        if int(name) > 2:
            with contextlib.suppress(OSError):
                os.close(int(name))
    os.umask(int(request["umask"]) & 0o777)
    os.environ.clear()
    os.environ.update(request["env"])
    import tempfile

    tempfile.tempdir = None  # chosen again from this environment's TMPDIR
    encoding, errors = sys.stdout.encoding, sys.stdout.errors
    sys.stdin = open(0, encoding=encoding, errors=errors, closefd=False)  # noqa: SIM115
    # line-buffered to a terminal (stderr always), as the interpreter sets up its own streams
    sys.stdout = open(1, "w", 1 if os.isatty(1) else -1, encoding, errors, closefd=False)  # noqa: SIM115
    sys.stderr = open(2, "w", 1, encoding, "backslashreplace", closefd=False)  # noqa: SIM115
    prog = str(request.get("prog") or "toolcage")
    sys.argv = [prog, *request["argv"]]
    from toolcage.cli.main import main

    main(prog_name=prog)  # ends the process itself (startup.exit_now)


def _die_with_parent(parent: int) -> None:
    """SIGTERM to this process when the daemon dies (as when its client does), if it has not already."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, int(signal.SIGTERM), 0, 0, 0)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:
        os.kill(os.getpid(), signal.SIGTERM)


def preload() -> None:
    """Import what ``toolcage run`` will (structlog as the command loads it: without rich)."""
    import importlib

    from toolcage import logs

    for name in PRELOAD:
        importlib.import_module(name)
    logs._Cli.without_rich = True
    logs._structlog()
    logs._Cli.without_rich = False
    import gc

    gc.collect()
    gc.freeze()  # what was imported is shared with every fork, not copied by the collector's writes


def daemon_main(path: str) -> None:
    """``python -m toolcage.cli.daemon PATH``: the daemon itself (``toolcage daemon start`` runs it)."""
    preload()
    try:
        Daemon(path).serve()
    except Exception as exc:
        _log(f"failed: {type(exc).__name__}: {exc}")
        raise SystemExit(1) from None


# -- the commands ---------------------------------------------------------------------------------------
def _where() -> str:
    path = entry.socket_path()
    if path is None:
        raise UsageError(f"{entry.ENV}=off: unset it, or name a socket path, to use the daemon")
    if len(path.encode()) > entry.SUN_PATH_MAX:
        raise UsageError(
            f"the daemon's socket path is {len(path.encode())} bytes, more than a Unix socket's {entry.SUN_PATH_MAX}: "
            f"set {entry.ENV} to a shorter path (in a directory of yours with mode 0700)"
        )
    return path


def ask(path: str, op: str) -> dict[str, Any] | None:
    """The daemon's answer to ``ping`` or ``stop``, or None when no daemon (to be trusted) answers there."""
    sock = entry.connect(path, timeout=READ_S)
    if sock is None:
        return None
    with sock:
        try:
            sock.sendall(entry.frame({"op": op}))
            line = entry.Lines(sock).next()
        except OSError:
            return None
    if line is None:
        return None
    kind, _, body = line.partition(" ")
    if kind == "declined":
        return {"declined": body}
    try:
        answer = json.loads(body)
    except ValueError:
        return None
    return answer if isinstance(answer, dict) else None


@click.group()
def daemon() -> None:
    """A resident process that makes `toolcage run` start faster: it imports once what every run would,
    and runs each `toolcage run` in a fresh fork of itself (same streams, directory and environment).
    `toolcage run` uses it whenever it answers; TOOLCAGE_DAEMON=off never does, TOOLCAGE_DAEMON=PATH
    uses the one listening at PATH."""
    use_json(True)


@daemon.command()
@click.option(
    "--foreground",
    is_flag=True,
    help="Run the daemon in this process (to watch it, or under a supervisor in the session it serves).",
)
def start(foreground: bool) -> None:
    """Start the daemon (nothing to do if one runs); prints its pid, socket and log as JSON."""
    path = _where()
    where = os.path.dirname(path)
    try:
        os.makedirs(where, mode=0o700, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"cannot make {where}: {exc.strerror}") from None
    bad = entry.unsafe_dir(path)
    if bad:
        raise UsageError(f"the daemon's socket directory is not safe: {bad}")
    running = ask(path, "ping")
    if running is not None and running.get("install") != entry.install()[:2]:
        raise UsageError(
            f"a daemon of another install (Python prefix {running.get('install')}) listens at {path}: stop it with "
            f"that install's `toolcage daemon stop`, or give this one a socket of its own ({entry.ENV}=PATH)"
        )
    if running is not None and (running.get("stale") or running.get("stopping")):
        ask(path, "stop")  # its code changed on disk: it runs nothing more; a new one takes its socket
        running = None
    if running is not None:
        emit({"status": "running", **running})
        return
    if running is None and _listening(path):  # alive but not answering: another would orphan it
        raise UsageError(
            f"a process listens at {path} but did not answer as a daemon within {READ_S:.0f} s: stop it "
            f"(`toolcage daemon stop`, or by its pid) before starting another"
        )
    argv = [sys.executable, "-m", "toolcage.cli.daemon", path]
    if foreground:
        sys.stdout.flush()
        os.execv(sys.executable, argv)  # noqa: S606  # this Python, a fixed module, no shell
    log = os.path.join(where, "daemon.log")
    with contextlib.suppress(OSError):
        if os.path.getsize(log) > LOG_MAX:
            os.unlink(log)
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
    try:
        proc = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=fd, stderr=fd, start_new_session=True, close_fds=True
        )
    finally:
        os.close(fd)
    deadline = time.monotonic() + START_S
    while time.monotonic() < deadline:
        answer = ask(path, "ping")
        if answer is not None and answer.get("pid") == proc.pid:
            emit({"status": "started", **answer, "log": log})
            return
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    else:
        proc.terminate()
    raise UsageError(f"the daemon did not start (its log: {log}): {_tail(log)}")


def _listening(path: str) -> bool:
    """Whether something accepts connections at ``path`` (a socket left by a dead daemon refuses them)."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    try:
        probe.connect(path)
    except OSError:
        return False
    finally:
        probe.close()
    return True


def _tail(log: str) -> str:
    try:
        with open(log, "rb") as f:
            f.seek(max(0, os.path.getsize(log) - 400))
            return f.read().decode("utf-8", "replace").strip().splitlines()[-1]
    except (OSError, IndexError):
        return "no log"


@daemon.command()
def stop() -> None:
    """Stop the daemon: it takes no new command, and ends once the running ones have."""
    answer = ask(_where(), "stop")
    if answer is not None and "declined" in answer:
        raise UsageError(f"the daemon will not be stopped from this process: {answer['declined']}")
    emit({"status": "not running"} if answer is None else {"status": "stopping", **answer})


@daemon.command()
def status() -> None:
    """Whether the daemon runs: its pid, socket, version and the commands it runs now."""
    path = _where()
    answer = ask(path, "ping")
    emit({"status": "not running", "socket": path} if answer is None else {"status": "running", **answer})


def register(group: click.Group) -> None:
    group.add_command(daemon)


__all__ = ["Daemon", "code_stamp", "daemon", "daemon_main", "package_files", "register"]

if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m toolcage.cli.daemon SOCKET (`toolcage daemon start` runs it)")
    daemon_main(sys.argv[1])
