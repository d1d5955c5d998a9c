"""`toolcage image build --apt PKG` on the real engine: Debian packages downloaded on this host by its apt and
installed in an offline build of an image derived from the worker image (issue 24, item 6). Needs a Debian
bookworm host with apt (the packages' source) and the mirror apt uses."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from toolcage import Sandbox

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [
    pytest.mark.usefixtures("no_leaks"),
    pytest.mark.runc_only(
        "image building (the host's engine and its build steps): the same whatever kernel the sandbox has"
    ),
]


def _build(*args: str) -> subprocess.CompletedProcess[str]:
    from toolcage import DEFAULT_IMAGE

    parent = os.environ.get("TOOLCAGE_IMAGE", DEFAULT_IMAGE)  # used as it is (--from): no one's image is rebuilt
    cmd = [sys.executable, "-m", "toolcage.cli", "image", "build", *args, "--from", parent]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=600)


@pytest.fixture(scope="module")
def with_git(engine: Any) -> Iterator[dict[str, Any]]:
    """An image derived with --apt git, under a toolcage-test- tag, removed at the end whatever happened."""
    tag = f"toolcage-test-apt-{uuid.uuid4().hex[:8]}:1"
    try:
        out = _build("--apt", "git", "--tag", tag)
        assert out.returncode == 0, out.stderr[-3000:]
        yield {"tag": tag, "result": json.loads(out.stdout), "stderr": out.stderr}
    finally:
        try:
            engine.api.remove_image(tag)
        except Exception as exc:  # gone already (a failed build) is fine; anything else is said
            if "No such image" not in str(exc):
                raise


def test_git_runs_in_the_sandbox_on_the_workspace_repository(with_git: dict[str, Any], tmp_path: Path) -> None:
    """git is there for tool code; it reads the read-only workspace's repository (owned by another uid)."""
    assert with_git["result"]["apt"] == ["git"] and with_git["result"]["built"]
    repo = tmp_path / "repo"
    repo.mkdir()
    git = ["git", "-C", str(repo), "-c", "user.email=t@example.org", "-c", "user.name=t"]
    subprocess.run([*git, "init", "-q"], check=True)
    (repo / "a.txt").write_text("hi\n")
    subprocess.run([*git, "add", "a.txt"], check=True)
    subprocess.run([*git, "commit", "-qm", "first"], check=True)
    for p in (tmp_path, *repo.rglob("*"), repo):
        p.chmod(p.stat().st_mode | 0o055)
    with Sandbox(image=with_git["tag"], workspace=repo, audit=False) as sb:
        r = sb.call("run_shell", {"command": "git --version && git -C /workspace log --format=%s"})
        assert r.ok and r.result["stdout"].startswith("git version 2.") and r.result["stdout"].endswith("first\n"), r
        r = sb.call("run_shell", {"command": "find / -xdev -perm /6000 -type f 2>/dev/null | wc -l"})
        assert r.result["stdout"].strip() == "0"  # no setuid/setgid file came with the packages


def test_a_rebuild_is_up_to_date(with_git: dict[str, Any]) -> None:
    out = _build("--apt", "git", "--tag", with_git["tag"])
    assert out.returncode == 0 and json.loads(out.stdout)["built"] is False, out.stderr[-2000:]


def test_an_unknown_package_is_exit_2(engine: Any) -> None:
    """A name apt does not know: exit 2, one line saying so; nothing is built."""
    out = _build("--apt", "no-such-package-toolcage", "--tag", "toolcage-test-apt-none:1")
    assert out.returncode == 2, out.stderr[-2000:]
    assert "--apt no-such-package-toolcage: apt on this host knows no such package" in out.stderr
    assert "Traceback" not in out.stderr and engine.image("toolcage-test-apt-none:1") is None
