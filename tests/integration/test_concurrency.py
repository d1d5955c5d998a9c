"""Several calls in flight on one sandbox, on the real engine: AsyncSandbox natively, Sandbox from threads.

Calls that run code run side by side in the worker, up to the policy's ``limits.concurrency``;
the sweep kills what a call left running once no code call is in flight, before that last
call's answer goes out.
"""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import yaml

from toolcage import AsyncSandbox, Sandbox

pytestmark = pytest.mark.usefixtures("no_leaks")

# each call marks itself started, then waits (up to 10 s) until all three have
RENDEZVOUS = (
    "touch started.{n}; i=0; while [ $(ls started.* | wc -l) -lt 3 ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i+1)); done;"
    " ls started.* | wc -l"
)


def _policy(tmp_path: Path, concurrency: int) -> Path:
    path = tmp_path / f"c{concurrency}.yaml"
    path.write_text(yaml.safe_dump({"name": f"c{concurrency}", "limits": {"concurrency": concurrency}}))
    return path


def test_async_gather_runs_calls_side_by_side(engine: Any) -> None:
    """Three calls gathered on one AsyncSandbox meet while all run; three 1 s sleeps take about 1 s, not 3."""

    async def go() -> tuple[list[str], float]:
        async with AsyncSandbox() as sb:
            met = await asyncio.gather(*(sb.call("run_shell", {"command": RENDEZVOUS.format(n=i)}) for i in range(3)))
            t0 = time.monotonic()
            await asyncio.gather(*(sb.call("run_shell", {"command": "sleep 1"}) for _ in range(3)))
            return [r.result["stdout"] for r in met], time.monotonic() - t0

    met, took = asyncio.run(go())
    assert met == ["3\n"] * 3
    assert took < 2.5, took  # one after another: 3 s and more


def test_threads_share_one_sandbox(engine: Any) -> None:
    """Sandbox.call from three threads at once: each gets its own answer, and they ran side by side."""
    with Sandbox() as sb, ThreadPoolExecutor(3) as pool:
        results = list(pool.map(lambda i: sb.call("run_shell", {"command": RENDEZVOUS.format(n=i)}), range(3)))
        assert [r.result["stdout"] for r in results] == ["3\n"] * 3
        assert sb.call("ping").result == "pong"


def test_concurrency_one_in_the_policy_runs_calls_one_at_a_time(engine: Any, tmp_path: Path) -> None:
    """limits.concurrency: 1: gathered calls run one after another (none meets the others)."""

    async def go() -> list[str]:
        async with AsyncSandbox(policy=_policy(tmp_path, 1)) as sb:
            script = RENDEZVOUS.replace("100", "3")
            rs = await asyncio.gather(*(sb.call("run_shell", {"command": script.format(n=i)}) for i in range(3)))
            return sorted(r.result["stdout"] for r in rs)

    assert asyncio.run(go()) == ["1\n", "2\n", "3\n"]


# Whether a process still runs, told by a file it rewrites every 0.1 s (not by a pid: under gVisor each
# call has a PID namespace of its own, where another call's pids mean nothing)
BEAT = "while :; do date +%s%N > {name}.beat; sleep 0.1; done"
BEATING = 'a=$(cat {name}.beat); sleep 0.6; [ "$(cat {name}.beat)" != "$a" ] && echo alive || echo gone'


def test_cancelling_one_gathered_call_leaves_the_others(engine: Any) -> None:
    """wait_for on one of three calls in flight cancels it in the sandbox (its processes killed); the
    other two end as they would and the sandbox takes more calls."""

    async def go() -> tuple[list[Any], str, str]:
        async with AsyncSandbox() as sb:
            slow = sb.call("run_shell", {"command": BEAT.format(name="slow")})
            t0 = time.monotonic()
            res = await asyncio.gather(
                asyncio.wait_for(slow, 1.0),
                sb.call("run_shell", {"command": "sleep 1.5; echo one"}),
                sb.call("run_shell", {"command": "sleep 1.5; echo two"}),
                return_exceptions=True,
            )
            took = f"{time.monotonic() - t0:.1f}"
            after = await sb.call("run_shell", {"command": BEATING.format(name="slow")})
            return res, took, after.result["stdout"]

    res, took, after = asyncio.run(go())
    assert isinstance(res[0], TimeoutError), res
    assert [r.result["stdout"] for r in res[1:]] == ["one\n", "two\n"]
    assert float(took) < 5, took
    assert after == "gone\n"


DAEMON = (
    "import os, time\nif os.fork() == 0:\n    os.setsid()\n    for _ in range(600):\n"
    "        open('daemon.beat', 'w').write(str(time.monotonic_ns())); time.sleep(0.1)\n    os._exit(0)\n"
    "time.sleep(0.3)\nprint('left one', flush=True)"
)
ALIVE = BEATING.format(name="daemon")


def test_what_a_call_leaves_is_swept_when_no_code_call_is_in_flight(engine: Any) -> None:
    """A daemon a call left lives on while another call is in flight, and is gone once none is: the
    sweep runs before the last call's answer, and the next call finds nothing."""
    with Sandbox() as sb:
        gate = threading.Event()

        def long_call() -> Any:
            gate.set()
            return sb.call("run_shell", {"command": "sleep 1.5; " + ALIVE})

        with ThreadPoolExecutor(1) as pool:
            pending = pool.submit(long_call)
            gate.wait()
            time.sleep(0.3)  # the long call runs
            left = sb.call("run_python", {"code": DAEMON})
            assert left.result["stdout"] == "left one\n"
            during = pending.result()
        if sb.kind == "gvisor":  # there it ends with its own call's PID namespace, at once
            assert during.result["stdout"] == "gone\n", during.result
        else:
            assert during.result["stdout"] == "alive\n", during.result  # a call was still in flight
        assert sb.call("run_shell", {"command": ALIVE}).result["stdout"] == "gone\n"
