"""Exposed ports: a sandbox's TCP port reached from the host, the sandbox still without a network.

The host side listens on 127.0.0.1 only (a random port by default). Each connection it accepts is relayed
through a process the engine execs in the sandbox for it (``EngineAPI.exec_socket``): a few lines of the
sandbox's own Python, run as the sandbox's user, copying its stdin to a TCP connection to
``127.0.0.1:PORT`` inside the sandbox and that connection back to its stdout. Nothing of the container's
network changes (it keeps only ``lo``; the policy's network is untouched), and the relay is one way in: it
connects to the one port the caller named, its stdout reaches only the host client that connected, and a
process of the sandbox cannot reach the host's loopback (another network namespace, no route).

Bounds, per sandbox: at most ``max_connections`` relayed connections at once (past it, a connection is
accepted and closed at once), and ``bytes_per_s`` through all of them, both ways (a token bucket of one
second's worth). Everything dies with the sandbox: ``Ports.close`` closes every listener and connection,
and a relay process is in the container, which ends with its run (a runner killed by SIGKILL too: the
reaper and the run's deadline end the container, and the host side was the runner's own sockets).

Errors: a port outside 1..65535 or a sandbox not running, UsageError; an engine without exec, SandboxError.
"""

from __future__ import annotations

import socket
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from toolcage import logs
from toolcage.engine.runtime import RT
from toolcage.errors import SandboxError, ToolcageError, UsageError
from toolcage.policies import contract

if TYPE_CHECKING:
    from toolcage.engine.api import EngineAPI

HOST = "127.0.0.1"
MAX_CONNECTIONS = 64  # relayed connections at once, per sandbox, at most (see max_connections)
BYTES_PER_S = 512 * 1024 * 1024  # through every relay of a sandbox, both ways
CHUNK = 64 * 1024  # what one read of either side takes (each relay holds at most this per direction)
RT_PYTHON = (f"{RT}/bin/python3", "-S")  # a user's own image: the runtime's (toolcage.engine.runtime)
WORKER_PYTHON = ("python3", "-I", "-S")  # the worker image's own

# The relay, run in the sandbox: stdin -> 127.0.0.1:PORT, and back to stdout. A refused connection exits 3
# without a word (the host closes its client's connection); the end of either side ends it.
RELAY = """\
import os,select,socket
if os.environ.get(%r):
    import ctypes,importlib.util as u
    sp=u.spec_from_file_location("nsinit",%r)
    m=u.module_from_spec(sp)
    sp.loader.exec_module(m)
    if not m.stack_filter(ctypes.CDLL(None,use_errno=True),("mincore",)):
        os._exit(126)
try:
    s=socket.create_connection(("127.0.0.1",%d))
    s.setsockopt(socket.IPPROTO_TCP,socket.TCP_NODELAY,1)
except OSError:
    os._exit(3)
def out(b):
    v=memoryview(b)
    while v:
        v=v[os.write(1,v):]
p=select.poll()
p.register(0,select.POLLIN)
p.register(s,select.POLLIN)
try:
    while True:
        for fd,ev in p.poll():
            if fd==0:
                b=os.read(0,65536)
                if b:
                    s.sendall(b)
                else:
                    p.unregister(0)
                    s.shutdown(socket.SHUT_WR)
            else:
                b=s.recv(65536)
                if not b:
                    os._exit(0)
                out(b)
except OSError:
    pass
os._exit(0)
"""


# In a run with a cached workspace copy (TOOLCAGE_COPY_LOWER set: the container's profile allows unshare and mount
# for the worker's boot, toolcage.worker.copyfs), the relay, which the engine execs beside the worker and so does not
# descend from it, stacks the worker's filter on itself first, from the toolcage the sandbox runs (read-only)
_SEAL = (contract.ENV_COPY_LOWER, "/opt/toolcage/lib/toolcage/worker/children/nsinit.py")


