"""toolcage.lifecycle.ports without an engine: a fake ``exec_socket`` (a socketpair whose far end echoes stdin
back as the engine's stdout frames, with a stderr frame between) drives the host side: relaying, the
connection cap, the byte rate, and close() leaving no listener, connection or thread."""

from __future__ import annotations

import socket
import struct
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from toolcage.errors import UsageError
from toolcage.lifecycle.ports import Ports, TokenBucket, _frames, check_port, max_connections, relay_command


def frame(stream: int, data: bytes) -> bytes:
    return bytes([stream, 0, 0, 0]) + struct.pack(">I", len(data)) + data


class FakeEngine:
    """Each exec: an echoing relay (stdout frames, plus a stderr frame the host must drop)."""

    def __init__(self) -> None:
        self.execs: list[list[str]] = []
        self.live = 0

    def exec_socket(self, cid: str, cmd: list[str], user: str) -> tuple[socket.socket, Callable[[], None]]:
        self.execs.append(cmd)
        host, far = socket.socketpair()

        def echo() -> None:
            self.live += 1
            try:
                while data := far.recv(4096):
                    far.sendall(frame(2, b"noise on stderr") + frame(1, data))
            except OSError:
                pass
            finally:
                self.live -= 1
                far.close()

        threading.Thread(target=echo, daemon=True).start()
        return host, host.close


def relay_threads() -> set[str]:
    return {t.name for t in threading.enumerate() if t.name.startswith(("toolcage-relay", "toolcage-port"))}


def test_check_port_and_the_cap() -> None:
    assert check_port(1) == 1 and check_port(65535) == 65535
    for bad in (0, 65536, -5, "80", 8.0, True, None):
        with pytest.raises(UsageError):
            check_port(bad)
    assert max_connections(64) == 16 and max_connections(8) == 2 and max_connections(4096) == 64
    assert max_connections(2) == 1
    foreign = relay_command(8000, foreign=True)
    assert foreign[:2] == ["/opt/toolcage/rt/bin/python3", "-S"] and '("127.0.0.1",8000)' in foreign[-1]


def test_frames_keep_stdout_and_drop_stderr() -> None:
    a, b = socket.socketpair()
    b.sendall(frame(1, b"he") + frame(2, b"x" * 100_000) + frame(1, b"llo"))
    b.close()
    got: list[bytes] = []
    _frames(a, got.append)
    a.close()
    assert b"".join(got) == b"hello"


def test_relay_cap_and_close() -> None:
    before = relay_threads()
    engine: Any = FakeEngine()
    ports = Ports(lambda: (engine, "cid", False), max_connections=2)
    exposed = ports.expose(8000)
    assert ports.expose(8000) is exposed and exposed.host == "127.0.0.1" and exposed.url().startswith("http://127.")
    with pytest.raises(UsageError, match="exposed already"):
        ports.expose(8000, host_port=1 if exposed.port != 1 else 2)
    a = socket.create_connection((exposed.host, exposed.port), timeout=5)
    b = socket.create_connection((exposed.host, exposed.port), timeout=5)
    for s in (a, b):
        s.sendall(b"ping")
        assert s.recv(100) == b"ping"
    c = socket.create_connection((exposed.host, exposed.port), timeout=5)
    assert c.recv(10) == b""  # past the cap
    c.close()
    assert ports.connections() == 2 and len(engine.execs) == 2
    assert engine.execs[0][:3] == ["python3", "-I", "-S"]
    ports.close()
    for s in (a, b):
        assert s.recv(10) == b""
        s.close()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection((exposed.host, exposed.port), timeout=5).close()
    assert relay_threads() - before == set() and ports.connections() == 0
    deadline = time.monotonic() + 5
    while engine.live and time.monotonic() < deadline:
        time.sleep(0.01)
    assert engine.live == 0
    with pytest.raises(UsageError, match="closed"):
        ports.expose(8001)


def test_a_target_that_refuses_is_said() -> None:
    def target() -> Any:
        raise UsageError("the sandbox is not running")

    with pytest.raises(UsageError, match="not running"):
        Ports(target).expose(8000)


def test_token_bucket_holds_the_rate() -> None:
    bucket = TokenBucket(1_000_000)
    start = time.monotonic()
    for _ in range(30):
        bucket.take(100_000)  # 3 MB: one second in hand, then two at the rate
    took = time.monotonic() - start
    assert 1.7 < took < 3.5, took
