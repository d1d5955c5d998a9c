"""Inside a sandbox with ``network.mode: proxy``: relay 127.0.0.1:3128 to the egress proxy's Unix socket.

The sandbox has no network interface but ``lo``; the proxy's socket (a read-only mount)
is its only way out. Ordinary HTTP clients find the relay through ``HTTP_PROXY``. One
thread and a selector serve every connection, so the relay costs a single pid of the
sandbox's pids limit however many connections tool code opens.
"""

from __future__ import annotations

import selectors
import socket
import threading

MAX_BUFFER = 1 << 20


class _Pair:
    def __init__(self, a: socket.socket, b: socket.socket) -> None:
        self.socks = (a, b)
        self.pending: dict[socket.socket, bytearray] = {a: bytearray(), b: bytearray()}  # bytes waiting to go TO sock
        self.eof: set[socket.socket] = set()

    def other(self, s: socket.socket) -> socket.socket:
        return self.socks[1] if s is self.socks[0] else self.socks[0]


def _serve(listener: socket.socket, path: str) -> None:
    sel = selectors.DefaultSelector()
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
        for s in p.socks:
            try:
                sel.unregister(s)
            except (KeyError, ValueError):
                pass
            s.close()

    while True:
        for key, mask in sel.select():
            if key.data is None:
                try:
                    client, _ = listener.accept()
                    upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                    upstream.connect(path)
                except OSError:
                    try:
                        client.close()
                    except (OSError, UnboundLocalError):
                        pass
                    continue
                client.setblocking(False)
                upstream.setblocking(False)
                pair = _Pair(client, upstream)
                for new in pair.socks:
                    sel.register(new, selectors.EVENT_READ, pair)
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


def start(path: str, port: int = 3128) -> None:
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", port))
    listener.listen(64)
    listener.setblocking(False)
    threading.Thread(target=_serve, args=(listener, path), name="toolcage-relay", daemon=True).start()
