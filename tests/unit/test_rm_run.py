"""`toolcage rm RUN` removes one run and everything of it, judged as gc judges; gc removes what a kept run
left once its containers were removed by hand, and an image's shared files in the same pass (issue 35)."""

from __future__ import annotations

import json
import os
import socket
from typing import Any

import pytest
from click.testing import CliRunner

from tests.unit._helpers import run_spec
from toolcage.engine import ownership, sharedfiles
from toolcage.engine.labels import LABEL_DEADLINE, LABEL_OWNER, LABEL_OWNER_NS, LABEL_OWNER_STARTED, labels
from toolcage.errors import NotFound, UsageError
from toolcage.lifecycle import discard, reaper
from toolcage.policies import load_policy

IMAGE = "sha256:" + "ef" * 32


class FakeEngine:
    """Containers, networks and volumes with labels, filtered as the engine filters (key or key=value)."""

    def __init__(self) -> None:
        self.objects: dict[str, list[dict[str, Any]]] = {"container": [], "network": [], "volume": []}
        self.removed: list[tuple[str, str]] = []
        self.images: set[str] = set()

    def _match(self, kind: str, label: str) -> list[dict[str, Any]]:
        key, _, value = label.partition("=")
        return [o for o in self.objects[kind] if key in o["Labels"] and (not value or o["Labels"][key] == value)]

    def containers(self, label: str, all: bool = True) -> list[dict[str, Any]]:
        return self._match("container", label)

    def networks(self, label: str) -> list[dict[str, Any]]:
        return self._match("network", label)

    def volumes(self, label: str) -> list[dict[str, Any]]:
        return self._match("volume", label)

    def _drop(self, kind: str, key: str, value: str) -> None:
        self.removed.append((kind, value))
        self.objects[kind] = [o for o in self.objects[kind] if o[key] != value]

    def remove(self, cid: str) -> None:
        self._drop("container", "Id", cid)

    def remove_network(self, name: str) -> None:
        self._drop("network", "Id", name)

    def remove_volume(self, name: str) -> None:
        self._drop("volume", "Name", name)

    def inspect(self, ref: str) -> dict[str, Any] | None:
        for c in self.objects["container"]:
            if ref in (c["Id"], c["Names"][0].lstrip("/")):
                return {"Id": c["Id"], "Name": c["Names"][0], "Config": {"Labels": c["Labels"]}}
        return None

    def image(self, ref: str) -> dict[str, Any] | None:
        return {"Id": ref} if ref in self.images else None

    def add_run(self, run_id: str, *, keep: bool = True, owner: str = "dead", proxy: bool = True) -> dict[str, str]:
        """A run's objects: its container, an egress proxy and network, its overlay and socket volumes.
        ``owner``: dead (a pid that is gone, here), alive (this process), elsewhere (another namespace)."""
        lab = labels(load_policy("default"), run_spec(run_id=run_id, keep=keep))
        if owner == "dead":
            lab[LABEL_OWNER] = f"{socket.gethostname()}:999999"
        elif owner == "alive":
            lab[LABEL_OWNER], lab[LABEL_OWNER_STARTED] = ownership.owner()
            lab[LABEL_OWNER_NS] = ownership.namespace_key()
        else:
            lab[LABEL_OWNER_NS], lab[LABEL_DEADLINE] = "other-boot/1/1", owner  # the deadline, as text
        self.objects["container"].append(
            {"Id": f"c-{run_id}", "Names": [f"/toolcage-run_shell-{run_id}"], "Labels": lab}
        )
        if proxy:
            self.objects["container"].append(
                {"Id": f"p-{run_id}", "Names": [f"/toolcage-proxy-{run_id}"], "Labels": lab}
            )
            self.objects["network"].append({"Id": f"n-{run_id}", "Name": f"toolcage-egress-{run_id}", "Labels": lab})
        for name, target in sharedfiles.run_volumes(run_id):
            lower = f"/v/toolcage-files-efefefefefef-{target.rsplit('/', 1)[-1]}/_data"
            opts = sharedfiles.overlay_options(lower, "/v/toolcage-files-efefefefefef/_data")
            self.objects["volume"].append({"Name": name, "Labels": lab, "Options": opts, "Mountpoint": f"/v/{name}"})
        return lab


@pytest.fixture
def engine(monkeypatch: pytest.MonkeyPatch) -> FakeEngine:
    eng = FakeEngine()
    import toolcage.engine.docker_adapter
    import toolcage.lifecycle.audit

    monkeypatch.setattr(toolcage.engine.docker_adapter.Engine, "default", classmethod(lambda cls: eng))
    monkeypatch.setattr(toolcage.lifecycle.audit, "shared", lambda *a: None)
    return eng


def test_rm_removes_one_kept_run_and_everything_of_it(engine: FakeEngine) -> None:
    """Its container and proxy first, then its network and volumes; another kept run stays."""
    engine.add_run("aaaa0001")
    engine.add_run("bbbb0002")
    found = discard.find_run(engine, "aaaa0001")
    assert found.refusal is None and [o.kind for o in found.objects][:2] == ["container", "container"]
    audit = Recorder()
    discard.discard(engine, found, audit)
    assert {v for _, v in engine.removed} == {
        "c-aaaa0001", "p-aaaa0001", "n-aaaa0001",
        "toolcage-files-run-aaaa0001-usr", "toolcage-files-run-aaaa0001-lib",
    }  # fmt: skip
    assert [k for k, _ in engine.removed][:2] == ["container", "container"]
    assert all(e["by"] == "rm" and e["run_id"] == "aaaa0001" for e in audit.events) and len(audit.events) == 5
    assert len(engine.objects["container"]) == 2  # the other run's


