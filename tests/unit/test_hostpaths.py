"""A runner inside a container: bind-mount sources mapped from its view to the engine host's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.unit._helpers import run_spec
from toolcage.engine import hostpaths
from toolcage.errors import UsageError, WorkspaceError


def test_parse_and_map_take_the_longest_prefix() -> None:
    m = hostpaths.parse("/app=/srv/agent, /app/data=/mnt/data/ ,")
    assert m == (("/app/data", "/mnt/data"), ("/app", "/srv/agent"))
    assert hostpaths.to_host("/app/data/x/y.txt", m, "w") == "/mnt/data/x/y.txt"
    assert hostpaths.to_host("/app/tools", m, "w") == "/srv/agent/tools"
    assert hostpaths.to_host("/app", m, "w") == "/srv/agent"
    assert hostpaths.to_host("/anything", None, "w") == "/anything"  # not in a container: as it is


@pytest.mark.parametrize("bad", ["/app", "app=/srv", "/app=srv", "=/srv"])
def test_a_malformed_mapping_is_a_usage_error(bad: str) -> None:
    with pytest.raises(UsageError, match="TOOLCAGE_HOST_PATHS"):
        hostpaths.parse(bad)


def test_a_path_under_no_mapping_is_refused_with_the_fix() -> None:
    """/application is not under /app (no prefix match across a name), and /tmp is nowhere: refused."""
    m = hostpaths.parse("/app=/srv/agent")
    for path in ("/application/x", "/tmp/ws"):
        with pytest.raises(UsageError, match=r"bind-mount it into the runner's container.*TOOLCAGE_HOST_PATHS"):
            hostpaths.to_host(path, m, "the workspace")


class _Engine:
    """Knows one container, by its id only (never by a hostname), with these mounts."""

    def __init__(self, mounts: list[dict[str, Any]], cid: str = "c" * 64) -> None:
        self.mounts, self.cid, self.asked = mounts, cid, []

    def inspect(self, cid: str) -> dict[str, Any] | None:
        self.asked.append(cid)
        return {"Id": cid, "Mounts": self.mounts} if cid == self.cid else None


def _mountinfo(cid: str, *points: str) -> list[tuple[str, str]]:
    """What /proc/self/mountinfo shows in a Docker container: the engine's files for ``cid``, then ``points``."""
    files = [(f"/var/lib/docker/containers/{cid}/{f}", f"/etc/{f}") for f in ("hostname", "hosts", "resolv.conf")]
    return [("/", "/"), *files, *(("/x", p) for p in points)]


@pytest.fixture
def in_a_container(monkeypatch: pytest.MonkeyPatch) -> None:
    """A runner in a container: the engine's server out of sight, no variable, nothing cached."""
    monkeypatch.delenv(hostpaths.ENV, raising=False)
    monkeypatch.setattr(hostpaths, "in_container", lambda: True)
    monkeypatch.setattr(hostpaths, "engine_server", lambda: "out of sight")
    monkeypatch.setattr(hostpaths, "_detected", {})


MOUNTS = [
    {"Type": "bind", "Source": "/srv/agent/ws", "Destination": "/data/ws"},
    {"Type": "volume", "Source": "/var/lib/docker/volumes/x/_data", "Destination": "/cache", "Name": "x"},
    {"Type": "bind", "Source": "/var/run/docker.sock", "Destination": "/run/docker.sock"},
]


def test_own_container_id_from_the_engines_files_in_mountinfo() -> None:
    """Docker's and Podman's per-container files name the id; none, or two different ids, name nothing."""
    cid, other = "a" * 64, "b" * 64
    assert hostpaths.own_container_id(_mountinfo(cid)) == cid
    podman = [(f"/run/containers/storage/overlay-containers/{cid}/userdata/hostname", "/etc/hostname")]
    assert hostpaths.own_container_id(podman) == cid
    assert hostpaths.own_container_id([("/", "/")]) is None
    assert hostpaths.own_container_id([*_mountinfo(cid), (f"/containers/{other}/hosts", "/etc/hosts")]) is None
    # the engine's file mounted somewhere else is not this container's own
    assert hostpaths.own_container_id([(f"/var/lib/docker/containers/{cid}/hostname", "/data/h")]) is None


def test_detected_from_the_runner_containers_own_bind_mounts(
    monkeypatch: pytest.MonkeyPatch, in_a_container: None
) -> None:
    """The container is found by its id in mountinfo (whatever its hostname); its binds are the mapping."""
    engine = _Engine(MOUNTS)
    monkeypatch.setattr(hostpaths, "_mountinfo", lambda: _mountinfo(engine.cid, "/data/ws", "/run/docker.sock"))
    run = hostpaths.map_run(
        run_spec(workspace=Path("/data/ws/proj"), tool_mounts=(("/data/ws/tools", "/t/0"),)), engine
    )
    assert run.workspace == Path("/srv/agent/ws/proj") and run.tool_mounts == (("/srv/agent/ws/tools", "/t/0"),)
    assert engine.asked == [engine.cid]  # never its hostname
    with pytest.raises(UsageError, match="the workspace /elsewhere"):
        hostpaths.map_run(run_spec(workspace=Path("/elsewhere")), engine)


