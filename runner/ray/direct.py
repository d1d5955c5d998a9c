"""The direct channel from a driver to a node's agent: a run's or a session call's request and its answer
without a Ray actor call for each.

Ray finds the agent and watches it (``hello`` hands out this channel's address and key; a node that leaves
the cluster, or an agent Ray reports dead, closes the driver's channel to it, so a call waiting on it ends in
``NodeLost`` as it did through Ray). The request and the answer go over one TCP connection to the agent,
kept open between calls. On this repository's 2-core machine a Ray actor call cost a run 8 ms (4.6 ms to
reach the agent, 3.5 ms back), against well under 1 ms here.

What keeps it as closed as Ray's own channel:

- **Both ends prove the key.** The agent makes a 32-byte key when it starts and gives it only in its
  ``hello`` answer, i.e. to a client Ray lets call the actor. A connection opens with a challenge each way
  (HMAC-SHA256 of both nonces): the agent serves nothing to a peer that cannot answer, and the driver takes
  nothing from an address that cannot.
- **Every frame is signed** with a key of the connection's own (from the key and both nonces), a direction
  and a sequence number: a frame changed, replayed, reordered or sent back the other way closes the
  connection.
- **Requests are plain data.** The agent reads a request with an unpickler that loads no class at all
  (dicts, lists, tuples, strings, bytes, numbers, None): even a peer that holds the key cannot make it run code.
  The answer (a ``CallResult``, a ``ToolcageError``) is the agent's, as through Ray.
- **Bounded.** A frame says its size before it is read: a request over 64 MiB or an answer over 256 MiB
  closes the connection before anything is allocated for it; the challenge must be answered in 10 s, and at
  most 64 connections wait to answer it at once: the 65th pushes the oldest out (a flood cannot take the
  agent's file descriptors, and must outrun a driver's one round trip to push its connection out).
- **Only where Ray is in the clear.** With Ray's TLS on (``RAY_USE_TLS``) the agent opens no channel and the
  driver keeps Ray's, so a secret never travels less protected than Ray would carry it. Without TLS both
  carry it in the clear between machines; the key keeps others from using the channel, not from reading it.
- **A lost connection ends the run.** The agent cancels a request whose connection closed (its sandbox is
  removed); a driver whose connection dies after the request went out asks Ray whether the agent lives:
  ``NodeLost`` if not, else ``SandboxInterrupted`` (cancelled there); it never asks another node (the run may
  have had effects). A request the agent fails (wrong arguments, an answer that will not pickle) is answered
  with that error, on a connection that stays up. A channel that cannot be opened (a firewall between the
  driver and the node, a flood of keyless connections) is set aside for that agent for 30 s, and its calls go
  through Ray meanwhile.

Only ``run`` and a session's ``call`` take this path (:data:`METHODS`); opening and closing a session, files
and images stay on Ray.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import io
import os
import pickle
import secrets
import socket
import struct
import threading
from collections.abc import Awaitable, Callable
from typing import Any

from toolcage.errors import SandboxError

METHODS = frozenset({"run", "call"})
MAGIC = b"TCD1"
NONCE = 32
MAC = 32
HEADER = struct.Struct(">I")
MAX_REQUEST = 64 << 20
MAX_ANSWER = 256 << 20
HANDSHAKE_S = 10.0
BACKLOG = 32  # the listen queue: with MAX_CHALLENGES, what bounds the descriptors a flood holds at once
MAX_CHALLENGES = 64  # connections still to prove the key, at once: more are closed at once (no fd flood)
CONNECT_S = 3.0
HANDSHAKES = 8


class ChannelError(Exception):
    """The channel failed. ``sent``: whether the request may have reached the agent."""

    def __init__(self, message: str, *, sent: bool) -> None:
        super().__init__(message)
        self.sent = sent


def tls_on() -> bool:
    """Whether Ray carries its own traffic over TLS (then the direct channel is not used)."""
    return os.environ.get("RAY_USE_TLS", "0").strip().lower() in {"1", "true", "yes"}


def _mac(key: bytes, *parts: bytes) -> bytes:
    return hmac.new(key, b"".join(parts), hashlib.sha256).digest()


def _keys(token: bytes, nonce_s: bytes, nonce_c: bytes) -> tuple[bytes, bytes, bytes]:
    """The client's proof, the server's proof, and the connection's frame key."""
    return (
        _mac(token, b"tcd-client", nonce_s, nonce_c),
        _mac(token, b"tcd-server", nonce_s, nonce_c),
        _mac(token, b"tcd-frames", nonce_s, nonce_c),
    )


