"""Workspace validation: existing directories only, never host secrets."""

from __future__ import annotations

import os
import pwd
import socket
import struct
from pathlib import Path

import pytest

from toolcage.errors import WorkspaceError
from toolcage.files import mountview, upload
from toolcage.workspace import check_host_path, validate_workspace


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


# Issue 34, point 3: toolcage's state and any user's credential stores, for the mount and the copy.


@pytest.fixture
def state_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """HOME and XDG_STATE_HOME in tmp_path: the default state directory and the XDG one both exist."""
    home = tmp_path / "home" / "me"
    (home / ".local" / "state" / "toolcage").mkdir(parents=True)
    (tmp_path / "xdg" / "toolcage").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    return tmp_path


@pytest.mark.parametrize(
    "rel",
    [
        "home/me/.local",
        "home/me/.local/state",
        "home/me/.local/state/toolcage",
        "xdg",
        "xdg/toolcage",
    ],
)
def test_refuses_the_state_directory_and_what_contains_it(state_home: Path, rel: str) -> None:
    """toolcage's state directory (XDG_STATE_HOME's and the default), and every directory holding it, are refused."""
    with pytest.raises(WorkspaceError, match=r"state directory|\.local/state/toolcage"):
        validate_workspace(state_home / rel)


def test_state_directory_inside_is_refused(state_home: Path) -> None:
    """A directory inside the state directory is refused too (its key is one level up, but the audit log is there)."""
    inner = state_home / "xdg" / "toolcage" / "runs"
    inner.mkdir()
    with pytest.raises(WorkspaceError, match="state directory"):
        validate_workspace(inner)


@pytest.mark.parametrize(
    ("layout", "match"),
    [
        ("alice/.ssh/", r"credential store \(\.ssh\)"),
        ("alice/.gnupg/", r"\.gnupg"),
        ("alice/.aws/", r"\.aws"),
        ("alice/.config/gcloud/", r"gcloud"),
        ("alice/.netrc", r"\.netrc"),
        ("alice/.pgpass", r"\.pgpass"),
        ("alice/.docker/config.json", r"\.docker"),
        ("alice/.kube/config", r"\.kube"),
        ("alice/.azure/msal_token_cache.json", r"\.azure"),
        ("bob/.local/state/toolcage/", "toolcage state directory"),
        ("elsewhere/toolcage/snapshot.key", "snapshot key"),
    ],
)
def test_refuses_any_users_credential_store_in_the_tree(tmp_path: Path, layout: str, match: str) -> None:
    """Another user's .ssh, .aws, ... (or a toolcage state directory) anywhere in the tree is refused, naming it."""
    ws = tmp_path / "ws"
    target = ws / "deep" / layout
    if layout.endswith("/"):
        target.mkdir(parents=True)
    else:
        target.parent.mkdir(parents=True)
        target.write_text("secret\n")
    with pytest.raises(WorkspaceError, match=match):
        validate_workspace(ws)


@pytest.mark.parametrize("layout", [".docker/Dockerfile", ".kube/manifests/", ".azure/pipelines.yml", "a/.sshd/"])
def test_project_directories_named_like_a_store_are_accepted(tmp_path: Path, layout: str) -> None:
    """A project's .docker/, .kube/ or .azure/ without the tool's credentials in it is accepted."""
    target = tmp_path / layout
    if layout.endswith("/"):
        target.mkdir(parents=True)
    else:
        target.parent.mkdir(parents=True)
        target.write_text("x\n")
    assert validate_workspace(tmp_path) == tmp_path.resolve()


def test_refuses_a_path_inside_any_users_store(tmp_path: Path) -> None:
    """A path inside a .ssh (or .aws, ...) of any user is refused by name, not only under the runner's home."""
    (tmp_path / "alice" / ".ssh" / "keys").mkdir(parents=True)
    with pytest.raises(WorkspaceError, match=r"inside a \.ssh directory"):
        validate_workspace(tmp_path / "alice" / ".ssh" / "keys")


def test_refuses_another_users_home_and_what_contains_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Any user's home (the password database) and a directory containing one are refused; a project in it is not."""
    bob = tmp_path / "users" / "bob"
    (bob / "proj").mkdir(parents=True)
    real = pwd.getpwall
    fake = pwd.struct_passwd(("bob", "x", 4242, 4242, "", str(bob), "/bin/sh"))
    monkeypatch.setattr(pwd, "getpwall", lambda: [*real(), fake])
    with pytest.raises(WorkspaceError, match="home directory of 'bob'"):
        validate_workspace(bob)
    with pytest.raises(WorkspaceError, match="contains the home directory of 'bob'"):
        validate_workspace(tmp_path / "users")
    assert validate_workspace(bob / "proj") == (bob / "proj").resolve()


