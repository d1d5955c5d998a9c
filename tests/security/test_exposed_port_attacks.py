"""Attacks on exposed ports (issue 37, point 4; toolcage.lifecycle.ports): a relay must not become a way out.

1. no_route_to_the_listener: code in the sandbox connects to the host's listener, at 127.0.0.1 (its own
   loopback: nothing there) and at the engine's gateway and the host's addresses (no route: the sandbox has
   only ``lo``). Control: the host connects in.
2. relay_output_reaches_only_its_client: code in the sandbox takes over a live relay (same uid: it opens the
   relay's /proc/PID/fd/1) and writes to it: the bytes reach only the host client that connected in, which
   the sandbox's server could answer anything anyway; the relay's own argv names 127.0.0.1:PORT only.
3. flood_is_rate_limited: a server in the sandbox writing as fast as it can: the host side passes at most
   bytes_per_s (the token bucket), holding one chunk per direction.
4. sigkill_runner_leaves_nothing: the runner killed by SIGKILL while a relay carries a connection: its
   listener is gone with it, and the sandbox (with its relay processes) stops at once.
"""

from __future__ import annotations

import itertools
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from toolcage import Sandbox
from toolcage.lifecycle.ports import Ports, relay_command

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def sb(engine: Any) -> Iterator[Sandbox]:
    with Sandbox() as box:
        box.spawn("python3 -m http.server 8000 --bind 127.0.0.1 -d /scratch").wait(port=8000, timeout=15)
        yield box


def _host_addresses() -> list[str]:
    """The host's IPv4 addresses but loopback (the engine's bridge gateway among them), from /proc/net/fib_trie."""
    found: set[str] = set()
    try:
        lines = Path("/proc/net/fib_trie").read_text().splitlines()
    except OSError:
        return []
    for before, line in itertools.pairwise(lines):
        if "/32 host LOCAL" in line:
            addr = before.split()[-1]
            if not addr.startswith("127."):
                found.add(addr)
    return sorted(found)


PROBE = """
import socket, sys
port = int(sys.argv[1])
for host in sys.argv[2:]:
    try:
        socket.create_connection((host, port), timeout=2).close()
        print(host, "CONNECTED")
    except OSError as exc:
        print(host, type(exc).__name__, exc.errno)
"""


def test_no_route_to_the_listener(sb: Sandbox) -> None:
    exposed = sb.expose(8000)
    socket.create_connection((exposed.host, exposed.port), timeout=5).close()  # control: the host gets in
    targets = ["127.0.0.1", *sorted({"172.17.0.1", *_host_addresses()})]
    res = sb.call("exec", {"argv": ["python3", "-c", PROBE, str(exposed.port), *targets]})
    lines = res.result["stdout"].splitlines()
    assert len(lines) == len(targets), res.result
    assert not [line for line in lines if "CONNECTED" in line], lines
    # its own loopback refuses (nothing listens there); every other address has no route at all (runc says
    # ENETUNREACH, gVisor EHOSTUNREACH)
    assert lines[0].startswith("127.0.0.1 ConnectionRefusedError"), lines
    assert all(line.split()[-1] in ("101", "113") for line in lines[1:]), lines


HIJACK = r"""
import os
for pid in os.listdir("/proc"):
    if not pid.isdigit():
        continue
    try:
        cmd = open(f"/proc/{pid}/cmdline", "rb").read()
    except OSError:
        continue
    if b"create_" + b"connection" in cmd:  # the relay (never this code itself)
        fd = os.open(f"/proc/{pid}/fd/1", os.O_WRONLY)
        os.write(fd, b"INJECTED")
        print("hijacked", pid)
"""


HOLD = (
    "import socket,time\ns=socket.socket();s.bind(('127.0.0.1',8003));s.listen(1)\n"
    "c,_=s.accept()\nc.sendall(b'ok')\ntime.sleep(120)\n"
)


def test_relay_output_reaches_only_its_client(sb: Sandbox) -> None:
    """Under runc the relay is a process code of the same uid can open; under gVisor each call runs in a PID
    namespace of its own, where no relay is even visible."""
    argv = relay_command(8000, foreign=False)
    assert argv[:3] == ["python3", "-I", "-S"] and '("127.0.0.1",8000)' in argv[-1]
    sb.write_files({"/scratch/hold.py": HOLD})
    sb.spawn(argv=["python3", "/scratch/hold.py"]).wait(port=8003, timeout=15)
    exposed = sb.expose(8003)
    with socket.create_connection((exposed.host, exposed.port), timeout=10) as client:
        head = b""
        while len(head) < 2:  # its server said "ok": the relay carries the connection now
            data = client.recv(2 - len(head))
            assert data, head
            head += data
        assert head == b"ok"
        out = sb.call("exec", {"argv": ["python3", "-c", HIJACK]}).result["stdout"]
        if sb.kind == "gvisor":
            assert out == "", out
            return
        assert "hijacked" in out, "no live relay found to take over"
        got = b""
        while b"INJECTED" not in got:
            data = client.recv(100)
            assert data, got
            got += data
        assert got == b"INJECTED"  # the one place its output goes: the client that connected in


FLOOD = (
    "import socket\ns=socket.socket();s.bind(('127.0.0.1',8002));s.listen(1)\n"
    "c,_=s.accept()\nb=b'x'*65536\nwhile True: c.sendall(b)\n"
)


def test_flood_is_rate_limited(sb: Sandbox, engine: Any) -> None:
    sb.write_files({"/scratch/flood.py": FLOOD})
    sb.spawn(argv=["python3", "/scratch/flood.py"]).wait(port=8002, timeout=15)
    assert sb.container_id is not None
    rate = 2 * 1024 * 1024
    ports = Ports(lambda: (engine, str(sb.container_id), False), bytes_per_s=rate)
    try:
        exposed = ports.expose(8002)
        with socket.create_connection((exposed.host, exposed.port), timeout=10) as client:
            got, start = 0, time.monotonic()
            while time.monotonic() - start < 2.0:
                got += len(client.recv(1 << 20))
            took = time.monotonic() - start
        # one second's worth in hand at the start, then the rate: well under what loopback carries (GiB/s)
        assert got <= rate * (1 + took) + (1 << 20), (got, took)
        assert got >= rate * 0.5, (got, took)
    finally:
        ports.close()


RUNNER = """
import socket, sys, time
from toolcage import Sandbox
sb = Sandbox().start()
sb.spawn("python3 -m http.server 8000 --bind 127.0.0.1 -d /scratch").wait(port=8000, timeout=15)
e = sb.expose(8000)
c = socket.create_connection((e.host, e.port))
c.sendall(b"GET / HTTP/1.1\\r\\nHost: x\\r\\n\\r\\n")
c.recv(10)
print(e.port, sb.container_id, flush=True)
time.sleep(60)
"""


@pytest.mark.runc_only("the runner's own death and the host listener are the same under either runtime")
def test_sigkill_runner_leaves_nothing(engine: Any) -> None:
    proc = subprocess.Popen([sys.executable, "-c", RUNNER], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline().split()
    assert len(line) == 2, "the runner did not start"
    port, cid = int(line[0]), line[1]
    try:
        assert engine.inspect(cid)["State"]["Running"]
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", port), timeout=5).close()
        deadline = time.monotonic() + 10
        while (engine.inspect(cid) or {}).get("State", {}).get("Running") and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not (engine.inspect(cid) or {}).get("State", {}).get("Running"), "the sandbox outlived its runner"
    finally:
        proc.kill()
        proc.stdout.close()
        engine.remove(cid)
