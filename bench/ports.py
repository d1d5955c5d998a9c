"""Exposed ports (``Sandbox.expose``): HTTP requests/s and MiB/s through the relay, beside floors measured in
the same run against the same server.

    python -m bench.ports [--requests 200] [--sandbox container|gvisor] [--json PATH]

One sandbox runs ``python3 -m http.server`` (HTTP/1.0: a connection per request) over a 1 KiB file and a
100 MiB one in /scratch; its port 8000 is exposed. Measured, each ``--runs`` times, interleaved:

- ``relay``: the host's client (raw sockets, the response read to its end) through 127.0.0.1:PORT, so each
  request costs one ``docker exec`` of the relay; sequential, and 8 at once;
- ``exec_per_request`` (the floor a relay can reach): one ``docker exec`` per request of a Python client in
  the container, as ``docker exec C curl ...`` would be typed (the image has no curl); sequential;
- ``inside`` (the ceiling: no engine at all): the same client looping in one ``docker exec``, timed inside;
- keep-alive: the same server speaking HTTP/1.1 (port 8001), 5x the requests on one connection (one relay),
  from the host through the relay beside the same loop inside the container;
- MiB/s of the 100 MiB file: through the relay; inside (a loopback download in the container, timed inside);
  and ``docker exec C cat FILE`` read on the host (the engine's exec stream alone, which the relay rides on).

Ratios are the relay's figure over each floor's (requests/s, MiB/s: above 1 is faster). Reported, no goal.
"""

from __future__ import annotations

import argparse
import json
import platform
import socket
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any

import toolcage
from toolcage import Sandbox

MiB = 1 << 20
BIG = 100 * MiB
POLICY: dict[str, Any] = {
    "extends": "default",
    "limits": {"scratch": "256m", "memory": "1g"},
    "timeouts": {"run_s": 900, "idle_s": 900, "call_s": 300},
}
# the same server speaking HTTP/1.1 (keep-alive): one connection, so one relay, for every request
SERVER_11 = (
    "import functools, http.server as h; H = h.SimpleHTTPRequestHandler; H.protocol_version = 'HTTP/1.1'; "
    "H.disable_nagle_algorithm = True; "
    "h.ThreadingHTTPServer(('127.0.0.1', 8001), functools.partial(H, "
    "directory='/scratch/www')).serve_forever()"
)
KEEPALIVE = """
import http.client, sys, time
port, count = int(sys.argv[1]), int(sys.argv[2])
c = http.client.HTTPConnection("127.0.0.1", port)
t = time.perf_counter()
for _ in range(count):
    c.request("GET", "/small")
    assert len(c.getresponse().read()) == 1024
print(time.perf_counter() - t)
"""
CLIENT = """
import socket, sys, time
def get(path):
    s = socket.create_connection(("127.0.0.1", 8000))
    s.sendall(b"GET " + path.encode() + b" HTTP/1.0\\r\\n\\r\\n")
    n = 0
    while True:
        b = s.recv(1 << 20)
        if not b:
            break
        n += len(b)
    s.close()
    return n
path, count = sys.argv[1], int(sys.argv[2])
t = time.perf_counter()
n = sum(get(path) for _ in range(count))
print(time.perf_counter() - t, n)
"""


def get(port: int, path: str) -> int:
    with socket.create_connection(("127.0.0.1", port), timeout=60) as s:
        s.sendall(f"GET {path} HTTP/1.0\r\n\r\n".encode())
        n = 0
        while True:
            b = s.recv(1 << 20)
            if not b:
                return n
            n += len(b)


def relay_rps(port: int, count: int, parallel: int = 1) -> float:
    start = time.perf_counter()
    if parallel == 1:
        sizes = [get(port, "/small") for _ in range(count)]
    else:
        with ThreadPoolExecutor(parallel) as pool:
            sizes = list(pool.map(lambda _: get(port, "/small"), range(count)))
    took = time.perf_counter() - start
    assert all(n > 1024 for n in sizes), sizes
    return count / took


def keepalive_rps(port: int, count: int) -> float:
    import http.client

    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    start = time.perf_counter()
    for _ in range(count):
        c.request("GET", "/small")
        assert len(c.getresponse().read()) == 1024
    took = time.perf_counter() - start
    c.close()
    return count / took


