"""toolcage.engine.sharedfiles: when an image's program files come from volumes its sandboxes share, and
what ``gc`` removes. The engine is a fake here (the decisions and their order are the point); what a
sandbox can do with the mounts is in tests/security/test_shared_files.py, on the real engine."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from tests.unit._helpers import run_spec
from toolcage.engine import sharedfiles
from toolcage.engine.hostconfig import container_config
from toolcage.engine.knobs import DOCKER, PODMAN, FlavorKnobs
from toolcage.errors import SandboxError
from toolcage.policies.loader import validate_policy

IMAGE = "sha256:" + "ab" * 32


class FakeEngine:
    def __init__(self, driver: str = "fuse-overlayfs", flavor: FlavorKnobs = DOCKER) -> None:
        self.driver, self._flavor = driver, flavor
        self.vols: dict[str, dict[str, str]] = {}
        self.calls: list[str] = []
        self.images = {IMAGE}
        self.containers_: list[dict[str, Any]] = []
        self.fail_create = False
        self.opts: dict[str, dict[str, str]] = {}
        self.probe_exit = 0

    def flavor(self) -> FlavorKnobs:
        return self._flavor

    def info(self) -> dict[str, Any]:
        self.calls.append("info")
        return {"Driver": self.driver}

    def volumes(self, label: str) -> list[dict[str, Any]]:
        self.calls.append("volumes")
        key, _, value = label.partition("=")
        return [
            {"Name": n, "Labels": lb, "Mountpoint": f"/v/{n}/_data", "Options": self.opts.get(n)}
            for n, lb in self.vols.items()
            if key in lb and (not value or lb[key] == value)
        ]

    def create_volume(self, name: str, labels: dict[str, str], options: dict[str, str] | None = None) -> str:
        self.calls.append(f"create_volume {name}")
        self.vols.setdefault(name, dict(labels))  # one already there is kept as it is, as Docker does
        if options:
            self.opts.setdefault(name, options)
        return name

    def start(self, cid: str) -> None:
        self.calls.append(f"start {cid}")

    def wait(self, cid: str, timeout: float) -> int | None:
        return self.probe_exit

    def remove_volume(self, name: str) -> None:
        self.calls.append(f"remove_volume {name}")
        self.vols.pop(name, None)

    def create(self, config: dict[str, Any], name: str) -> str:
        self.calls.append("create")
        if self.fail_create:
            raise SandboxError("the engine died during the copy")
        assert config["Image"] == IMAGE and "Cmd" not in config
        if name.endswith("-probe"):  # runs /usr/bin/true from an overlay of the filled /usr
            (mount,) = config["HostConfig"]["Mounts"]
            assert mount["ReadOnly"] and self.opts[mount["Source"]]["type"] == "overlay"
            return "probe"
        assert [m["Target"] for m in config["HostConfig"]["Mounts"]] == list(sharedfiles.TARGETS)
        assert not any(m.get("VolumeOptions", {}).get("NoCopy") for m in config["HostConfig"]["Mounts"])
        return "filler"

    def remove(self, cid: str) -> None:
        self.calls.append(f"remove {cid}")

    def image(self, ref: str) -> dict[str, Any] | None:
        return {"Id": ref} if ref in self.images else None

    def containers(self, label: str, all: bool = True) -> list[dict[str, Any]]:
        return self.containers_


@pytest.fixture(autouse=True)
def _fresh(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(sharedfiles.ENV, raising=False)
    sharedfiles.forget()


def test_a_copying_driver_fills_two_volumes_once_probes_then_marks_them() -> None:
    engine = FakeEngine()
    got = sharedfiles.layers(engine, IMAGE)
    assert got is not None
    assert [t for _, t in got.lowers] == ["/usr", "/opt/toolcage/lib"]
    marker = engine.vols[sharedfiles.marker_name(IMAGE)]
    assert marker[sharedfiles.LABEL_USE] == "1"
    assert {f"/v/{marker[sharedfiles.LABEL_USR]}/_data", f"/v/{marker[sharedfiles.LABEL_OPT]}/_data"} == {
        p for p, _ in got.lowers
    }
    assert got.empty == f"/v/{sharedfiles.marker_name(IMAGE)}/_data"
    # the order that keeps a half fill from ever being used: volumes, the engine's copy, its container gone,
    # a probe that an overlay of them mounts and runs, the marker last
    order = [c.split()[0] for c in engine.calls]
    fill = ["volumes", "info", "create_volume", "create_volume", "create", "remove"]
    probe = ["create_volume", "volumes", "create_volume", "create", "start", "remove", "remove_volume", "remove_volume"]
    assert order == [*fill, *probe, "create_volume", "volumes"]
    assert engine.calls[-2] == f"create_volume {sharedfiles.marker_name(IMAGE)}"
    assert not [n for n in engine.vols if "probe" in n or "empty" in n]  # the probe's volumes are gone
    engine.calls.clear()
    assert sharedfiles.layers(engine, IMAGE) == got and engine.calls == []  # asked once per process
    sharedfiles.forget()
    assert sharedfiles.layers(engine, IMAGE) == got and engine.calls == ["volumes"]  # the next process: one call


def test_an_engine_that_cannot_mount_the_overlay_gets_a_marker_saying_no() -> None:
    engine = FakeEngine()
    engine.probe_exit = 1
    assert sharedfiles.layers(engine, IMAGE) is None
    assert engine.vols[sharedfiles.marker_name(IMAGE)][sharedfiles.LABEL_USE] == "0"


def test_a_sharing_driver_gets_a_marker_saying_no_and_no_layers() -> None:
    engine = FakeEngine(driver="overlay2")
    assert sharedfiles.layers(engine, IMAGE) is None
    assert engine.vols == {sharedfiles.marker_name(IMAGE): {sharedfiles.LABEL: IMAGE, sharedfiles.LABEL_USE: "0"}}
    sharedfiles.forget()
    engine.calls.clear()
    assert sharedfiles.layers(engine, IMAGE) is None and engine.calls == ["volumes"]  # no info, no fill


def test_a_fill_that_fails_is_never_used_and_leaves_nothing() -> None:
    engine = FakeEngine()
    engine.fail_create = True
    assert sharedfiles.layers(engine, IMAGE) is None
    assert engine.vols == {}  # both data volumes removed, no marker


def test_a_marker_naming_a_volume_removed_by_hand_is_not_used() -> None:
    engine = FakeEngine()
    found = sharedfiles.layers(engine, IMAGE)
    assert found is not None
    usr = engine.vols[sharedfiles.marker_name(IMAGE)][sharedfiles.LABEL_USR]
    del engine.vols[usr]
    sharedfiles.forget()
    assert sharedfiles.layers(engine, IMAGE) is None  # (the worker would find an empty /usr)


@pytest.mark.parametrize(
    ("setting", "flavor", "image"), [("off", DOCKER, IMAGE), ("", PODMAN, IMAGE), ("", DOCKER, None)]
)
def test_off_podman_or_no_image_asks_nothing(
    monkeypatch: pytest.MonkeyPatch, setting: str, flavor: FlavorKnobs, image: str | None
) -> None:
    if setting:
        monkeypatch.setenv(sharedfiles.ENV, setting)
    engine = FakeEngine(flavor=flavor)
    assert sharedfiles.layers(engine, image) is None
    assert engine.calls == []


def test_a_run_mounts_overlays_of_its_own_never_the_shared_volumes() -> None:
    """The shared volumes' inodes are never a sandbox's: an overlay per run has its own (locks and inotify
    stay in the run) over the same files (the page cache is shared). Read-only, never copied into."""
    engine = FakeEngine()
    found = sharedfiles.layers(engine, IMAGE)
    assert found is not None
    volumes = sharedfiles.run_volumes("run1")
    assert volumes == (("toolcage-files-run-run1-usr", "/usr"), ("toolcage-files-run-run1-lib", "/opt/toolcage/lib"))
    made = sharedfiles.make_run_volumes(engine, found, volumes, {"toolcage.run_id": "run1"})
    assert made == [v for v, _ in volumes]
    for (name, _), (lower, _) in zip(volumes, found.lowers, strict=True):
        assert engine.opts[name] == {"type": "overlay", "device": "overlay", "o": f"lowerdir={lower}:{found.empty}"}
    policy = validate_policy({"name": "p"})
    mounts = container_config(policy, dataclasses.replace(run_spec(), shared_files=volumes))["HostConfig"]["Mounts"]
    assert [m for m in mounts if m["Source"].startswith("toolcage-files-")] == [
        {"Type": "volume", "Source": v, "Target": t, "ReadOnly": True, "VolumeOptions": {"NoCopy": True}}
        for v, t in volumes
    ]


def test_gc_finds_what_no_image_or_marker_needs_and_never_what_a_live_run_is_made_of() -> None:
    engine = FakeEngine()
    found = sharedfiles.layers(engine, IMAGE)
    assert found is not None
    kept = {engine.vols[sharedfiles.marker_name(IMAGE)][k] for k in (sharedfiles.LABEL_USR, sharedfiles.LABEL_OPT)}
    kept.add(sharedfiles.marker_name(IMAGE))
    gone = "sha256:" + "cd" * 32
    engine.vols["toolcage-files-cdcdcdcdcdcd"] = {sharedfiles.LABEL: gone, sharedfiles.LABEL_USE: "0"}
    engine.vols["toolcage-files-abababababab-0000-usr"] = {sharedfiles.LABEL: IMAGE}  # a fill that died
    engine.containers_ = [{"Id": "old-fill", "Created": 0}]
    found_stale = sharedfiles.stale(engine, now=sharedfiles.FILL_STALE_S + 1)
    assert found_stale[0] == ("container", "old-fill", "a fill of shared files whose process did not remove it")
    assert {n for _, n, _ in found_stale[1:]} == {"toolcage-files-cdcdcdcdcdcd", "toolcage-files-abababababab-0000-usr"}
    assert not kept & {name for _, name, _ in found_stale}
    assert found_stale[-1][1] == "toolcage-files-cdcdcdcdcdcd"  # a marker after the volumes it names
    assert sharedfiles.stale(engine, now=sharedfiles.FILL_STALE_S - 1)[0][0] == "volume"  # a fill may be under way
    # ... and the volumes it writes are left to it (removing one in use, Docker refused and gc stopped there)
    engine.containers_ = [
        {
            "Id": "new-fill",
            "Created": 0,
            "Mounts": [
                {"Type": "volume", "Name": "toolcage-files-abababababab-0000-usr"},
                {"Type": "bind", "Name": None},
            ],
        }
    ]
    young = sharedfiles.stale(engine, now=sharedfiles.FILL_STALE_S - 1)
    assert {n for _, n, _ in young} == {"toolcage-files-cdcdcdcdcdcd"}
    engine.containers_ = [{"Id": "old-fill", "Created": 0}]
    # the image goes while a run of it lives: its volumes stay until that run's overlays are gone
    engine.images.clear()
    run = sharedfiles.run_volumes("live")
    sharedfiles.make_run_volumes(engine, found, run, {"toolcage.run_id": "live"})
    assert not kept & {n for _, n, _ in sharedfiles.stale(engine)}
    assert sharedfiles.drop(engine, IMAGE) == []
    for name, _ in run:
        del engine.vols[name]
    assert kept <= {n for _, n, _ in sharedfiles.stale(engine)}


def test_drop_removes_an_images_volumes_marker_first_and_leaves_one_in_use() -> None:
    engine = FakeEngine()
    assert sharedfiles.layers(engine, IMAGE) is not None
    usr = engine.vols[sharedfiles.marker_name(IMAGE)][sharedfiles.LABEL_USR]
    lib = engine.vols[sharedfiles.marker_name(IMAGE)][sharedfiles.LABEL_OPT]
    engine.calls.clear()
    refuse = {lib}  # the engine refuses (in use some other way)

    def remove_volume(name: str) -> None:
        engine.calls.append(f"remove_volume {name}")
        if name in refuse:
            raise SandboxError(f"volume {name} is in use")
        engine.vols.pop(name, None)

    engine.remove_volume = remove_volume  # type: ignore[method-assign]
    assert sharedfiles.drop(engine, IMAGE) == [sharedfiles.marker_name(IMAGE), usr]
    assert next(c for c in engine.calls if c.startswith("remove_volume")) == (
        f"remove_volume {sharedfiles.marker_name(IMAGE)}"
    )
    assert set(engine.vols) == {lib}
    assert sharedfiles.layers(engine, IMAGE) is not None  # asked again (and filled again), not the dropped answer
