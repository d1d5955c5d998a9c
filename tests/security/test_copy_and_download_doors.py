"""Issue 34, points 3 and 4 (download half): the writable copy and downloads, from the attacker's side.

- The copy gives the sandbox what the read-only mount would, no more: a file uid/gid 65532 could not read
  through the mount (0600, 0640 of another group, inside a 0700 directory) is not in the copy.
- The workspace refusals cover toolcage's own state directory (the snapshot key) and the credential
  stores of any user's home, for the mount and the copy: the forged-snapshot chain stops at the start.
- A download never writes ``.git`` (nor a name git takes for it), nor a link into one or out of the
  target: the sandbox's ``core.fsmonitor`` and hooks never reach the host repository.

Run under runc and gVisor (TOOLCAGE_SANDBOX=gvisor).
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import pwd
import struct
import subprocess
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from toolcage import CallResult, Sandbox
from toolcage.errors import WorkspaceError
from toolcage.files import download as transfer
from toolcage.files import snapshot
from toolcage.files.download import DownloadUsage
from toolcage.files.outbound import door_problem
from toolcage.files.snapshot import SnapshotInvalid

from ..helpers import run_cli

pytestmark = pytest.mark.usefixtures("no_leaks")

UID = 65532
ROOT_RUNNER = os.geteuid() == 0  # only root can give a file to uid/gid 65532 (chown) to show both sides


def shell(sb: Sandbox, command: str) -> str:
    r = sb.call("run_shell", {"command": command})
    assert r.ok and r.result["exit_code"] == 0, r
    return str(r.result["stdout"])


# 1. the copy reads only what the mount would -------------------------------------------------------------

# path -> (mode, owner uid or None: the runner's, group gid or None: the runner's, through the mount, in the copy)
_LAYOUT: dict[str, tuple[int, int | None, int | None, str, str]] = {
    "public.txt": (0o644, None, None, "read", "read"),
    "secret.txt": (0o600, None, None, "denied", "absent"),
    "other-only.txt": (0o604, None, None, "read", "read"),
    "private/inside.txt": (0o644, None, None, "denied", "absent"),  # private/ is 0700
    "nolist/known.txt": (0o644, None, None, "read", "absent"),  # nolist/ is 0711: listed by name only
}
if ROOT_RUNNER:
    _LAYOUT |= {
        "group-65532.txt": (0o640, None, UID, "read", "read"),
        "owner-65532.txt": (0o600, UID, None, "read", "read"),
        "group-root.txt": (0o640, None, None, "denied", "absent"),
    }
GVISOR = os.environ.get("TOOLCAGE_SANDBOX") == "gvisor"
# POSIX access ACLs (set as root): runc's kernel honours them, gVisor reads the mode bits; the copy takes a file
# only when both allow, so it never gives more than either runtime's mount.
_ACLS: dict[str, tuple[int, list[tuple[int, int, int]], str, str]] = {
    # 0644, but a named entry gives uid 65532 nothing
    "acl-denies.txt": (
        0o644,
        [(0x01, 6, 0), (0x02, 0, UID), (0x04, 4, 0), (0x10, 4, 0), (0x20, 4, 0)],
        "denied",
        "absent",
    ),
    # 0640 root:root, a named entry gives uid 65532 read
    "acl-grants.txt": (
        0o640,
        [(0x01, 6, 0), (0x02, 4, UID), (0x04, 4, 0), (0x10, 4, 0), (0x20, 0, 0)],
        "read",
        "absent",
    ),
}
if ROOT_RUNNER:
    for _rel, (_mode, _, _ro, _copy) in _ACLS.items():
        _gv = {"acl-denies.txt": "read", "acl-grants.txt": "denied"}[_rel]  # gVisor: the mode bits alone
        _LAYOUT[_rel] = (_mode, None, None, _gv if GVISOR else _ro, _copy)


def _tree(ws: Path) -> None:
    ws.mkdir(mode=0o755)
    ws.chmod(0o755)  # whatever the umask
    for d, mode in (("private", 0o700), ("nolist", 0o711)):
        (ws / d).mkdir()
        (ws / d).chmod(mode)
    for rel, (mode, uid, gid, _, _) in _LAYOUT.items():
        p = ws / rel
        p.write_text(f"content of {rel}\n")
        p.chmod(mode)
        if uid is not None or gid is not None:
            os.chown(p, -1 if uid is None else uid, -1 if gid is None else gid)
        if rel in _ACLS:
            acl = struct.pack("<I", 2) + b"".join(struct.pack("<HHI", *e) for e in _ACLS[rel][1])
            os.setxattr(p, "system.posix_acl_access", acl)


def _seen(sb: Sandbox) -> dict[str, str]:
    """What the sandbox gets for each path of the layout: read (its content checked), denied or absent."""
    script = "; ".join(
        f'if cat /workspace/{rel} >/dev/null 2>&1; then echo "{rel} read $(cat /workspace/{rel} | md5sum)";'
        f" elif cat /workspace/{rel} 2>&1 | grep -q 'Permission denied'; then echo '{rel} denied';"
        f" else echo '{rel} absent'; fi"
        for rel in _LAYOUT
    )
    got: dict[str, str] = {}
    for line in shell(sb, script).splitlines():
        rel, what, *rest = line.split(" ", 2)
        if what == "read":
            assert rest[0].split()[0] == hashlib.md5(f"content of {rel}\n".encode()).hexdigest(), line
        got[rel] = what
    return got


def test_copy_gives_what_the_mount_gives_no_more(engine: Any, tmp_path: Path) -> None:
    """A 0600 file, one of another group, a 0700 directory's: unreadable through the mount, absent from the copy."""
    ws = tmp_path / "ws"
    _tree(ws)
    with Sandbox(workspace=ws, tool="copy-doors-ro") as sb:
        ro = _seen(sb)
    with Sandbox(workspace=ws, workspace_mode="copy", tool="copy-doors-copy") as sb:
        copy = _seen(sb)
        listed = set(shell(sb, "cd /workspace && find . -mindepth 1 | sort").split())
    assert ro == {rel: v[3] for rel, v in _LAYOUT.items()}, ro
    assert copy == {rel: v[4] for rel, v in _LAYOUT.items()}, copy
    # no more than the mount: whatever the copy reads, the mount reads
    assert {r for r, w in copy.items() if w == "read"} <= {r for r, w in ro.items() if w == "read"}
    # a directory the sandbox could not list is there, empty; a file it could not read is not
    assert {"./private", "./nolist"} <= listed and "./secret.txt" not in listed
    assert not any(p.startswith(("./private/", "./nolist/")) for p in listed), listed


