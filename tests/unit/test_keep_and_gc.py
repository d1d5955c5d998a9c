"""Kept runs (--keep) are the user's: labelled at creation, never reaped, removed by gc only with --kept."""

from __future__ import annotations

import json
import socket
from typing import Any

import pytest
from click.testing import CliRunner

from tests.unit._helpers import run_spec
from toolcage.engine.hostconfig import container_config
from toolcage.engine.labels import LABEL_KEEP, LABEL_OWNER
from toolcage.lifecycle import reaper
from toolcage.policies import load_policy


class FakeEngine:
    """The part of EngineAPI the reaper and gc use, over an in-memory list of containers."""

    def __init__(self, containers: list[dict[str, Any]]) -> None:
        self.objects = containers
        self.removed: list[str] = []

    def containers(self, label: str, all: bool = True) -> list[dict[str, Any]]:
        return [c for c in self.objects if label in c["Labels"] and c["Id"] not in self.removed]

    def networks(self, label: str) -> list[dict[str, Any]]:
        return []

    def volumes(self, label: str) -> list[dict[str, Any]]:
        return []

    def remove(self, cid: str) -> None:
        self.removed.append(cid)


def _container(cid: str, keep: bool) -> dict[str, Any]:
    """A container whose owner process is gone (pid 999999 on this host): an orphan unless kept."""
    labels = container_config(load_policy("default"), run_spec(run_id=cid, keep=keep))["Labels"]
    labels[LABEL_OWNER] = f"{socket.gethostname()}:999999"
    return {"Id": cid, "Names": [f"/toolcage-run_python-{cid}"], "Labels": labels}


@pytest.fixture
def engine(monkeypatch: pytest.MonkeyPatch) -> FakeEngine:
    eng = FakeEngine([_container("kept0001", keep=True), _container("dead0001", keep=False)])
    import toolcage.engine.docker_adapter
    import toolcage.lifecycle.audit

    monkeypatch.setattr(toolcage.engine.docker_adapter.Engine, "default", classmethod(lambda cls: eng))
    monkeypatch.setattr(toolcage.lifecycle.audit, "shared", lambda *a: None)
    return eng


def test_keep_is_a_label_set_at_creation() -> None:
    """RunSpec(keep=True) puts toolcage.keep=1 on the container; a normal run toolcage.keep=0 (over an image's)."""
    p = load_policy("default")
    assert container_config(p, run_spec(keep=True))["Labels"][LABEL_KEEP] == "1"
    assert container_config(p, run_spec())["Labels"][LABEL_KEEP] == "0"


def test_reaper_never_removes_a_kept_container(engine: FakeEngine) -> None:
    """The background reaper's pass removes the dead run's container and leaves the kept one."""
    assert [o.id for o in reaper.find_orphans(engine)] == ["dead0001"]
    reaper.remove(engine, reaper.find_orphans(engine, include_kept=True), by="reaper")
    assert engine.removed == ["dead0001"]


def test_gc_lists_kept_but_removes_it_only_with_kept_flag(engine: FakeEngine) -> None:
    """`gc` removes orphans and lists kept containers; `gc --kept` removes those too."""
    out = CliRunner().invoke(reaper_cli(), ["gc", "--json"])
    assert out.exit_code == 0, out.output
    doc = json.loads(out.stdout)
    assert [o["id"] for o in doc["removed"]] == ["dead0001"] and [o["id"] for o in doc["kept"]] == ["kept0001"]
    assert engine.removed == ["dead0001"]
    out = CliRunner().invoke(reaper_cli(), ["gc", "--kept"])
    assert out.exit_code == 0 and "removed container toolcage-run_python-kept0001" in out.stdout
    assert engine.removed == ["dead0001", "kept0001"]


def test_gc_dry_run_removes_nothing(engine: FakeEngine) -> None:
    """`gc --dry-run` names what it would remove and what is kept, and removes nothing."""
    out = CliRunner().invoke(reaper_cli(), ["gc", "--dry-run"])
    assert "would remove container toolcage-run_python-dead0001" in out.stdout
    assert "kept container toolcage-run_python-kept0001" in out.stdout
    assert engine.removed == []


def reaper_cli() -> Any:
    from toolcage.cli.main import cli

    return cli
