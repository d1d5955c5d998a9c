"""The offline base bootstrap on a fresh machine: debootstrap installed as root, one sentence otherwise."""

from __future__ import annotations

from typing import Any

import pytest

from toolcage.image import build


def test_without_root_says_what_to_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """No debootstrap and no root: one sentence naming the command to run, nothing attempted."""
    monkeypatch.setattr(build.shutil, "which", lambda name: None if name == "debootstrap" else f"/usr/bin/{name}")
    monkeypatch.setattr(build.os, "geteuid", lambda: 1000)
    ran: list[Any] = []
    monkeypatch.setattr(build.subprocess, "run", lambda *a, **k: ran.append(a))
    with pytest.raises(build.BuildError, match=r"run `sudo apt-get install debootstrap`") as info:
        build.bootstrap_base(object(), lambda _m: None)
    assert not ran and info.value.message.count(". ") == 0


def test_as_root_installs_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """As root with apt-get: debootstrap is installed (update, then install, when the first try fails)."""
    installed: list[bool] = []
    monkeypatch.setattr(
        build.shutil,
        "which",
        lambda name: ("/usr/sbin/debootstrap" if installed else None) if name == "debootstrap" else "/usr/bin/apt-get",
    )
    monkeypatch.setattr(build.os, "geteuid", lambda: 0)
    calls: list[list[str]] = []

    class Done:
        def __init__(self, rc: int) -> None:
            self.returncode, self.stdout, self.stderr = rc, "", "E: no candidate"

    def run(cmd: list[str], **_k: Any) -> Done:
        calls.append(cmd)
        if cmd[1] == "install" and len(calls) == 1:
            return Done(100)  # package lists not fetched yet
        if cmd[1] == "install":
            installed.append(True)
        return Done(0)

    monkeypatch.setattr(build.subprocess, "run", run)
    build._install_debootstrap(lambda _m: None)
    assert [c[1] for c in calls] == ["install", "update", "install"]