@pytest.mark.parametrize(
    "host",
    ["/home/bob/.local", "/home/bob/.local/state", "/home/bob/.local/state/toolcage", "/srv/bob/.ssh/keys"],
)
def test_host_path_names_the_state_directory_and_stores(host: str) -> None:
    """The name-only check of the engine host's path refuses a .local/state/toolcage and any .ssh by name."""
    with pytest.raises(WorkspaceError, match=r"\.local/state/toolcage|\.ssh"):
        check_host_path(host, "/ws")


# The copy's rule: what uid/gid 65532 could read through the mount (toolcage.files.mountview).


def _st(mode: int, uid: int = 0, gid: int = 0) -> os.stat_result:
    return os.stat_result((mode, 0, 0, 1, uid, gid, 0, 0, 0, 0))


@pytest.mark.parametrize(
    ("mode", "uid", "gid", "want", "allowed"),
    [
        (0o100644, 0, 0, mountview.READ, True),
        (0o100600, 0, 0, mountview.READ, False),
        (0o100640, 0, 0, mountview.READ, False),
        (0o100640, 0, 65532, mountview.READ, True),
        (0o100604, 0, 65532, mountview.READ, False),  # the group class decides for a member: the kernel's rule
        (0o100600, 65532, 0, mountview.READ, True),
        (0o100066, 65532, 0, mountview.READ, False),  # the owner class decides for the owner
        (0o040755, 0, 0, mountview.LIST, True),
        (0o040711, 0, 0, mountview.LIST, False),
        (0o040744, 0, 0, mountview.LIST, False),
        (0o040700, 0, 0, mountview.LIST, False),
    ],
)
def test_mode_bits_for_the_sandbox_user(mode: int, uid: int, gid: int, want: int, allowed: bool) -> None:
    """Owner, group or other bits against uid/gid 65532, as the kernel picks the class."""
    assert mountview.allows(_st(mode, uid, gid), want) is allowed


def _acl(*entries: tuple[int, int, int]) -> bytes:
    return struct.pack("<I", 2) + b"".join(struct.pack("<HHI", *e) for e in entries)


_BASE = ((0x01, 6, 0xFFFFFFFF), (0x04, 4, 0xFFFFFFFF), (0x20, 4, 0xFFFFFFFF))


@pytest.mark.parametrize(
    ("acl", "allowed"),
    [
        (_acl(*_BASE), True),
        (_acl(*_BASE[:2], (0x02, 0, 65532), (0x10, 4, 0xFFFFFFFF), _BASE[2]), False),  # a named entry denies 65532
        (_acl(*_BASE[:2], (0x08, 0, 65532), (0x10, 4, 0xFFFFFFFF), _BASE[2]), False),  # its group's entry denies
        (_acl(*_BASE[:2], (0x02, 4, 65532), (0x10, 0, 0xFFFFFFFF), _BASE[2]), False),  # the mask denies
        (_acl(*_BASE[:2], (0x02, 4, 65532), (0x10, 4, 0xFFFFFFFF), _BASE[2]), True),
        (b"\x02\x00\x00\x00\x01", False),  # malformed: nothing
    ],
)
def test_access_acl_for_the_sandbox_user(acl: bytes, allowed: bool) -> None:
    """An access ACL is evaluated as the kernel does for uid/gid 65532, on top of the mode bits gVisor checks."""
    assert mountview.allows(_st(0o100644), mountview.READ, acl) is allowed


def test_a_named_acl_grant_alone_does_not_copy() -> None:
    """A 0640 file an ACL gives to uid 65532 is not copied: gVisor reads the mode bits, where other has nothing."""
    st = _st(0o100640)
    assert not mountview.allows(st, mountview.READ, _acl(*_BASE[:2], (0x02, 4, 65532), (0x10, 4, 0), (0x20, 0, 0)))


def test_copy_walk_withholds_what_the_sandbox_could_not_read(tmp_path: Path) -> None:
    """The copy's walk leaves out 0600 files, copies a 0700 directory empty, and names both."""
    ws = tmp_path / "ws"
    (ws / "private").mkdir(parents=True)
    (ws / "private" / "in.txt").write_text("x")
    (ws / "private").chmod(0o700)
    (ws / "secret.txt").write_text("x")
    (ws / "secret.txt").chmod(0o600)
    (ws / "public.txt").write_text("x")
    (ws / "link").symlink_to("secret.txt")
    ws.chmod(0o755)
    withheld = upload._Withheld()
    names = [name for _, name, _ in upload._entries(str(ws), withheld=withheld)]
    assert names == ["link", "private", "public.txt"]
    assert sorted(withheld) == ["private/", "secret.txt"] and withheld.total == 2
    assert mountview.copied(ws, "public.txt") and not mountview.copied(ws, "private/in.txt")
    assert not mountview.copied(ws, "secret.txt")
    ws.chmod(0o700)  # the workspace directory itself is the caller's grant (mkdtemp makes 0700 ones)
    withheld = upload._Withheld()
    assert [name for _, name, _ in upload._entries(str(ws), withheld=withheld)] == names
    assert mountview.copied(ws, "public.txt") and not mountview.copied(ws, "")
