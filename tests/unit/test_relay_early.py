"""The worker's egress relay when the proxy starts beside the sandbox (worker.egress.relay): a connection
made before the proxy listens is held and joined to it once it does; it never waits forever; and once the
proxy has listened, a connection it refuses is closed at once, as before."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from toolcage.worker.egress import relay


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[int, Path]]:
    """A relay on a free port of its own, towards ``tmp_path/proxy.sock`` (nothing listens there yet)."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    listener.setblocking(False)
    path = tmp_path / "proxy.sock"
    threading.Thread(target=relay._serve, args=(listener, str(path), 8), daemon=True).start()
    yield listener.getsockname()[1], path
    listener.close()


def _echo_proxy(path: Path) -> socket.socket:
    """A stand-in for the proxy: answers each connection's first bytes with b"proxy:" + them."""
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(16)

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            data = conn.recv(1024)
            conn.sendall(b"proxy:" + data)
            conn.close()

    threading.Thread(target=serve, daemon=True).start()
    return server


def _stop(server: socket.socket) -> None:
    """Stop listening now (a close alone leaves the accept that blocks on it taking one more connection)."""
    server.shutdown(socket.SHUT_RDWR)
    server.close()


def _ask(port: int, data: bytes, timeout: float = 5.0) -> bytes:
    """What comes back to ``data``; b"" when the relay closed the connection (reset, its data unread)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as c:
        c.sendall(data)
        out = b""
        try:
            while chunk := c.recv(1024):
                out += chunk
        except ConnectionResetError:
            return out
        return out


def test_a_connection_made_before_the_proxy_listens_reaches_it_once_it_does(served: tuple[int, Path]) -> None:
    port, path = served
    got: list[bytes] = []
    early = threading.Thread(target=lambda: got.append(_ask(port, b"GET early")))
    early.start()
    time.sleep(0.3)  # the connection is held meanwhile: nothing listens at the proxy's path
    assert not got
    server = _echo_proxy(path)
    try:
        early.join(5)
        assert got == [b"proxy:GET early"]
        assert _ask(port, b"GET later") == b"proxy:GET later"  # and later ones go straight through
    finally:
        _stop(server)


def test_a_held_connection_is_closed_when_the_proxy_never_comes(
    served: tuple[int, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    port, _path = served
    monkeypatch.setattr(relay, "PROXY_WAIT_S", 0.3)
    t = time.monotonic()
    assert _ask(port, b"GET nowhere") == b""  # closed, nothing relayed anywhere
    assert 0.25 <= time.monotonic() - t < 3


def test_once_the_proxy_has_listened_a_refused_connection_is_closed_at_once(served: tuple[int, Path]) -> None:
    port, path = served
    server = _echo_proxy(path)
    assert _ask(port, b"GET one") == b"proxy:GET one"
    _stop(server)  # the proxy is gone: its socket stays, nothing listens
    t = time.monotonic()
    assert _ask(port, b"GET two") == b""
    assert time.monotonic() - t < 1.0  # not held for PROXY_WAIT_S