# 2. the workspace refusals: the state directory and any user's credential stores -------------------------


@pytest.fixture
def homes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Path]:
    """A home of the runner's (HOME), another user's home (in the password database), toolcage's state directory
    under XDG_STATE_HOME with its snapshot key, and a directory holding another user's .ssh: all in tmp_path."""
    home = tmp_path / "home" / "me"
    (home / ".local" / "state" / "toolcage").mkdir(parents=True)
    (home / ".local" / "state" / "toolcage" / "audit.jsonl").write_text("{}\n")
    xdg = tmp_path / "xdg"
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("XDG_STATE_HOME", str(xdg))
    snapshot.host_key(create=True)
    users = tmp_path / "users"
    ssh = users / "alice" / ".ssh"
    ssh.mkdir(parents=True)
    (ssh / "config").write_text("Host prod\n  User deploy\n")
    (ssh / "id_ed25519").write_text("-----BEGIN OPENSSH PRIVATE KEY-----\n")
    (ssh / "id_ed25519").chmod(0o600)
    bob = tmp_path / "bob"
    (bob / "notes").mkdir(parents=True)
    (bob / "notes" / "todo.txt").write_text("bob's\n")
    real = pwd.getpwall
    fake = pwd.struct_passwd(("bob", "x", 4242, 4242, "", str(bob), "/bin/sh"))
    monkeypatch.setattr(pwd, "getpwall", lambda: [*real(), fake])
    return {
        "~/.local": home / ".local",
        "~/.local/state": home / ".local" / "state",
        "~/.local/state/toolcage": home / ".local" / "state" / "toolcage",
        "$XDG_STATE_HOME": xdg,
        "$XDG_STATE_HOME/toolcage": xdg / "toolcage",
        "a directory holding alice/.ssh": users,
        "alice's .ssh": ssh,
        "bob's home": bob,
    }


