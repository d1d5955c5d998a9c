"""toolcage on a Ray cluster of 1, 2 and 3 worker nodes, each with its own Docker engine, on this machine.

    sudo .venv/bin/python -m bench.ray_cluster [--nodes 1,2,3] [--burst 200] [--seq 40]

For each cluster size (examples/ray_cluster/local_cluster.py starts it: one head, N worker raylets, N dockerds):
- **floor**: ``--burst`` plain ``docker run --rm`` on the one-node cluster's engine, 8 at a time: fresh
  containers per second that engine sustains here;
- **burst**: ``--burst`` one-off runs (``run_python`` ``pass``) submitted at once through ``Cluster.map``; fresh
  sandboxes per second (runs answered / wall time), p50 and p99 of each run's time to its answer (from the
  submission), and the per-node start rate (runs / wall / nodes);
- **placement overhead**: ``--seq`` sequential runs through the one-node cluster, each on a warm slot (the pool
  refills between runs), beside the same run on a local ``AsyncPool`` of the same size on the same node's
  engine: the difference of the medians is what placement and the way to the agent add. Goal: at most 5 ms at
  p50. Its split: the same runs with the direct channel off (``Cluster(direct=False)``: one Ray actor call per
  run, as before issue 40's ninth round), and a Ray actor call that does nothing (``status``), Ray's own floor.

On a 2-core machine extra nodes add engines and agents, not CPU: the burst rate cannot grow with the node
count here. The per-node rate of the one-node cluster is the figure a real cluster of N machines multiplies.
Needs root (it starts dockerd) and the worker image in the main engine.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import statistics
import sys
import time
from pathlib import Path
from typing import Any

GOAL_MS = 5.0
ROOT = Path(__file__).resolve().parents[1]


def _harness() -> Any:
    path = ROOT / "examples" / "ray_cluster" / "local_cluster.py"
    spec = importlib.util.spec_from_file_location("local_cluster", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["local_cluster"] = mod
    spec.loader.exec_module(mod)
    return mod


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(q * (len(xs) - 1)))]


def _local_pool(seq: int, warm: int, docker_host: str) -> list[float]:
    """The same run on a local pool on the same engine as the one-node cluster's node: the floor placement adds to."""
    from toolcage import AsyncPool
    from toolcage.engine.docker_adapter import Engine

    engine = Engine(base_url=docker_host)

    async def go() -> list[float]:
        out = []
        async with AsyncPool("default", size=warm, tool="bench", engine=engine) as pool:
            await pool.wait_ready(timeout=120)
            for _ in range(seq):
                await asyncio.sleep(0.4)  # as the cluster's sequential runs: the slot just used is refilled
                t = time.perf_counter()
                async with pool.sandbox() as sb:
                    r = await sb.call("run_python", {"code": "pass"})
                    out.append((time.perf_counter() - t) * 1000)  # to the answer: the close comes after
                assert r.ok, r
                await pool.wait_ready(timeout=60)
        return out

    return asyncio.run(go())


def _docker_run_floor(node: Any, burst: int, parallel: int = 8) -> float:
    """Fresh containers per second the node's engine sustains from plain ``docker run --rm`` (``true`` in the
    worker image, no network), ``parallel`` at a time: the engine's own limit on this machine."""
    from concurrent.futures import ThreadPoolExecutor

    def one(_: int) -> None:
        node.docker("run", "--rm", "--network", "none", "--entrypoint", "true", "toolcage-worker:0.1.0")

    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=parallel) as ex:
        list(ex.map(one, range(burst)))
    return burst / (time.perf_counter() - t0)


def _sequential(c: Any, n: int, seq: int) -> list[float]:
    """``seq`` runs one after another, each on a warm slot: ms from the call to its answer."""
    out = []
    for _ in range(seq):
        deadline = time.monotonic() + 30
        while sum(1 for x in c.nodes() if x["eligible"]) < n and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.4)  # the slot just used is refilled before the next run
        t = time.perf_counter()
        r = c.run("run_python", {"code": "pass"})
        out.append((time.perf_counter() - t) * 1000)
        assert r.ok, r
    return out


