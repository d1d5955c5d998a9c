"""Find and remove toolcage containers and networks whose owner is provably gone or whose deadline passed.

Threat and complaint: a runner killed with SIGKILL never runs its clean-up (``--rm`` never
fires either), so containers and networks pile up. Every object carries its owner's pid and
process start time, the namespace those mean a process in (boot id, PID and time namespaces:
toolcage.engine.ownership), and the run deadline. A reaper judges an owner only from where it can see
it: in the same namespace, an object whose owner is dead (or whose pid now belongs to another
process) is an orphan, and one whose owner lives is never touched, whatever its deadline says.
An owner it cannot check (another PID namespace, another boot or machine, an object with no
namespace label) is left alone until its deadline has passed. A hostname proves nothing: runners
in containers, compose services and CI jobs share them.

Each removal is audited first with the remover's identity, so a run whose container went from
under it can say who took it (:func:`removed_by`).

Objects of a run started with ``--keep`` (label ``toolcage.keep``) belong to the user until
they remove them: the background reaper never touches them, and ``gc`` lists them but removes
them only when asked (``gc --kept``). Once the user removed a kept run's containers themselves
(``docker rm``), what is left of it (its volumes over the image's shared files, its network) is
of no use to anyone and no longer kept: ``gc`` removes it. ``toolcage rm RUN_ID`` removes one run
and everything of it (toolcage.lifecycle.discard).
"""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from toolcage.engine import ownership
from toolcage.engine.api import EngineAPI
from toolcage.engine.labels import (
    LABEL_DEADLINE,
    LABEL_KEEP,
    LABEL_OWNER,
    LABEL_OWNER_NS,
    LABEL_OWNER_STARTED,
    LABEL_RUN_ID,
)

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


def orphan_reason(labels: dict[str, str], now: float, here: str) -> str | None:
    """Why an object with these labels is an orphan, or None if its owner may still want it.
    ``here`` is the reaper's own namespace key (ownership.namespace_key; "" checks no owner)."""
    _, _, pid_text = labels.get(LABEL_OWNER, "").rpartition(":")
    try:
        deadline = float(labels.get(LABEL_DEADLINE, "inf"))
    except ValueError:
        deadline = float("inf")
    if here and labels.get(LABEL_OWNER_NS) == here and pid_text.isdigit():
        pid = int(pid_text)
        if not _pid_alive(pid):
            return f"owner process {pid} is gone"
        started = labels.get(LABEL_OWNER_STARTED, "")
        if started and ownership.process_start_ticks(pid) != started:
            return f"owner pid {pid} now belongs to another process"
        return None  # its owner lives: the run is its owner's to end and remove, past its deadline too
    if now > deadline + DEADLINE_GRACE_S:
        return "run deadline passed"
    return None


def is_kept(labels: dict[str, str]) -> bool:
    return labels.get(LABEL_KEEP) == "1"


def find_orphans(engine: EngineAPI, now: float | None = None, include_kept: bool = False) -> list[Orphan]:
    """Objects whose owner is gone or whose deadline passed. Kept objects (``--keep``) are left
    out unless ``include_kept``; then they come back with ``kept=True``."""
    now = time.time() if now is None else now
    here = ownership.namespace_key()
    objects = labelled(engine, LABEL_RUN_ID)
    # runs that still have a container: a kept run's volumes and network stay kept only while one is there
    with_container = {labels.get(LABEL_RUN_ID) for kind, _, _, labels in objects if kind == "container"}
    out: list[Orphan] = []
    for kind, oid, name, labels in objects:
        kept = is_kept(labels)
        if kept and kind != "container" and labels.get(LABEL_RUN_ID) not in with_container:
            kept = False  # the user removed the kept containers (docker rm): nothing of the run uses it
        if kept and not include_kept:
            continue
        why = orphan_reason(labels, now, here)
        if why:
            if is_kept(labels) and not kept:
                why = f"{why}; a kept run whose containers were removed (docker rm): nothing uses it"
            out.append(Orphan(kind, oid, name, labels.get(LABEL_RUN_ID, "?"), why, kept))
    return out


