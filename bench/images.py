"""Per-task images at scale (issue 36, point 5): many small foreign images through a pool and a cluster.

The images are built here, locally, with no registry: ``docker import`` of a small tar holding one
distinct file (``/task/id``), tagged ``toolcage-test-burst-N`` (:func:`burst_images`); each has its own
content id. Figures (``python -m bench.images [pool|cluster|all]``):

- ``pool_burst``: one run in each of 20 images through one :class:`~toolcage.pool.Pool`
  (``pool.sandbox(image=...)``, filled on demand), against the same count of runs on one image.
- ``cluster_first_run`` / ``cluster_burst``: on a local Ray cluster of two engines (this machine's and a
  second dockerd, tests.integration.test_local_cluster's shape), the first run of an image a node
  has against one it lacks (sent over without a registry), and the burst through ``cluster.sandbox``.
"""

from __future__ import annotations

import io
import json
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
    if not fresh and engine.image(ref) is not None:
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
    return ref


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

    def burst(refs: Sequence[str | None]) -> float:
        with Pool(size=parallel, audit=False, max_warm=parallel) as pool:
            pool.wait_ready(timeout=120)  # the pool's own image warm, as an eval loop's would be

            def one(ref: str | None) -> None:
                with pool.sandbox(image=ref) as sb:
                    _one_run(sb)

            t = time.monotonic()
            with ThreadPoolExecutor(parallel) as ex:
                list(ex.map(one, refs))
            return time.monotonic() - t

    one_image = burst([None] * runs)
    many = burst(order)
    return {
        "runs": runs,
        "images": len(images),
        "one_image_s": round(one_image, 2),
        "many_images_s": round(many, 2),
        "ratio": round(many / one_image, 2),
    }


def main(argv: Sequence[str]) -> int:
    what = argv[0] if argv else "pool"
    out: dict[str, Any] = {}
    images = burst_images(20)
    if what in ("pool", "all"):
        out["pool_burst"] = pool_burst(images)
    if what in ("cluster", "all"):
        from bench.images_cluster import cluster_figures  # Ray only when asked

        out.update(cluster_figures(images))
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
