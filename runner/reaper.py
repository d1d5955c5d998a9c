"""Find and remove toolcage containers and networks whose owner is provably gone or whose deadline passed.

Threat and complaint: a runner killed with SIGKILL never runs its clean-up (``--rm`` never
fires either), so containers and networks pile up. Every object carries its owner's host,
pid and process start time, and the run deadline; an object is an orphan when its owner
on this host is dead (or its pid now belongs to another process), or when its deadline
has passed. Objects owned by a live process on this host, or by another host before
their deadline, are never touched.

Objects of a run started with ``--keep`` (label ``toolcage.keep``) belong to the user until
they remove them: the background reaper never touches them, and ``gc`` lists them but removes
them only when asked (``gc --kept``).
"""

from __future__ import annotations

import os
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any

from toolcage.config import LABEL_DEADLINE, LABEL_KEEP, LABEL_OWNER, LABEL_OWNER_STARTED, LABEL_RUN_ID
from toolcage.engine import EngineAPI
from toolcage.ownership import process_start_ticks

DEADLINE_GRACE_S = 5.0


@dataclass(frozen=True)
class Orphan:
    kind: str  # "container" | "network" | "volume"
    id: str
    name: str
    run_id: str
    reason: str
    kept: bool = False  # started with --keep: removed only by `gc --kept`


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def orphan_reason(labels: dict[str, str], now: float, host: str) -> str | None:
    """Why an object with these labels is an orphan, or None if its owner may still want it."""
    owner = labels.get(LABEL_OWNER, "")
    owner_host, _, pid_text = owner.rpartition(":")
    try:
        deadline = float(labels.get(LABEL_DEADLINE, "inf"))
    except ValueError:
        deadline = float("inf")
    if owner_host == host and pid_text.isdigit():
        pid = int(pid_text)
        if not _pid_alive(pid):
            return f"owner process {pid} is gone"
        started = labels.get(LABEL_OWNER_STARTED, "")
        if started and process_start_ticks(pid) != started:
            return f"owner pid {pid} now belongs to another process"
    if now > deadline + DEADLINE_GRACE_S:
        return "run deadline passed"
    return None


def is_kept(labels: dict[str, str]) -> bool:
    return labels.get(LABEL_KEEP) == "1"


def find_orphans(engine: EngineAPI, now: float | None = None, include_kept: bool = False) -> list[Orphan]:
    """Objects whose owner is gone or whose deadline passed. Kept objects (``--keep``) are left
    out unless ``include_kept``; then they come back with ``kept=True``."""
    now = time.time() if now is None else now
    host = socket.gethostname()
    label = LABEL_RUN_ID
    listings: list[tuple[str, list[dict[str, Any]], Any]] = [  # kind, objects, (id, name) of one
        ("container", engine.containers(label), lambda c: (c["Id"], (c.get("Names") or ["?"])[0].lstrip("/"))),
        ("network", engine.networks(label), lambda n: (n["Id"], n.get("Name", "?"))),
        ("volume", engine.volumes(label), lambda v: (v["Name"], v["Name"])),
    ]
    out: list[Orphan] = []
    for kind, objects, ident in listings:
        for obj in objects:
            labels = obj.get("Labels") or {}
            kept = is_kept(labels)
            if kept and not include_kept:
                continue
            why = orphan_reason(labels, now, host)
            if why:
                oid, name = ident(obj)
                out.append(Orphan(kind, oid, name, labels.get(LABEL_RUN_ID, "?"), why, kept))
    return out


def remove(engine: EngineAPI, orphans: list[Orphan], audit: Any = None, by: str = "gc") -> None:
    """Containers first (a network or volume in use cannot be removed). Each removal is audited
    first, so every container that ever existed leaves a trace even if its runner left none."""
    for o in sorted(orphans, key=lambda o: o.kind != "container"):
        if o.kept and by == "reaper":
            continue  # only an explicit `gc --kept` removes what the user kept
        if audit is not None:
            audit.event("gc.removed", by=by, kind=o.kind, id=o.id, name=o.name, run_id=o.run_id, reason=o.reason)
        if o.kind == "container":
            engine.remove(o.id)
        elif o.kind == "volume":
            engine.remove_volume(o.id)
        else:
            engine.remove_network(o.id)


_REAPED = False


def reap_in_background(engine: EngineAPI, log: Any, audit: Any = None) -> None:
    """Once per process, when the first sandbox starts: remove orphans without delaying the run."""
    global _REAPED
    if _REAPED:
        return
    _REAPED = True

    def _run() -> None:
        try:
            orphans = find_orphans(engine)  # never the kept ones
            remove(engine, orphans, audit, by="reaper")
            for o in orphans:
                log.warning("gc.removed", kind=o.kind, name=o.name, run_id=o.run_id, reason=o.reason)
        except Exception as exc:  # never let clean-up break a run
            log.info("gc.failed", error=str(exc))  # the run itself reports an unreachable engine

    threading.Thread(target=_run, name="toolcage-reaper", daemon=True).start()
