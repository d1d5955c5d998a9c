"""The workspace copy kept by the engine (``workspace_cache``): a big tree copied once, each later run in milliseconds.

Why: a writable copy made at start pays for every file twice, the host's walk and tar and the sandbox's
extraction (2.6 s for 100,000 files, 8x a read-only start; the extraction alone is 3.6x). A coding agent
starts many runs on the same tree. With ``workspace_cache=True`` (``--workspace-cache``), the second start of a
tree makes a volume holding it as the sandbox user owns it, and every run of the same tree after that mounts
it read-only under its own copy-on-write layer (toolcage.worker.copyfs: an overlay laid at the worker's boot,
its upper layer the run's tmpfs of ``limits.workspace_copy``). A run sees and changes a copy exactly as
without the cache; ``changes()`` and snapshots work the same.

How, as values (the run's side of it is ``Sandbox._cached_copy``):

- the tree's key (toolcage.files.treekey): one walk of the tree (names, kinds, modes, owners, sizes, mtimes,
  ctimes, inodes: a file's content or permission changed sets its ctime; one replaced is another inode), with
  the ``workspace_gitignore`` choice and the copy's format; no ACL read, no file opened. Every start with the
  cache walks the tree so: a tree changed since is a miss, never a stale copy.
- :func:`state`: what the engine keeps for a workspace path (one engine call): its trees by key, each named by
  a marker volume ``toolcage-copy-<key>``, and the trees started once and not kept (:func:`mark_seen`). A
  marker is made only after its tree was filled in whole (:func:`record`), so a fill that did not finish is
  never used; volumes no marker names are removed by ``toolcage gc``.
- :func:`new_volume`, then a run of toolcage's own that runs no code (``Sandbox._make_cached``) fills it
  through the upload protocol, as any copy is made (what the sandbox user could not read is withheld the same
  way), with the volume itself at /workspace; then :func:`record`. Two runners making the same tree at once:
  the engine keeps the first marker, the other volume is removed. At most :data:`KEEP_PER_PATH` trees of one
  workspace path are kept (the older ones, when no run uses them, are removed when a new one is made).
- :func:`usable`: whether this engine can lay the overlay (Linux >= 6.6, runc, an engine that lets the
  container make a user namespace): probed once per engine, kernel and worker image by a container of that image,
  the answer kept in a marker volume. Not usable: the copy is made as without the cache, and said once.

Threat: a run changing the tree later runs start from. The volume is mounted read-only; the worker covers
it before anything of the run executes; nothing of the sandbox ever writes it after its fill (which ran
no code). What the cache keeps is a copy of the workspace at rest on the engine's disk, as the user asked
(``docs/security.md``); ``toolcage gc --copies`` removes every one not in use.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import threading
from dataclasses import dataclass
from typing import Any

from toolcage import logs
from toolcage.engine.api import EngineAPI
from toolcage.engine.sharedfiles import marked
from toolcage.errors import ToolcageError
from toolcage.policies import contract

PREFIX = "toolcage-copy-"
DATA_PREFIX = "toolcage-copy-data-"
ABLE_PREFIX = "toolcage-copy-able-"
LABEL = "toolcage.copy"  # on every volume of this module: the tree's key (on the probe's marker: "able")
LABEL_DATA = "toolcage.copy.data"  # on a marker: the volume holding the tree
LABEL_PATH = "toolcage.copy.path"  # the workspace's path, hashed
LABEL_SIZE = "toolcage.copy.size"  # the tmpfs space the copy takes (the run's limits.workspace_copy is checked)
LABEL_ABLE = "toolcage.copy.able"  # on the probe's marker: "1" the engine lays the overlay, "0" it cannot
LABEL_IMAGE = "toolcage.copy.image"  # on the probe's marker: the worker image it asked (gc: gone with the image)
LABEL_AT = "toolcage.copy.at"  # on a marker and a seen record: when it was made (ns since the epoch)
LABEL_SEEN = "toolcage.copy.seen"  # on a seen record: "1" (a tree started once, not kept: kept the next time)
SEEN_PREFIX = "toolcage-copy-seen-"
SEEN_PER_PATH = 4
KEEP_PER_PATH = 2


@dataclass(frozen=True)
class Cached:
    """A cached tree: the volume holding it, and the space its copy takes (what limits.workspace_copy bounds);
    its key and when it was made."""

    volume: str
    size: int
    key: str = ""
    at: int = 0


@dataclass(frozen=True)
class PathState:
    """What the engine keeps for one workspace path (one engine call): its cached trees by key, and the trees
    started once and not kept (key -> when)."""

    ready: dict[str, Cached]
    seen: dict[str, int]

    def newest(self) -> Cached | None:
        return max(self.ready.values(), key=lambda c: c.at, default=None)

    def guess(self) -> Cached | None:
        """The tree a start of this path most likely finds: the newest cached one, unless a tree was started
        since it was made (the workspace changed: the walk decides before the container starts, then)."""
        newest = self.newest()
        if newest is None or max(self.seen.values(), default=0) > newest.at:
            return None
        return newest


def _at(labels: dict[str, Any]) -> int:
    try:
        return int(labels.get(LABEL_AT) or 0)
    except ValueError:
        return 0


def state(engine: EngineAPI, where: str) -> PathState:
    found = {str(v["Name"]): v for v in engine.volumes(f"{LABEL_PATH}={where}")}
    ready: dict[str, Cached] = {}
    seen: dict[str, int] = {}
    for name, v in found.items():
        labels = v.get("Labels") or {}
        k = str(labels.get(LABEL) or "")
        if labels.get(LABEL_SEEN) == "1":
            seen[k] = _at(labels)
        elif labels.get(LABEL_DATA) in found and name == marker_name(k):
            try:
                ready[k] = Cached(str(labels[LABEL_DATA]), int(labels.get(LABEL_SIZE) or 0), k, _at(labels))
            except ValueError:
                continue
    return PathState(ready, seen)


def mark_seen(engine: EngineAPI, k: str, where: str) -> None:
    """Tree ``k`` of the path was started and not kept: the next start of it keeps it. At most SEEN_PER_PATH
    such records per path (the oldest go)."""
    import time

    labels = {LABEL: k, LABEL_PATH: where, LABEL_SEEN: "1", LABEL_AT: str(time.time_ns())}
    engine.create_volume(f"{SEEN_PREFIX}{k}", labels)
    seen = sorted(state(engine, where).seen.items(), key=lambda item: item[1], reverse=True)
    for old, _ in seen[SEEN_PER_PATH:]:
        _quiet(engine.remove_volume, f"{SEEN_PREFIX}{old}")


def path_label(local: str | os.PathLike[str]) -> str:
    return hashlib.sha256(os.fsencode(os.path.abspath(os.fspath(local)))).hexdigest()[:24]


def marker_name(k: str) -> str:
    return f"{PREFIX}{k}"


def lookup(engine: EngineAPI, k: str) -> Cached | None:
    """The cached tree of key ``k`` on this engine, or None (one engine call)."""
    seen = marked(engine, f"{LABEL}={k}", marker_name(k))
    if seen is None:
        return None
    labels, found = seen
    data = labels.get(LABEL_DATA)
    if not data or data not in found:
        return None  # its tree removed by hand: made again (gc removes the marker)
    try:
        return Cached(data, int(labels.get(LABEL_SIZE) or 0), k, _at(labels))
    except ValueError:
        return None


# --- whether the engine can lay the overlay -----------------------------------------------------------------
_able: dict[tuple[int, str, str], bool] = {}
_kernels: dict[int, str] = {}
_able_lock = threading.Lock()
PROBE = (
    "python3", "-S", "-c",
    "import sys; from toolcage.worker import copyfs; copyfs.lay(sys.argv[1], sys.argv[2])",
    contract.COPY_LOWER, contract.WORKSPACE,
)  # fmt: skip


def usable(engine: EngineAPI, image: str) -> bool:
    """Whether ``engine`` lays a cached copy's overlay (asked of the engine once per kernel, remembered)."""
    kernel = _kernels.get(id(engine))
    if kernel is None:  # (`info` takes about 12 ms: once per engine and process, not on every start)
        kernel = _kernels[id(engine)] = str(engine.info().get("KernelVersion") or "")
    image_id = str((engine.image(image) or {}).get("Id") or image)  # a new worker image is asked again
    memo = (id(engine), kernel, image_id)
    with _able_lock:
        if memo in _able:
            return _able[memo]
        name = ABLE_PREFIX + hashlib.sha256(f"{kernel}\0{image_id}".encode()).hexdigest()[:16]
        marker = next((v for v in engine.volumes(f"{LABEL}=able") if v.get("Name") == name), None)
        if marker is not None:
            able = (marker.get("Labels") or {}).get(LABEL_ABLE) == "1"
        else:
            able = _probe(engine, image)
            engine.create_volume(name, {LABEL: "able", LABEL_ABLE: "1" if able else "0", LABEL_IMAGE: image_id})
        if not able:
            logs.get_logger().warning(
                "workspace.cache_unavailable",
                detail="this engine cannot lay a cached copy (Linux 6.6 or later, runc, user namespaces for "
                "the sandbox's boot): each copy is made at start",
            )
        _able[memo] = able
        return able


