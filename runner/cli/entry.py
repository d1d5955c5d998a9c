"""The ``toolcage`` console script: ``toolcage run`` through the resident process when one runs, every other
command (and ``run`` when none answers) in this process.

A cold ``toolcage run`` spends about 40% of its time importing (click, docker-py and requests, the standard
library they pull, toolcage itself: ``bench.split_cli``). ``toolcage daemon start`` (``toolcage.cli.daemon``)
keeps a process that has imported all of it once; this client, which imports nothing but ``socket`` and
``json``, hands it the command line, the environment, the working directory and its standard streams (as
file descriptors), and the daemon forks a copy of itself that runs exactly what this process would have run,
with this process's streams, directory and environment. Signals this process gets go on to that copy, its
exit status comes back as this process's, and if this process dies, the copy is told to stop (SIGTERM:
the sandbox is removed, as after a Ctrl-C).

Threat: another local user posing as the daemon, to be handed this process's environment (its secrets) and
streams. The socket's directory must be this user's own and closed to everyone else (0700), and the process
listening on it must run as this user (``SO_PEERCRED``); anything else and the command runs here, the
daemon unasked. The daemon checks the same of every client, and runs the command of a client only when that
client is confined exactly as the daemon is (``toolcage.cli.daemon.peer_check``). ``TOOLCAGE_DAEMON=off``
never asks it; ``TOOLCAGE_DAEMON=/path/to.sock`` asks the daemon listening there instead of the default
(``$XDG_STATE_HOME/toolcage/daemon/daemon.sock``, else under ``~/.local/state``).
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

from toolcage.policies import contract

if TYPE_CHECKING:
    import socket
    from collections.abc import Mapping

ENV = contract.ENV_DAEMON
OFF = ("off", "0", "no", "false")
HEADER = 4  # a request: 4 bytes of length (big-endian), then that many bytes of JSON
MAX_REQUEST = 1 << 20  # the daemon reads no longer request (a larger environment runs the command here)
SUN_PATH_MAX = 107  # sockaddr_un's path, less its terminating NUL
# SIGINT, SIGTERM, SIGHUP, SIGQUIT, passed on to the command's process; by number, as importing signal's
# enums costs a few ms the client need not pay
FORWARDED = (2, 15, 1, 3)


def socket_path(environ: Mapping[str, str] | None = None) -> str | None:
    """Where the daemon listens, or None: asked not to be used (``TOOLCAGE_DAEMON=off``)."""
    env = os.environ if environ is None else environ
    chosen = env.get(ENV, "").strip()
    if chosen.lower() in OFF:
        return None
    if chosen:
        return os.path.abspath(os.path.expanduser(chosen))
    state = env.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return os.path.join(state, "toolcage", "daemon", "daemon.sock")


def unsafe_dir(path: str) -> str | None:
    """Why the socket at ``path`` may not be trusted with a command's environment, or None: its directory
    must be a real directory of this user's, which no one else may enter or write (0700)."""
    where = os.path.dirname(path)
    try:
        st = os.lstat(where)
    except OSError as exc:
        return f"{where}: {exc.strerror}"
    if st.st_mode & 0o170000 != 0o040000:  # S_IFDIR, without importing stat
        return f"{where} is not a directory"
    if st.st_uid != os.getuid():
        return f"{where} belongs to uid {st.st_uid}, not to this user ({os.getuid()})"
    if st.st_mode & 0o077:
        return f"{where} is open to others (mode {st.st_mode & 0o777:o}); it must be 0700"
    return None


def peer_cred(sock: socket.socket) -> tuple[int, int, int]:
    """(pid, uid, gid) of the process at the other end of a connected Unix socket (``SO_PEERCRED``)."""
    import socket
    import struct

    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, gid = struct.unpack("3i", raw)
    return int(pid), int(uid), int(gid)


def install() -> list[str]:
    """Which toolcage this is: its Python prefix, toolcage's directory and version (the daemon runs only its own)."""
    import toolcage

    return [sys.prefix, os.path.dirname(os.path.abspath(toolcage.__file__)), toolcage.__version__]


