"""Memory per warm pool slot, split into its parts (issue 27: 25.8 MiB, 55.7 MiB under a proxy policy; goal: half).

    python -m bench.warm_memory [--size 8] [--settle 2]

For the default policy and for the bundled policy whose ``network.mode`` is ``proxy`` (found among
the bundled policies: ``connector-http``), in turn:
  1. a warm-up ``Pool(size=1)`` of that policy is filled and closed (imports, the engine client, the
     image's files in the host's cache), then this process's RSS is read;
  2. ``Pool(size=N)`` is filled (``wait_ready``), left ``--settle`` s, and each slot's containers (the
     sandbox, and under a proxy policy its egress proxy: the containers labelled with the slot's run
     id) are read from the host's side, cgroup v1 (``/sys/fs/cgroup/memory/docker/<id>/``):
       - ``memory.usage_in_bytes`` (what the issue's figures count), and from ``memory.stat``:
         ``total_rss`` (anonymous), ``total_cache`` (page cache charged to the container: the image's
         files it read through fuse-overlayfs, and its tmpfs mounts as ``total_shmem``),
         ``total_mapped_file`` (the part of the cache mapped by its processes), the rest (kernel);
       - every process in the cgroup (``cgroup.procs``): ``Rss``, ``Pss`` and ``Anonymous`` from
         ``/proc/<pid>/smaps_rollup``, named by its command line (docker-init, the worker, the zygote,
         the proxy);
  3. this process's RSS growth per slot (the runner's side: sessions, reader threads, buffers), from
     step 1 to the filled pool, divided by N.
Printed: the per-slot medians with the split, PASS or MISS against half of the issue's figures, and
which parts are largest. Containers are toolcage's own (tool ``bench-memory``); closing the pool
removes them.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from toolcage import DEFAULT_IMAGE

MiB = 1024 * 1024
ISSUE = {"default": 25.8, "proxy": 55.7}  # MiB per warm slot, issue 27
CG = "/sys/fs/cgroup/memory/docker"


def proxy_policy() -> str:
    """The bundled policy with network.mode proxy (connector-http, the one ``python -m bench`` uses)."""
    import toolcage.policies as pols
    from toolcage.policies import load_policy

    names = sorted(p.stem for p in Path(pols.__file__).parent.glob("*.yaml"))
    found = [n for n in names if load_policy(n).network.mode == "proxy"]
    if not found:
        raise SystemExit("no bundled policy with network.mode proxy")
    return "connector-http" if "connector-http" in found else found[0]


def own_rss() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def rollup(pid: int) -> dict[str, int]:
    out = {}
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:]:
            k, v = line.split(":", 1)
            out[k] = int(v.split()[0]) * 1024
    except OSError:
        pass
    return out


def proc_name(pid: int) -> str:
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return "?"
    words = [a.decode(errors="replace") for a in argv if a]
    line = " ".join(words)
    if "docker-init" in line or words[:1] == ["/sbin/docker-init"]:
        return "docker-init"
    if "zygote" in line:
        return "zygote"
    if "-m" in words[:-1]:  # python -m MODULE: the worker, or the egress proxy's module
        return words[words.index("-m") + 1]
    return os.path.basename(words[0]) if words else "?"


def container_memory(cid: str) -> dict[str, Any]:
    base = Path(CG, cid)
    if not base.is_dir():
        raise SystemExit(f"no memory cgroup at {base} (this bench reads cgroup v1 with the cgroupfs driver)")
    stat = dict(line.split() for line in Path(base, "memory.stat").read_text().splitlines())
    usage = int(Path(base, "memory.usage_in_bytes").read_text())
    rss, cache = int(stat["total_rss"]), int(stat["total_cache"])
    procs = {}
    for pid in (int(x) for x in Path(base, "cgroup.procs").read_text().split()):
        name = proc_name(pid)
        while name in procs:
            name += "'"
        procs[name] = rollup(pid)
    return {
        "usage": usage,
        "rss (anonymous)": rss,
        "cache": cache,
        "  of which shmem (tmpfs)": int(stat.get("total_shmem", 0)),
        "  of which mapped_file": int(stat["total_mapped_file"]),
        "  of which not mapped": cache - int(stat["total_mapped_file"]),
        "other (kernel, usage - rss - cache)": usage - rss - cache,
        "procs": procs,
    }


def measure(policy: str, size: int, image: str, settle: float) -> dict[str, Any]:
    from toolcage.engine.docker_adapter import Engine
    from toolcage.engine.labels import LABEL_POOL, LABEL_ROLE, LABEL_RUN_ID
    from toolcage.pool import Pool

    engine = Engine.default()
    with Pool(policy, size=1, image=image, tool="bench-memory", audit=None) as warm:
        if not warm.wait_ready(timeout=180):
            raise SystemExit(f"the warm-up {policy} pool did not fill")
    rss0 = own_rss()
    time.sleep(settle)
    avail0 = mem_available()
    slots: list[dict[str, Any]] = []
    with Pool(policy, size=size, image=image, tool="bench-memory", audit=None) as pool:
        if not pool.wait_ready(timeout=300):
            raise SystemExit(f"the {policy} pool did not fill")
        time.sleep(settle)  # let the slots' workers settle before reading their memory
        rss1 = own_rss()
        host_per_slot = (avail0 - mem_available()) / size
        by_run: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for c in engine.containers(f"{LABEL_POOL}={pool.id}", all=False):
            by_run[c["Labels"].get(LABEL_RUN_ID, c["Id"])].append(c)
        for parts in by_run.values():
            slot: dict[str, Any] = {}
            for c in parts:
                role = c["Labels"].get(LABEL_ROLE, "sandbox")
                slot[role] = container_memory(c["Id"])
            if "sandbox" in slot:
                slots.append(slot)
    return {
        "slots": slots,
        "runner_per_slot": (rss1 - rss0) / size,
        "rss0": rss0,
        "rss1": rss1,
        "host_per_slot": host_per_slot,
    }


def mem_available() -> int:
    """The host's MemAvailable: what filling the pool took from the machine, whoever is charged for it."""
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return 0


