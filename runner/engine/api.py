"""The Engine protocol: what the runner needs from a container engine, as a type.

``docker_adapter.Engine`` satisfies it; tests pass fakes that do. Modules type their engine
parameter with it instead of ``Any``, so a misspelt call or a fake that drifted fails mypy.
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterator
from typing import Any, Protocol

from toolcage.engine.knobs import DOCKER, PODMAN, FlavorKnobs


class EngineAPI(Protocol):
    """Engine calls with foreign errors already translated to ``toolcage.errors``."""

    def ping(self) -> dict[str, Any]: ...
    def info(self) -> dict[str, Any]: ...
    def flavor(self) -> FlavorKnobs:
        """Docker or Podman, as knob values (``toolcage.engine.knobs``), decided once per engine."""
        ...

    # images
    def image(self, ref: str) -> dict[str, Any] | None: ...
    def pull(self, ref: str) -> bool: ...
    def import_tarball(self, path: str, repository: str, tag: str) -> None: ...
    def save_image(self, ref: str) -> Iterator[bytes]: ...
    def load_image(self, data: bytes | Iterator[bytes]) -> None: ...
    def build(
        self, context: str, tag: str, buildargs: dict[str, str], labels: dict[str, str]
    ) -> Iterator[dict[str, Any]]: ...

    # containers
    def create(self, config: dict[str, Any], name: str) -> str: ...
    def attach(self, cid: str) -> tuple[socket.socket, Callable[[], None]]: ...
    def exec_socket(self, cid: str, cmd: list[str], user: str) -> tuple[socket.socket, Callable[[], None]]:
        """A process started in a running container: a raw socket on its stdin and its multiplexed
        stdout/stderr (8-byte frames), and its closer (an exposed port's relay: toolcage.lifecycle.ports)."""
        ...

    def start(self, cid: str) -> None: ...
    def kill(self, cid: str, signal: str = "SIGKILL") -> None: ...
    def inspect(self, cid: str) -> dict[str, Any] | None: ...
    def wait(self, cid: str, timeout: float) -> int | None: ...
    def remove(self, cid: str) -> None: ...
    def containers(self, label: str, all: bool = True) -> list[dict[str, Any]]: ...
    def logs(self, cid: str, tail: int | None = None) -> str: ...
    def stats(self, cid: str) -> dict[str, Any]: ...
    def kill_requested(self, cid: str, since: float) -> bool | None:
        """Whether someone asked the engine to kill the container (``docker kill``, ``stop``, ``rm -f``, the API)
        since ``since`` (epoch seconds), from the engine's own events: a kill by the kernel (its OOM killer)
        leaves none. None: the engine could not tell."""
        ...

    def oom_reported(self, cid: str, since: float) -> bool | None:
        """Whether the engine recorded an out-of-memory kill in the container since ``since`` (its ``oom`` event,
        which stays when ``State.OOMKilled`` does not: Docker 20.10 under a loaded gVisor pass read exit 137 with
        OOMKilled false). None: the engine could not tell."""
        ...

    # networks
    def create_network(self, name: str, internal: bool, labels: dict[str, str]) -> str: ...
    def network(self, name: str) -> dict[str, Any] | None: ...
    def remove_network(self, name: str) -> None: ...
    def networks(self, label: str) -> list[dict[str, Any]]: ...

    # volumes
    def create_tmpfs_volume(self, name: str, labels: dict[str, str], options: str) -> str: ...
    def create_volume(self, name: str, labels: dict[str, str], options: dict[str, str] | None = None) -> str: ...
    def remove_volume(self, name: str) -> None: ...
    def volumes(self, label: str) -> list[dict[str, Any]]: ...


def is_podman(version: dict[str, Any]) -> bool:
    """The engine's version info names Podman among its components (its Docker-compatible service)."""
    return any("podman" in str(c.get("Name", "")).lower() for c in version.get("Components") or [])


def rootless(info: dict[str, Any]) -> bool:
    """Docker says so in SecurityOptions (name=rootless); Podman's compatible service in ``Rootless``."""
    return info.get("Rootless") is True or "name=rootless" in " ".join(info.get("SecurityOptions") or [])


def limits_problem(info: dict[str, Any]) -> str | None:
    """Why the engine cannot enforce a sandbox's memory and pids limits, or None. Rootless on cgroup v1
    there is no cgroup the engine may delegate: rootless Podman (seen on this machine kind, 4.3.1)
    creates the container and silently drops --memory and --pids-limit."""
    if rootless(info) and str(info.get("CgroupVersion")) == "1":
        return (
            "the engine runs rootless on cgroup v1, where it cannot enforce the memory and pids limits (it "
            "ignores them): use a rootful engine, or a host with cgroup v2 delegating the memory and pids "
            "controllers to the user"
        )
    return None


def podman_ping(headers: Any) -> bool:
    """The engine's ``/_ping`` headers say Podman (its Docker-compatible service adds ``Libpod-*`` ones).
    One cheap call: ``/version`` asks the engine for every component's version (5-9 ms here)."""
    return any(str(k).lower().startswith("libpod-") for k in headers)


def detect_flavor(podman: bool, info: Callable[[], dict[str, Any]]) -> FlavorKnobs:
    """The engine's flavour (``podman``: from :func:`podman_ping` or :func:`is_podman`; ``info``: asked
    only for Podman, whose limits are checked: a rootless Docker says so itself, in create's warnings).
    SandboxError with the fix when the engine cannot hold a sandbox."""
    if not podman:
        return DOCKER
    problem = limits_problem(info())
    if problem:
        from toolcage.errors import SandboxError

        raise SandboxError(f"this engine cannot hold a sandbox: {problem}")
    return PODMAN


__all__ = ["EngineAPI", "detect_flavor", "is_podman", "limits_problem", "podman_ping", "rootless"]
