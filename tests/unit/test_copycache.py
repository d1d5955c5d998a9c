"""toolcage.engine.copycache's decisions as values, on a fake engine: what a path's record says, what gc removes."""

from __future__ import annotations

import time
from typing import Any

from toolcage.engine import copycache as cc

OLD = "2020-01-01T00:00:00Z"


def _now() -> str:  # at the call: a pass of the suite can take longer than STALE_S after this module's import
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


class FakeEngine:
    def __init__(self, volumes: list[dict[str, Any]], images: set[str] = frozenset(), mounted: set[str] = frozenset()):
        self._volumes, self._images, self._mounted = volumes, images, mounted

    def volumes(self, label: str) -> list[dict[str, Any]]:
        key, _, value = label.partition("=")
        return [v for v in self._volumes if key in v["Labels"] and (not value or v["Labels"][key] == value)]

    def image(self, ref: str) -> dict[str, Any] | None:
        return {"Id": ref} if ref in self._images else None

    def containers(self, label: str, all: bool = True) -> list[dict[str, Any]]:
        return [{"Mounts": [{"Name": n} for n in self._mounted]}]

    def create_volume(self, name: str, labels: dict[str, str], options: dict[str, str] | None = None) -> str:
        if all(v["Name"] != name for v in self._volumes):  # as the engine: one of that name is kept as it is
            self._volumes.append({"Name": name, "CreatedAt": _now(), "Labels": dict(labels)})
        return name

    def remove_volume(self, name: str) -> None:
        from toolcage.errors import SandboxError

        if name in self._mounted:
            raise SandboxError(f"remove {name}: volume is in use")
        self._volumes = [v for v in self._volumes if v["Name"] != name]

    def names(self) -> set[str]:
        return {v["Name"] for v in self._volumes}


def marker(k: str, data: str, at: int, where: str = "p") -> dict[str, Any]:
    labels = {cc.LABEL: k, cc.LABEL_PATH: where, cc.LABEL_DATA: data, cc.LABEL_SIZE: "4096", cc.LABEL_AT: str(at)}
    return {"Name": cc.marker_name(k), "CreatedAt": _now(), "Labels": labels}


def data(name: str, k: str, created: str | None = None, where: str = "p") -> dict[str, Any]:
    return {"Name": name, "CreatedAt": created or _now(), "Labels": {cc.LABEL: k, cc.LABEL_PATH: where}}


def seen(k: str, at: int, where: str = "p") -> dict[str, Any]:
    labels = {cc.LABEL: k, cc.LABEL_PATH: where, cc.LABEL_SEEN: "1", cc.LABEL_AT: str(at)}
    return {"Name": f"{cc.SEEN_PREFIX}{k}", "CreatedAt": _now(), "Labels": labels}


def test_a_paths_record_guesses_the_newest_kept_tree_unless_a_tree_started_since() -> None:
    engine = FakeEngine([marker("a", "da", 10), data("da", "a"), marker("b", "db", 20), data("db", "b")])
    state = cc.state(engine, "p")  # type: ignore[arg-type]
    assert set(state.ready) == {"a", "b"} and state.guess() is not None and state.guess().volume == "db"
    engine = FakeEngine([marker("b", "db", 20), data("db", "b"), seen("c", 30)])
    assert cc.state(engine, "p").guess() is None  # type: ignore[arg-type]
    engine = FakeEngine([marker("b", "db", 20), data("db", "b"), seen("c", 5)])
    assert cc.state(engine, "p").guess().volume == "db"  # type: ignore[arg-type, union-attr]
    # a marker whose tree is gone is no kept tree
    assert cc.state(FakeEngine([marker("a", "gone", 10)]), "p").ready == {}  # type: ignore[arg-type]


def test_gc_removes_what_no_run_needs_and_with_copies_every_tree_not_in_use() -> None:
    vols = [
        marker("a", "da", 10), data("da", "a"),  # a kept tree: stays
        data(cc.DATA_PREFIX + "fresh", "x"),  # a fill under way (no marker yet, new): stays
        data(cc.DATA_PREFIX + "old", "y", created=OLD),  # a fill that never finished: goes
        marker("z", "dz-gone", 10),  # a marker whose tree is gone: goes
        seen("s", 1),  # a noted tree: stays
        {"Name": f"{cc.ABLE_PREFIX}1", "CreatedAt": OLD, "Labels": {cc.LABEL: "able", cc.LABEL_IMAGE: "sha256:old"}},
        {"Name": f"{cc.ABLE_PREFIX}2", "CreatedAt": OLD, "Labels": {cc.LABEL: "able", cc.LABEL_IMAGE: "sha256:new"}},
    ]  # fmt: skip
    engine = FakeEngine(vols, images={"sha256:new"})
    assert sorted(n for _, n, _ in cc.stale(engine)) == sorted(  # type: ignore[arg-type]
        [cc.DATA_PREFIX + "old", cc.marker_name("z"), f"{cc.ABLE_PREFIX}1"]
    )
    engine = FakeEngine(vols, images={"sha256:new"}, mounted={"da"})
    every = {n for _, n, _ in cc.stale(engine, copies=True)}  # type: ignore[arg-type]
    assert "da" not in every and cc.marker_name("a") not in every  # in use: the tree and its marker stay
    assert {cc.DATA_PREFIX + "fresh", cc.DATA_PREFIX + "old", cc.marker_name("z"), f"{cc.SEEN_PREFIX}s"} <= every


def test_gc_never_names_a_tree_a_run_mounts_even_a_long_fill() -> None:
    """A fill older than STALE_S that a run still mounts (a big tree, a slow disk) is not named: the engine would
    refuse its removal and gc would stop there."""
    vols = [data(cc.DATA_PREFIX + "slow", "k", created=OLD)]
    assert cc.stale(FakeEngine(vols, mounted={cc.DATA_PREFIX + "slow"})) == []  # type: ignore[arg-type]
    assert [n for _, n, _ in cc.stale(FakeEngine(vols))] == [cc.DATA_PREFIX + "slow"]  # type: ignore[arg-type]


def test_a_path_keeps_at_most_two_trees_and_four_noted_ones_never_one_in_use() -> None:
    """Keeping a tree removes the oldest others of its path beyond KEEP_PER_PATH (a tree a run mounts stays);
    noting one removes the oldest noted beyond SEEN_PER_PATH. Oldest by the time each was made (ns), not by the
    engine's CreatedAt (whole seconds)."""
    vols = [marker(k, f"d{k}", at) for k, at in (("a", 10), ("b", 20), ("c", 30))]
    vols += [data(f"d{k}", k) for k in "abc"]
    engine = FakeEngine(vols)
    cc._evict(engine, "p", keep="a")  # type: ignore[arg-type]  # a: just kept; c the newest other; b goes
    assert engine.names() == {cc.marker_name("a"), "da", cc.marker_name("c"), "dc"}
    engine = FakeEngine([marker(k, f"d{k}", at) for k, at in (("a", 10), ("b", 20), ("c", 30))] + [
        data(f"d{k}", k) for k in "abc"], mounted={"da"})  # fmt: skip
    cc._evict(engine, "p", keep="c")  # type: ignore[arg-type]  # a would go, but a run mounts it
    assert {"da", "db", "dc"} <= engine.names()
    engine = FakeEngine([seen(k, at) for k, at in (("s1", 1), ("s2", 2), ("s3", 3), ("s4", 4))])
    cc.mark_seen(engine, "s5", "p")  # type: ignore[arg-type]
    assert engine.names() == {f"{cc.SEEN_PREFIX}{k}" for k in ("s2", "s3", "s4", "s5")}
