"""The image's program files, shared between its sandboxes: one copy in the host's page cache, not one each.

Why (memory per warm slot): with a storage driver that gives every container a mount of its
own over the image (fuse-overlayfs, as on this project's machines; vfs, btrfs and zfs likewise), the
files a worker reads at start (the interpreter, libc, libcrypto, the standard library, toolcage: about
15 MiB) are cached anew for each container and charged to its cgroup, and every read goes through that
container's FUSE daemon (about 58 ms of its CPU per start). overlay2 shares the image's files between
containers already. Elsewhere the engine copies the image's ``/usr`` and ``/opt/toolcage/lib`` once into
two volumes named for the image id, and each sandbox of that image (and its egress proxy) mounts them
read-only over the same paths: the same bytes, read from the host's own filesystem, cached once.
Measured here: a warm worker's cgroup 23.7 -> 9.0 MiB, a container start about 90 ms less.

How, as values: :func:`layers` answers the (engine, image id) pair with where the shared files lie on the
engine's host, or None. The decision is asked of the engine once per pair and process: a marker volume
``toolcage-files-<image id>`` whose labels say whether to share (``toolcage.files.use``) and which two
volumes hold the files. The first run of an image on an engine makes it: the storage driver from
``info`` (overlay2: a marker saying no), else the two volumes filled by the engine itself (a container
created with them mounted, not started: Docker copies the image's directory into an empty volume at
create), a probe that an overlay of them mounts and runs, then the marker. ``TOOLCAGE_SHARED_FILES=off``
turns it off; Podman's service is left out (its flavour says so).

Each run mounts them through volumes of its own (:func:`run_volumes`: the local driver's read-only
overlay, the shared directory as its only layer), not the shared volumes themselves. Why (found by
attacking the first version, which mounted the shared volumes in every sandbox): every sandbox then
opened the same inodes, and an inode's locks and inotify events are the kernel's, whoever opened it.
A sandbox with no network passed a workspace file to a sandbox under a proxy policy through
``fcntl`` locks on ``/usr/lib/python3.11/this.py`` (byte ranges as bits), saw by inotify which commands
and modules other sandboxes and their proxies opened, and slowed every other sandbox's start about
2.5x by piling locks on libc. An overlay has inodes of its own per mount (locks and inotify stay in the
run), while its reads and mappings are the shared files' own pages (the memory is shared).

Threat: a sandbox changing what later sandboxes run. The overlay has no upper layer (read-only in
itself) and is mounted read-only (and the sandbox has no capability to remount); only the engine
writes the shared volumes, from the image, before any sandbox mounts them. A fill that did not finish
(the engine or the runner died during the copy) is never used: the marker naming the volumes is made
only after the engine's create returned, and data volumes no marker names are removed by
``toolcage gc``. What sandboxes still share is the page cache of the image's files, as overlay2 shares
it for every container of an image (docs/security.md says what that means).
"""

from __future__ import annotations

import os
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from toolcage import logs
from toolcage.engine.api import EngineAPI
from toolcage.engine.labels import LABEL_RUN_ID
from toolcage.errors import ToolcageError
from toolcage.policies import contract

ENV = contract.ENV_SHARED_FILES  # "off" (or 0/no/false): every container reads the image's files itself
PREFIX = "toolcage-files-"
LABEL = "toolcage.files"  # on every volume of this module: the image id it holds files of
LABEL_USE = "toolcage.files.use"  # on the marker: "1" share, "0" the engine shares them already
LABEL_USR = "toolcage.files.usr"  # on the marker: the volume holding /usr
LABEL_OPT = "toolcage.files.lib"  # on the marker: the volume holding /opt/toolcage/lib
RUN_PREFIX = "toolcage-files-run-"  # a run's own overlay volumes (the run's labels: the reaper's and gc's)
FILL_STALE_S = 600.0  # a fill takes seconds: a fill container this old lost its process
TARGETS = ("/usr", "/opt/toolcage/lib")  # (/bin, /lib, /sbin link into /usr; connectors mount beside lib)
# storage drivers whose containers already share the image's files in the page cache
SHARING_DRIVERS = frozenset({"overlay2", "overlay", "aufs"})


@dataclass(frozen=True)
class Layers:
    """Where an image's shared files lie on the engine's host: (directory, target) per shared path, and an
    empty directory (an overlay of lower layers only takes two or more)."""

    lowers: tuple[tuple[str, str], ...]
    empty: str


