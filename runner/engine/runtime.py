"""The worker's runtime in a user's own image: filled once per worker image, mounted read-only in each run.

Why (issue 36): a user's image (an eval task's, a Node image, a team's Dockerfile) runs unchanged, with
nothing built per image. The worker image carries its runtime as a tree of its own, ``/opt/toolcage/rt``
(its CPython, loader and libraries, edited so that nothing of another image is loaded: ``image/rt.py``),
beside ``/opt/toolcage/lib`` (toolcage and its packages). A sandbox of any other image mounts both,
read-only, and starts ``/opt/toolcage/rt/bin/python3`` there (:data:`ENTRYPOINT`); the image's own
ENTRYPOINT and CMD never run, and its files are data to the worker.

How, as values (the pattern of ``engine.sharedfiles``): :func:`find` answers (engine, worker image id)
with the two volumes holding the trees and whether runs mount overlays of them. The first use on an engine
fills them: a container of the worker image is created (never started) with the two empty volumes at
those paths, and the engine copies the image's directories into them; a probe then checks that an overlay
of them mounts; a marker volume ``toolcage-rt-<image id>`` records both, made last (a fill that did not
finish is never used: ``toolcage gc`` removes volumes no marker names).

Each run mounts its own overlay volumes of them (:func:`run_mounts`), not the shared volumes themselves:
the same reason as ``sharedfiles`` (an inode's locks and inotify events are the kernel's, whoever opened
it: sandboxes sharing inodes could signal each other through ``fcntl`` locks on rt's files). Where an
engine cannot mount such an overlay (the probe failed: a rootless engine), runs mount the volumes
themselves, read-only: that covert channel is then open between runs of foreign images
(``docs/security.md`` says so).

Threat: a sandbox changing what later sandboxes run. The volumes are written only by the engine, from the
worker image, before any sandbox mounts them; the overlays have no upper layer and are mounted read-only.
"""

from __future__ import annotations

import secrets
import threading
from dataclasses import dataclass
from typing import Any

from toolcage import logs
from toolcage.engine.api import EngineAPI
from toolcage.engine.sharedfiles import drop_volumes, in_use_paths, marked, overlay_options, stale_of
from toolcage.errors import SandboxError, ToolcageError

PREFIX = "toolcage-rt-"
RUN_PREFIX = "toolcage-rt-run-"  # a run's own overlay volumes (the run's labels: the reaper's and gc's)
LABEL = "toolcage.rt"  # on every volume of this module: the worker image id it holds the runtime of
LABEL_VOLUMES = "toolcage.rt.volumes"  # on the marker: the data volumes, comma-separated, in TARGETS order
LABEL_OVERLAY = "toolcage.rt.overlay"  # on the marker: "1" runs mount overlays of them, "0" the volumes
TARGETS = ("/opt/toolcage/lib", "/opt/toolcage/rt")
RT = "/opt/toolcage/rt"
# the worker in a user's image: rt's interpreter by absolute path, never one found on the image's PATH
ENTRYPOINT = (f"{RT}/bin/python3", "-S", "-m", "toolcage.worker")


@dataclass(frozen=True)
class Runtime:
    """Where one worker image's runtime lies on an engine: (data volume, mountpoint on the engine's host,
    target) per tree; ``empty``: an empty directory for the overlays (None: runs mount the volumes)."""

    volumes: tuple[tuple[str, str, str], ...]
    empty: str | None


_known: dict[tuple[int, str], Runtime] = {}
_guard = threading.Lock()
_locks: dict[tuple[int, str], threading.Lock] = {}


def marker_name(image_id: str) -> str:
    return f"{PREFIX}{_short(image_id)}"


def find(engine: EngineAPI, image_id: str) -> Runtime:
    """The runtime of this worker image on this engine, filled on first use (a few seconds, once)."""
    key = (id(engine), image_id)
    if key in _known:
        return _known[key]
    with _guard:
        lock = _locks.setdefault(key, threading.Lock())
    with lock:  # a pool's slots starting together wait for the first fill
        if key not in _known:
            found = _listed(engine, image_id)
            if found is None:
                _make(engine, image_id)
                found = _listed(engine, image_id)
            if found is None:
                raise SandboxError(f"the worker's runtime volumes of image {_short(image_id)} could not be made")
            _known[key] = found
        return _known[key]


