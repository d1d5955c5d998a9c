"""The egress proxy enforces the allowlist, so it runs from the worker image, never from the run's own
(a --pip, --requirements or --image image can add packages that would shadow the proxy's code)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.unit._helpers import run_spec
from toolcage.backends import BackendOptions, ContainerBackend
from toolcage.engine.knobs import DOCKER, FlavorKnobs
from toolcage.options import RunOptions
from toolcage.policies.loader import validate_policy
from toolcage.rpc.transport import StreamParser


class _Engine:
    """Records what would be created; stops at the first container (its config is the point)."""

    def __init__(self) -> None:
        self.created: list[dict[str, Any]] = []

    def network(self, name: str) -> None:
        return None

    def flavor(self) -> FlavorKnobs:
        return DOCKER

    def create(self, cfg: dict[str, Any], name: str) -> str:
        self.created.append(cfg)
        raise RuntimeError("stop here")

    def __getattr__(self, name: str) -> Any:
        return lambda *a, **k: None


def test_the_proxy_runs_from_the_worker_image_not_the_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """A run of its own image still gets the worker image ($TOOLCAGE_IMAGE) for its egress proxy: the options
    hand it to the backend (BackendOptions.proxy_image), which never reads the options itself."""
    monkeypatch.setenv("TOOLCAGE_IMAGE", "toolcage-worker:trusted")
    monkeypatch.setattr("toolcage.lifecycle.reaper.reap_in_background", lambda *a, **k: None)
    policy = validate_policy({"name": "p", "network": {"mode": "proxy", "allow": [{"host": "example.test"}]}})
    engine = _Engine()
    opts = RunOptions.resolve(policy, tool="t", sandbox="container", image="my-tools:1", engine=engine, audit=False)  # type: ignore[arg-type]
    backend = ContainerBackend(policy, BackendOptions(name="toolcage-x", log=None, **opts.backend_options()))
    with pytest.raises(RuntimeError, match="stop here"):
        backend.start(backend.complete(run_spec(image="my-tools:1")), StreamParser(1024))
    proxy = engine.created[0]
    assert proxy["Labels"]["toolcage.role"] == "egress-proxy"
    assert proxy["Image"] == "toolcage-worker:trusted"