def frame(request: dict[str, object]) -> bytes:
    import json

    body = json.dumps(request, separators=(",", ":")).encode()
    return len(body).to_bytes(HEADER, "big") + body


def connect(path: str, timeout: float) -> socket.socket | None:
    """A connection to the daemon at ``path`` that this user may trust, or None (no daemon, or one not to be
    trusted: see the module's threat)."""
    import socket

    if len(path.encode()) > SUN_PATH_MAX or unsafe_dir(path) is not None:
        return None
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    sock.settimeout(timeout)
    try:
        sock.connect(path)
        if peer_cred(sock)[1] != os.getuid():
            sock.close()
            return None
    except OSError:
        sock.close()
        return None
    return sock


class Lines:
    """The daemon's answers: one line each."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = b""

    def next(self) -> str | None:
        """The next line, or None at the connection's end."""
        while b"\n" not in self.buf:
            chunk = self.sock.recv(4096)
            if not chunk:
                return None
            self.buf += chunk
            if len(self.buf) > 65536:
                return None
        line, _, self.buf = self.buf.partition(b"\n")
        return line.decode("utf-8", "replace")


def via_daemon(argv: list[str]) -> int | None:
    """Run ``toolcage`` + argv through the daemon: its exit status, or None when no daemon took it (none runs,
    none to be trusted, or it declined: a different install, or code changed since it started)."""
    path = socket_path()
    if path is None:
        return None
    sock = connect(path, timeout=10.0)
    if sock is None:
        return None
    import socket

    try:
        for fd in (0, 1, 2):
            os.fstat(fd)  # a stream this process lacks is not to be given the daemon's (nor the cwd's) number
        cwd = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        sock.close()
        return None
    try:
        umask = os.umask(0)
        os.umask(umask)
        request = {
            "op": "run",
            "argv": argv,
            "prog": _prog(),
            "env": dict(os.environ),
            "umask": umask,
            "install": install(),
        }
        data = frame(request)
        if len(data) > HEADER + MAX_REQUEST:
            return None
        fds = [0, 1, 2, cwd]
        import array

        ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds).tobytes())]
        sock.sendmsg([data[:HEADER]], ancillary)  # the descriptors travel with the first bytes
        sock.sendall(data[HEADER:])
        lines = Lines(sock)
        first = lines.next()
    except OSError:
        return None  # the daemon went away before it took the command: run it here
    finally:
        os.close(cwd)
    if first is None or not first.startswith("started "):
        sock.close()
        return None  # declined (first says why) or gone: run it here
    return _follow(sock, lines)


def _prog() -> str:
    """The program's name as click would tell it in this process (``toolcage``, ``python -m toolcage.cli``)."""
    package = getattr(sys.modules.get("__main__"), "__package__", None)
    name = os.path.splitext(os.path.basename(sys.argv[0]))[0]
    if not package:
        return os.path.basename(sys.argv[0]) or "toolcage"
    return f"python -m {package}" + ("" if name == "__main__" else f".{name}")


def _follow(sock: socket.socket, lines: Lines) -> int:
    """The command runs in the daemon's copy: pass on this process's signals, return its exit status."""
    import signal

    def forward(signum: int, frame: object) -> None:
        try:
            sock.sendall(f"signal {signum}\n".encode())
        except OSError:
            pass

    for signum in FORWARDED:
        signal.signal(signum, forward)
    sock.settimeout(None)
    while True:
        try:
            line = lines.next()
        except OSError:
            line = None
        if line is None:
            sys.stderr.write("toolcage: error: the toolcage daemon ended during the command; it was stopped\n")
            return 3
        kind, _, value = line.partition(" ")
        if kind == "exit" and value.isdigit():
            return int(value)
        if kind == "killed" and value.isdigit():
            return 128 + int(value)


def main() -> None:
    argv = sys.argv[1:]
    if argv[:1] == ["run"]:
        status = via_daemon(argv)
        if status is not None:
            os._exit(status)  # this process wrote nothing: nothing to flush, nothing to tear down
    from toolcage.cli.main import main as in_process

    in_process()


__all__ = ["install", "main", "peer_cred", "socket_path", "unsafe_dir", "via_daemon"]