def labelled(engine: EngineAPI, label: str) -> list[tuple[str, str, str, dict[str, Any]]]:
    """(kind, id, name, labels) of every container, network and volume with ``label`` (``key`` or
    ``key=value``), containers first: a volume or network in use cannot be removed before them."""
    out: list[tuple[str, str, str, dict[str, Any]]] = []
    for c in engine.containers(label):
        out.append(("container", str(c["Id"]), (c.get("Names") or ["?"])[0].lstrip("/"), c.get("Labels") or {}))
    for n in engine.networks(label):
        out.append(("network", str(n["Id"]), str(n.get("Name", "?")), n.get("Labels") or {}))
    for v in engine.volumes(label):
        out.append(("volume", str(v["Name"]), str(v["Name"]), v.get("Labels") or {}))
    return out


def shared_files_orphans(engine: EngineAPI, going: list[Orphan] | None = None, copies: bool = False) -> list[Orphan]:
    """For ``gc``: what toolcage.engine.sharedfiles made and no longer needs (no run owns those). A run's
    overlay volume that goes in the same pass (``going``; default: the orphans that are not kept) does not
    hold the image's shared files, so one ``gc`` after ``docker rmi`` removes them both (the run's first)."""
    from toolcage.engine import copycache, runtime, sharedfiles

    going = find_orphans(engine) if going is None else going
    names = frozenset(o.name for o in going if o.kind == "volume" and not o.kept)
    found = sharedfiles.stale(engine, going=names) + runtime.stale(engine)  # (and the runtime's, same reasons)
    found += copycache.stale(engine, copies=copies)  # workspace_cache: unfinished fills (every tree: gc --copies)
    return [Orphan(kind, oid, oid, "-", why) for kind, oid, why in found]


def remove(engine: EngineAPI, orphans: list[Orphan], audit: Any = None, by: str = "gc") -> None:
    """Containers first (a network or volume in use cannot be removed). Each removal is audited
    first, with who removes it, so every container that ever existed leaves a trace even if its
    runner left none, and its run can say who took it."""
    me = ownership.identity()
    for o in sorted(orphans, key=lambda o: o.kind != "container"):
        if o.kept and by == "reaper":
            continue  # only an explicit `gc --kept` removes what the user kept
        if audit is not None:
            audit.event("gc.removed", by=by, kind=o.kind, id=o.id, name=o.name, run_id=o.run_id, reason=o.reason, **me)
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


REMOVED_SCAN_BYTES = 8 << 20  # how far back from its end the audit log is searched for a removal


def removed_by(audit_path: Path | None, container_id: str) -> dict[str, Any] | None:
    """The audit record of toolcage's gc or reaper removing this container, if the log has it
    (the last ``REMOVED_SCAN_BYTES`` of it: a removal that matters was recorded moments ago)."""
    if audit_path is None or not container_id:
        return None
    try:
        with open(audit_path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - REMOVED_SCAN_BYTES))
            tail = f.read()
    except OSError:
        return None
    needle = container_id.encode()
    for line in reversed(tail.splitlines()):
        if needle not in line or b"gc.removed" not in line:
            continue
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if isinstance(rec, dict) and rec.get("event") == "gc.removed" and rec.get("id") == container_id:
            return rec
    return None


def removed_message(audit_path: Path | None, container_id: str) -> tuple[str, dict[str, Any]]:
    """What a run whose container vanished tells its caller, and the details for its error."""
    rec = removed_by(audit_path, container_id)
    if rec is None:
        where = f"; {audit_path} has no record of toolcage's gc or reaper removing it" if audit_path else ""
        return f"the sandbox's container was removed from outside (not by this runner){where}", {
            "removed_from_outside": True
        }
    who = str(rec.get("remover", "?"))
    host, _, pid = who.rpartition(":")
    return (
        f"the sandbox's container was removed from outside (not by this runner): toolcage {rec.get('by', 'gc')} "
        f"(pid {pid} on host {host}, namespace {rec.get('remover_ns') or 'unknown'}) removed it at "
        f"{rec.get('ts', '?')}, because: {rec.get('reason', '?')}",
        {"removed_from_outside": True, "removed_by": {k: rec.get(k) for k in ("by", "remover", "remover_ns", "ts")}},
    )
