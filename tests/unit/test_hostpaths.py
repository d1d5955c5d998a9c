"""A runner inside a container: bind-mount sources mapped from its view to the engine host's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.unit._helpers import run_spec
from toolcage import hostpaths
from toolcage.errors import UsageError


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
    def __init__(self, mounts: list[dict[str, Any]]) -> None:
        self.mounts = mounts

    def inspect(self, cid: str) -> dict[str, Any]:
        return {"Id": cid, "Mounts": self.mounts}


def test_detected_from_the_runner_containers_own_bind_mounts(monkeypatch: pytest.MonkeyPatch) -> None:
    """In a container, its own bind mounts are the mapping (volumes and the engine socket's file too, as binds)."""
    monkeypatch.delenv(hostpaths.ENV, raising=False)
    monkeypatch.setattr(hostpaths, "in_container", lambda: True)
    monkeypatch.setattr(hostpaths, "_detected", {})
    engine = _Engine(
        [
            {"Type": "bind", "Source": "/srv/agent/ws", "Destination": "/data/ws"},
            {"Type": "volume", "Source": "/var/lib/docker/volumes/x/_data", "Destination": "/cache", "Name": "x"},
            {"Type": "bind", "Source": "/var/run/docker.sock", "Destination": "/var/run/docker.sock"},
        ]
    )
    run = hostpaths.map_run(
        run_spec(workspace=Path("/data/ws/proj"), tool_mounts=(("/data/ws/tools", "/t/0"),)), engine
    )
    assert run.workspace == Path("/srv/agent/ws/proj") and run.tool_mounts == (("/srv/agent/ws/tools", "/t/0"),)
    with pytest.raises(UsageError, match="the workspace /elsewhere"):
        hostpaths.map_run(run_spec(workspace=Path("/elsewhere")), engine)


def test_the_variable_wins_and_outside_a_container_nothing_is_mapped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hostpaths, "_detected", {})
    monkeypatch.setattr(hostpaths, "in_container", lambda: False)
    monkeypatch.delenv(hostpaths.ENV, raising=False)
    spec = run_spec(workspace=Path("/data/ws"))
    assert hostpaths.map_run(spec, _Engine([])) == spec
    monkeypatch.setenv(hostpaths.ENV, "/data=/host/data")
    assert hostpaths.map_run(spec, _Engine([])).workspace == Path("/host/data/ws")
