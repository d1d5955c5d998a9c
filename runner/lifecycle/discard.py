"""Removing one run and everything of it, when asked (``toolcage rm RUN``).

Why: a run started with ``--keep`` stays for ``docker inspect`` and ``docker logs`` until its user removes
it, and ``docker rm`` of its container leaves the rest behind (its volumes over the image's shared files,
a stopped egress proxy, its network), while ``gc --kept`` removes every user's kept runs on the machine.
Here one run goes: everything the engine holds labelled with its run id, containers first (a volume or
network in use cannot go), each removal audited first (``gc.removed``, ``by="rm"``), as gc does it.

Which runs may go is the reaper's judgement, not a new one (toolcage.lifecycle.reaper.orphan_reason): an
object whose owner process is gone (in this namespace: boot, PID and time namespaces) or whose deadline
passed. A run whose owner still lives is its owner's to end; one whose owner is in another namespace (a
container, another machine on the same engine) cannot be judged from here until its deadline. A name the
engine knows but toolcage did not make (no run label) is refused too. Each refusal is one line.
Decisions as values: :func:`find_run` answers what would go or why not; :func:`discard` removes it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from toolcage.engine import ownership
from toolcage.engine.api import EngineAPI
from toolcage.engine.labels import LABEL_OWNER, LABEL_OWNER_NS, LABEL_RUN_ID
from toolcage.errors import NotFound, UsageError
from toolcage.lifecycle.reaper import Orphan, is_kept, labelled, orphan_reason, remove


@dataclass(frozen=True)
class RunObjects:
    """One run's objects on the engine, containers first; ``refusal``: why they may not go (None: they may)."""

    run_id: str
    objects: tuple[Orphan, ...]
    refusal: str | None = None


def _why_not(run_id: str, labels: dict[str, Any], here: str) -> str:
    owner = str(labels.get(LABEL_OWNER, "?"))
    host, _, pid = owner.rpartition(":")
    if here and labels.get(LABEL_OWNER_NS) == here:
        return (
            f"run {run_id} is still owned by process {pid} on {host}, which is alive: close it there "
            "(or end that process), then remove it"
        )
    return (
        f"run {run_id} was started by process {pid} on {host} in another PID namespace, boot or machine: "
        "whether it still runs cannot be told from here; remove it from there, or here once its deadline passed"
    )


def find_run(engine: EngineAPI, ref: str, now: float | None = None) -> RunObjects:
    """The objects of run ``ref`` (a run id, or the name or id of one of its containers) and whether they
    may go. NotFound when the engine has nothing of it; UsageError for a container toolcage did not make."""
    ref = ref.strip()
    if not ref or any(c in ref for c in ",=\n"):
        raise UsageError(f"rm: {ref!r} is not a run id or a container name")
    run_id = ref
    objects = labelled(engine, f"{LABEL_RUN_ID}={run_id}")
    if not objects:
        info = engine.inspect(ref)  # a container's name or id, as docker ps shows it
        if info is not None and not _named(ref, info):
            info = None  # docker took ref as an id's unique prefix: a run id of 8 hex would name another run
        if info is None:
            raise NotFound(
                f"no toolcage run {ref!r} on this engine (`toolcage ps` lists live runs, "
                "`toolcage gc --dry-run` what runs left)",
                run_id=ref,
            )
        run_id = str(((info.get("Config") or {}).get("Labels") or {}).get(LABEL_RUN_ID) or "")
        if not run_id:
            raise UsageError(f"rm: container {ref!r} was not made by toolcage (no {LABEL_RUN_ID} label): not removed")
        objects = labelled(engine, f"{LABEL_RUN_ID}={run_id}")
    now = time.time() if now is None else now
    here = ownership.namespace_key()
    found: list[Orphan] = []
    for kind, oid, name, labels in objects:
        why = orphan_reason(labels, now, here)
        if why is None:
            return RunObjects(run_id, (), _why_not(run_id, labels, here))
        found.append(Orphan(kind, oid, name, run_id, why, kept=is_kept(labels)))
    return RunObjects(run_id, tuple(found))  # containers first, as listed


def _named(ref: str, info: dict[str, Any]) -> bool:
    """``ref`` is the container's name, its id, or its id as ``docker ps`` shows it (12 characters or more)."""
    cid = str(info.get("Id") or "")
    return ref == str(info.get("Name") or "").lstrip("/") or (len(ref) >= 12 and cid.startswith(ref))


def discard(engine: EngineAPI, run: RunObjects, audit: Any = None) -> None:
    """Remove what :func:`find_run` found (UsageError with its refusal, when it may not go)."""
    if run.refusal is not None:
        raise UsageError(f"rm: {run.refusal}", run_id=run.run_id)
    remove(engine, list(run.objects), audit, by="rm")


__all__ = ["RunObjects", "discard", "find_run"]