@pytest.mark.parametrize("mode", ["ro", "copy"])
def test_state_and_any_users_credentials_are_refused(engine: Any, homes: dict[str, Path], mode: str) -> None:
    """~/.local(/state), the state directory (default, XDG), another user's home and .ssh: refused, no container."""
    started = []
    for name, path in homes.items():
        try:
            with Sandbox(workspace=path, workspace_mode=mode, tool="copy-doors-refuse") as sb:
                started.append((name, shell(sb, "cd /workspace && find . -type f | head -5 | tr '\\n' ' '")))
        except WorkspaceError as exc:
            assert str(path) in str(exc)
    assert not started, f"mounted ({mode}) and listed: {started}"


def _forge_chain(state: Path, out: Path) -> str:
    """The attack of the issue: the state directory as a copy workspace, its snapshot.key read, a snapshot
    of the attacker's forged with it, resumed by the host. Says how far it got."""
    try:
        sb = Sandbox(workspace=state, workspace_mode="copy", tool="copy-doors-forge")
    except WorkspaceError as exc:
        return f"refused at the start: {exc}"
    with sb:
        r = sb.call("run_shell", {"command": "base64 -w0 /workspace/snapshot.key"})
    if not (r.ok and r.result["exit_code"] == 0 and r.result["stdout"]):
        return "the key was not in the copy"
    stolen = base64.b64decode(r.result["stdout"])
    with Sandbox(snapshot_key=stolen, tool="copy-doors-forge") as sb:
        shell(sb, "echo planted-by-the-sandbox > /scratch/planted")
        sb.snapshot(out)
    try:
        with Sandbox(resume=out, tool="copy-doors-forge") as sb:
            return f"resume accepted the forged snapshot: {shell(sb, 'cat /scratch/planted').strip()}"
    except SnapshotInvalid as exc:
        return f"resume refused it: {exc}"