def _probe(engine: EngineAPI, image: str) -> bool:
    from toolcage.engine import seccomp
    from toolcage.engine.hostconfig import SANDBOX_UID

    tag = secrets.token_hex(4)
    lower = f"{PREFIX}probe-{tag}"
    cid: str | None = None
    try:
        engine.create_volume(lower, {LABEL: "probe"})
        config = {
            "Image": image,
            "Entrypoint": list(PROBE),
            "User": f"{SANDBOX_UID}:{SANDBOX_UID}",
            "NetworkDisabled": True,
            "Labels": {LABEL: "probe"},
            "HostConfig": {
                "NetworkMode": "none",
                "ReadonlyRootfs": True,
                "CapDrop": ["ALL"],
                "SecurityOpt": ["no-new-privileges", seccomp.security_opt(copy=True)],
                "Tmpfs": {contract.WORKSPACE: f"rw,nosuid,nodev,size=1m,uid={SANDBOX_UID},gid={SANDBOX_UID},mode=0755"},
                "Mounts": [
                    {"Type": "volume", "Source": lower, "Target": contract.COPY_LOWER, "ReadOnly": True,
                     "VolumeOptions": {"NoCopy": True}}
                ],
            },
        }  # fmt: skip
        cid = engine.create(config, f"{PREFIX}probe-{tag}")
        engine.start(cid)
        return engine.wait(cid, 60.0) == 0
    except ToolcageError:
        return False
    finally:
        if cid is not None:
            _quiet(engine.remove, cid)
        _quiet(engine.remove_volume, lower)


