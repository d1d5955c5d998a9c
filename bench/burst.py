"""A burst of short tasks through the warm pool against the same burst without one (issue 40).

    python -m bench.burst [--tasks 40] [--threads 2] [--size 2] [--rounds 3]

Each task is a run: a sandbox, one ``run_python`` (``print(1)``), closed. ``--tasks`` tasks go through
``--threads`` threads at once, in three ways, in turn, ``--rounds`` times (the order rotates each round):

- ``cold``: ``Sandbox()`` per task, no pool (the floor);
- ``pool``: ``with pool.sandbox() as sb:`` from a ``Pool(size=--size)`` made and filled before the clock
  starts (an application's warm pool, waiting when the burst comes);
- ``pool cold``: the same, from a pool made when the clock starts (nothing waits yet).

Each burst ends when the last task's sandbox is removed (``toolcage.wait_removed()``): what a pool refills
meanwhile for runs to come competes with the burst and is counted; closing the pool after (removing the
slots it keeps warm) is timed apart (``close s``).
Goal: the pool is never slower than no pool: each pool's median at most 1.0x cold's (PASS or MISS).
Also printed: per task, the wait for a slot (``pool.sandbox()`` to started) and how many slots were
started in all (a pool that refills past the burst starts more containers than tasks).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import toolcage
from toolcage import Pool, Sandbox

CODE = {"code": "print(1)"}


def _task(make: Callable[[], Sandbox], waits: list[float]) -> None:
    t = time.perf_counter()
    with make() as sb:
        waits.append(time.perf_counter() - t)
        got = sb.call("run_python", CODE)
        if not got.ok or got.result.get("stdout") != "1\n":
            raise RuntimeError(f"a task failed: {got.status} {got.result!r} {got.error!r}")


def burst(kind: str, tasks: int, threads: int, size: int) -> dict[str, Any]:
    waits: list[float] = []
    pool: Pool | None = None
    if kind == "pool":
        pool = Pool(size=size, audit=False, tool="bench-burst")
        if not pool.wait_ready(timeout=120):
            raise SystemExit("the pool did not fill within 120 s")
    t = time.perf_counter()
    if kind == "pool cold":
        pool = Pool(size=size, audit=False, tool="bench-burst")
    made_before = 0
    try:
        make: Callable[[], Sandbox]
        if pool is None:
            make = lambda: Sandbox(audit=False, tool="bench-burst")  # noqa: E731
        else:
            warm = pool
            made_before = warm.slots_started if kind == "pool" else 0
            make = warm.sandbox
        with ThreadPoolExecutor(threads) as ex:
            list(ex.map(lambda _: _task(make, waits), range(tasks)))
        toolcage.wait_removed(120)  # the tasks' sandboxes removed: the burst is over
        seconds = time.perf_counter() - t
    finally:
        started = (pool.slots_started - made_before) if pool is not None else tasks
        t_close = time.perf_counter()
        if pool is not None:
            pool.close()  # what it refilled for runs to come, removed
        toolcage.wait_removed(120)
        close_s = time.perf_counter() - t_close
    return {"s": seconds, "close_s": close_s, "wait_ms_median": statistics.median(waits) * 1000, "containers": started}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.burst", description=__doc__.split("\n\n")[0])
    ap.add_argument("--tasks", type=int, default=40)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--size", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    kinds = ["cold", "pool", "pool cold"]
    rows: dict[str, list[dict[str, Any]]] = {k: [] for k in kinds}
    load = [os.getloadavg()[0]]
    for r in range(args.rounds):
        order = kinds[r % 3 :] + kinds[: r % 3]
        for kind in order:
            print(f"\rround {r + 1}: {kind}{' ' * 20}", end="", file=sys.stderr, flush=True)
            rows[kind].append(burst(kind, args.tasks, args.threads, args.size))
        load.append(os.getloadavg()[0])
    print(file=sys.stderr)
    med = {k: statistics.median(x["s"] for x in v) for k, v in rows.items()}
    print(
        f"{args.tasks} tasks (run_python print(1)) on {args.threads} threads; pool size {args.size}; "
        f"{args.rounds} rounds"
    )
    print(
        f"{'burst':<12}{'s min':>8}{'s med':>8}{'s max':>8}{'vs cold':>9}{'slot wait ms':>14}{'containers':>12}"
        f"{'close s':>9}"
    )
    for k, v in rows.items():
        s = [x["s"] for x in v]
        wait = statistics.median(x["wait_ms_median"] for x in v)
        made = statistics.median(x["containers"] for x in v)
        close = statistics.median(x["close_s"] for x in v)
        print(
            f"{k:<12}{min(s):>8.2f}{med[k]:>8.2f}{max(s):>8.2f}{med[k] / med['cold']:>8.2f}x{wait:>14.1f}"
            f"{made:>12.0f}{close:>9.2f}"
        )
    verdicts = {k: med[k] <= med["cold"] for k in ("pool", "pool cold")}
    for k, ok in verdicts.items():
        print(
            f"{'PASS' if ok else 'MISS'}  {k}: the burst through the pool no slower than without "
            f"({med[k] / med['cold']:.2f}x)"
        )
    print(f"load average (1 min) at each round's start and the end: {[round(x, 2) for x in load]}")
    if args.json is not None:
        args.json.write_text(json.dumps({"args": vars(args) | {"json": str(args.json)}, "rows": rows, "load": load}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
