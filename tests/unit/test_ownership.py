"""An owner is a process in a namespace, not a hostname; a removal names its remover, and a run can find it."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import pytest

from tests.unit._helpers import run_spec
from toolcage.engine import ownership
from toolcage.engine.hostconfig import container_config
from toolcage.engine.labels import LABEL_OWNER_NS
from toolcage.lifecycle import audit, reaper
from toolcage.policies import load_policy


def test_the_namespace_key_names_boot_pid_and_time_namespaces_not_the_host() -> None:
    """boot_id/pid-ns/time-ns of this process; the hostname is no part of it."""
    key = ownership.namespace_key()
    boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    assert key.split("/")[:2] == [boot, str(os.stat("/proc/self/ns/pid").st_ino)]
    assert socket.gethostname() not in key


def test_no_key_when_proc_is_another_namespaces(monkeypatch: pytest.MonkeyPatch) -> None:
    """Under another namespace's /proc no pid can be checked: the key is empty, and so nothing is judged by pid."""
    monkeypatch.setattr(ownership, "proc_is_ours", lambda: False)
    assert ownership.namespace_key() == ""
    dead = {"toolcage.owner": "h:999999", "toolcage.owner_ns": "", "toolcage.deadline": "9999999999"}
    assert reaper.orphan_reason(dead, 0, "") is None


def test_every_run_is_labelled_with_its_owners_namespace() -> None:
    """container_config puts the owner's namespace key on the container."""
    labels = container_config(load_policy("default"), run_spec())["Labels"]
    assert labels[LABEL_OWNER_NS] == ownership.namespace_key() != ""


def test_an_owner_from_before_namespaces_is_left_until_its_deadline() -> None:
    """A container with no namespace label (an older runner) is judged by its deadline alone."""
    here = ownership.namespace_key()
    old = {"toolcage.owner": f"{socket.gethostname()}:999999", "toolcage.deadline": "100"}
    assert reaper.orphan_reason(old, 50, here) is None
    assert reaper.orphan_reason(old, 200, here) == "run deadline passed"


def test_a_removal_is_audited_with_its_remover_and_found_by_container_id(tmp_path: Path) -> None:
    """remove() writes gc.removed with the remover's pid, start time and namespace; removed_by finds it by id."""

    class Engine:
        removed: list[str] = []

        def remove(self, cid: str) -> None:
            self.removed.append(cid)

    log = audit.Audit(tmp_path / "audit.jsonl")
    log.event("run.started", run_id="r1", id="c1")  # the id alone is not a removal
    orphan = reaper.Orphan("container", "c1", "toolcage-x-r1", "r1", "owner process 7 is gone")
    reaper.remove(Engine(), [orphan], log, by="gc")  # type: ignore[arg-type]
    rec = reaper.removed_by(log.path, "c1")
    assert rec is not None and rec["by"] == "gc" and rec["remover"] == f"{socket.gethostname()}:{os.getpid()}"
    assert rec["remover_ns"] == ownership.namespace_key() and rec["remover_started"]
    assert reaper.removed_by(log.path, "c2") is None and reaper.removed_by(None, "c1") is None
    msg, details = reaper.removed_message(log.path, "c1")
    assert "removed from outside (not by this runner): toolcage gc" in msg and f"pid {os.getpid()}" in msg
    assert "owner process 7 is gone" in msg and details["removed_by"]["by"] == "gc"
    msg, details = reaper.removed_message(log.path, "c2")
    assert "has no record of toolcage's gc or reaper removing it" in msg and details == {"removed_from_outside": True}


def test_removed_by_skips_torn_and_foreign_lines(tmp_path: Path) -> None:
    """A torn line or a record that only mentions the id is not taken for a removal."""
    path = tmp_path / "audit.jsonl"
    good = {"event": "gc.removed", "id": "c1", "by": "reaper", "remover": "h:1"}
    path.write_text(json.dumps(good) + "\n" + '{"event": "gc.removed", "id": "c1", "by": "x' + "\n")
    rec = reaper.removed_by(path, "c1")
    assert rec is not None and rec["by"] == "reaper"