def test_rm_by_container_name_after_docker_rm_left_the_rest(engine: FakeEngine) -> None:
    """A container name finds its run; after `docker rm` of both containers the run id still finds the rest."""
    engine.add_run("aaaa0001")
    assert discard.find_run(engine, "toolcage-run_shell-aaaa0001").run_id == "aaaa0001"
    engine.remove("c-aaaa0001")
    engine.remove("p-aaaa0001")
    assert {o.kind for o in discard.find_run(engine, "aaaa0001").objects} == {"network", "volume"}


def test_rm_refuses_a_run_whose_owner_lives_or_cannot_be_judged(engine: FakeEngine) -> None:
    """A live owner here, or an owner in another namespace before its deadline: one line saying why, nothing
    removed; once that deadline passed, it goes (the reaper's judgement, not a new one)."""
    engine.add_run("live0001", owner="alive")
    engine.add_run("away0001", owner="9e99")
    engine.add_run("late0001", owner="1.0")
    live = discard.find_run(engine, "live0001")
    assert live.objects == () and f"process {os.getpid()}" in str(live.refusal) and "alive" in str(live.refusal)
    with pytest.raises(UsageError, match="still owned by process"):
        discard.discard(engine, live)
    away = discard.find_run(engine, "away0001")
    assert "another PID namespace" in str(away.refusal)
    assert discard.find_run(engine, "late0001").refusal is None
    assert engine.removed == []


def test_rm_refuses_what_toolcage_did_not_make_and_says_when_nothing_is_there(engine: FakeEngine) -> None:
    """A container with no run label is not removed; an unknown name is NotFound; a filter is not a name."""
    engine.objects["container"].append({"Id": "x1", "Names": ["/my-db"], "Labels": {"owner": "me"}})
    with pytest.raises(UsageError, match="not made by toolcage"):
        discard.find_run(engine, "my-db")
    with pytest.raises(NotFound, match="no toolcage run 'nope'"):
        discard.find_run(engine, "nope")
    with pytest.raises(UsageError, match="not a run id"):
        discard.find_run(engine, "toolcage.keep=1")
    assert engine.removed == []


def test_rm_cli_prints_what_went_and_refuses_in_one_line(engine: FakeEngine) -> None:
    """`rm --dry-run --json` lists, `rm` removes; a refusal is one stderr line, exit 2, nothing on stdout."""
    from toolcage.cli.main import cli

    engine.add_run("aaaa0001", proxy=False)
    engine.add_run("live0001", owner="alive")
    out = CliRunner().invoke(cli, ["rm", "--dry-run", "--json", "aaaa0001"])
    assert out.exit_code == 0, out.output
    assert len(json.loads(out.stdout)["would_remove"]) == 3 and engine.removed == []
    out = CliRunner().invoke(cli, ["rm", "aaaa0001"])
    assert out.exit_code == 0 and "removed container toolcage-run_shell-aaaa0001" in out.stdout
    out = CliRunner().invoke(cli, ["rm", "live0001"])
    assert out.exit_code == 2 and out.stdout == "" and len(out.stderr.strip().splitlines()) == 1
    assert "still owned by process" in out.stderr


def test_gc_removes_what_a_kept_run_left_after_docker_rm(engine: FakeEngine) -> None:
    """While a kept run has a container, all of it is kept; once the user removed its containers, its
    network and volumes are no one's: plain gc removes them."""
    engine.add_run("aaaa0001")
    assert all(o.kept for o in reaper.find_orphans(engine, include_kept=True)) and not reaper.find_orphans(engine)
    engine.remove("c-aaaa0001")
    engine.remove("p-aaaa0001")
    left = reaper.find_orphans(engine)
    assert {o.kind for o in left} == {"network", "volume"} and not any(o.kept for o in left)
    assert all("docker rm" in o.reason for o in left)


def test_one_gc_removes_an_images_shared_files_and_the_run_overlays_made_of_them(engine: FakeEngine) -> None:
    """After `docker rm` and `docker rmi`: the run's overlay volumes go in the same pass, so they no longer
    keep the image's shared files in use; a live run's overlays still do."""
    for name in ("toolcage-files-efefefefefef", "toolcage-files-efefefefefef-usr", "toolcage-files-efefefefefef-lib"):
        engine.objects["volume"].append(
            {"Name": name, "Labels": {sharedfiles.LABEL: IMAGE}, "Mountpoint": f"/v/{name}/_data"}
        )
    engine.add_run("aaaa0001", proxy=False)
    engine.remove("c-aaaa0001")
    shared = {o.name for o in reaper.shared_files_orphans(engine)}
    assert shared == {
        "toolcage-files-efefefefefef",
        "toolcage-files-efefefefefef-usr",
        "toolcage-files-efefefefefef-lib",
    }
    assert not reaper.shared_files_orphans(engine, going=[])  # the overlays staying: the files stay in use
    engine.add_run("live0001", owner="alive", proxy=False)
    assert not reaper.shared_files_orphans(engine)


class Recorder:
    """An audit that records its events."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []

    def event(self, event: str, /, **fields: Any) -> None:
        self.events.append({"event": event, **fields})
