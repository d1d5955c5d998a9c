"""ContainerBackend.remove with an egress proxy: the run's overlay volumes go after both containers, and a
failure to remove them never hides why the proxy's teardown failed. The engine and the proxy are fakes:
the order and the error that reaches the caller are the point."""

from __future__ import annotations

from typing import Any

import pytest

from toolcage.backends import BackendOptions, ContainerBackend
from toolcage.errors import SandboxError, ToolcageError
from toolcage.policies.loader import validate_policy


class _Engine:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def remove(self, cid: str) -> None:
        self.calls.append(f"remove {cid}")

    def remove_volume(self, name: str) -> None:
        self.calls.append(f"remove_volume {name}")
        raise ToolcageError(f"volume {name} is busy")


class _Proxy:
    def __init__(self, engine: _Engine, fails: bool) -> None:
        self.engine, self.fails = engine, fails

    def down(self, before_volume: Any) -> None:
        before_volume()
        self.engine.calls.append("proxy down")
        if self.fails:
            raise SandboxError("the proxy would not stop")


def _backend(engine: _Engine, fails: bool) -> ContainerBackend:
    policy = validate_policy({"name": "p", "network": {"mode": "proxy", "allow": [{"host": "example.test"}]}})
    options = BackendOptions(engine=engine, image="i:1", proxy_image="i:1", name="toolcage-x", log=None)  # type: ignore[arg-type]
    backend = ContainerBackend(policy, options)
    backend.container_id = "sandbox"
    backend._egress = _Proxy(engine, fails)
    backend._files = ["toolcage-files-run-x-usr"]
    return backend


def test_the_proxys_error_is_the_one_raised_and_the_volumes_are_still_tried() -> None:
    engine = _Engine()
    with pytest.raises(SandboxError, match="the proxy would not stop"):
        _backend(engine, fails=True).remove(keep=False)
    assert engine.calls == ["remove sandbox", "proxy down", "remove_volume toolcage-files-run-x-usr"]


def test_with_the_proxy_down_a_volume_that_will_not_go_is_reported() -> None:
    engine = _Engine()
    with pytest.raises(ToolcageError, match="is busy"):
        _backend(engine, fails=False).remove(keep=False)
    assert engine.calls == ["remove sandbox", "proxy down", "remove_volume toolcage-files-run-x-usr"]