def max_connections(pids: int) -> int:
    """The cap on a sandbox's relayed connections: each relay is one process of the sandbox (one task, about
    8 MiB), counted against its pids and memory limits, so a quarter of its pids at most (16 of the default 64)."""
    return max(1, min(MAX_CONNECTIONS, pids // 4))


def check_port(port: Any, what: str = "port") -> int:
    """A TCP port number 1..65535 (``what`` names it in the UsageError)."""
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        raise UsageError(f"{what} must be a TCP port number 1..65535, not {port!r}")
    return port


def relay_command(port: int, foreign: bool) -> list[str]:
    """The relay's argv: the sandbox's own Python (the runtime's for a user's own image) on :data:`RELAY`."""
    return [*(RT_PYTHON if foreign else WORKER_PYTHON), "-c", RELAY % (*_SEAL, check_port(port))]


@dataclass(frozen=True)
class ExposedPort:
    """A sandbox port reached from the host: ``host:port`` on the host relays to ``sandbox_port`` inside."""

    host: str
    port: int  # the host side's
    sandbox_port: int

    def url(self, scheme: str = "http") -> str:
        return f"{scheme}://{self.host}:{self.port}"


class TokenBucket:
    """``rate`` bytes a second, at most one second's worth in hand; ``take`` sleeps until it may."""

    def __init__(self, rate: int) -> None:
        self.rate = max(1, int(rate))
        self._tokens = float(self.rate)
        self._at = time.monotonic()
        self._lock = threading.Lock()

    def take(self, n: int) -> None:
        while True:
            with self._lock:
                now = time.monotonic()
                self._tokens = min(float(self.rate), self._tokens + (now - self._at) * self.rate)
                self._at = now
                if self._tokens >= min(n, self.rate):
                    self._tokens -= n
                    return
                wait = (min(n, self.rate) - self._tokens) / self.rate
            time.sleep(min(wait, 0.5))


def _frames(sock: socket.socket, deliver: Callable[[bytes], None]) -> None:
    """Read the engine's multiplexed stream (8-byte headers: stream, 0, 0, 0, size) until EOF; stdout's
    payload goes to ``deliver``, stderr's is dropped (read in bounded pieces, never kept)."""
    head = b""
    while True:
        while len(head) < 8:
            got = sock.recv(8 - len(head))
            if not got:
                return
            head += got
        stream, size = head[0], struct.unpack(">I", head[4:8])[0]
        head = b""
        while size:
            got = sock.recv(min(size, CHUNK))
            if not got:
                return
            size -= len(got)
            if stream == 1:
                deliver(got)


def _quiet(fn: Callable[[], Any]) -> None:
    try:
        fn()
    except OSError:
        pass


class _Conn:
    """One relayed connection: the host client's socket and its relay's exec socket, two pumping threads."""

    def __init__(self, client: socket.socket) -> None:
        self.client = client
        self.relay: socket.socket | None = None
        self.close_relay: Callable[[], None] | None = None
        self.closed = False
        self.lock = threading.Lock()

    def close(self) -> None:
        with self.lock:
            if self.closed:
                return
            self.closed = True
        _quiet(lambda: self.client.shutdown(socket.SHUT_RDWR))
        _quiet(self.client.close)
        if self.relay is not None:
            _quiet(lambda: self.relay.shutdown(socket.SHUT_RDWR))  # type: ignore[union-attr]
        if self.close_relay is not None:
            self.close_relay()


class Ports:
    """A sandbox's exposed ports: one listener each, relayed connections shared under one cap and one
    byte rate. ``target()`` says where a relay runs: (engine, container id, foreign image?), or raises."""

    def __init__(
        self,
        target: Callable[[], tuple[EngineAPI, str, bool]],
        *,
        max_connections: int = MAX_CONNECTIONS,
        bytes_per_s: int = BYTES_PER_S,
        log: Any = None,
    ) -> None:
        self._target = target
        self.max_connections = max_connections
        self.bucket = TokenBucket(bytes_per_s)
        self.log = log if log is not None else logs.get_logger()
        self._lock = threading.Lock()
        self._listeners: dict[int, tuple[ExposedPort, socket.socket, threading.Thread]] = {}
        self._conns: set[_Conn] = set()
        self._threads: set[threading.Thread] = set()
        self._closed = False

    # the API ----------------------------------------------------------------------------
    def expose(self, port: int, host_port: int = 0) -> ExposedPort:
        """Listen on 127.0.0.1:``host_port`` (0: a free one) and relay to the sandbox's ``port``. The same
        ``port`` again: its ExposedPort (a different ``host_port`` asked then is a UsageError)."""
        check_port(port)
        if host_port != 0:
            check_port(host_port, "host_port")
        engine, cid, foreign = self._target()
        if not hasattr(engine, "exec_socket"):
            raise SandboxError("this engine cannot run a process in a sandbox (no exec): no port can be exposed")
        with self._lock:
            if self._closed:
                raise UsageError("the sandbox is closed: no port can be exposed")
            known = self._listeners.get(port)
            if known is not None:
                if host_port not in (0, known[0].port):
                    raise UsageError(f"sandbox port {port} is exposed already, at {known[0].url()}")
                return known[0]
            listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                listener.bind((HOST, host_port))
                listener.listen(64)
            except OSError as exc:
                listener.close()
                raise UsageError(f"cannot listen on {HOST}:{host_port}: {exc.strerror or exc}") from None
            exposed = ExposedPort(HOST, listener.getsockname()[1], port)
            thread = threading.Thread(
                target=self._accept, args=(listener, exposed, engine, cid, foreign),
                name=f"toolcage-port-{port}", daemon=True,
            )  # fmt: skip
            self._listeners[port] = (exposed, listener, thread)
            thread.start()
        self.log.info("port.exposed", sandbox_port=port, host=HOST, host_port=exposed.port)
        return exposed

    def exposed(self) -> dict[int, ExposedPort]:
        with self._lock:
            return {port: entry[0] for port, entry in self._listeners.items()}

    def unexpose(self, port: int) -> None:
        """Stop listening for ``port`` (connections already relayed go on until either side ends them)."""
        check_port(port)
        with self._lock:
            entry = self._listeners.pop(port, None)
        if entry is not None:
            self._stop_listener(entry[1], entry[2])
            self.log.info("port.unexposed", sandbox_port=port)

    def close(self, timeout: float = 2.0) -> None:
        """Close every listener and every relayed connection; wait (up to ``timeout``) for their threads."""
        with self._lock:
            self._closed = True
            listeners, self._listeners = list(self._listeners.values()), {}
            conns = list(self._conns)
        for _, listener, thread in listeners:
            self._stop_listener(listener, thread)
        for conn in conns:
            conn.close()
        until = time.monotonic() + timeout
        with self._lock:
            threads = list(self._threads)
        for thread in threads:
            thread.join(max(0.0, until - time.monotonic()))

    def connections(self) -> int:
        with self._lock:
            return len(self._conns)

    # the work ---------------------------------------------------------------------------
    @staticmethod
    def _stop_listener(listener: socket.socket, thread: threading.Thread) -> None:
        _quiet(lambda: listener.shutdown(socket.SHUT_RDWR))  # wakes accept() (Linux: EINVAL)
        _quiet(listener.close)
        if thread is not threading.current_thread():
            thread.join(2.0)

    def _accept(
        self, listener: socket.socket, exposed: ExposedPort, engine: EngineAPI, cid: str, foreign: bool
    ) -> None:
        cmd = relay_command(exposed.sandbox_port, foreign)
        user = f"{contract.SANDBOX_UID}:{contract.SANDBOX_UID}"
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # closed
            _quiet(lambda: client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1))  # noqa: B023 - called now
            conn = _Conn(client)
            with self._lock:
                full = len(self._conns) >= self.max_connections
                if not full and not self._closed:
                    self._conns.add(conn)
            if full or self._closed:
                conn.close()
                if full:
                    self.log.warning("port.refused", sandbox_port=exposed.sandbox_port, reason="connections")
                continue
            thread = threading.Thread(
                target=self._relay, args=(conn, engine, cid, cmd, user), name="toolcage-relay", daemon=True
            )
            with self._lock:
                self._threads.add(thread)
            thread.start()

    def _relay(self, conn: _Conn, engine: EngineAPI, cid: str, cmd: list[str], user: str) -> None:
        down: threading.Thread | None = None
        try:
            try:
                relay, close_relay = engine.exec_socket(cid, cmd, user)
            except ToolcageError as exc:
                self.log.warning("port.relay_failed", error=str(exc)[:200])
                return
            with conn.lock:
                conn.relay, conn.close_relay = relay, close_relay
                closed = conn.closed
            if closed:
                close_relay()
                return
            down = threading.Thread(target=self._down, args=(conn, relay), name="toolcage-relay-down", daemon=True)
            with self._lock:
                self._threads.add(down)
            down.start()
            self._up(conn, relay)
            down.join()
        finally:
            conn.close()
            with self._lock:
                self._conns.discard(conn)
                self._threads.discard(threading.current_thread())
                if down is not None:
                    self._threads.discard(down)

    def _up(self, conn: _Conn, relay: socket.socket) -> None:
        """The host client's bytes to the relay's stdin; its EOF closes the relay's stdin."""
        try:
            while True:
                data = conn.client.recv(CHUNK)
                if not data:
                    relay.shutdown(socket.SHUT_WR)
                    return
                self.bucket.take(len(data))
                relay.sendall(data)
        except OSError:
            conn.close()

    def _down(self, conn: _Conn, relay: socket.socket) -> None:
        """The relay's stdout to the host client; its end (the sandbox's server closed, nobody listened,
        the sandbox ended) closes the client's connection."""

        def deliver(data: bytes) -> None:
            self.bucket.take(len(data))
            conn.client.sendall(data)

        try:
            _frames(relay, deliver)
        except OSError:
            pass
        finally:
            conn.close()


__all__ = [
    "BYTES_PER_S",
    "MAX_CONNECTIONS",
    "ExposedPort",
    "Ports",
    "TokenBucket",
    "check_port",
    "max_connections",
    "relay_command",
]
