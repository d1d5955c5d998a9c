"""The runner inside a container: bind-mount sources named as the engine's host sees them.

A runner that drives the engine through a mounted socket (``/var/run/docker.sock``) asks for bind
mounts by path, and the engine resolves those paths on *its* host, not in the runner's container.
So the workspace and connector sources, which the runner checks in its own view, are mapped to the
host's view before they go into a container's config:

- ``TOOLCAGE_HOST_PATHS``: ``/inside=/on/host`` pairs separated by commas, e.g.
  ``/app/data=/srv/agent/data,/app/tools=/srv/agent/tools``;
- detected where possible: a runner in a Docker container (``/.dockerenv``) inspects its own
  container (its hostname is its id) and maps each bind mount's destination to its source.

A path under no mapping is refused with a message naming the fix, rather than mounted from
wherever the host happens to have the same path. Outside a container nothing is mapped.
"""

from __future__ import annotations

import os
from pathlib import PurePosixPath
from typing import Any

from toolcage.errors import UsageError

ENV = "TOOLCAGE_HOST_PATHS"
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


def detect(engine: Any) -> Mapping | None:
    """The runner's own container's bind mounts, when it runs in one the engine knows; else None."""
    if not in_container():
        return None
    try:
        info = engine.inspect(os.uname().nodename)
    except Exception:
        return None
    return from_mounts(info.get("Mounts") or []) if info else None


_detected: dict[str, Mapping | None] = {}  # the runner's container's mounts do not change: asked once


def resolve(engine: Any) -> Mapping | None:
    """The mapping in force: $TOOLCAGE_HOST_PATHS, else detected; None when the runner is not in a
    container (or the engine cannot say which: then paths go as they are)."""
    text = os.environ.get(ENV)
    if text:
        return parse(text)
    if "auto" not in _detected:
        _detected["auto"] = detect(engine)
    return _detected["auto"]


def map_run(run: Any, engine: Any) -> Any:
    """``run`` (a RunSpec) with its workspace and connector sources named as the engine's host sees them."""
    import dataclasses
    from pathlib import Path

    mapping = resolve(engine)
    if mapping is None:
        return run
    workspace = Path(to_host(str(run.workspace), mapping, "the workspace")) if run.workspace is not None else None
    tools = tuple((to_host(src, mapping, "the connector source"), dst) for src, dst in run.tool_mounts)
    return dataclasses.replace(run, workspace=workspace, tool_mounts=tools)


def to_host(path: str, mapping: Mapping | None, what: str) -> str:
    """``path`` as the engine's host names it; UsageError when no mapping covers it."""
    if mapping is None:
        return path
    p = _norm(path)
    for inside, host in mapping:
        if p == inside or p.startswith(inside.rstrip("/") + "/"):
            return _norm(host + p[len(inside) :]) if inside != "/" else _norm(host + p)
    raise UsageError(
        f"{what} {path} is not in any directory this runner's container has from its host, so the engine "
        f"cannot mount it: bind-mount it into the runner's container, or name its host path in {ENV} "
        "(/path/in/runner=/path/on/host)"
    )
