"""The engine's flavour from its ``/_ping`` headers (one cheap call; ``/version`` took 5-9 ms here)."""

from __future__ import annotations

from toolcage.engine.api import podman_ping

DOCKER_PING = {"Api-Version": "1.41", "Docker-Experimental": "false", "Ostype": "linux", "Server": "Docker/20.10.24"}
# Podman 4.3.1's Docker-compatible service, as it answered on this machine
PODMAN_PING = {
    "Api-Version": "1.41",
    "Docker-Experimental": "true",
    "Libpod-Api-Version": "4.3.1",
    "Libpod-Buildah-Version": "1.28.2",
    "Server": "Libpod/4.3.1 (linux)",
}


def test_podman_says_so_in_its_ping_headers_and_docker_does_not() -> None:
    assert podman_ping(PODMAN_PING) is True
    assert podman_ping({k.lower(): v for k, v in PODMAN_PING.items()}) is True
    assert podman_ping(DOCKER_PING) is False