def med(values: list[float]) -> float:
    return statistics.median(values) if values else 0.0


def main() -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.warm_memory", description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", type=int, default=8, help="slots per pool (medians over them)")
    ap.add_argument("--settle", type=float, default=2.0, help="seconds between the pool filled and the reading")
    ap.add_argument("--image", default=os.environ.get("TOOLCAGE_IMAGE", DEFAULT_IMAGE))
    args = ap.parse_args()
    proxy = proxy_policy()
    from toolcage.engine import sharedfiles
    from toolcage.engine.docker_adapter import Engine

    engine = Engine.default()
    image_id = (engine.image(args.image) or {}).get("Id")
    shared = sharedfiles.layers(engine, image_id)
    driver = engine.info().get("Driver")
    print(
        f"storage driver {driver}; the image's files: "
        + (
            f"shared, through each run's overlays at {', '.join(t for _, t in shared.lowers)}"
            if shared
            else "each container's own"
        ),
        file=sys.stderr,
    )
    results = {}
    for label, policy in (("default", "default"), ("proxy", proxy)):
        results[label] = measure(policy, args.size, args.image, args.settle)
        print(f"  {label} ({policy}): {len(results[label]['slots'])} slots read", file=sys.stderr, flush=True)

    verdicts = []
    largest: dict[str, list[tuple[str, float]]] = {}
    for label, res in results.items():
        slots = res["slots"]
        policy = "default" if label == "default" else proxy
        goal = ISSUE[label] / 2
        total = [sum(s[r]["usage"] for r in s) / MiB for s in slots]
        print(f"\nwarm slot, {policy} policy: median of {len(slots)} slots, MiB (cgroup v1, the host's side)")
        parts: list[tuple[str, float]] = []
        for role in sorted({r for s in slots for r in s}, key=lambda r: r != "sandbox"):
            mems = [s[role] for s in slots if role in s]
            print(f"  {role} container")
            for k in mems[0]:
                if k == "procs":
                    continue
                v = med([m[k] / MiB for m in mems])
                print(f"    {k:<40}{v:>8.1f}")
                if k in (
                    "rss (anonymous)",
                    "  of which not mapped",
                    "  of which mapped_file",
                    "  of which shmem (tmpfs)",
                ):
                    parts.append((f"{role} {k.strip().replace('of which ', 'cache ')}", v))
            names = sorted({n for m in mems for n in m["procs"]})
            print(f"    {'process':<24}{'Rss':>8}{'Pss':>8}{'Anon':>8}{'Pss_File':>9}")
            for n in names:
                got = [m["procs"][n] for m in mems if n in m["procs"]]

                def f(key: str, got: list[dict[str, int]] = got) -> float:
                    return med([g.get(key, 0) / MiB for g in got])

                print(f"    {n:<24}{f('Rss'):>8.1f}{f('Pss'):>8.1f}{f('Anonymous'):>8.1f}{f('Pss_File'):>9.1f}")
        runner = res["runner_per_slot"] / MiB
        print(f"  {'slot total (cgroup usage, all its containers)':<42}{med(total):>8.1f}")
        print(
            f"  {'the host: MemAvailable drop per slot':<42}{res['host_per_slot'] / MiB:>8.1f}"
            "  (the runner, the engine, page cache wherever charged; noisy)"
        )
        print(
            f"  {'the runner (this process) per slot':<42}{runner:>8.1f}"
            f"  (RSS {res['rss0'] / MiB:.0f} -> {res['rss1'] / MiB:.0f} MiB for {args.size} slots)"
        )
        ok = med(total) <= goal
        verdicts.append(
            f"{policy}: {med(total):.1f} MiB per warm slot (issue: {ISSUE[label]}), goal <= {goal:.1f}:"
            f" {'PASS' if ok else 'MISS'}"
        )
        largest[policy] = sorted(parts, key=lambda kv: -kv[1])[:3]

    print("\nmemory per warm slot, goal: half of the issue's figures")
    for v in verdicts:
        print(f"  {v}")
    print(
        "\nconclusion: largest parts per slot: "
        + "; ".join(f"{p}: " + ", ".join(f"{k} {v:.1f} MiB" for k, v in parts) for p, parts in largest.items())
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