class _NoClasses(pickle.Unpickler):
    """Loads plain data only: any class or function a pickle names is refused."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"a request may not name {module}.{name}")


def loads_request(data: bytes) -> tuple[str, tuple[Any, ...]]:
    got = _NoClasses(io.BytesIO(data)).load()
    if (
        not isinstance(got, tuple)
        or len(got) != 2
        or not isinstance(got[0], str)
        or got[0] not in METHODS
        or not isinstance(got[1], tuple)
    ):
        raise pickle.UnpicklingError("a request is (method, args) for one of " + ", ".join(sorted(METHODS)))
    return got[0], got[1]


class _Signer:
    """One direction's frames: sequence numbers and MACs."""

    def __init__(self, key: bytes, direction: bytes) -> None:
        self.key, self.direction, self.seq = key, direction, 0

    def mac(self, payload: bytes) -> bytes:
        out = _mac(self.key, self.direction, self.seq.to_bytes(8, "big"), payload)
        self.seq += 1
        return out


# the driver's end ------------------------------------------------------------------------------


def _recv_exact(sock: socket.socket, n: int, closed: str) -> bytes:
    """``n`` bytes from ``sock``; ConnectionError(``closed``) if the peer closes first."""
    buf = bytearray()
    while len(buf) < n:
        got = sock.recv(min(n - len(buf), 1 << 20))
        if not got:
            raise ConnectionError(closed)
        buf += got
    return bytes(buf)