_known: dict[tuple[int, str], Layers | None] = {}
_locks: dict[tuple[int, str], threading.Lock] = {}
_guard = threading.Lock()


def enabled() -> bool:
    return os.environ.get(ENV, "").strip().lower() not in ("off", "0", "no", "false")


def marker_name(image_id: str) -> str:
    return f"{PREFIX}{_short(image_id)}"


def layers(engine: EngineAPI, image_id: str | None) -> Layers | None:
    """Where this image's shared files lie, or None (each container reads the image's own files).
    Never raises for the engine's sake: a run without shared files is a run as before."""
    if not image_id or not enabled() or not engine.flavor().shared_files:
        return None
    key = (id(engine), image_id)
    if key in _known:
        return _known[key]
    with _guard:
        lock = _locks.setdefault(key, threading.Lock())
    with lock:  # one fill per process at a time: a pool's slots starting together wait for the first
        if key not in _known:
            try:
                found = _decide(engine, image_id)
            except ToolcageError as exc:
                logs.get_logger().warning("files.not_shared", image=_short(image_id), error=exc.message)
                found = None  # asked again by the next process; this one reads its own files
            _known[key] = found
        return _known[key]


def run_volumes(run_id: str) -> tuple[tuple[str, str], ...]:
    """A run's own volumes over the shared files: (name, target) for each shared path."""
    return tuple((f"{RUN_PREFIX}{run_id}-{target.rsplit('/', 1)[-1]}", target) for target in TARGETS)


def overlay_options(lower: str, empty: str) -> dict[str, str]:
    """The local driver's options for a read-only overlay whose only content is ``lower``."""
    return {"type": "overlay", "device": "overlay", "o": f"lowerdir={lower}:{empty}"}


def make_run_volumes(
    engine: EngineAPI, found: Layers, volumes: tuple[tuple[str, str], ...], labels: dict[str, str]
) -> list[str]:
    """Create a run's overlay volumes (the engine mounts them when the container starts); the names made,
    also when one fails (the caller removes those)."""
    lower = dict((target, path) for path, target in found.lowers)
    made: list[str] = []
    try:
        for name, target in volumes:
            engine.create_volume(name, labels, overlay_options(lower[target], found.empty))
            made.append(name)
    except BaseException:
        for name in made:
            _quiet(engine.remove_volume, name)
        raise
    return made


def _decide(engine: EngineAPI, image_id: str) -> Layers | None:
    found = _listed(engine, image_id)
    if found is False:
        _make(engine, image_id)
        found = _listed(engine, image_id)
    return found if isinstance(found, Layers) else None


def _listed(engine: EngineAPI, image_id: str) -> Layers | bool | None:
    """What the marker says (one engine call: this module's volumes of this image); False: no marker."""
    seen = marked(engine, f"{LABEL}={image_id}", marker_name(image_id))
    if seen is None:
        return False
    labels, volumes = seen
    usr, opt = labels.get(LABEL_USR), labels.get(LABEL_OPT)
    if labels.get(LABEL_USE) != "1" or usr not in volumes or opt not in volumes:
        return None  # not sharing, or a volume removed by hand (`toolcage gc` then removes the marker too)
    paths = [str(volumes[v].get("Mountpoint") or "") for v in (usr, opt, marker_name(image_id))]
    if not all(paths):
        return None
    return Layers(lowers=((paths[0], TARGETS[0]), (paths[1], TARGETS[1])), empty=paths[2])


def _make(engine: EngineAPI, image_id: str) -> None:
    """Decide for this engine and image, fill the volumes if sharing, then make the marker saying so."""
    log = logs.get_logger()
    short = _short(image_id)
    base = {LABEL: image_id}
    driver = str(engine.info().get("Driver") or "")
    if driver in SHARING_DRIVERS:
        engine.create_volume(marker_name(image_id), {**base, LABEL_USE: "0"})
        return
    tag = secrets.token_hex(4)
    usr, opt = f"{PREFIX}{short}-{tag}-usr", f"{PREFIX}{short}-{tag}-lib"
    log.info("files.sharing", image=short, driver=driver, detail="copying the image's /usr and /opt/toolcage/lib once")
    made: list[str] = []
    filler: str | None = None
    try:
        for name in (usr, opt):
            engine.create_volume(name, base)
            made.append(name)
        config = {
            "Image": image_id,
            "Entrypoint": ["/nonexistent"],  # never started: the engine copies the files at create
            "NetworkDisabled": True,
            "Labels": base,
            "HostConfig": {
                "NetworkMode": "none",
                "Mounts": [
                    {"Type": "volume", "Source": v, "Target": t, "ReadOnly": False}
                    for v, t in zip((usr, opt), TARGETS, strict=True)
                ],
            },
        }
        filler = engine.create(config, f"{PREFIX}{short}-{tag}-fill")
    except BaseException:
        for name in made:  # half-filled volumes are never named by a marker; gone now, or by gc
            _quiet(engine.remove_volume, name)
        raise
    finally:
        if filler is not None:
            _quiet(engine.remove, filler)
    use = "1" if _probe(engine, image_id, usr, base) else "0"
    # (if another process made its marker first, the engine keeps that one: these two are then named by
    # none, and `toolcage gc` removes them)
    engine.create_volume(marker_name(image_id), {**base, LABEL_USE: use, LABEL_USR: usr, LABEL_OPT: opt})


