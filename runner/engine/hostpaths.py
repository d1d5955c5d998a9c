"""The runner inside a container: bind-mount sources named as the engine's host sees them.

A runner that drives the engine through a mounted socket (``/var/run/docker.sock``) asks for bind
mounts by path, and the engine resolves those paths on *its* host, not in the runner's container.
So the workspace and connector sources, which the runner checks in its own view, are mapped to the
host's view before they go into a container's config, and checked again there (``/data/hostetc``
in the runner can be the host's ``/etc``: toolcage.workspace.check_host_path). The view is decided
once, as a value with its reason (:class:`HostView`):

- ``TOOLCAGE_HOST_PATHS``: ``/inside=/on/host`` pairs separated by commas, e.g.
  ``/app/data=/srv/agent/data,/app/tools=/srv/agent/tools`` (``/=/``: the same paths);
- the engine's server shares this runner's root (SO_PEERCRED on its Unix socket, then the
  server's ``/proc/<pid>/root``): the same paths, nothing to map (also when that server is in this
  runner's PID namespace and the runner is in no container it can find);
- the runner's own container, found by its id in ``/proc/self/mountinfo`` (the engine bind-mounts
  ``/etc/hostname``, ``/etc/hosts`` and ``/etc/resolv.conf`` from ``.../containers/<id>/``), never by
  its hostname (``--hostname``, compose's ``hostname:`` make that anything): each bind mount's
  destination maps to its source, once the engine's account of those mounts agrees with ours.

When the runner is in a container (or the engine's server is out of its sight) and none of these
holds, it cannot be sure where a path leads: every path is refused with the fix, rather than
mounted from whatever the host has at the same path. A runner outside any container talking to an
engine over TCP passes its paths on as they are.
"""

from __future__ import annotations

import os
import posixpath
import re
import socket
import struct
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

from toolcage.errors import UsageError
from toolcage.policies import contract

ENV = contract.ENV_HOST_PATHS
Mapping = tuple[tuple[str, str], ...]  # (path in the runner's view, the same on the engine's host), longest first


def parse(text: str) -> Mapping:
    """``/inside=/on/host,...`` -> the mapping; UsageError naming the bad entry."""
    pairs = []
    for entry in (e.strip() for e in text.split(",")):
        if not entry:
            continue
        inside, sep, host = entry.partition("=")
        if not sep or not inside.startswith("/") or not host.startswith("/"):
            raise UsageError(f"{ENV}: {entry!r} is not /path/in/runner=/path/on/host")
        pairs.append((_norm(inside), _norm(host)))
    return _ordered(pairs)


def _norm(path: str) -> str:
    return str(PurePosixPath(os.path.normpath(path)))


def _ordered(pairs: list[tuple[str, str]]) -> Mapping:
    return tuple(sorted(pairs, key=lambda p: len(p[0]), reverse=True))


def from_mounts(mounts: list[dict[str, Any]]) -> Mapping:
    """A container's bind mounts (``docker inspect``'s ``Mounts``) as a mapping."""
    return _ordered(
        [(_norm(m["Destination"]), _norm(m["Source"])) for m in mounts if m.get("Type") == "bind" and m.get("Source")]
    )


def in_container() -> bool:
    return os.path.exists("/.dockerenv") or os.path.exists("/run/.containerenv")


@dataclass(frozen=True)
class HostView:
    """How the engine's host names this runner's paths. ``mapping`` None: as they are; ``sure``
    False: the runner cannot tell, and refuses every path; ``why`` says which case and how it knows."""

    mapping: Mapping | None
    why: str
    sure: bool = True


def _engine_socket() -> str | None:
    """The Unix socket the engine client uses (DOCKER_HOST, else the default); None for TCP and others."""
    host = os.environ.get("DOCKER_HOST", "")
    if not host:
        return "/var/run/docker.sock"
    return host[len("unix://") :] if host.startswith("unix://") else None


