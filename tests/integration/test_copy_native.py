"""The workspace copy extracted by the runtime's GNU tar (worker.tools.untar, issue 40): the same copy as the
worker's own extraction made, byte for byte, name for name and mode for mode, and its diff as before. CI runs
this file again under gVisor."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from toolcage import Sandbox

pytestmark = pytest.mark.usefixtures("no_leaks")

NAMES = [
    "plain.txt",
    "sp ace.txt",
    "new\nline.txt",
    "back\\slash",
    "tab\there",
    "caf\u00e9.txt",
    os.fsdecode(b"bytes-\xff-not-utf8"),
    "long-" + "x" * 150,
    "quote\"'s",
    "-dash",
]

# every entry under /workspace: name (bytes as hex, so none is lost in JSON) -> kind, mode and content's hash
LIST = r"""
import hashlib, json, os, stat
out = {}
for d, dirs, files, dfd in os.fwalk(b"/workspace"):
    for n in dirs + files:
        p = os.path.join(d, n)
        st = os.lstat(p)
        rel = os.path.relpath(p, b"/workspace").hex()
        if stat.S_ISLNK(st.st_mode):
            out[rel] = ["link", os.readlink(p).hex()]
        elif stat.S_ISDIR(st.st_mode):
            out[rel] = ["dir", oct(st.st_mode & 0o7777)]
        else:
            digest = hashlib.sha256(open(p, "rb").read()).hexdigest()
            out[rel] = ["file", oct(st.st_mode & 0o7777), int(st.st_mtime), digest]
print(json.dumps(out))
"""


def _tree(root: Path) -> Path:
    """A tree with every kind of name, mode and link a repository may hold."""
    (root / "sub" / "deep").mkdir(parents=True)
    for i, name in enumerate(NAMES):
        (root / name).write_bytes(f"content {i}\n".encode())
    (root / "sub" / "deep" / "f.py").write_text("print(1)\n")
    (root / "exec.sh").write_text("#!/bin/sh\n")
    (root / "exec.sh").chmod(0o755)
    (root / "private").write_text("mine\n")
    (root / "private").chmod(0o604)  # (one the sandbox user could not read would be withheld)
    (root / "setuid").write_text("s\n")
    (root / "setuid").chmod(0o4755)  # the copy takes no setuid, setgid or sticky bit
    (root / "empty").mkdir()
    (root / "locked").mkdir()
    (root / "locked" / "in.txt").write_text("in\n")
    (root / "locked").chmod(0o555)  # the copy's directories are the sandbox user's to write in
    (root / "rel-link").symlink_to("sub/deep/f.py")
    (root / "abs-link").symlink_to("/etc/passwd")  # made as it is: nothing is written through it
    (root / "dangling").symlink_to("nowhere")
    os.utime(root / "plain.txt", (1_600_000_000, 1_600_000_000))
    return root


def _expected(root: Path) -> dict[str, list[Any]]:
    """The copy the worker's own extraction makes of ``root``: modes & 0o777, directories owner-writable."""
    import hashlib

    out: dict[str, list[Any]] = {}
    for d, dirs, files in os.walk(os.fsencode(root)):
        for n in dirs + files:
            p = os.path.join(d, n)
            st = os.lstat(p)
            rel = os.path.relpath(p, os.fsencode(root)).hex()
            if os.path.islink(p):
                out[rel] = ["link", os.readlink(p).hex()]
            elif os.path.isdir(p):
                out[rel] = ["dir", oct((st.st_mode & 0o777) | 0o700)]
            else:
                digest = hashlib.sha256(Path(os.fsdecode(p)).read_bytes()).hexdigest()
                out[rel] = ["file", oct(st.st_mode & 0o777), int(st.st_mtime), digest]
    return out


class Spy(Sandbox):
    """A Sandbox that keeps what its upload calls answered (the copy's fill is made of them)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.uploads: list[dict[str, Any]] = []
        self.deflated = 0  # chunks of the tar the runner sent deflated
        self.named = 0  # calls that named the tar's files and symlinks (a listed stream's, after the tar)

    def call(self, tool: str, params: dict[str, Any] | None = None, **kwargs: Any) -> Any:
        r = super().call(tool, params, **kwargs)
        if tool == "upload" and isinstance(r.result, dict):
            self.uploads.append(r.result)
            named = bool((params or {}).get("names"))
            self.named += named
            self.deflated += bool((params or {}).get("deflated")) and not named
        return r


def test_the_copy_is_gnu_tars_and_the_same_as_before(engine: Any, tmp_path: Path) -> None:
    """The runtime's tar made the copy (the worker said so; its chunk came deflated), and it holds every name
    (a newline, a backslash, bytes that are no UTF-8, a 150-byte name), mode (setuid cleared, a 0555
    directory writable), mtime, content and link as the worker's own extraction would; the diff sees no
    change until one is made; the host's tree is untouched."""
    root = _tree(tmp_path / "repo")
    want = _expected(root)
    with Spy(workspace=root, workspace_mode="copy") as sb:
        got = json.loads(sb.call("run_python", {"code": LIST}).result["stdout"])
        assert got == want
        assert sb.uploads and sb.uploads[-1].get("native") is True, sb.uploads  # GNU tar extracted it
        assert sb.deflated == 1  # its one chunk, mostly headers and padding, went deflated
        # the runner named the entries itself (GNU tar named none: no -v), and the worker kept those names
        assert sb.uploads[0].get("listed") is True and sb.named == 1, (sb.uploads, sb.named)
        none = sb.changes()  # the base the worker recorded is every name the runner sent
        assert (none.added, none.changed, none.removed) == ((), (), ()), none
        r = sb.call("run_shell", {"command": "echo more >> /workspace/locked/in.txt && rm '/workspace/-dash'"})
        assert r.result["exit_code"] == 0, r.result
        some = sb.changes()
        assert (some.added, some.changed, some.removed) == ((), ("locked/in.txt",), ("-dash",)), some
    assert (root / "locked" / "in.txt").read_text() == "in\n" and (root / "-dash").exists()
    assert _expected(root) == want


def test_a_copy_of_incompressible_files_goes_as_it_is(engine: Any, tmp_path: Path) -> None:
    """Files that do not compress (random bytes, as a repository's images and archives are) go as they are (a
    chunk with few zeros is not even tried), and arrive whole."""
    import hashlib

    root = tmp_path / "repo"
    root.mkdir()
    digests = {}
    for i in range(6):
        data = os.urandom(3 << 20)
        (root / f"blob{i}.bin").write_bytes(data)
        digests[f"/workspace/blob{i}.bin"] = hashlib.sha256(data).hexdigest()
    with Spy(workspace=root, workspace_mode="copy") as sb:
        code = (
            "import hashlib, glob\n"
            "for p in sorted(glob.glob('/workspace/*')): print(p, hashlib.sha256(open(p, 'rb').read()).hexdigest())"
        )
        out = sb.call("run_python", {"code": code}).result["stdout"]
        assert dict(line.split() for line in out.splitlines()) == digests
        assert sb.uploads[-1].get("native") is True and sb.deflated == 0, (sb.deflated, sb.uploads)