def test_forged_snapshot_chain_stops_at_the_start(engine: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The state directory as a copy workspace is refused, so its snapshot key never reaches a sandbox to forge with."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    snapshot.host_key(create=True)
    got = _forge_chain(snapshot.key_path().parent, tmp_path / "forged.tar")
    assert got.startswith("refused at the start"), got
    assert "state" in got


def test_the_snapshot_key_is_out_of_the_sandboxs_reach(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The key is 0600 in a 0700 directory: uid 65532 could not read it through a mount or a copy wherever it lies."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    snapshot.host_key(create=True)
    path = snapshot.key_path()
    assert path.stat().st_mode & 0o777 == 0o600
    assert path.parent.stat().st_mode & 0o777 == 0o700


# 3. downloads never write .git, nor a link into it or out of the target -----------------------------------


def _git(repo: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "GIT_CONFIG_GLOBAL": "/dev/null", "GIT_CONFIG_NOSYSTEM": "1"}
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, env=env, timeout=60)


def _digest(top: Path) -> dict[str, str]:
    """Every entry under ``top``: its mode and its content's (or link's) sha256."""
    out: dict[str, str] = {}
    for dirpath, dirnames, filenames in os.walk(top):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            st = p.lstat()
            data = os.readlink(p).encode() if p.is_symlink() else p.read_bytes() if p.is_file() else b""
            out[str(p.relative_to(top))] = f"{st.st_mode:o} {hashlib.sha256(data).hexdigest()}"
    return out


def test_download_into_a_repository_runs_nothing_on_the_host(engine: Any, tmp_path: Path) -> None:
    """run --workspace-mode copy --download /workspace:REPO: the sandbox's .git config (fsmonitor), hooks stay out."""
    repo = tmp_path / "repo"
    repo.mkdir()
    repo.chmod(0o755)
    assert _git(repo, "init", "-q").returncode == 0
    (repo / "README.md").write_text("hello\n")
    assert _git(repo, "add", "README.md").returncode == 0
    assert _git(repo, "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "one").returncode == 0
    for d in (repo, *[Path(p) for p, _, _ in os.walk(repo / ".git")]):
        d.chmod(d.stat().st_mode | 0o005)  # readable by the sandbox, so that the copy holds .git as the did
        for f in d.iterdir():
            if f.is_file():
                f.chmod(f.stat().st_mode | 0o004)
    before = _digest(repo / ".git")
    ran = tmp_path / "ran"
    hook = f"#!/bin/sh\\necho hook >> {ran}\\n"
    command = (
        "cd /workspace && echo changed > README.md"
        f" && printf '[core]\\n\\tfsmonitor = \"echo fsmonitor >> {ran}; false\"\\n' >> .git/config"
        f" && printf '{hook}' > .git/hooks/post-checkout && chmod +x .git/hooks/post-checkout"
        f" && cp .git/hooks/post-checkout .git/hooks/pre-commit"
        f" && mkdir -p sub/.git/hooks && printf '{hook}' > sub/.git/hooks/post-checkout"
        f" && mkdir -p .GIT/hooks && printf '{hook}' > .GIT/hooks/post-checkout"
        " && ln -s .git/hooks hooklink && ln -s ../../../../etc/passwd outlink && ln -s /etc abslink"
    )
    res = run_cli(
        "run", "run_shell", "--workspace", str(repo), "--workspace-mode", "copy",
        "--params", json.dumps({"command": command}), "--download", f"/workspace:{repo}",
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    assert (repo / "README.md").read_text() == "changed\n"  # what is not .git comes through
    assert _digest(repo / ".git") == before, "the download changed the host's .git"
    for name in ("sub/.git", ".GIT", "hooklink", "outlink", "abslink"):
        assert not os.path.lexists(repo / name), name
    assert "is .git or a name git takes for it" in res.stdout, res.stdout[-2000:]
    _git(repo, "status")
    _git(repo, "checkout", "-q", "-b", "toolcage-probe")
    _git(repo / "sub", "status")
    assert not ran.exists(), f"the host ran the sandbox's command: {ran.read_text()}"


# hostile streams, no container: the rule at the door itself


def _stream(entries: list[tuple[str, bytes | str | None]]) -> Callable[[dict[str, Any]], CallResult]:
    """A worker that answers a download with a tar of ``entries`` (bytes: a file; str: a symlink's target;
    None: a directory)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        for name, what in entries:
            info = tarfile.TarInfo(name)
            if what is None:
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                tf.addfile(info)
            elif isinstance(what, str):
                info.type, info.linkname = tarfile.SYMTYPE, what
                tf.addfile(info)
            else:
                info.size, info.mode = len(what), 0o755
                tf.addfile(info, io.BytesIO(what))
    data = buf.getvalue()

    def call(params: dict[str, Any]) -> CallResult:
        return CallResult("ok", "download", "r", {"stream": "s", "frame": data, "done": True})

    return call


GIT_NAMES = [".git/config", "a/.git/hooks/pre-commit", ".GIT/config", ".git./config", ".Git /x", "git~1/config", ".git"]


@pytest.mark.parametrize("name", GIT_NAMES)
def test_a_git_name_is_never_written(tmp_path: Path, name: str) -> None:
    """Every name git (or a case-insensitive host) takes for .git is skipped by a download, with its reason."""
    planted = [(name, b"[core]\n\tfsmonitor = touch /tmp/x\n"), ("ok.txt", b"ok\n")]
    res = transfer.download(_stream(planted), "/w", tmp_path)
    assert (tmp_path / "ok.txt").read_text() == "ok\n"
    assert {p.name for p in tmp_path.iterdir()} == {"ok.txt"}
    assert any(s["reason"].startswith("is .git or a name git takes") for s in res.skipped), res.skipped


@pytest.mark.parametrize("target", [".git/hooks", "a/../.git/config", ".GIT", "../x", "/etc", "sub/../../x"])
def test_a_link_into_git_or_out_is_never_made(tmp_path: Path, target: str) -> None:
    """A symlink into .git or out of the target is skipped by a download."""
    (tmp_path / ".git").mkdir()
    res = transfer.download(_stream([("sub/f", b"x"), ("link", target)]), "/w", tmp_path)
    assert not os.path.lexists(tmp_path / "link"), target
    assert res.skipped and res.symlinks == 0


def test_a_link_through_a_host_link_out_is_never_made(tmp_path: Path) -> None:
    """A symlink whose target passes through a host symlink that leads out of the target is skipped."""
    target = tmp_path / "t"
    target.mkdir()
    (target / "hostlink").symlink_to("/etc")
    res = transfer.download(_stream([("link", "hostlink/passwd")]), "/w", target)
    assert not os.path.lexists(target / "link") and res.skipped


def test_merge_never_writes_through_a_host_link(tmp_path: Path) -> None:
    """Merging into an existing directory never follows a host symlink: a directory over a link is refused."""
    target, out = tmp_path / "t", tmp_path / "out"
    target.mkdir()
    out.mkdir()
    (target / "d").symlink_to(out)
    with pytest.raises(DownloadUsage):
        transfer.download(_stream([("d/f", b"x")]), "/w", target)
    assert list(out.iterdir()) == []


@pytest.mark.parametrize("head", [b"ref: refs/heads/main\n", "refs/heads/main"])
def test_a_bare_repository_is_never_made(tmp_path: Path, head: bytes | str) -> None:
    """A HEAD beside objects/ and refs/ (a bare repository: git reads its config, runs its hooks) is skipped."""
    ran = tmp_path / "ran"
    config = f'[core]\n\trepositoryformatversion = 0\n\tbare = true\n\tfsmonitor = "echo x >> {ran}; false"\n'
    out = tmp_path / "out"
    stream = [("proj/", None), ("proj/objects/", None), ("proj/refs/", None), ("proj/refs/heads/", None)]
    stream += [("proj/config", config.encode()), ("proj/HEAD", head), ("proj/file.txt", b"x\n")]
    stream += [("proj/hooks/reference-transaction", f"#!/bin/sh\necho hook >> {ran}\n".encode())]
    res = transfer.download(_stream(stream), "/w", out)
    assert not os.path.lexists(out / "proj" / "HEAD")
    assert any("bare git repository" in s["reason"] for s in res.skipped), res.skipped
    for args in (["status"], ["log"], ["symbolic-ref", "HEAD", "refs/heads/other"]):
        _git(out / "proj", *args)
    assert not ran.exists()


@pytest.mark.parametrize(
    ("rel", "link", "made", "why"),
    [
        ("a/.git/config", None, {}, "is .git"),
        ("a/GIT~1", None, {}, "is .git"),
        ("repo/HEAD", None, {"repo/objects": "dir", "repo/refs": "dir"}, "bare git repository"),
        ("repo/HEAD", None, {"repo/commondir": "file"}, "bare git repository"),
        ("l", ".git/hooks", {}, "into .git"),
        ("l", "/etc", {}, "absolute"),
        ("a/l", "../../x", {}, "out of the target"),
        ("l", "d/../x", {"d": "link"}, "through a symlink"),
        ("repo/HEAD", None, {"repo/objects": "dir"}, None),
        ("a/l", "../b/c", {}, None),
    ],
)
def test_door_problem_is_the_one_rule(
    tmp_path: Path, rel: str, link: str | None, made: dict[str, str], why: str | None
) -> None:
    """outbound.door_problem, which every door out asks, gives each refusal its reason (None: it may be written)."""
    got = door_problem(rel, link, tmp_path, made)
    assert (got is None) if why is None else (got is not None and why in got), got