def engine_server() -> str:
    """Where the process serving the engine's socket stands (SO_PEERCRED): ``"same root"`` (it sees
    this runner's ``/``), ``"other root"``, ``"out of sight"`` (in a PID namespace this runner cannot
    see into: another host's or the container host's), ``"in sight"`` (its root is not ours to read,
    as another user's daemon's is not) or ``"unknown"`` (a TCP engine, no answer, another /proc)."""
    path = _engine_socket()
    if path is None:
        return "unknown"
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(2)
            s.connect(path)
            pid, _, _ = struct.unpack("3i", s.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
    except OSError:
        return "unknown"
    if pid <= 0:
        return "out of sight"
    from toolcage.engine.ownership import proc_is_ours

    if not proc_is_ours():
        return "unknown"
    try:
        theirs, ours = os.stat(f"/proc/{pid}/root"), os.stat("/")
    except PermissionError:
        return "in sight"
    except OSError:
        return "unknown"
    return "same root" if (theirs.st_dev, theirs.st_ino) == (ours.st_dev, ours.st_ino) else "other root"


# the files the engine bind-mounts into each container from its own per-container directory:
# Docker's /var/lib/docker/containers/<id>/, Podman's .../overlay-containers/<id>/userdata/
_ENGINE_FILES = ("/etc/hostname", "/etc/hosts", "/etc/resolv.conf")
_CONTAINER_DIR = re.compile(r"/(?:overlay-)?containers/([0-9a-f]{64})(?:/userdata)?/(?:hostname|hosts|resolv\.conf)$")


def _unescape(field: str) -> str:
    """A mountinfo path field (space, tab, newline and backslash are octal escapes)."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def _mountinfo() -> list[tuple[str, str]]:
    """(root within its filesystem, mount point) of each of this process's mounts."""
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        fields = line.split(" ")
        if len(fields) > 4:
            out.append((_unescape(fields[3]), _unescape(fields[4])))
    return out


def own_container_id(mounts: list[tuple[str, str]]) -> str | None:
    """This runner's container id, from the engine's per-container files it mounted here; None when
    there is no such mount, or they name more than one container (then none can be trusted)."""
    ids = {m.group(1) for root, point in mounts if point in _ENGINE_FILES for m in [_CONTAINER_DIR.search(root)] if m}
    return ids.pop() if len(ids) == 1 else None


def detect(engine: Any) -> HostView:
    """The host view when $TOOLCAGE_HOST_PATHS does not name it (see the module docstring)."""
    server = engine_server()
    if server == "same root":
        return HostView(None, "the engine's server shares this runner's root")
    mounts = _mountinfo()
    cid = own_container_id(mounts)
    if cid is not None:
        try:
            info = engine.inspect(cid)
        except Exception:
            info = None
        if not info or not str(info.get("Id", "")).startswith(cid):
            return HostView(None, f"the engine does not know this runner's container ({cid[:12]})", sure=False)
        points = {point for _, point in mounts}
        # as this runner's kernel names them (/var/run/docker.sock is /run/docker.sock where /var/run links there)
        binds = [
            {**m, "Destination": os.path.realpath(str(m.get("Destination", "/")))}
            for m in info.get("Mounts") or []
            if m.get("Type") == "bind"
        ]
        strange = [m["Destination"] for m in binds if m["Destination"] not in points]
        if strange:
            return HostView(
                None, f"the engine's account of container {cid[:12]} has mounts this runner lacks: {strange[:3]}", False
            )
        return HostView(from_mounts(binds), f"the bind mounts of this runner's container {cid[:12]}")
    if server == "in sight":
        return HostView(None, "the engine's server is in this runner's PID namespace, and this runner in no container")
    if server in ("other root", "out of sight") or in_container():
        return HostView(None, f"this runner is in a container it cannot find (the engine's server: {server})", False)
    return HostView(None, "this runner is not in a container")


_detected: dict[str, HostView] = {}  # the runner's container's mounts do not change: asked once


def resolve(engine: Any) -> HostView:
    """The host view in force: $TOOLCAGE_HOST_PATHS, else detected (a view the runner is unsure
    of is asked again next time: the engine may have been unreachable)."""
    text = os.environ.get(ENV)
    if text:
        return HostView(parse(text), f"${ENV}")
    if "auto" in _detected:
        return _detected["auto"]
    view = detect(engine)
    if view.sure:
        _detected["auto"] = view
    return view


def map_run(run: Any, engine: Any) -> Any:
    """``run`` (a RunSpec) with its workspace and connector sources named as the engine's host sees
    them, each checked there too (WorkspaceError), or UsageError naming the fix."""
    import dataclasses
    from pathlib import Path

    from toolcage.workspace import check_host_path

    if run.workspace is None and not run.tool_mounts:
        return run
    view = resolve(engine)
    if view.mapping is None and view.sure:
        return run

    def host(path: str, what: str) -> str:
        if not view.sure:
            raise UsageError(
                f"{what} {path}: this runner cannot tell which host directory it is ({view.why}), so the engine "
                f"might mount another one of the same name; name its host path in {ENV} "
                "(/path/in/runner=/path/on/host, or /=/ when the engine sees the same paths as this runner)"
            )
        mapped = to_host(path, view.mapping, what)
        check_host_path(mapped, path, what)
        return mapped

    workspace = Path(host(str(run.workspace), "the workspace")) if run.workspace is not None else None
    tools = tuple((host(src, "the connector source"), dst) for src, dst in run.tool_mounts)
    return dataclasses.replace(run, workspace=workspace, tool_mounts=tools)


def to_host(path: str, mapping: Mapping | None, what: str) -> str:
    """``path`` as the engine's host names it; UsageError when no mapping covers it."""
    if mapping is None:
        return path
    p = _norm(path)
    for inside, host in mapping:
        if p == inside or p.startswith(inside.rstrip("/") + "/"):
            rest = p[len(inside) :] if inside != "/" else p
            return _norm(posixpath.join(host, rest.lstrip("/")))
    raise UsageError(
        f"{what} {path} is not in any directory this runner's container has from its host, so the engine "
        f"cannot mount it: bind-mount it into the runner's container, or name its host path in {ENV} "
        "(/path/in/runner=/path/on/host)"
    )