def _probe(engine: EngineAPI, image_id: str, usr: str, base: dict[str, str]) -> bool:
    """Whether this engine mounts a run's overlay of the shared files (a rootless engine may not): a
    container of the image runs ``/usr/bin/true`` from one, once per image. Its empty layer is a volume
    of its own, gone with it."""
    tag = secrets.token_hex(4)
    short = _short(image_id)
    names = (f"{PREFIX}{short}-{tag}-probe", f"{PREFIX}{short}-{tag}-empty")
    cid: str | None = None
    try:
        engine.create_volume(names[1], base)
        where = {v["Name"]: v.get("Mountpoint") for v in engine.volumes(f"{LABEL}={image_id}")}
        if not where.get(usr) or not where.get(names[1]):
            return False
        engine.create_volume(names[0], base, overlay_options(str(where[usr]), str(where[names[1]])))
        config = {
            "Image": image_id,
            "Entrypoint": ["/usr/bin/true"],
            "User": "65532:65532",
            "NetworkDisabled": True,
            "Labels": base,
            "HostConfig": {
                "NetworkMode": "none",
                "ReadonlyRootfs": True,
                "Mounts": [
                    {"Type": "volume", "Source": names[0], "Target": TARGETS[0], "ReadOnly": True,
                     "VolumeOptions": {"NoCopy": True}}
                ],
            },
        }  # fmt: skip
        cid = engine.create(config, f"{PREFIX}{short}-{tag}-probe")
        engine.start(cid)
        return engine.wait(cid, timeout=60) == 0
    except ToolcageError as exc:
        logs.get_logger().warning("files.not_shared", image=short, error=exc.message)
        return False
    finally:
        if cid is not None:
            _quiet(engine.remove, cid)
        for name in names:
            _quiet(engine.remove_volume, name)


def in_use_paths(engine: EngineAPI, going: frozenset[str] = frozenset(), prefix: str = RUN_PREFIX) -> set[str]:
    """The host directories live runs' overlays are made of: the engine does not know them as in use
    (no container mounts the shared volumes themselves), so their removal must not happen under a run.
    Overlays named in ``going`` (removed first, in the same pass) hold nothing. ``prefix``: the runs' overlay
    volumes of which module (this one's, or toolcage.engine.runtime's)."""
    paths: set[str] = set()
    for v in engine.volumes(LABEL_RUN_ID):
        if str(v.get("Name", "")).startswith(prefix) and v.get("Name") not in going:
            for part in str((v.get("Options") or {}).get("o", "")).split(","):
                if part.startswith("lowerdir="):
                    paths.update(part.removeprefix("lowerdir=").split(":"))
    return paths


def stale(
    engine: EngineAPI, now: float | None = None, going: frozenset[str] = frozenset()
) -> list[tuple[str, str, str]]:
    """What of this module is no longer of use, as (kind, id or name, why): the volumes of images the engine
    no longer has, data volumes no marker names (a fill that did not finish, or lost a race), and a
    fill's container older than ``FILL_STALE_S`` (its process died before removing it). Containers first.
    ``going``: runs' overlay volumes the caller removes first (orphans): they keep nothing in use."""

    def named(labels: dict[str, str]) -> set[str]:
        return {labels.get(LABEL_USR) or "", labels.get(LABEL_OPT) or ""}

    return stale_of(engine, LABEL, marker_name, named, "shared files", in_use_paths(engine, going), now)


