"""The backend seam: Sandbox runs on any Backend and never asks which one it has."""

from __future__ import annotations

import inspect
import sys
from typing import Any

import pytest

from toolcage import Sandbox, backends
from toolcage import sandbox as sandbox_mod
from toolcage.backends import ExitStatus, ProcessBackend


class RecordingBackend(ProcessBackend):
    """The local worker, recording which of the five seam methods the Sandbox used."""

    def __init__(self, policy: Any, **kw: Any) -> None:
        super().__init__(policy, **kw)
        self.seen: list[str] = []

    def image_id(self) -> str | None:
        self.seen.append("image_id")
        return "sha256:fake"

    def start(self, run: Any, parser: Any) -> Any:
        self.seen.append("start")
        return super().start(run, parser)

    def kill(self) -> None:
        self.seen.append("kill")
        super().kill()

    def exit_status(self, timeout: float) -> ExitStatus:
        self.seen.append("exit_status")
        return super().exit_status(timeout)

    def remove(self, keep: bool) -> None:
        self.seen.append("remove")
        super().remove(keep)


def test_a_new_backend_is_one_entry(monkeypatch: pytest.MonkeyPatch) -> None:
    """A backend registered by name runs a whole run (start, calls, usage, remove) with no change to Sandbox."""
    monkeypatch.setitem(backends.BACKENDS, "recording", RecordingBackend)
    with Sandbox(sandbox="recording", audit=False) as sb:
        assert sb.call("ping").result == "pong"
        backend = sb._backend
    assert isinstance(backend, RecordingBackend)
    assert backend.seen[0] == "start" and "remove" in backend.seen and "kill" not in backend.seen
    assert sb.summary is not None and sb.summary.status == "ok" and sb.summary.calls == 1


def test_unknown_backend_is_a_usage_error() -> None:
    """--sandbox with a name no backend has is refused before anything starts, listing the names."""
    from toolcage import UsageError

    with pytest.raises(UsageError, match="'container', 'none'"):
        Sandbox(sandbox="gvisor", audit=False)


def test_sandbox_does_not_branch_on_its_backend() -> None:
    """No `kind ==` tests or transport isinstance checks remain in the Sandbox (issue 8)."""
    source = inspect.getsource(sandbox_mod)
    assert "kind ==" not in source and "isinstance(self._transport" not in source
    assert "ProcessTransport" not in source and "DockerAttachTransport" not in source
    assert sys.modules["toolcage.sandbox"] is sandbox_mod
