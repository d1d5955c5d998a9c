"""Exposed ports (issue 37, point 4): a server in the sandbox reached from the host at 127.0.0.1:PORT, HTTP and
WebSocket, while the sandbox keeps only ``lo`` and its policy's network; closing the sandbox closes them.

One sandbox serves the module (an http.server and a stdlib WebSocket echo server spawned in it); the tests
that close theirs make their own. Under runc and gVisor.
"""

from __future__ import annotations

import base64
import hashlib
import os
import socket
import struct
import threading
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from toolcage import Sandbox
from toolcage.errors import SandboxError, UsageError

# A WebSocket echo server with the stdlib alone (RFC 6455: the handshake, then text frames echoed back)
WS_SERVER = r"""
import base64, hashlib, socket, struct, threading
G = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
def serve(c):
    f = c.makefile("rb")
    key = None
    while True:
        line = f.readline()
        if line in (b"\r\n", b""):
            break
        k, _, v = line.partition(b":")
        if k.strip().lower() == b"sec-websocket-key":
            key = v.strip()
    acc = base64.b64encode(hashlib.sha1(key + G).digest())
    c.sendall(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
              b"Sec-WebSocket-Accept: " + acc + b"\r\n\r\n")
    while True:
        h = f.read(2)
        if len(h) < 2:
            return
        op, n = h[0] & 15, h[1] & 127
        if n == 126:
            n = struct.unpack(">H", f.read(2))[0]
        elif n == 127:
            n = struct.unpack(">Q", f.read(8))[0]
        mask = f.read(4)
        data = bytes(b ^ mask[i % 4] for i, b in enumerate(f.read(n)))
        if op == 8:
            c.sendall(b"\x88\x00")
            return
        head = bytes([0x80 | op]) + (bytes([n]) if n < 126 else b"\x7e" + struct.pack(">H", n))
        c.sendall(head + data)
s = socket.socket()
s.bind(("127.0.0.1", 8001))
s.listen(8)
while True:
    c, _ = s.accept()
    threading.Thread(target=serve, args=(c,), daemon=True).start()
"""


@pytest.fixture(scope="module")
def sb(engine: Any) -> Iterator[Sandbox]:
    with Sandbox(expose=(8000,)) as box:
        box.write_files({"/scratch/www/hello.txt": "hello from the sandbox\n", "/scratch/ws.py": WS_SERVER})
        http = box.spawn("python3 -m http.server 8000 --bind 127.0.0.1 -d /scratch/www")
        ws = box.spawn(argv=["python3", "/scratch/ws.py"])
        assert http.wait(port=8000, timeout=15) and ws.wait(port=8001, timeout=15)
        yield box


def _get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=10) as r:
        assert r.status == 200
        return bytes(r.read())


def test_http_through_the_exposed_port(sb: Sandbox) -> None:
    exposed = sb.exposed()[8000]  # exposed at start (Sandbox(expose=...))
    assert exposed.host == "127.0.0.1" and exposed.sandbox_port == 8000 and exposed.port > 0
    assert sb.expose(8000) == exposed  # the same port again: the same listener
    assert _get(exposed.url() + "/hello.txt") == b"hello from the sandbox\n"
    # several at once, each through its own relay
    got: list[bytes] = []
    threads = [threading.Thread(target=lambda: got.append(_get(exposed.url() + "/hello.txt"))) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert got == [b"hello from the sandbox\n"] * 6


def _ws_frame(payload: bytes) -> bytes:
    mask = os.urandom(4)
    n = len(payload)
    head = b"\x81" + (bytes([0x80 | n]) if n < 126 else b"\xfe" + struct.pack(">H", n))
    return head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))