def stale_of(
    engine: EngineAPI,
    label: str,
    marker: Callable[[str], str],
    named: Callable[[dict[str, str]], set[str]],
    what: str,
    busy: set[str],
    now: float | None = None,
) -> list[tuple[str, str, str]]:
    """The stale objects of a module that keeps volumes per image under ``label`` (this one, and
    toolcage.engine.runtime): its fill containers older than ``FILL_STALE_S``, the volumes of images the
    engine no longer has, and data volumes their image's ``marker`` volume does not name (``named``: the
    names its labels give). None whose mountpoint a live run's overlay is made of (``busy``). Containers first,
    markers last."""
    now = time.time() if now is None else now
    out: list[tuple[str, str, str]] = []
    filling: set[str] = set()  # volumes a fill under way writes (Docker refuses to remove them: gc stopped there)
    for c in engine.containers(label):
        if now - float(c.get("Created") or 0) > FILL_STALE_S:
            out.append(("container", str(c["Id"]), f"a fill of {what} whose process did not remove it"))
        else:
            filling |= {str(m.get("Name")) for m in c.get("Mounts") or () if m.get("Type") == "volume"}
    volumes = engine.volumes(label)
    present: dict[str, bool] = {}
    names: set[str] = set()
    markers: set[str] = set()
    for v in volumes:
        labels = v.get("Labels") or {}
        image = labels.get(label, "")
        if image not in present:
            present[image] = bool(image) and engine.image(image) is not None
        if v["Name"] == marker(image):
            markers.add(v["Name"])
            names |= named(labels)
    for v in volumes:
        name, image = v["Name"], (v.get("Labels") or {}).get(label, "")
        if v.get("Mountpoint") in busy or name in filling:
            continue  # a live run's overlay is made of it, or a fill writes it: later
        if not present.get(image):
            out.append(("volume", name, f"{what} of image {_short(image) or '?'}, which the engine no longer has"))
        elif name != marker(image) and name not in names:
            out.append(("volume", name, f"{what} no marker names (a fill that did not finish)"))
    return sorted(out, key=lambda o: (o[0] != "container", o[1] in markers))  # markers last


def drop(engine: EngineAPI, image_id: str) -> list[str]:
    """Remove this image's volumes (an image a build just replaced, no longer tagged): the marker first,
    so a run of that image asks again rather than mounting half of them. One in use (a sandbox of that
    image still running) stays, for ``toolcage gc`` once the image is gone; none goes while a live run's
    overlay is made of them. The names removed."""
    removed = drop_volumes(engine, f"{LABEL}={image_id}", marker_name(image_id), RUN_PREFIX)
    for key in [k for k in _known if k[1] == image_id]:
        del _known[key]
    return removed


def marked(engine: EngineAPI, label: str, marker: str) -> tuple[dict[str, Any], dict[str, dict[str, Any]]] | None:
    """The volumes under ``label`` by name and the labels of the one named ``marker`` (one engine call), or None
    when there is no marker: how this module, the runtime's and the kept workspace copies' read what they made."""
    volumes = {v["Name"]: v for v in engine.volumes(label)}
    found = volumes.get(marker)
    return None if found is None else (found.get("Labels") or {}, volumes)


def drop_volumes(engine: EngineAPI, label: str, marker: str, run_prefix: str) -> list[str]:
    """Remove the volumes under ``label``, ``marker`` first (a run asks again rather than mounting half of
    them); none while a live run's overlay (``run_prefix``) is made of one. The names removed."""
    removed = []
    volumes = sorted(engine.volumes(label), key=lambda v: v["Name"] != marker)
    busy = in_use_paths(engine, prefix=run_prefix)
    if any(v.get("Mountpoint") in busy for v in volumes):
        return []  # a run of that image still lives (a pool made before the build): gc, once the image is gone
    for v in volumes:
        try:
            engine.remove_volume(v["Name"])
            removed.append(v["Name"])
        except ToolcageError:
            continue
    return removed


def forget() -> None:
    """Ask the engine again next time (after ``toolcage gc`` removed volumes of this module)."""
    _known.clear()


def _short(image_id: str) -> str:
    return image_id.removeprefix("sha256:")[:12]


def _quiet(fn: Any, *args: Any) -> None:
    try:
        fn(*args)
    except ToolcageError as exc:
        logs.get_logger().warning("files.cleanup_failed", what=str(args[0])[:80], error=exc.message)


__all__ = [
    "ENV",
    "LABEL",
    "TARGETS",
    "Layers",
    "drop",
    "drop_volumes",
    "enabled",
    "forget",
    "in_use_paths",
    "layers",
    "make_run_volumes",
    "marker_name",
    "overlay_options",
    "run_volumes",
    "stale",
    "stale_of",
]