def run_mounts(run_id: str, rt: Runtime) -> tuple[tuple[str, str], ...]:
    """A run's (volume, target) pairs: its own overlays' names, or the shared volumes themselves."""
    if rt.empty is None:
        return tuple((name, target) for name, _path, target in rt.volumes)
    return tuple((f"{RUN_PREFIX}{run_id}-{target.rsplit('/', 1)[-1]}", target) for _n, _p, target in rt.volumes)


def make_run_volumes(
    engine: EngineAPI, rt: Runtime, mounts: tuple[tuple[str, str], ...], labels: dict[str, str]
) -> list[str]:
    """Create a run's overlay volumes (none when it mounts the shared ones); the names made, for removal."""
    if rt.empty is None:
        return []
    where = {target: path for _n, path, target in rt.volumes}
    made: list[str] = []
    try:
        for name, target in mounts:
            engine.create_volume(name, labels, overlay_options(where[target], rt.empty))
            made.append(name)
    except BaseException:
        for name in made:
            _quiet(engine.remove_volume, name)
        raise
    return made


def _listed(engine: EngineAPI, image_id: str) -> Runtime | None:
    seen = marked(engine, f"{LABEL}={image_id}", marker_name(image_id))
    if seen is None:
        return None
    labels, volumes = seen
    names = str(labels.get(LABEL_VOLUMES, "")).split(",")
    if len(names) != len(TARGETS) or not all(n in volumes and volumes[n].get("Mountpoint") for n in names):
        return None  # a volume removed by hand: made again (gc removes the old marker's leftovers)
    empty = str(volumes[marker_name(image_id)].get("Mountpoint") or "") if labels.get(LABEL_OVERLAY) == "1" else ""
    return Runtime(
        volumes=tuple((n, str(volumes[n]["Mountpoint"]), t) for n, t in zip(names, TARGETS, strict=True)),
        empty=empty or None,
    )


def _make(engine: EngineAPI, image_id: str) -> None:
    """Fill the two volumes from the worker image (the engine copies at create), probe, then the marker."""
    short = _short(image_id)
    base = {LABEL: image_id}
    tag = secrets.token_hex(4)
    names = [f"{PREFIX}{short}-{tag}-{t.rsplit('/', 1)[-1]}" for t in TARGETS]
    logs.get_logger().info("runtime.filling", image=short, detail="copying the worker's runtime once")
    made: list[str] = []
    filler: str | None = None
    try:
        for name in names:
            engine.create_volume(name, base)
            made.append(name)
        config = {
            "Image": image_id,
            "Entrypoint": ["/nonexistent"],  # never started: the engine copies the directories at create
            "NetworkDisabled": True,
            "Labels": base,
            "HostConfig": {
                "NetworkMode": "none",
                "Mounts": [
                    {"Type": "volume", "Source": v, "Target": t, "ReadOnly": False}
                    for v, t in zip(names, TARGETS, strict=True)
                ],
            },
        }
        filler = engine.create(config, f"{PREFIX}{short}-{tag}-fill")
    except BaseException:
        for name in made:
            _quiet(engine.remove_volume, name)
        raise
    finally:
        if filler is not None:
            _quiet(engine.remove, filler)
    where = {v["Name"]: v.get("Mountpoint") for v in engine.volumes(f"{LABEL}={image_id}")}
    overlay = "1" if _probe(engine, image_id, str(where.get(names[1]) or ""), base) else "0"
    if overlay == "0" and not _probe(engine, image_id, "", base, volume=names[1]):
        # not even the volume itself runs rt's python3: an engine that did not copy the image's directory
        # at create (or a worker image older than rt). No marker: asked again, with the reason now
        for name in made:
            _quiet(engine.remove_volume, name)
        raise SandboxError(
            f"the worker image {short} gives no runtime for other images on this engine (its /opt/toolcage/rt "
            "did not run from a volume): rebuild it with `toolcage image build`"
        )
    engine.create_volume(marker_name(image_id), {**base, LABEL_VOLUMES: ",".join(names), LABEL_OVERLAY: overlay})


