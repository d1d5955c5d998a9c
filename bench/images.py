"""Per-task images at scale (issue 36, point 5): many small foreign images through a pool and a cluster.

The images are built here, locally, with no registry: ``docker import`` of a small tar holding one
distinct file (``/task/id``), tagged ``toolcage-test-burst-N`` (:func:`burst_images`); each has its own
content id. Figures (``python -m bench.images [pool|cluster|all]``):

- ``first_run``: a cold ``Sandbox(image=...)`` of an image never run before against its second run, and
  against the worker image.
- ``pool_burst``: 40 runs over 20 images through one :class:`~toolcage.pool.Pool` (``pool.sandbox(image=...)``,
  filled on demand; and with the next runs' images asked for ahead, ``pool.warm``), against the same
  count of runs on the pool's own image (its warm slots).
- ``cluster_first_run`` / ``cluster_burst``: on a local Ray cluster of two worker nodes, each with a
  dockerd of its own (examples/ray_cluster/local_cluster.py), the first run of an image never run before on
  a node that has it against one that lacks it (sent over without a registry), and 40 runs over 20
  images through ``cluster.run(image=...)`` (first: the nodes lack them; again: they have them) against
  40 on the cluster's own image.
"""

from __future__ import annotations

import contextlib
import io
import json
import statistics
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

PREFIX = "toolcage-test-burst-"


def burst_image(n: int, engine: Any = None, *, fresh: bool = False) -> str:
    """``toolcage-test-burst-N``: an image of one file, ``/task/id`` (``task N``), built with ``docker
    import`` when missing (``fresh``: built again, with a new content id: a salt in the file)."""
    from toolcage.engine.docker_adapter import Engine

    engine = engine or Engine.default()
    ref = f"{PREFIX}{n}"
    old = engine.image(ref)
    if not fresh and old is not None:
        return ref
    body = f"task {n}\n" + (f"salt {time.time_ns()}\n" if fresh else "")
    with tempfile.TemporaryDirectory(prefix="toolcage-test-burst-") as tmp:
        archive = Path(tmp) / "image.tar"
        with tarfile.open(archive, "w") as tar:
            for d in ("task", "tmp"):
                info = tarfile.TarInfo(d)
                info.type, info.mode = tarfile.DIRTYPE, 0o1777 if d == "tmp" else 0o755
                tar.addfile(info)
            data = body.encode()
            info = tarfile.TarInfo("task/id")
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
        engine.import_tarball(str(archive), ref, "latest")
    if old is not None:  # the build it replaces, untagged now: not left behind
        drop_image(old["Id"], engine)
    return ref


def drop_image(ref: str, engine: Any = None) -> None:
    """Remove an image this module made (not one a container still uses)."""
    from toolcage.engine.docker_adapter import Engine

    engine = engine or Engine.default()
    with contextlib.suppress(Exception):
        engine.api.remove_image(ref)


def burst_images(count: int = 20, engine: Any = None) -> list[str]:
    return [burst_image(n, engine) for n in range(1, count + 1)]


def _timed(fn: Callable[[], Any]) -> float:
    t = time.monotonic()
    fn()
    return time.monotonic() - t


def _one_run(sb: Any) -> None:
    got = sb.call("write_file", {"path": "note.txt", "content": "x"})
    if not got.ok:
        raise RuntimeError(f"a run failed: {got.error}")


def pool_burst(images: Sequence[str], runs: int | None = None, parallel: int = 2) -> dict[str, Any]:
    """``runs`` runs (default: two per image) spread over ``images`` through one pool, ``parallel`` at a
    time, against the same count on the pool's own (worker) image. Seconds for the whole burst."""
    from concurrent.futures import ThreadPoolExecutor

    from toolcage.pool import Pool

    runs = runs or 2 * len(images)
    order = [images[i % len(images)] for i in range(runs)]

    def burst(refs: Sequence[str | None], ahead: int = 0) -> float:
        # ahead: the loop asks for the slots of the next `ahead` runs' images before it takes one (Pool.warm)
        with Pool(size=parallel, audit=False, max_warm=max(parallel, ahead)) as pool:
            pool.wait_ready(timeout=120)  # the pool's own image warm, as an eval loop's would be
            for ref in refs[:ahead]:
                pool.warm(ref)

            def one(i: int) -> None:
                if ahead and i + ahead < len(refs):
                    pool.warm(refs[i + ahead])
                with pool.sandbox(image=refs[i]) as sb:
                    _one_run(sb)

            t = time.monotonic()
            with ThreadPoolExecutor(parallel) as ex:
                list(ex.map(one, range(len(refs))))
            return time.monotonic() - t

    one_image = burst([None] * runs)
    many = burst(order)
    warmed = burst(order, ahead=parallel)
    return {
        "runs": runs,
        "images": len(images),
        "one_image_s": round(one_image, 2),
        "many_images_s": round(many, 2),
        "many_images_warmed_ahead_s": round(warmed, 2),
        "ratio": round(many / one_image, 2),
        "ratio_warmed_ahead": round(warmed / one_image, 2),
    }