def inside_keepalive_rps(cid: str, count: int) -> float:
    out = subprocess.run(
        ["docker", "exec", "-u", "65532:65532", cid, "python3", "-I", "-S", "-c", KEEPALIVE, "8001", str(count)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return count / float(out)


def exec_rps(cid: str, count: int) -> float:
    start = time.perf_counter()
    for _ in range(count):
        subprocess.run(
            ["docker", "exec", "-u", "65532:65532", cid, "python3", "-I", "-S", "-c", CLIENT, "/small", "1"],
            check=True,
            capture_output=True,
        )
    return count / (time.perf_counter() - start)


def inside(cid: str, path: str, count: int) -> tuple[float, int]:
    out = subprocess.run(
        ["docker", "exec", "-u", "65532:65532", cid, "python3", "-I", "-S", "-c", CLIENT, path, str(count)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    return float(out[0]), int(out[1])


def exec_cat_mibs(cid: str) -> float:
    start = time.perf_counter()
    proc = subprocess.Popen(["docker", "exec", cid, "cat", "/scratch/www/big"], stdout=subprocess.PIPE)
    assert proc.stdout is not None
    n = 0
    while chunk := proc.stdout.read(1 << 20):
        n += len(chunk)
    proc.wait()
    took = time.perf_counter() - start
    assert n == BIG, n
    return n / MiB / took


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(prog="python -m bench.ports")
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--sandbox", default="container")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    series: dict[str, list[float]] = {
        k: []
        for k in (
            "relay_rps", "relay_rps_8", "relay_keepalive_rps", "inside_keepalive_rps", "exec_per_request_rps",
            "inside_rps", "relay_mibs", "inside_mibs", "exec_cat_mibs",
        )
    }  # fmt: skip
    with Sandbox(POLICY, sandbox=args.sandbox) as sb:
        sb.call("run_shell", {"command": f"mkdir -p /scratch/www && head -c 1024 /dev/urandom > /scratch/www/small "
                                         f"&& head -c {BIG} /dev/zero > /scratch/www/big"})  # fmt: skip
        sb.spawn("python3 -m http.server 8000 --bind 127.0.0.1 -d /scratch/www").wait(port=8000, timeout=15)
        sb.spawn(argv=["python3", "-c", SERVER_11]).wait(port=8001, timeout=15)
        port, port_11 = sb.expose(8000).port, sb.expose(8001).port
        cid = str(sb.container_id)
        relay_rps(port, 5)  # warm
        for _ in range(args.runs):
            series["relay_rps"].append(relay_rps(port, args.requests))
            series["exec_per_request_rps"].append(exec_rps(cid, max(10, args.requests // 4)))
            series["relay_rps_8"].append(relay_rps(port, args.requests, parallel=8))
            series["relay_keepalive_rps"].append(keepalive_rps(port_11, args.requests * 5))
            series["inside_keepalive_rps"].append(inside_keepalive_rps(cid, args.requests * 5))
            took, _ = inside(cid, "/small", args.requests)
            series["inside_rps"].append(args.requests / took)
            start = time.perf_counter()
            assert get(port, "/big") > BIG
            series["relay_mibs"].append(BIG / MiB / (time.perf_counter() - start))
            took, n = inside(cid, "/big", 1)
            series["inside_mibs"].append(n / MiB / took)
            series["exec_cat_mibs"].append(exec_cat_mibs(cid))
    med = {k: round(statistics.median(v), 1) for k, v in series.items()}
    result = {
        "bench": "ports",
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "toolcage": toolcage.__version__,
        "python": platform.python_version(),
        "sandbox": args.sandbox,
        "requests": args.requests,
        "runs": args.runs,
        "median": med,
        "ratios": {
            "relay_rps / exec_per_request_rps": round(med["relay_rps"] / med["exec_per_request_rps"], 2),
            "relay_rps / inside_rps": round(med["relay_rps"] / med["inside_rps"], 3),
            "relay_keepalive_rps / inside_keepalive_rps": round(
                med["relay_keepalive_rps"] / med["inside_keepalive_rps"], 2
            ),
            "relay_mibs / exec_cat_mibs": round(med["relay_mibs"] / med["exec_cat_mibs"], 2),
            "relay_mibs / inside_mibs": round(med["relay_mibs"] / med["inside_mibs"], 2),
        },
        "series": series,
    }
    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            f.write(text + "\n")
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