def _probe(engine: EngineAPI, image_id: str, rt_path: str, base: dict[str, str], volume: str | None = None) -> bool:
    """Whether rt's python3 runs for a run: from an overlay of ``rt_path`` (this engine mounts such overlays),
    or, given ``volume``, from that volume itself. Once per worker image."""
    if not rt_path and volume is None:
        return False
    tag = secrets.token_hex(4)
    short = _short(image_id)
    names = (f"{PREFIX}{short}-{tag}-probe", f"{PREFIX}{short}-{tag}-empty")
    cid: str | None = None
    try:
        if volume is None:
            engine.create_volume(names[1], base)
            where = {v["Name"]: v.get("Mountpoint") for v in engine.volumes(f"{LABEL}={image_id}")}
            if not where.get(names[1]):
                return False
            engine.create_volume(names[0], base, overlay_options(rt_path, str(where[names[1]])))
        config = {
            "Image": image_id,
            "Entrypoint": [f"{RT}/bin/python3", "-S", "-c", "pass"],
            "User": "65532:65532",
            "NetworkDisabled": True,
            "Labels": base,
            "HostConfig": {
                "NetworkMode": "none",
                "ReadonlyRootfs": True,
                "Mounts": [
                    {"Type": "volume", "Source": volume or names[0], "Target": RT, "ReadOnly": True,
                     "VolumeOptions": {"NoCopy": True}}
                ],
            },
        }  # fmt: skip
        cid = engine.create(config, f"{PREFIX}{short}-{tag}-probe")
        engine.start(cid)
        return engine.wait(cid, timeout=60) == 0
    except ToolcageError as exc:
        logs.get_logger().warning("runtime.no_overlay", image=short, error=exc.message)
        return False
    finally:
        if cid is not None:
            _quiet(engine.remove, cid)
        if volume is None:
            _quiet(engine.remove_volume, names[0])
            _quiet(engine.remove_volume, names[1])


def stale(engine: EngineAPI, now: float | None = None) -> list[tuple[str, str, str]]:
    """What of this module is no longer of use, as (kind, id or name, why): the volumes of worker images the
    engine no longer has, volumes no marker names, and a fill's container older than ``sharedfiles.FILL_STALE_S``
    (sharedfiles.stale_of, the same rules as the shared files')."""

    def named(labels: dict[str, str]) -> set[str]:
        return set(str(labels.get(LABEL_VOLUMES, "")).split(","))

    busy = in_use_paths(engine, prefix=RUN_PREFIX)
    return stale_of(engine, LABEL, marker_name, named, "the worker's runtime", busy, now)


def drop(engine: EngineAPI, image_id: str) -> list[str]:
    """Remove this worker image's runtime volumes (a build replaced the image, no tag names it): the marker
    first; none while a live run's overlay is made of them (``toolcage gc`` then). The names removed."""
    removed = drop_volumes(engine, f"{LABEL}={image_id}", marker_name(image_id), RUN_PREFIX)
    for key in [k for k in _known if k[1] == image_id]:
        del _known[key]
    return removed


def forget() -> None:
    _known.clear()


def _short(image_id: str) -> str:
    return image_id.removeprefix("sha256:")[:12]


def _quiet(fn: Any, *args: Any) -> None:
    try:
        fn(*args)
    except ToolcageError as exc:
        logs.get_logger().warning("runtime.cleanup_failed", what=str(args[0])[:80], error=exc.message)


__all__ = [
    "ENTRYPOINT",
    "LABEL",
    "RT",
    "TARGETS",
    "Runtime",
    "drop",
    "find",
    "forget",
    "make_run_volumes",
    "marker_name",
    "run_mounts",
    "stale",
]