class _Conn:
    def __init__(self, sock: socket.socket, key: bytes) -> None:
        self.sock = sock
        self.out = _Signer(key, b"q")
        self.inn = _Signer(key, b"a")

    def exchange(self, payload: bytes) -> bytes:
        frame = HEADER.pack(len(payload)) + self.out.mac(payload)
        try:
            self.sock.sendall(frame + payload if len(payload) < 65536 else frame)
            if len(payload) >= 65536:
                self.sock.sendall(payload)
        except OSError as exc:
            raise ChannelError(f"the request could not be sent: {exc}", sent=True) from None
        try:
            (size,) = HEADER.unpack(_recv_exact(self.sock, HEADER.size, "the agent closed the connection"))
            if size > MAX_ANSWER:
                raise ChannelError(f"the agent's answer says {size} bytes, over {MAX_ANSWER}", sent=True)
            mac = _recv_exact(self.sock, MAC, "the agent closed the connection")
            body = _recv_exact(self.sock, size, "the agent closed the connection")
        except OSError as exc:
            raise ChannelError(f"the connection to the agent broke: {exc}", sent=True) from None
        if not hmac.compare_digest(mac, self.inn.mac(body)):
            raise ChannelError("an answer was not signed with the connection's key", sent=True)
        return body

    def abort(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self.abort()
        with contextlib.suppress(OSError):
            self.sock.close()


def _connect(host: str, port: int, token: bytes) -> _Conn:
    """A connection that has proved both ends; ChannelError(sent=False) if none can be made."""
    try:
        sock = socket.create_connection((host, port), timeout=CONNECT_S)
    except OSError as exc:
        raise ChannelError(f"the agent's channel at {host}:{port} cannot be reached: {exc}", sent=False) from None
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        hello = _recv_exact(sock, len(MAGIC) + NONCE, "closed during the challenge")
        if hello[: len(MAGIC)] != MAGIC:
            raise OSError("not a toolcage agent's channel")
        nonce_s, nonce_c = hello[len(MAGIC) :], secrets.token_bytes(NONCE)
        mine, theirs, key = _keys(token, nonce_s, nonce_c)
        sock.sendall(nonce_c + mine)
        proof = _recv_exact(sock, MAC, "the agent refused the key")
        if not hmac.compare_digest(proof, theirs):
            raise OSError("the peer could not prove the agent's key")
        sock.settimeout(None)
    except OSError as exc:
        with contextlib.suppress(OSError):
            sock.close()
        raise ChannelError(f"the agent's channel at {host}:{port} failed its challenge: {exc}", sent=False) from None
    return _Conn(sock, key)


class Channel:
    """The driver's channel to one agent: a few kept connections, one call at a time on each (a thread that
    calls takes an idle one, else opens one). :meth:`close` breaks every connection, so each waiting call
    ends (``ChannelError``)."""

    def __init__(self, host: str, port: int, token: bytes) -> None:
        self.host, self.port, self.token = host, port, token
        self._idle: list[_Conn] = []
        self._open: set[_Conn] = set()
        self._lock = threading.Lock()
        # handshakes this driver has in flight to the agent at once: a burst of callers must not push its own
        # connections out of the agent's challenge list (MAX_CHALLENGES); the others wait for one, or a free one
        self._handshakes = threading.BoundedSemaphore(HANDSHAKES)
        self.closed = False

    @classmethod
    def of(cls, info: Any) -> Channel | None:
        """The channel an agent's ``hello`` offers (``{"host", "port", "key"}``), or None."""
        if tls_on() or not isinstance(info, dict):
            return None
        try:
            return cls(str(info["host"]), int(info["port"]), bytes.fromhex(str(info["key"])))
        except (KeyError, ValueError, TypeError):
            return None

    def same(self, info: Any) -> bool:
        return isinstance(info, dict) and (info.get("host"), info.get("port")) == (self.host, self.port)

    def call(self, method: str, args: tuple[Any, ...], hold: Callable[[_Conn | None], bool] | None = None) -> Any:
        """The agent's answer to ``method(*args)``. ``hold`` is given the connection before the request is
        sent (an async caller aborts it when it is cancelled) and None once the answer is in; it returns False
        when it may have aborted the connection, which is then not kept."""
        payload = pickle.dumps((method, args), protocol=5)
        if len(payload) > MAX_REQUEST:
            raise ChannelError(f"the request is {len(payload)} bytes, over {MAX_REQUEST}", sent=False)
        conn = self._take()
        if hold is not None:
            hold(conn)
        try:
            body = conn.exchange(payload)
        except ChannelError:
            self._forget(conn)
            raise
        keep = hold(None) if hold is not None else True
        with self._lock:
            if self.closed or not keep:
                self._open.discard(conn)
                conn.close()
            else:
                self._idle.append(conn)
        return pickle.loads(body)  # noqa: S301 - signed by the agent, which proved the key (as Ray's answers)

    def _take(self) -> _Conn:
        with self._lock:
            if self.closed:
                raise ChannelError("the channel is closed (its agent was lost)", sent=False)
            if self._idle:
                return self._idle.pop()
        with self._handshakes:
            with self._lock:  # one may have been freed while this waited
                if self._idle and not self.closed:
                    return self._idle.pop()
            conn = _connect(self.host, self.port, self.token)
        with self._lock:
            if self.closed:
                conn.close()
                raise ChannelError("the channel is closed (its agent was lost)", sent=False)
            self._open.add(conn)
        return conn

    def _forget(self, conn: _Conn) -> None:
        with self._lock:
            self._open.discard(conn)
        conn.close()

    def close(self) -> None:
        """Break every connection: the calls waiting on them end now (the agent is lost)."""
        with self._lock:
            self.closed = True
            conns, self._open, self._idle = list(self._open), set(), []
        for conn in conns:
            conn.close()

    def retire(self) -> None:
        """Take no new calls; the calls in flight finish on their connections, which are closed after."""
        with self._lock:
            self.closed = True
            idle, self._idle = self._idle, []
            for conn in idle:
                self._open.discard(conn)
        for conn in idle:
            conn.close()


# the agent's end --------------------------------------------------------------------------------

Handler = Callable[..., Awaitable[Any]]
_GONE = object()  # what _answer says when the driver left before the answer


class Server:
    """The agent's end: serves ``handlers`` (method -> coroutine function returning an Outcome) to peers
    that prove ``token``; a request whose connection closes before its answer is cancelled."""

    def __init__(
        self, token: bytes, handlers: dict[str, Handler], dumps: Callable[[Any], bytes],
        on_error: Callable[[Exception, str], Any],
    ) -> None:  # fmt: skip
        self.token = token
        self.handlers = handlers
        self.dumps = dumps
        # the answer to a request the handler failed (stage "request") or whose answer would not pickle ("answer")
        self.on_error = on_error
        self.refused = 0  # connections that failed the challenge or sent a bad frame
        self.failed = 0  # requests whose answer could not be sent at all (its error would not pickle either)
        self.evicted = 0  # connections pushed out of the challenge list by a newer one
        self.peak = 0  # the most connections that waited on the challenge at once
        # connections yet to prove the key, oldest first; the next past MAX_CHALLENGES aborts the oldest's
        # transport (its read fails, its task ends as a refusal: a cancelled task is one logged error each)
        self.challenging: dict[asyncio.Task[Any], asyncio.StreamWriter] = {}
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[Any]] = set()

    async def start(self, host: str) -> tuple[str, int]:
        self._server = await asyncio.start_server(self._serve, host=host, port=0, limit=1 << 20, backlog=BACKLOG)
        port = self._server.sockets[0].getsockname()[1]
        return host, int(port)

    def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
        try:
            if len(self.challenging) >= MAX_CHALLENGES:  # the oldest goes: a driver answers in one round trip,
                oldest = next(iter(self.challenging))  # so a flood must outrun it to push it out
                self.challenging.pop(oldest).transport.abort()
                self.evicted += 1
            if task is not None:
                self.challenging[task] = writer
                self.peak = max(self.peak, len(self.challenging))
            try:
                key = await asyncio.wait_for(self._challenge(reader, writer, task), HANDSHAKE_S)
            finally:
                if task is not None:
                    self.challenging.pop(task, None)
            if key is None:
                self.refused += 1
                return
            inn, out = _Signer(key, b"q"), _Signer(key, b"a")
            while True:
                try:
                    (size,) = HEADER.unpack(await reader.readexactly(HEADER.size))
                except asyncio.IncompleteReadError:
                    return  # the driver closed an idle connection
                if size > MAX_REQUEST:
                    self.refused += 1
                    return
                mac = await reader.readexactly(MAC)
                body = await reader.readexactly(size)
                if not hmac.compare_digest(mac, inn.mac(body)):
                    self.refused += 1
                    return
                try:
                    method, args = loads_request(body)
                except Exception:
                    self.refused += 1
                    return
                try:
                    answer = await self._answer(reader, self.handlers[method](*args))
                except Exception as exc:  # the request failed, not the channel: say so, and go on serving
                    answer = self._failed(exc, "request")
                if answer is _GONE:
                    return  # the driver left mid-request: the request was cancelled
                try:
                    data = self.dumps(answer)
                except Exception as exc:
                    data = self.dumps(self._failed(exc, "answer"))
                writer.write(HEADER.pack(len(data)) + out.mac(data))
                writer.write(data)
                await writer.drain()
        except (TimeoutError, asyncio.IncompleteReadError, ConnectionError, OSError):
            return
        except Exception:  # a failure of the answer's own (its error would not pickle either): this connection ends
            self.failed += 1
            return
        finally:
            if task is not None:
                self._tasks.discard(task)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    def _failed(self, exc: Exception, stage: str) -> Any:
        try:
            return self.on_error(exc, stage)
        except Exception:  # e.g. an exception whose message raises: a plain error, with no view of the node
            return ("error", SandboxError(f"the agent could not answer the request ({type(exc).__name__})"), {})

    async def _challenge(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, task: asyncio.Task[Any] | None
    ) -> bytes | None:
        nonce_s = secrets.token_bytes(NONCE)
        writer.write(MAGIC + nonce_s)
        await writer.drain()
        got = await reader.readexactly(NONCE + MAC)
        nonce_c, proof = got[:NONCE], got[NONCE:]
        theirs, mine, key = _keys(self.token, nonce_s, nonce_c)
        if not hmac.compare_digest(proof, theirs):
            return None
        if task is not None:  # proved: no longer one a flood can push out (before the first await after it)
            self.challenging.pop(task, None)
        writer.write(mine)
        await writer.drain()
        return key

    async def _answer(self, reader: asyncio.StreamReader, work: Awaitable[Any]) -> Any:
        """The request's answer; _GONE if the connection closed (or the peer sent more) before it: then the
        request is cancelled, and the agent's run ends as when its client is gone."""
        job = asyncio.ensure_future(work)
        watch = asyncio.ensure_future(reader.read(1))
        try:
            await asyncio.wait({job, watch}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            job.cancel()
            watch.cancel()
            raise
        if job.done() and not watch.done():
            watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watch
            return job.result()
        job.cancel()  # EOF (or a byte out of turn): nobody waits for this answer
        with contextlib.suppress(BaseException):
            await job
        return _GONE


__all__ = ["MAX_ANSWER", "MAX_REQUEST", "METHODS", "Channel", "ChannelError", "Server", "loads_request", "tls_on"]