def _cluster(n: int, burst: int, seq: int, warm: int, max_starting: int) -> dict[str, Any]:
    import ray

    import toolcage.ray as tcr

    lc = _harness().LocalCluster()
    lc.up(nodes=n, image_on=set(range(n)))
    try:
        ray.init(address=lc.address, log_to_driver=False)
        per_node = {"warm": warm, "max_running": 32, "max_starting": max_starting}
        via_ray: list[float] = []
        noop: list[float] = []
        if n == 1:  # the split: the same runs through one Ray actor call each, and Ray's floor
            off = tcr.Cluster("default", name="bench-ray", per_node=per_node, direct=False)
            off.wait_ready(count=n, timeout=300)
            via_ray = _sequential(off, n, seq)
            handle = next(iter(off._agents.values())).handle
            for _ in range(50):
                t = time.perf_counter()
                ray.get(handle.status.remote())
                noop.append((time.perf_counter() - t) * 1000)
            off.close(stop_agents=True)
        c = tcr.Cluster("default", name="bench", per_node=per_node)
        c.wait_ready(count=n, timeout=300)
        one = _sequential(c, n, seq)
        # the burst
        lat: list[float] = []
        t0 = time.perf_counter()

        def timed(_: int) -> Any:
            t = time.perf_counter()
            r = c.run("run_python", {"code": "pass"}, wait_s=600)
            lat.append((time.perf_counter() - t) * 1000)
            return r

        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(max_workers=min(burst, 64 * n)) as ex:
            results = list(ex.map(timed, range(burst)))
        wall = time.perf_counter() - t0
        errors = [r for r in results if not getattr(r, "ok", False)]
        c.close(stop_agents=True)
        ray.shutdown()
        local = _local_pool(seq, warm, lc.nodes[0].docker_host) if n == 1 else []
        floor = _docker_run_floor(lc.nodes[0], burst) if n == 1 else 0.0
        return {
            "local": local, "floor": floor, "via_ray": via_ray, "noop": noop,
            "nodes": n, "seq": one, "lat": lat, "wall_s": wall, "errors": len(errors),
            "rate": (burst - len(errors)) / wall, "per_node": (burst - len(errors)) / wall / n,
        }  # fmt: skip
    finally:
        if ray.is_initialized():
            ray.shutdown()
        lc.down()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", default="1,2,3")
    ap.add_argument("--burst", type=int, default=200)
    ap.add_argument("--seq", type=int, default=40)
    ap.add_argument("--warm", type=int, default=4)
    ap.add_argument("--max-starting", type=int, default=4)
    a = ap.parse_args()
    sizes = [int(n) for n in a.nodes.split(",")]
    if sizes[0] != 1:
        ap.error("--nodes must start with 1: the one-node cluster's engine is where the local floor is measured")
    rows = [_cluster(n, a.burst, a.seq, a.warm, a.max_starting) for n in sizes]
    local = rows[0]["local"]
    lp50 = statistics.median(local)
    print(
        f"per node: warm={a.warm}, max_running=32, max_starting={a.max_starting}; run_python pass, to answer and close"
    )
    print(f"local AsyncPool on node 0's engine, acquire to answer: p50 {lp50:.1f} ms, p99 {_pct(local, 0.99):.1f} ms")
    floor = rows[0]["floor"]
    print(f"plain docker run --rm on node 0's engine, 8 at a time: {floor:.1f} containers/s (the engine's floor)")
    print(
        f"{'nodes':>5} {'seq p50':>9} {'overhead':>9} {'burst':>6} {'errors':>6} {'runs/s':>7} {'per node':>9} "
        f"{'p50 ms':>8} {'p99 ms':>8}"
    )
    for r in rows:
        p50 = statistics.median(r["seq"])
        print(
            f"{r['nodes']:>5} {p50:>9.1f} {p50 - lp50:>+9.1f} {a.burst:>6} {r['errors']:>6} {r['rate']:>7.1f} "
            f"{r['per_node']:>9.1f} {_pct(r['lat'], 0.5):>8.0f} {_pct(r['lat'], 0.99):>8.0f}"
        )
    one = rows[0]
    over = statistics.median(one["seq"]) - lp50
    print(
        f"placement overhead at p50 (1 node): {over:+.1f} ms, goal <= {GOAL_MS} ms: "
        + ("PASS" if over <= GOAL_MS else "MISS")
    )
    if one["via_ray"]:
        ray_p50 = statistics.median(one["via_ray"])
        print(
            f"split: the same runs with one Ray actor call each (direct=False): p50 {ray_p50:.1f} ms "
            f"({ray_p50 - lp50:+.1f} ms over the local pool); a Ray actor call that does nothing: p50 "
            f"{statistics.median(one['noop']):.2f} ms; the direct channel saves "
            f"{ray_p50 - statistics.median(one['seq']):.1f} ms"
        )
    print(f"one node's burst rate is {rows[0]['per_node'] / floor:.2f}x its engine's docker run rate")
    print(
        f"a cluster of N machines like this one's node would start about N x {rows[0]['per_node']:.1f} fresh "
        "sandboxes/s (each machine's engine and CPU are its own; here all nodes share 2 cores)"
    )


if __name__ == "__main__":
    main()
