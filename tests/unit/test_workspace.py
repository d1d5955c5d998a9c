"""Workspace validation: existing directories only, never host secrets."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from toolcage.errors import WorkspaceError
from toolcage.workspace import validate_workspace


def test_accepts_a_project_dir(tmp_path: Path) -> None:
    """A plain directory is accepted and returned resolved."""
    assert validate_workspace(tmp_path) == tmp_path.resolve()


def test_resolves_symlinks(tmp_path: Path) -> None:
    """A symlink is resolved before the checks (a link to /etc is still /etc)."""
    link = tmp_path / "link"
    link.symlink_to("/etc")
    with pytest.raises(WorkspaceError, match="inside /etc"):
        validate_workspace(link)


@pytest.mark.parametrize(
    "path",
    [
        "/",
        "/etc",
        "/etc/ssl",
        "/root",
        "/proc",
        "/proc/self",
        "/sys",
        "/dev",
        "/usr",
        "/var/run",
        "/run",
        "/boot",
        "/home",
        "/tmp",
        "/var/tmp",
        "/var/lib",
        "/var",
    ],
)
def test_refuses_system_paths(path: str) -> None:
    """System and secret-holding paths are refused."""
    if not os.path.exists(path):
        pytest.fail(f"{path} should exist on a Linux test host")
    with pytest.raises(WorkspaceError):
        validate_workspace(path)


def test_refuses_missing_and_files(tmp_path: Path) -> None:
    """A missing path or a file is refused with a clear message."""
    with pytest.raises(WorkspaceError, match="does not exist"):
        validate_workspace(tmp_path / "nope")
    f = tmp_path / "f"
    f.write_text("x")
    with pytest.raises(WorkspaceError, match="not a directory"):
        validate_workspace(f)


def test_refuses_home_and_its_secrets(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The home directory itself, ~/.ssh and anything containing them are refused."""
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / "proj").mkdir()
    monkeypatch.setenv("HOME", str(home))
    with pytest.raises(WorkspaceError, match="home directory"):
        validate_workspace(home)
    with pytest.raises(WorkspaceError, match=r"\.ssh"):
        validate_workspace(home / ".ssh")
    assert validate_workspace(home / "proj") == (home / "proj").resolve()


def test_root_home_projects_allowed_for_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """When HOME is /root, /root/project is a project like any other; /root and /root/.ssh are not."""
    if not os.path.isdir("/root"):
        pytest.fail("/root should exist on a Linux test host")
    monkeypatch.setenv("HOME", "/root")
    monkeypatch.setattr(Path, "home", classmethod(lambda cls: Path("/root")))
    with pytest.raises(WorkspaceError):
        validate_workspace("/root")
    proj = Path("/root/toolcage-ws-test")
    if os.access("/root", os.W_OK):
        proj.mkdir(exist_ok=True)
        try:
            assert validate_workspace(proj) == proj
        finally:
            proj.rmdir()


def test_refuses_dir_holding_the_docker_host_socket(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A directory that contains the engine socket DOCKER_HOST names (e.g. rootless Docker) is refused."""
    run = tmp_path / "run"
    run.mkdir()
    monkeypatch.setenv("DOCKER_HOST", f"unix://{run}/docker.sock")
    with pytest.raises(WorkspaceError, match="engine socket"):
        validate_workspace(tmp_path)
    monkeypatch.delenv("DOCKER_HOST")
    assert validate_workspace(tmp_path) == tmp_path.resolve()


@pytest.mark.parametrize(
    ("path", "reason"),
    [
        ("/tmp", "too broad"),
        ("/var/tmp", "too broad"),
        ("/var/lib", "contains /var/lib/docker"),
        ("/var", "contains /var/run"),
        ("/", "contains /proc"),
    ],
)
def test_shared_dirs_and_parents_of_refused_trees(path: str, reason: str) -> None:
    """Host-wide directories and every parent of a refused tree are refused with a one-sentence reason."""
    if not os.path.isdir(path):
        pytest.fail(f"{path} should exist on a Linux test host")
    with pytest.raises(WorkspaceError, match=reason):
        validate_workspace(path)


def test_project_under_tmp_still_accepted(tmp_path: Path) -> None:
    """Only /tmp itself is refused: a project directory under it (pytest's tmp_path) is accepted."""
    assert str(tmp_path).startswith("/tmp/")
    assert validate_workspace(tmp_path) == tmp_path.resolve()


def test_refuses_workspace_holding_a_unix_socket(tmp_path: Path) -> None:
    """A Unix socket anywhere in the tree is refused, naming it (connect() works through a read-only mount)."""
    deep = tmp_path / "a" / "b"
    deep.mkdir(parents=True)
    srv = socket.socket(socket.AF_UNIX)
    try:
        srv.bind(str(deep / "agent.sock"))
        with pytest.raises(WorkspaceError, match=r"Unix socket, '.*/a/b/agent\.sock'"):
            validate_workspace(tmp_path)
    finally:
        srv.close()
    (deep / "agent.sock").unlink()
    assert validate_workspace(tmp_path) == tmp_path.resolve()


def test_refuses_fifo_and_device_nodes(tmp_path: Path) -> None:
    """FIFOs (writable through a read-only mount) and device nodes are refused too."""
    os.mkfifo(tmp_path / "pipe")
    with pytest.raises(WorkspaceError, match="FIFO"):
        validate_workspace(tmp_path)
    (tmp_path / "pipe").unlink()
    os.mknod(tmp_path / "null", 0o600 | 0o020000, os.makedev(1, 3))
    with pytest.raises(WorkspaceError, match="device node"):
        validate_workspace(tmp_path)


def test_symlinks_to_sockets_are_not_followed(tmp_path: Path) -> None:
    """A symlink to a socket elsewhere is not a socket in the workspace (it resolves inside the container)."""
    (tmp_path / "ws").mkdir()
    (tmp_path / "ws" / "docker.sock").symlink_to("/var/run/docker.sock")
    (tmp_path / "ws" / "etc").symlink_to("/run")
    assert validate_workspace(tmp_path / "ws") == (tmp_path / "ws").resolve()


def test_unlistable_dir_the_sandbox_can_enter(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A directory the runner cannot list is refused when others may search it, skipped when not."""
    hidden = tmp_path / "hidden"
    hidden.mkdir()
    real = os.scandir

    def scandir(p: object) -> object:
        if str(p) == str(hidden):
            raise PermissionError(13, "Permission denied")
        return real(p)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "scandir", scandir)
    hidden.chmod(0o711)
    with pytest.raises(WorkspaceError, match="cannot be checked"):
        validate_workspace(tmp_path)
    hidden.chmod(0o700)
    assert validate_workspace(tmp_path) == tmp_path.resolve()