def first_runs(repeat: int = 3) -> dict[str, Any]:
    """A cold ``Sandbox(image=...)`` of an image never run before (a fresh build each time) against a
    second cold run of it, and against the worker image; first answer (start + one call), medians."""
    from toolcage import Sandbox

    def cold(ref: str | None) -> float:
        def go() -> None:
            with Sandbox(image=ref, audit=False) as sb:
                _one_run(sb)

        return _timed(go)

    cold(None)  # the worker image's runtime volumes exist (made once per worker build)
    first, second, worker = [], [], []
    for i in range(repeat):
        ref = burst_image(90 + i, fresh=True)
        first.append(cold(ref))
        second.append(cold(ref))
        worker.append(cold(None))
    for i in range(repeat):
        drop_image(f"{PREFIX}{90 + i}")
    med = statistics.median
    return {
        "repeat": repeat,
        "first_run_s": round(med(first), 3),
        "second_run_s": round(med(second), 3),
        "worker_image_s": round(med(worker), 3),
        "first_over_second": round(med(first) / med(second), 2),
    }


def cluster_figures(images: Sequence[str], repeat: int = 3) -> dict[str, Any]:
    """On a local Ray cluster of two nodes (each its own dockerd, both with the worker image): the first run
    of a never-seen image on the node that has it (loaded there beforehand) against one that lacks it (sent
    from here, docker save/load, no registry); then 40 runs over ``images`` (none on the nodes yet), a second
    such burst (they are there now), and 40 runs on the cluster's own image."""
    from concurrent.futures import ThreadPoolExecutor

    import ray

    import toolcage.ray as tcr
    from tests.helpers import ray_harness
    from toolcage.engine.docker_adapter import Engine

    engine = Engine.default()
    lc = ray_harness().LocalCluster()
    lc.up(nodes=2, image_on={0, 1})
    try:
        ray.init(address=lc.address, log_to_driver=False)
        n0, n1 = lc.nodes
        c = tcr.Cluster("default", name="bench-img", per_node={"warm": 2, "max_running": 8, "max_starting": 2})
        try:
            c.wait_ready(count=2, timeout=180)

            def session(ref: str | None, node: str | None) -> float:
                def go() -> None:
                    with c.sandbox(image=ref, node=node) as sb:
                        _one_run(sb)

                return _timed(go)

            session(None, n0.node_id), session(None, n1.node_id)
            has, lacks = [], []
            for i in range(repeat):
                ref = burst_image(80 + i, engine, fresh=True)
                Engine(base_url=n0.docker_host).load_image(engine.save_image(ref))
                has.append(session(ref, n0.node_id))
                ref = burst_image(85 + i, engine, fresh=True)
                lacks.append(session(ref, n1.node_id))
            sent = [e for e in c.events if e["event"] == "run_image_sent"]

            def burst(refs: Sequence[str | None]) -> float:
                def one(ref: str | None) -> None:
                    r = c.run("write_file", {"path": "n.txt", "content": "x"}, image=ref)
                    if not r.ok:
                        raise RuntimeError(r.error)

                t = time.monotonic()
                with ThreadPoolExecutor(8) as ex:
                    list(ex.map(one, refs))
                return time.monotonic() - t

            runs = 2 * len(images)
            spread = [images[i % len(images)] for i in range(runs)]
            one_image = burst([None] * runs)
            many_first = burst(spread)
            many_again = burst(spread)
            med = statistics.median
            return {
                "cluster_first_run": {
                    "repeat": repeat,
                    "node_has_it_s": round(med(has), 3),
                    "node_lacks_it_s": round(med(lacks), 3),
                    "send_s": round(med(e["s"] for e in sent), 3) if sent else None,
                    "ratio": round(med(lacks) / med(has), 2),
                },
                "cluster_burst": {
                    "runs": runs,
                    "images": len(images),
                    "one_image_s": round(one_image, 2),
                    "many_images_first_s": round(many_first, 2),
                    "many_images_again_s": round(many_again, 2),
                    "ratio_first": round(many_first / one_image, 2),
                    "ratio_again": round(many_again / one_image, 2),
                    "images_sent": len([e for e in c.events if e["event"] == "run_image_sent"]) - len(sent),
                },
            }
        finally:
            c.close(stop_agents=True)
            ray.shutdown()
    finally:
        lc.down()
        for i in (*range(80, 80 + repeat), *range(85, 85 + repeat)):
            drop_image(f"{PREFIX}{i}", engine)


def main(argv: Sequence[str]) -> int:
    what = argv[0] if argv else "pool"
    out: dict[str, Any] = {}
    images = burst_images(20)
    if what in ("pool", "all"):
        out["first_run"] = first_runs()
        out["pool_burst"] = pool_burst(images)
    if what in ("cluster", "all"):
        out.update(cluster_figures(images))
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