def _recv_exact(s: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        got = s.recv(n - len(buf))
        assert got, "connection closed early"
        buf += got
    return buf


def test_websocket_through_the_exposed_port(sb: Sandbox) -> None:
    exposed = sb.expose(8001)
    key = base64.b64encode(os.urandom(16))
    with socket.create_connection((exposed.host, exposed.port), timeout=10) as s:
        s.sendall(
            b"GET /chat HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            b"Sec-WebSocket-Key: " + key + b"\r\nSec-WebSocket-Version: 13\r\n\r\n"
        )
        head = b""
        while b"\r\n\r\n" not in head:
            head += _recv_exact(s, 1)
        accept = base64.b64encode(hashlib.sha1(key + b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11").digest())
        assert head.startswith(b"HTTP/1.1 101") and accept in head
        for message in (b"hi", b"x" * 1000, "caf\u00e9".encode()):
            s.sendall(_ws_frame(message))
            first = _recv_exact(s, 2)
            n = first[1] & 127
            if n == 126:
                n = struct.unpack(">H", _recv_exact(s, 2))[0]
            assert first[0] == 0x81 and _recv_exact(s, n) == message


def test_the_sandbox_keeps_no_network_and_the_host_side_only_loopback(sb: Sandbox, engine: Any) -> None:
    exposed = sb.exposed()[8000]
    res = sb.call("run_shell", {"command": "tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '"})
    assert res.result["stdout"].split() == ["lo"]
    assert sb.policy.network.mode == "none"
    info = engine.inspect(sb.container_id)
    assert info["HostConfig"]["NetworkMode"] == "none" and info["HostConfig"]["PortBindings"] in ({}, None)
    # the host listener: 127.0.0.1 only (its line in the host's /proc/net/tcp, address 0100007F)
    with open("/proc/net/tcp") as f:
        rows = [line.split() for line in f.read().splitlines()[1:]]
    listening = [r[1] for r in rows if r[3] == "0A" and int(r[1].split(":")[1], 16) == exposed.port]
    assert listening == [f"0100007F:{exposed.port:04X}"]


def test_a_port_nobody_listens_on_closes_the_connection(sb: Sandbox, capfd: pytest.CaptureFixture[str]) -> None:
    exposed = sb.expose(9)
    with socket.create_connection((exposed.host, exposed.port), timeout=10) as s:
        s.sendall(b"GET / HTTP/1.0\r\n\r\n")
        assert s.recv(100) == b""  # closed, nothing said
    sb.unexpose(9)
    assert 9 not in sb.exposed()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection((exposed.host, exposed.port), timeout=5).close()
    assert "Traceback" not in capfd.readouterr().err


def test_bad_ports_and_doors_are_refused(sb: Sandbox) -> None:
    for bad in (0, 65536, -1, "80", True):
        with pytest.raises(UsageError):
            sb.expose(bad)  # type: ignore[arg-type]
    with pytest.raises(UsageError, match="exposed already"):
        sb.expose(8000, host_port=sb.exposed()[8000].port + 1 if sb.exposed()[8000].port < 65535 else 1024)
    with pytest.raises(UsageError, match="not running"):
        Sandbox().expose(8000)
    with pytest.raises(UsageError):
        Sandbox(expose=(0,))


def test_sandbox_none_has_no_exec() -> None:
    with Sandbox(sandbox="none") as local, pytest.raises(SandboxError, match="no container"):
        local.expose(8000)


def _relay_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith(("toolcage-relay", "toolcage-port"))]


def _wait_connections(ports: Any, count: int) -> None:
    deadline = time.monotonic() + 10
    while ports.connections() < count and time.monotonic() < deadline:
        time.sleep(0.02)
    assert ports.connections() == count


def test_the_cap_and_close_leave_nothing(engine: Any) -> None:
    """At most max_connections relayed connections at once (a sandbox's: a quarter of its pids; 2 here); past
    it a connection is closed at once and the held ones work on. close() ends every listener, connection and
    thread, and the container (with its relay processes) goes."""
    from toolcage.lifecycle.ports import Ports

    before = set(_relay_threads())
    box = Sandbox()
    with box:
        box.spawn("python3 -m http.server 8000 --bind 127.0.0.1").wait(port=8000, timeout=15)
        capped = Ports(lambda: (engine, str(box.container_id), False), max_connections=2)
        exposed, mine = capped.expose(8000), box.expose(8000)
        held = [socket.create_connection((exposed.host, exposed.port), timeout=10) for _ in range(2)]
        held.append(socket.create_connection((mine.host, mine.port), timeout=10))
        try:
            _wait_connections(capped, 2)
            with socket.create_connection((exposed.host, exposed.port), timeout=10) as third:
                assert third.recv(10) == b""  # past the cap: accepted and closed at once
            for s in held[:2]:  # the ones held still work
                s.sendall(b"GET / HTTP/1.0\r\n\r\n")
                assert s.recv(20).startswith(b"HTTP/1.0 200")
            capped.close()
            box.close()  # with a connection held through its own exposed port
            assert held[2].recv(10) == b""
        finally:
            capped.close()
            for s in held:
                s.close()
    for port in (exposed.port, mine.port):
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", port), timeout=5).close()
    deadline = time.monotonic() + 5
    while set(_relay_threads()) - before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert set(_relay_threads()) - before == set()
    with pytest.raises(UsageError):
        box.expose(8001)


ONE_REQUEST = (
    "import http.server as h; s = h.HTTPServer(('127.0.0.1', 8000), h.SimpleHTTPRequestHandler); s.handle_request()"
)


def test_cli_run_expose_says_where(engine: Any) -> None:
    """``toolcage run --expose 8000`` says the address on stderr before the call runs (stdout keeps the one JSON
    result); a connection made before the server listens is closed, so the client tries again."""
    import json
    import re
    import subprocess
    import sys

    from tests.helpers import ROOT

    params = json.dumps({"argv": ["python3", "-c", ONE_REQUEST], "cwd": "/scratch"})
    proc = subprocess.Popen(
        [sys.executable, "-m", "toolcage.cli", "run", "exec", "--expose", "8000", "--params", params],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert proc.stderr is not None
        found, said = None, []  # (other lines may come first: the reaper's warnings about other processes' runs)
        for line in proc.stderr:
            said.append(line)
            found = re.fullmatch(r"toolcage: exposed sandbox port 8000 at (http://127\.0\.0\.1:\d+)\n", line)
            if found:
                break
        assert found, said
        deadline, body = time.monotonic() + 15, b""
        while not body and time.monotonic() < deadline:
            try:
                body = _get(found.group(1) + "/")
            except (OSError, ValueError):  # not listening yet: the relay closed the connection
                time.sleep(0.1)
        assert b"Directory listing" in body
        out, _ = proc.communicate(timeout=30)
        assert json.loads(out)["status"] == "ok"
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.parametrize("foreign_image", ["debian-nopy"], indirect=True)
def test_a_users_own_image_without_python(foreign_image: str) -> None:
    """An image with no python3 of its own: the relay runs on the runtime's (/opt/toolcage/rt), as the worker."""
    with Sandbox(image=foreign_image) as box:
        box.write_files({"/scratch/www/hi.txt": "hi\n"})
        server = ["/opt/toolcage/rt/bin/python3", "-S", "-m", "http.server", "8000", "--bind", "127.0.0.1"]
        assert box.spawn(argv=[*server, "-d", "/scratch/www"]).wait(port=8000, timeout=15)
        assert _get(box.expose(8000).url() + "/hi.txt") == b"hi\n"