def drop(engine: EngineAPI, volume: str) -> None:
    """A tree whose fill failed: gone now (or by gc, if the engine refuses)."""
    _quiet(engine.remove_volume, volume)


def _quiet(fn: Any, *args: Any) -> None:
    try:
        fn(*args)
    except ToolcageError:
        pass


# --- making a cached tree (the filling run itself is the front's: toolcage.sandbox) -----------------------------
def new_volume(engine: EngineAPI, image: str, k: str, where: str) -> str:
    """A new, empty volume for tree ``k`` of the workspace path ``where`` (path_label), its root owned by the sandbox
    user: the filling run mounts it at /workspace."""
    data = f"{DATA_PREFIX}{k[:20]}-{secrets.token_hex(4)}"
    engine.create_volume(data, {LABEL: k, LABEL_PATH: where})
    try:
        _own(engine, image, data)
    except BaseException:
        _quiet(engine.remove_volume, data)
        raise
    return data


def record(engine: EngineAPI, k: str, where: str, data: str, size: int, log: Any) -> Cached:
    """The marker of tree ``k``, made once ``data`` holds it in whole; the tree's older copies of the same path
    beyond KEEP_PER_PATH are removed (those no run uses). Another runner's marker made first wins: its tree is
    used, ``data`` removed."""
    import time

    marker = {LABEL: k, LABEL_PATH: where, LABEL_DATA: data, LABEL_SIZE: str(size), LABEL_AT: str(time.time_ns())}
    engine.create_volume(marker_name(k), marker)
    _quiet(engine.remove_volume, f"{SEEN_PREFIX}{k}")
    got = lookup(engine, k)
    if got is None or got.volume != data:
        _quiet(engine.remove_volume, data)
    if got is None:
        raise ToolcageError("the workspace cache's marker could not be read back from the engine")
    log.info("workspace.cached", volume=got.volume, key=k[:12], size=size)
    _evict(engine, where, keep=k)
    return got


