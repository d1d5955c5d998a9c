"""A user's own image against the worker image (issue 36), as ratios to floors measured in the same run.

    python -m bench.foreign [--runs 10] [--calls 50] [--fills 3] [--sandbox container] [--json PATH] [--check]

Measures, each beside its floor, interleaved so that a loaded host's drift hits both alike:
  a. cold first answer: ``Sandbox(image=...)`` constructed -> ``ping`` answered, in toolcage-base:bookworm
     (a Debian image with its own CPython, no worker label) and a busybox image (no libc, no Python;
     ``tests/harness/foreign_images.py``), against the same in the worker image. Goal <= 1.2x.
  b. a warm ``exec`` of ``true`` (argv, no shell) on an open sandbox of each image, against the worker
     image's. Goal <= 1.2x.
  c. the first run of an image never seen before (a tag ``docker import``-ed just now from a one-file tar
     with a salt, so a new content id: the runtime volumes exist, nothing of that image was ever started)
     against a second run of the same image. Reported, no goal.
  d. the first run after the worker image changed (a new worker image id: ``FROM worker`` plus a salted
     LABEL, the same files; ``TOOLCAGE_IMAGE`` names it, so the runtime volumes are filled anew for it)
     against a second run with them present. Reported: the fill is paid once per worker image.

The machine's load (``/proc/loadavg``) is recorded at the start and the end. Objects it makes are named
``toolcage-test-foreign-bench-*`` and removed before it ends (the derived worker images' runtime volumes too).
Not part of ``python -m bench``: (c) and (d) build images (about a minute in all); run it on its own.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import platform
import statistics
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from toolcage import Sandbox
from toolcage.options import worker_image

PREFIX = "toolcage-test-foreign-bench-"
BOOKWORM = "toolcage-base:bookworm"
GOAL = 1.2


def summary(values: list[float]) -> dict[str, float]:
    s = sorted(values)
    return {
        "min": s[0],
        "p50": statistics.median(s),
        "p90": s[min(len(s) - 1, round(0.9 * (len(s) - 1)))],
        "max": s[-1],
        "n": len(s),
    }


def first_answer_ms(image: str, sandbox: str | None) -> float:
    """``Sandbox(image=...)`` constructed -> its first ``ping`` answered (the close is not counted: the
    container is removed off the caller's path, as ``Sandbox.close`` does)."""
    t = time.perf_counter()
    with Sandbox(image=image, tool="bench-foreign", sandbox=sandbox, audit=False) as sb:
        assert sb.call("ping").result == "pong"
        return (time.perf_counter() - t) * 1000


def busybox_image() -> str:
    """The busybox image of the foreign-images harness (built there if missing, with no registry)."""
    root = str(Path(__file__).resolve().parents[1])
    if root not in sys.path:
        sys.path.insert(0, root)
    from tests.harness import foreign_images

    return foreign_images.ensure("busybox")


def import_fresh(n: int) -> str:
    """A new image with its own content id: ``docker import`` of a tar of one salted file (no layer shared)."""
    ref = f"{PREFIX}fresh-{os.getpid()}-{n}:1"
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        body = f"task {n} {time.time_ns()}\n".encode()
        info = tarfile.TarInfo("task/id")
        info.size, info.mode = len(body), 0o644
        tar.addfile(info, io.BytesIO(body))
    subprocess.run(["docker", "import", "-", ref], input=buf.getvalue(), check=True, capture_output=True, timeout=120)
    return ref


def derived_worker(n: int) -> str:
    """A new worker image id with the worker's very files (``FROM`` it, one salted LABEL; the classic builder
    commits no layer for a LABEL): its runtime volumes do not exist yet."""
    ref = f"{PREFIX}worker-{os.getpid()}-{n}:1"
    dockerfile = f"FROM {worker_image()}\nLABEL toolcage.bench.salt={time.time_ns()}\n"
    subprocess.run(
        ["docker", "build", "-q", "--network", "none", "-t", ref, "-"],
        input=dockerfile.encode(),
        check=True,
        capture_output=True,
        timeout=300,
        env={**os.environ, "DOCKER_BUILDKIT": "0"},
    )
    return ref


def remove_image(ref: str, worker: bool = False) -> None:
    """Remove an image this module made (and, for a derived worker image, the runtime volumes filled for it)."""
    from toolcage import wait_removed
    from toolcage.engine import runtime
    from toolcage.engine.docker_adapter import Engine

    engine = Engine.default()
    info = engine.image(ref)
    wait_removed(60)
    subprocess.run(["docker", "rmi", "-f", ref], capture_output=True, timeout=120)
    if worker and info is not None:
        for v in engine.volumes(f"{runtime.LABEL}={info['Id']}"):
            with contextlib.suppress(Exception):
                engine.remove_volume(v["Name"])
        runtime.forget()


@contextlib.contextmanager
def env(name: str, value: str) -> Iterator[None]:
    old = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = old


def warm_exec(images: dict[str, str], sandbox: str | None, calls: int) -> dict[str, list[float]]:
    """A warm ``exec`` of ``true`` (argv) on one open sandbox per image, the images taking turns."""
    out: dict[str, list[float]] = {k: [] for k in images}
    with contextlib.ExitStack() as stack:
        boxes = {
            k: stack.enter_context(Sandbox(image=ref, tool="bench-foreign", sandbox=sandbox, audit=False))
            for k, ref in images.items()
        }
        for i in range(calls + 5):
            for k, sb in boxes.items():
                t = time.perf_counter()
                r = sb.call("exec", {"argv": ["true"]})
                ms = (time.perf_counter() - t) * 1000
                assert r.ok and r.result["exit_code"] == 0, r
                if i >= 5:  # the first five of each warm up
                    out[k].append(ms)
    return out


def pairs(make: Callable[[int], str], first_and_second: Callable[[str], tuple[float, float]], n: int, worker: bool):
    """``n`` samples of (first run, second run), each of a new image made by ``make`` and removed after."""
    firsts, seconds = [], []
    for i in range(n):
        ref = make(i)
        try:
            a, b = first_and_second(ref)
        finally:
            remove_image(ref, worker=worker)
        firsts.append(a)
        seconds.append(b)
        print(f"\r  {i + 1}/{n}", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    return firsts, seconds


def loadavg() -> str:
    return Path("/proc/loadavg").read_text().strip()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=10, help="cold first answers per image, and fresh images (c)")
    ap.add_argument("--calls", type=int, default=50, help="warm exec calls per image")
    ap.add_argument("--fills", type=int, default=3, help="worker images derived anew (d)")
    ap.add_argument("--sandbox", default=None, help="container, gvisor (default: what --sandbox auto picks)")
    ap.add_argument("--json", type=Path, default=Path("bench/results/foreign.json"))
    ap.add_argument("--check", action="store_true", help="exit 1 if a goal is missed")
    args = ap.parse_args()
    load_start = loadavg()
    with Sandbox(image=worker_image(), tool="bench-foreign", sandbox=args.sandbox, audit=False) as sb:
        kind = sb.kind
    images = {"worker": worker_image(), "bookworm": BOOKWORM, "busybox": busybox_image()}

    print(f"(a) cold first answer, {args.runs} per image ({kind})", file=sys.stderr)
    cold: dict[str, list[float]] = {k: [] for k in images}
    for ref in images.values():
        first_answer_ms(ref, args.sandbox)  # warm-up, discarded (fills the runtime volumes if they are not)
    for i in range(args.runs):
        for k, ref in images.items():
            cold[k].append(first_answer_ms(ref, args.sandbox))
        print(f"\r  {i + 1}/{args.runs}", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)

    print(f"(b) warm exec true, {args.calls} per image", file=sys.stderr)
    warm = warm_exec(images, args.sandbox, args.calls)

    def twice(ref: str) -> tuple[float, float]:
        from toolcage import wait_removed

        first = first_answer_ms(ref, args.sandbox)
        wait_removed(60)  # the second does not start beside the first's removal (off the caller's path)
        return first, first_answer_ms(ref, args.sandbox)

    print(f"(c) first run of a never-seen image vs its second run, {args.runs} images", file=sys.stderr)
    fresh_first, fresh_second = pairs(import_fresh, twice, args.runs, worker=False)

    print(f"(d) first run after the worker image changed vs with its runtime present, {args.fills}", file=sys.stderr)
    probe_ref = import_fresh(10_000)  # a foreign image, so the run mounts the (new) worker image's runtime

    def with_worker(ref: str) -> tuple[float, float]:
        with env("TOOLCAGE_IMAGE", ref):
            return twice(probe_ref)

    try:
        fill_first, fill_second = pairs(derived_worker, with_worker, args.fills, worker=True)
    finally:
        remove_image(probe_ref)

    stats: dict[str, dict[str, float]] = {}
    for k in images:
        stats[f"cold_first_answer_{k}"] = summary(cold[k])
        stats[f"warm_exec_true_{k}"] = summary(warm[k])
    stats["new_image_first_run"] = summary(fresh_first)
    stats["new_image_second_run"] = summary(fresh_second)
    stats["new_worker_image_first_run"] = summary(fill_first)
    stats["new_worker_image_second_run"] = summary(fill_second)
    p50 = {k: v["p50"] for k, v in stats.items()}
    ratios = {
        "cold_bookworm_vs_worker": p50["cold_first_answer_bookworm"] / p50["cold_first_answer_worker"],
        "cold_busybox_vs_worker": p50["cold_first_answer_busybox"] / p50["cold_first_answer_worker"],
        "warm_exec_bookworm_vs_worker": p50["warm_exec_true_bookworm"] / p50["warm_exec_true_worker"],
        "warm_exec_busybox_vs_worker": p50["warm_exec_true_busybox"] / p50["warm_exec_true_worker"],
        "new_image_first_vs_second_run": p50["new_image_first_run"] / p50["new_image_second_run"],
        "new_worker_image_first_vs_second_run": p50["new_worker_image_first_run"] / p50["new_worker_image_second_run"],
    }
    goals = {
        f"cold first answer in a foreign image <= {GOAL}x the worker image's ({k})": ratios[f"cold_{k}_vs_worker"]
        <= GOAL
        for k in ("bookworm", "busybox")
    }
    goals.update(
        {
            f"warm exec in a foreign image <= {GOAL}x the worker image's ({k})": ratios[f"warm_exec_{k}_vs_worker"]
            <= GOAL
            for k in ("bookworm", "busybox")
        }
    )
    load_end = loadavg()

    print(f"\n{'measure (ms)':<34}{'min':>9}{'p50':>9}{'p90':>9}{'max':>9}{'n':>5}")
    for name, s in stats.items():
        print(f"{name:<34}{s['min']:>9.1f}{s['p50']:>9.1f}{s['p90']:>9.1f}{s['max']:>9.1f}{s['n']:>5}")
    for k, v in ratios.items():
        print(f"ratio {k}: {v:.2f}x")
    for goal, ok in goals.items():
        print(f"{'PASS' if ok else 'MISS'}  {goal}")
    print(f"sandbox kind: {kind}; load average at start {load_start}, at end {load_end}")
    report: dict[str, Any] = {
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {"cpus": os.cpu_count(), "kernel": platform.release(), "load_start": load_start,
                    "load_end": load_end},
        "sandbox": kind,
        "images": images,
        "stats_ms": stats,
        "ratios": ratios,
        "goals": goals,
    }  # fmt: skip
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2))
    print(f"wrote {args.json}", file=sys.stderr)
    return 1 if args.check and not all(goals.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
