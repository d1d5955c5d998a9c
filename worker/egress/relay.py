"""Inside a sandbox with ``network.mode: proxy``: relay 127.0.0.1:3128 to the egress proxy's Unix socket.

The sandbox has no network interface but ``lo``; the proxy's socket (a read-only mount)
is its only way out. Ordinary HTTP clients find the relay through ``HTTP_PROXY``. One
thread and a selector serve every connection, so the relay costs a single pid of the
sandbox's pids limit however many connections tool code opens.

The proxy starts beside the sandbox, not before it: a connection accepted before the proxy
listens (its socket missing, or refusing) is held, unread, and joined to the proxy as soon as
it listens, for at most PROXY_WAIT_S; then it is closed (by then the runner has ended the run
for a proxy that never came up). Once the proxy has listened, a refused connection is closed at
once, as before. It never goes anywhere else: there is nowhere else to go.
"""

from __future__ import annotations

import contextlib
import resource
import selectors
import socket
import threading
import time

MAX_BUFFER = 1 << 20
PROXY_WAIT_S = 20.0  # a connection waits this long for the proxy (the runner gives the proxy 15 s to listen)
RETRY_S = 0.01  # while connections wait: how often the proxy's socket is tried
_RESERVED_FDS = 32  # protocol, stdio, the relay's own, a call's pipes and selector, Popen's transient pipes


class _Pair:
    def __init__(self, a: socket.socket, b: socket.socket) -> None:
        self.socks = (a, b)
        self.pending: dict[socket.socket, bytearray] = {a: bytearray(), b: bytearray()}  # bytes waiting to go TO sock
        self.eof: set[socket.socket] = set()

    def other(self, s: socket.socket) -> socket.socket:
        return self.socks[1] if s is self.socks[0] else self.socks[0]


def max_pairs() -> int:
    """Threat: tool code opening connections until the worker has no file descriptor left (each
    pair costs two), so that it cannot list /proc, start a child or log, and a sweep or a later
    call fails. The relay keeps at most this many pairs: half of what is left of the worker's
    descriptor limit after a reserve for the worker itself; past it a connection is refused."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        soft = 65536
    return max(1, (soft - _RESERVED_FDS) // 4)


def _upstream(path: str) -> socket.socket | None:
    """A connection to the proxy's socket, or None while the proxy does not listen yet (OSError: anything else)."""
    upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        upstream.connect(path)
    except (FileNotFoundError, ConnectionRefusedError):
        upstream.close()
        return None
    except BaseException:
        upstream.close()
        raise
    return upstream


def _serve(listener: socket.socket, path: str, limit: int) -> None:
    sel = selectors.DefaultSelector()
    pairs: set[_Pair] = set()
    waiting: list[tuple[socket.socket, float]] = []  # accepted before the proxy listened: (client, until)
    seen = False  # the proxy has listened once: from then on a connection it refuses is closed at once
    sel.register(listener, selectors.EVENT_READ, None)

    def update(p: _Pair) -> None:
        for s in p.socks:
            events = 0
            if s not in p.eof and len(p.pending[p.other(s)]) < MAX_BUFFER:
                events |= selectors.EVENT_READ
            if p.pending[s]:
                events |= selectors.EVENT_WRITE
            registered = s in sel.get_map()
            if events and registered:
                sel.modify(s, events, p)
            elif events:
                sel.register(s, events, p)
            elif registered:
                sel.unregister(s)

    def close(p: _Pair) -> None:
        pairs.discard(p)
        for s in p.socks:
            try:
                sel.unregister(s)
            except (KeyError, ValueError):
                pass
            s.close()

    def place(client: socket.socket, upstream: socket.socket | None, until: float) -> None:
        """Relay ``client`` through ``upstream`` (the proxy answered); with none, hold it until ``until`` while
        the proxy has never listened (it is still starting), else close it (expired, or a dead proxy's refusal)."""
        nonlocal seen
        if upstream is None:
            if seen or time.monotonic() >= until:
                client.close()
            else:
                waiting.append((client, until))
            return
        seen = True
        try:
            client.setblocking(False)
            upstream.setblocking(False)
            pair = _Pair(client, upstream)
            for new in pair.socks:
                sel.register(new, selectors.EVENT_READ, pair)
            pairs.add(pair)
        except (OSError, ValueError, KeyError):
            for sock in (client, upstream):
                with contextlib.suppress(KeyError, ValueError):
                    sel.unregister(sock)
                sock.close()

    while True:
        events = sel.select(RETRY_S if waiting else None)
        if waiting:
            held, waiting[:] = list(waiting), []
            up = True
            for client, until in held:
                upstream = None
                if up:  # one try per round while the proxy does not listen, not one per held connection
                    try:
                        upstream = _upstream(path)
                    except OSError:
                        upstream = None
                    up = upstream is not None
                place(client, upstream, until)
        for key, mask in events:
            if key.data is None:
                # never a name bound in an earlier round: closing it would close a live pair's socket
                try:
                    client, _ = listener.accept()
                except OSError:
                    continue
                if len(pairs) + len(waiting) >= limit:
                    client.close()  # refused: the worker's own descriptors come first
                    continue
                try:
                    upstream = _upstream(path)
                except OSError:
                    client.close()
                    continue
                place(client, upstream, time.monotonic() + PROXY_WAIT_S)
                continue
            pair = key.data
            s = key.fileobj
            assert isinstance(s, socket.socket)
            try:
                if mask & selectors.EVENT_READ:
                    data = s.recv(65536)
                    if data:
                        pair.pending[pair.other(s)] += data
                    else:
                        pair.eof.add(s)
                if mask & selectors.EVENT_WRITE and pair.pending[s]:
                    n = s.send(pair.pending[s])
                    del pair.pending[s][:n]
            except (BlockingIOError, InterruptedError):
                pass
            except OSError:
                close(pair)
                continue
            try:
                for x in pair.socks:  # half-close once a side is done and its data has gone through
                    if x in pair.eof and not pair.pending[pair.other(x)]:
                        try:
                            pair.other(x).shutdown(socket.SHUT_WR)
                        except OSError:
                            pass
                if all(x in pair.eof for x in pair.socks) and not any(pair.pending.values()):
                    close(pair)
                    continue
                update(pair)
            except (OSError, ValueError, KeyError):  # one broken pair must not stop the relay for later calls
                close(pair)


def start(path: str, port: int = 3128) -> None:
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", port))
    listener.listen(64)
    listener.setblocking(False)
    threading.Thread(target=_serve, args=(listener, path, max_pairs()), name="toolcage-relay", daemon=True).start()