@pytest.mark.parametrize(
    "case",
    ["no_container_id", "engine_does_not_know_it", "engine_names_mounts_the_runner_lacks"],
)
def test_a_runner_unsure_of_its_mapping_refuses_with_the_fix(
    monkeypatch: pytest.MonkeyPatch, in_a_container: None, case: str
) -> None:
    """In a container it cannot find (or whose engine's account disagrees): every path refused, naming the fix."""
    engine = _Engine(MOUNTS)
    mounts = {
        "no_container_id": [("/", "/"), ("/x", "/data/ws")],
        "engine_does_not_know_it": _mountinfo("d" * 64, "/data/ws", "/run/docker.sock"),
        "engine_names_mounts_the_runner_lacks": _mountinfo(engine.cid, "/run/docker.sock"),
    }[case]
    monkeypatch.setattr(hostpaths, "_mountinfo", lambda: mounts)
    with pytest.raises(UsageError, match=r"cannot tell which host directory.*TOOLCAGE_HOST_PATHS") as caught:
        hostpaths.map_run(run_spec(workspace=Path("/data/ws")), engine)
    assert "the workspace /data/ws" in caught.value.message
    assert hostpaths._detected == {}  # an unsure view is asked again next time
    assert hostpaths.map_run(run_spec(), engine) == run_spec()  # nothing to mount: nothing to refuse


def test_the_variable_wins_and_a_local_engine_maps_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """$TOOLCAGE_HOST_PATHS (also /=/) wins; an engine that shares the runner's root, or a TCP engine
    outside a container, gets paths as they are."""
    monkeypatch.setattr(hostpaths, "_detected", {})
    monkeypatch.setattr(hostpaths, "in_container", lambda: True)
    monkeypatch.setattr(hostpaths, "engine_server", lambda: "same root")
    monkeypatch.delenv(hostpaths.ENV, raising=False)
    spec = run_spec(workspace=Path("/data/ws"))
    assert hostpaths.map_run(spec, _Engine([])) == spec
    monkeypatch.setattr(hostpaths, "_detected", {})
    monkeypatch.setattr(hostpaths, "in_container", lambda: False)
    monkeypatch.setattr(hostpaths, "engine_server", lambda: "unknown")
    monkeypatch.setattr(hostpaths, "_mountinfo", lambda: [("/", "/")])
    assert hostpaths.map_run(spec, _Engine([])) == spec
    monkeypatch.setenv(hostpaths.ENV, "/data=/host/data")
    assert hostpaths.map_run(spec, _Engine([])).workspace == Path("/host/data/ws")
    monkeypatch.setenv(hostpaths.ENV, "/=/")
    assert hostpaths.map_run(spec, _Engine([])).workspace == Path("/data/ws")


@pytest.mark.parametrize(
    ("inside", "host"),
    [
        ("/data/hostetc", "/etc"),
        ("/data/hostetc/ssh", "/etc/ssh"),
        ("/data/home", "/home/alice"),
        ("/data/keys", "/srv/backup/.ssh"),
        ("/data/gc", "/home/alice/.config/gcloud"),
        ("/data/run", "/var/run"),
        ("/data/root", "/root"),
        ("/data/all", "/"),
        ("/data/var", "/var"),
    ],
)
def test_the_refusals_apply_to_the_host_path(monkeypatch: pytest.MonkeyPatch, inside: str, host: str) -> None:
    """A runner's harmless-looking path that is a refused one on the engine's host is refused, naming both."""
    monkeypatch.setenv(hostpaths.ENV, f"{inside}={host}")
    monkeypatch.setattr(hostpaths, "_detected", {})
    with pytest.raises(WorkspaceError, match=f"refusing to mount the workspace '{inside}' .on the engine's host"):
        hostpaths.map_run(run_spec(workspace=Path(inside)), _Engine([]))
    with pytest.raises(WorkspaceError):
        hostpaths.map_run(run_spec(tool_mounts=((inside, "/t/0"),)), _Engine([]))


def test_projects_on_the_host_are_still_mounted(monkeypatch: pytest.MonkeyPatch) -> None:
    """Projects under /root, /home/NAME, /srv and /tmp on the host pass the host-path check."""
    for host in ("/root/proj", "/home/alice/proj", "/srv/agent/repo", "/tmp/pytest-of-root/x"):
        monkeypatch.setenv(hostpaths.ENV, f"/data/ws={host}")
        assert hostpaths.map_run(run_spec(workspace=Path("/data/ws")), _Engine([])).workspace == Path(host)
