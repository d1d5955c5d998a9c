"""Calls on an open sandbox beside their floors: a raw attached echo loop and ``docker exec``.

- ``raw_echo``: a container in the run's hardened configuration whose entrypoint is a bare
  Python loop answering one line per request line, over the same attach socket docker-py gives
  toolcage: round trip p50, sequential calls/s and pipelined calls/s (a window of requests in
  flight), the floor for toolcage's own figures.
- ``docker_exec``: ``docker exec <running container> python3 -c pass`` as a user would type it.
- ``toolcage_pipelined``: pings gathered on one ``AsyncSandbox`` (a window in flight at once).
- ``toolcage_gathered_sleeps``: three 1-second calls gathered on one ``AsyncSandbox`` (the
  issue's concurrency goal: <= 1.3 s).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import time
from typing import Any

from toolcage import AsyncSandbox
from toolcage.engine.hostconfig import container_config
from toolcage.engine.labels import RunSpec
from toolcage.policies import load_policy

ANSWER = b'{"jsonrpc": "2.0", "result": "pong", "id": 1}\n'
ECHO_LINES = (
    "import os\n"
    "while True:\n"
    "    b = os.read(0, 65536)\n"
    "    if not b: break\n"
    "    n = b.count(b'\\n')\n"
    f"    if n: os.write(1, {ANSWER!r} * n)\n"
)
REQUEST = b'{"jsonrpc": "2.0", "method": "ping", "id": 1}\n'
WINDOW = 64


def bench_container(image: str, entrypoint: list[str] | None) -> tuple[Any, str]:
    """A created (not started) container in a run's hardened configuration; ``entrypoint`` replaces the worker."""
    from toolcage.engine.docker_adapter import Engine

    engine = Engine.default()
    cfg = container_config(
        load_policy("default"),
        RunSpec(
            run_id=f"bench{os.getpid()}{time.monotonic_ns() % 10**6}",
            tool="bench",
            image=image,
            policy_name="default",
            started_at="",
            deadline=time.time() + 300,
            owner="bench",
            owner_started="",
        ),
    )
    if entrypoint is not None:
        cfg["Entrypoint"] = entrypoint
    cid = engine.create(cfg, name=f"toolcage-bench-{os.getpid()}-{time.monotonic_ns()}")
    return engine, cid


def raw_echo(image: str, calls: int) -> dict[str, Any]:
    engine, cid = bench_container(image, ["python3", "-S", "-c", ECHO_LINES])
    try:
        sock, close = engine.attach(cid)
        engine.start(cid)

        def read_answers(n: int, buf: bytearray) -> None:
            while buf.count(b"pong") < n:  # the answers' bytes arrive in multiplexed stdout frames
                chunk = sock.recv(1 << 16)
                if not chunk:
                    raise RuntimeError("the echo loop ended")
                buf += chunk

        rtts: list[float] = []
        for i in range(calls + 200):
            buf = bytearray()
            t = time.perf_counter()
            sock.sendall(REQUEST)
            read_answers(1, buf)
            if i >= 200:
                rtts.append((time.perf_counter() - t) * 1000)
        sequential = len(rtts) / (sum(rtts) / 1000)
        total = calls * 4
        t0 = time.perf_counter()
        got = bytearray()
        sent = 0
        while got.count(b"pong") < total:
            window = min(WINDOW, total - sent, WINDOW - (sent - got.count(b"pong")))
            if window > 0:
                sock.sendall(REQUEST * window)
                sent += window
            read_answers(got.count(b"pong") + 1, got)
        pipelined = total / (time.perf_counter() - t0)
        close()
        return {"rtts": rtts, "sequential_per_s": sequential, "pipelined_per_s": pipelined}
    finally:
        engine.kill(cid)
        engine.remove(cid)


def docker_exec(cid: str, runs: int) -> list[float]:
    out = []
    for i in range(runs + 1):
        t = time.perf_counter()
        subprocess.run(["docker", "exec", cid, "python3", "-c", "pass"], check=True)
        if i:
            out.append((time.perf_counter() - t) * 1000)
    return out


def toolcage_pipelined(image: str, calls: int) -> float:
    """Pings per second with a window of WINDOW in flight on one AsyncSandbox (audit off)."""

    async def go() -> float:
        async with AsyncSandbox(image=image, tool="bench", audit=False) as sb:
            await asyncio.gather(*(sb.call("ping") for _ in range(WINDOW)))
            sem = asyncio.Semaphore(WINDOW)

            async def one() -> None:
                async with sem:
                    r = await sb.call("ping")
                    assert r.ok, r

            t0 = time.perf_counter()
            await asyncio.gather(*(one() for _ in range(calls)))
            return calls / (time.perf_counter() - t0)

    return asyncio.run(go())


def toolcage_gathered_sleeps(image: str, runs: int) -> list[float]:
    """Wall time (ms) of three `sleep 1` calls gathered on one AsyncSandbox."""

    async def go() -> list[float]:
        out = []
        async with AsyncSandbox(image=image, tool="bench", audit=False) as sb:
            for _ in range(runs):
                t0 = time.perf_counter()
                rs = await asyncio.gather(*(sb.call("run_shell", {"command": "sleep 1"}) for _ in range(3)))
                out.append((time.perf_counter() - t0) * 1000)
                assert all(r.ok for r in rs), rs
        return out

    return asyncio.run(go())
