"""A workspace an agent can live in (issue 24): the writable copy, changes() as git's diff, snapshots and
resume, remove, on the real engine (CI runs this file again under gVisor), and with --sandbox none."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from toolcage import AsyncSandbox, Sandbox
from toolcage.errors import UsageError
from toolcage.files.changes import ChangesUsage

pytestmark = pytest.mark.usefixtures("no_leaks")


def _tree_hash(top: Path) -> dict[str, str]:
    out = {}
    for p in sorted(top.rglob("*")):
        rel = str(p.relative_to(top))
        if p.is_symlink():
            out[rel] = "link:" + os.readlink(p)
        elif p.is_file():
            out[rel] = f"{oct(p.stat().st_mode & 0o777)}:" + hashlib.sha256(p.read_bytes()).hexdigest()
        else:
            out[rel] = "dir"
    return out


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    r = tmp_path / "repo"
    (r / "src").mkdir(parents=True)
    (r / ".venv" / "lib").mkdir(parents=True)
    (r / "a.txt").write_text("one\ntwo\nthree\n")
    (r / "src" / "m.py").write_text("print(1)\n")
    (r / "blob.bin").write_bytes(bytes(range(256)) * 8)
    (r / "gone.txt").write_text("bye\n")
    (r / ".gitignore").write_text(".venv/\n*.log\n")
    (r / "debug.log").write_text("ignored\n")
    (r / ".venv" / "lib" / "x.py").write_text("ignored\n")
    (r / "link").symlink_to("a.txt")
    subprocess.run(["git", "init", "-q", str(r)], check=True)
    return r


EDIT = (
    "cd \"${TOOLCAGE_WORKSPACE:-/workspace}\" && printf 'one\\n2\\nthree\\nfour' > a.txt && rm gone.txt"
    " && chmod +x src/m.py"
    " && head -c 3000 /dev/urandom > blob.bin && mkdir -p new/deep && printf 'n\\n' > new/deep/n.txt"
    " && ln -sfn src/m.py link && printf 'caf\\303\\251\\n' > 'sp ace.txt'"
)


def _apply(repo: Path, tmp_path: Path, diff: str) -> Path:
    """A copy of the host repo with ``diff`` applied by git."""
    dst = tmp_path / "applied"
    shutil.copytree(repo, dst, symlinks=True)
    patch = tmp_path / "p.diff"
    patch.write_text(diff)
    subprocess.run(["git", "apply", "--check", str(patch)], cwd=dst, check=True)
    subprocess.run(["git", "apply", str(patch)], cwd=dst, check=True)
    return dst


@pytest.mark.parametrize("sandbox", [None, "none"])
def test_copy_edit_and_diff_applies(engine: Any, repo: Path, tmp_path: Path, sandbox: str | None) -> None:
    before = _tree_hash(repo)
    with Sandbox(workspace=repo, workspace_mode="copy", workspace_gitignore=True, sandbox=sandbox) as sb:
        listed = sb.call("list_files", {"recursive": True}).result["entries"]
        names = {e["path"] for e in listed}
        assert "/workspace/a.txt" in names and "/workspace/.gitignore" in names
        assert not any(".venv" in n or n.endswith((".log", "/.git")) or "/.git/" in n for n in names)  # not copied
        r = sb.call("run_shell", {"command": EDIT})
        assert r.ok and r.result["exit_code"] == 0, r.result
        assert sb.call("write_file", {"path": "/workspace/w.txt", "content": "written\n"}).ok
        out = tmp_path / "files"
        ch = sb.changes(download_to=out)
    assert set(ch.added) == {"new/deep/n.txt", "sp ace.txt", "w.txt"}
    assert set(ch.changed) == {"a.txt", "blob.bin", "src/m.py", "link"}
    assert ch.removed == ("gone.txt",)
    assert "GIT binary patch" in ch.diff and "new mode 100755" in ch.diff
    assert _tree_hash(repo) == before  # the host's directory was never touched
    applied = _apply(repo, tmp_path, ch.diff)
    assert (applied / "a.txt").read_bytes() == b"one\n2\nthree\nfour"
    assert not (applied / "gone.txt").exists() and os.readlink(applied / "link") == "src/m.py"
    assert os.access(applied / "src" / "m.py", os.X_OK)
    assert (applied / "blob.bin").read_bytes() == (out / "blob.bin").read_bytes()
    assert len((out / "blob.bin").read_bytes()) == 3000 and (out / "new" / "deep" / "n.txt").read_text() == "n\n"
    assert not (out / "gone.txt").exists()


def test_read_only_stays_the_default(engine: Any, repo: Path) -> None:
    with Sandbox(workspace=repo) as sb:
        res = sb.call("write_file", {"path": "/workspace/x.txt", "content": "x"})
        assert not res.ok and "read-only" in res.error["message"]
        assert sb.call("run_shell", {"command": "touch /workspace/x"}).result["exit_code"] != 0
        with pytest.raises(ChangesUsage, match="read-only"):
            sb.changes()


def test_remove_tool(engine: Any, repo: Path) -> None:
    with Sandbox(workspace=repo, workspace_mode="copy") as sb:
        sb.call("run_shell", {"command": "mkdir -p d/e && touch d/e/f s.txt"})
        r = sb.call("remove", {"paths": ["s.txt", "/workspace/a.txt", "nope"], "missing_ok": True})
        assert r.ok and r.result["removed"] == ["/scratch/s.txt", "/workspace/a.txt"], r.result
        assert r.result["missing"] == ["/scratch/nope"]
        r = sb.call("remove", {"paths": ["d"]})
        assert not r.ok and "recursive" in r.error["message"]
        assert sb.call("remove", {"paths": ["d"], "recursive": True}).ok
        assert not sb.call("remove", {"paths": ["/etc/passwd"]}).ok
        assert sb.changes().removed == ("a.txt",)
    with Sandbox(workspace=repo) as sb:  # read-only: nothing there may be removed
        r = sb.call("remove", {"paths": ["/workspace/a.txt"]})
        assert not r.ok and r.error["code"] == -32002


def test_snapshot_and_resume_in_a_fresh_container(engine: Any, repo: Path, tmp_path: Path) -> None:
    snap = tmp_path / "s.tar"
    with Sandbox(workspace=repo, workspace_mode="copy", workspace_gitignore=True) as sb:
        sb.call("run_shell", {"command": EDIT})
        sb.call(
            "run_shell",
            {"command": "mkdir -p keep && head -c 5000 /dev/urandom > keep/r.bin && chmod 751 keep/r.bin"
             " && ln -s keep/r.bin rl && printf x > keep/t.txt"},
        )  # fmt: skip
        first = sb.changes()
        want = sb.call("run_shell", {"command": "cd /scratch && sha256sum keep/r.bin && stat -c %a keep/r.bin"})
        info = sb.snapshot(snap)
        first_container = sb.container_id
    assert info.workspace and info.files >= 5 and info.symlinks >= 2
    assert hashlib.sha256(snap.read_bytes()).hexdigest() == info.sha256
    with Sandbox(workspace=repo, resume=snap) as again:
        assert again.container_id != first_container
        got = again.call("run_shell", {"command": "cd /scratch && sha256sum keep/r.bin && stat -c %a keep/r.bin"})
        assert got.result["stdout"] == want.result["stdout"]
        assert again.call("run_shell", {"command": "readlink /scratch/rl"}).result["stdout"] == "keep/r.bin\n"
        assert again.call("read_file", {"path": "/workspace/new/deep/n.txt"}).result["content"] == "n\n"
        again.call("run_shell", {"command": "echo more >> /workspace/w2.txt"})
        second = again.changes()
    assert set(second.added) == set(first.added) | {"w2.txt"}
    assert second.changed == first.changed and second.removed == first.removed
    _apply(repo, tmp_path, second.diff)


def test_async_changes_and_snapshot(engine: Any, repo: Path, tmp_path: Path) -> None:
    async def main() -> tuple[Any, Any]:
        async with AsyncSandbox(workspace=repo, workspace_mode="copy") as sb:
            await sb.call("run_shell", {"command": "echo x >> /workspace/a.txt"})
            return await sb.changes(), await sb.snapshot(tmp_path / "a.tar")

    ch, info = asyncio.run(main())
    assert ch.changed == ("a.txt",) and info.workspace


def test_cli_diff_snapshot_resume(engine: Any, repo: Path, tmp_path: Path) -> None:
    toolcage = [sys.executable, "-m", "toolcage.cli"]
    diff, snap = tmp_path / "c.diff", tmp_path / "c.tar"
    params = json.dumps({"command": "echo edit >> /workspace/a.txt && echo s > /scratch/state"})
    p = subprocess.run(
        [*toolcage, "run", "run_shell", "--workspace", str(repo), "--workspace-mode", "copy", "--params", params,
         "--diff", str(diff), "--snapshot", str(snap)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert out["changes"]["changed"] == ["a.txt"] and out["snapshot"]["workspace"] is True
    assert "+edit" in diff.read_text()
    p = subprocess.run(
        [*toolcage, "run", "run_shell", "--resume", str(snap), "--params", '{"command": "cat /scratch/state"}'],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert p.returncode == 0 and json.loads(p.stdout)["result"]["stdout"] == "s\n", p.stderr
    bad = tmp_path / "bad.tar"
    data = bytearray(snap.read_bytes())
    at = bytes(data).index(b"three\nedit")
    data[at] ^= 1  # one bit of a file's content
    bad.write_bytes(bytes(data))
    p = subprocess.run(
        [*toolcage, "run", "ping", "--resume", str(bad)], capture_output=True, text=True, timeout=60
    )  # fmt: skip
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr
    p = subprocess.run(
        [*toolcage, "run", "ping", "--diff", str(diff)], capture_output=True, text=True, timeout=60
    )  # fmt: skip
    assert p.returncode == 2 and "--workspace-mode copy" in p.stderr and "Traceback" not in p.stderr
    p = subprocess.run(
        [*toolcage, "run", "ping", "--snapshot", str(tmp_path / "no" / "s.tar")],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert p.returncode == 2 and "does not exist" in p.stderr and "Traceback" not in p.stderr


def test_tools_list_has_the_new_tools(engine: Any) -> None:
    with Sandbox() as sb:
        listed = {t["name"]: t for t in sb.call("tools.list").result}
    for name in ("remove", "workspace_changes", "upload", "download", "exec", "run_node"):
        assert name in listed and listed[name]["params_schema"]["type"] == "object"
    assert "paths" in listed["download"]["params_schema"]["properties"]


def test_batch_write_and_read_in_a_few_calls(engine: Any, repo: Path) -> None:
    files = {f"many/d{i % 10}/f{i}.txt": f"file {i}\n" for i in range(1000)}
    files["bin/x.bin"] = bytes(range(256))  # type: ignore[assignment]
    with Sandbox(workspace=repo, workspace_mode="copy") as sb:
        before = sb.run.calls
        wrote = sb.write_files({**files, "/workspace/w.txt": "in the copy\n"})
        got = sb.read_files([*files, "/workspace/w.txt"])
        assert sb.run.calls - before <= 6  # one upload per root (open + chunk) and one download
        assert wrote.files == 1002 and got["many/d3/f3.txt"] == b"file 3\n" and got["bin/x.bin"] == bytes(range(256))
        assert got["/workspace/w.txt"] == b"in the copy\n"
        with pytest.raises(UsageError, match=r"nope\.txt"):
            sb.read_files(["nope.txt", "many/d1/f1.txt"])
        assert sb.read_files(["nope.txt", "many/d1/f1.txt"], missing_ok=True) == {"many/d1/f1.txt": b"file 1\n"}
        with pytest.raises(UsageError, match="not a file path"):
            sb.write_files({"/etc/x": b"1"})
        assert sb.changes().added == ("w.txt",)