def _own(engine: EngineAPI, image: str, volume: str) -> None:
    """The new volume's root owned by the sandbox user: the engine copies the owner and mode of the image's
    directory at the mount point into an empty volume when a container is created with it (/scratch: 65532,
    0755); the container never starts."""
    cid: str | None = None
    try:
        config = {
            "Image": image,
            "Entrypoint": ["/nonexistent"],
            "NetworkDisabled": True,
            "Labels": {LABEL: "own"},
            "HostConfig": {
                "NetworkMode": "none",
                "Mounts": [{"Type": "volume", "Source": volume, "Target": contract.SCRATCH, "ReadOnly": False}],
            },
        }
        cid = engine.create(config, f"{PREFIX}own-{secrets.token_hex(4)}")
    finally:
        if cid is not None:
            _quiet(engine.remove, cid)


def _evict(engine: EngineAPI, where: str, keep: str) -> None:
    """At most KEEP_PER_PATH trees of one workspace path: the oldest others go (a volume in use stays)."""
    others = sorted((c for c in state(engine, where).ready.values() if c.key != keep), key=lambda c: c.at, reverse=True)
    for c in others[KEEP_PER_PATH - 1 :]:
        try:
            engine.remove_volume(c.volume)  # refused while a run mounts it
            engine.remove_volume(marker_name(c.key))
        except ToolcageError:
            continue  # in use: kept until a later eviction, or gc


STALE_S = 600.0  # a fill takes seconds to minutes: a volume this old that no marker names lost its runner


def _age_s(volume: dict[str, Any]) -> float:
    import time
    from datetime import datetime

    raw = str(volume.get("CreatedAt") or "")
    try:
        return time.time() - datetime.fromisoformat(raw.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return 0.0


def stale(engine: EngineAPI, copies: bool = False) -> list[tuple[str, str, str]]:
    """For ``gc``: (kind, name, why) of this module's volumes no run needs: a tree no marker names (a fill
    that did not finish, or lost a race), a marker whose tree is gone, a probe's leftovers, the probe's answer
    for a worker image the engine no longer has; with ``copies`` (``gc --copies``), every kept tree, its marker
    and the trees noted as seen, except those a run mounts."""
    found = engine.volumes(LABEL)
    named = {str((v.get("Labels") or {}).get(LABEL_DATA)) for v in found if (v.get("Labels") or {}).get(LABEL_DATA)}
    names = {str(v.get("Name")) for v in found}
    out: list[tuple[str, str, str]] = []
    # a tree a run mounts stays (the engine would refuse: a fill that runs long, a kept tree in use), and its marker
    from toolcage.engine.labels import LABEL_RUN_ID

    used = {str(m.get("Name")) for c in engine.containers(LABEL_RUN_ID) for m in c.get("Mounts") or []}
    busy = {str(v.get("Name")) for v in found if (v.get("Labels") or {}).get(LABEL_DATA) in used} | used
    found = [v for v in found if str(v.get("Name")) not in busy]
    for v in found:
        name, labels = str(v.get("Name", "")), v.get("Labels") or {}
        if name.startswith(ABLE_PREFIX):
            image = labels.get(LABEL_IMAGE)
            if image and engine.image(str(image)) is None:
                out.append(("volume", name, "the workspace cache's answer for a worker image the engine no longer has"))
            continue
        if not name.startswith(PREFIX):
            continue
        data = labels.get(LABEL_DATA)
        if copies and (data or name.startswith((DATA_PREFIX, SEEN_PREFIX))):
            out.append(("volume", name, "a cached workspace copy (gc --copies)"))
        elif data and data not in names:
            out.append(("volume", name, "the cache marker of a workspace copy whose volume is gone"))
        elif name.startswith(DATA_PREFIX) and name not in named and _age_s(v) > STALE_S:
            out.append(("volume", name, "a workspace copy no cache marker names (its fill did not finish)"))
        elif labels.get(LABEL) == "probe" and _age_s(v) > STALE_S:
            out.append(("volume", name, "the workspace cache's probe, left over"))
    return out
