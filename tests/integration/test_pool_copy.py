"""The pool for coding tasks (issue 40): a pool's slot takes a writable workspace copy, or a snapshot's files,
after adoption, at the cost of the fill alone; never another run's files. On the real engine (CI runs this file
again under gVisor)."""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path
from typing import Any

import pytest

from toolcage import AsyncPool, Pool, Sandbox
from toolcage.errors import SnapshotInvalid, UsageError

pytestmark = pytest.mark.usefixtures("no_leaks")


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    r = tmp_path / "repo"
    (r / "src").mkdir(parents=True)
    (r / "a.txt").write_text("one\ntwo\n")
    (r / "src" / "m.py").write_text("print(1)\n")
    (r / ".gitignore").write_text("*.log\n")
    (r / "debug.log").write_text("ignored\n")
    subprocess.run(["git", "init", "-q", str(r)], check=True)
    return r


def _tree(host: Path) -> dict[str, bytes]:
    return {str(p.relative_to(host)): p.read_bytes() for p in sorted(host.rglob("*")) if p.is_file()}


def test_each_pooled_run_gets_a_fresh_copy_of_the_workspace(engine: Any, repo: Path) -> None:
    before = _tree(repo)
    with Pool(workspace=repo, workspace_mode="copy", workspace_gitignore=True, size=1, audit=False) as pool:
        assert pool.wait_ready(timeout=60)
        with pool.sandbox() as sb:
            assert sb.summary is None and sb.options.workspace_copy
            names = {e["path"] for e in sb.call("list_files", {"recursive": True}).result["entries"]}
            assert "/workspace/a.txt" in names and "/workspace/debug.log" not in names  # gitignore, as a cold run
            edit = "cd /workspace && printf 'one\\n2\\n' > a.txt && rm src/m.py && echo n > new.txt"
            assert sb.call("run_shell", {"command": edit}).result["exit_code"] == 0
            ch = sb.changes()
            first = sb.container_id
        assert ch.added == ("new.txt",) and ch.changed == ("a.txt",) and ch.removed == ("src/m.py",)
        assert "+2" in ch.diff
        with pool.sandbox() as again:  # another slot, another container, the workspace as the host has it
            assert again.container_id != first
            got = again.call("run_shell", {"command": "cd /workspace && cat a.txt src/m.py && ls new.txt"})
            assert got.result["stdout"].startswith("one\ntwo\nprint(1)\n") and got.result["exit_code"] != 0, got.result
            left = again.changes()
            assert (left.added, left.changed, left.removed) == ((), (), ())
    assert _tree(repo) == before  # the host's directory was never touched


def test_a_snapshot_resumes_into_a_pooled_slot(engine: Any, repo: Path, tmp_path: Path) -> None:
    snap = tmp_path / "s.tar"
    with Sandbox(workspace=repo, workspace_mode="copy") as sb:
        sb.call("run_shell", {"command": "echo three >> /workspace/a.txt && echo kept > /scratch/k.txt"})
        first = sb.changes()
        sb.snapshot(snap)
    with Pool(workspace=repo, workspace_mode="copy", size=1, audit=False) as pool:
        with pool.sandbox(resume=snap) as again:
            assert again.call("read_file", {"path": "/scratch/k.txt"}).result["content"] == "kept\n"
            assert again.call("read_file", {"path": "/workspace/a.txt"}).result["content"] == "one\ntwo\nthree\n"
            assert again.changes().changed == first.changed == ("a.txt",)
        # a snapshot whose workspace copy has nowhere to go, or a tampered one: refused before a slot is taken
        with Pool(size=1, audit=False) as plain, pytest.raises(UsageError, match="workspace_mode='copy'"):
            plain.sandbox(resume=snap)
        bad = tmp_path / "bad.tar"
        data = bytearray(snap.read_bytes())
        data[len(data) // 2] ^= 1
        bad.write_bytes(bytes(data))
        adopted = pool.adopted
        with pytest.raises(SnapshotInvalid):
            pool.sandbox(resume=bad)
        assert pool.adopted == adopted


def test_an_async_pool_fills_its_slots_copy(engine: Any, repo: Path) -> None:
    async def main() -> tuple[str, tuple[str, ...]]:
        async with (
            AsyncPool(workspace=repo, workspace_mode="copy", size=1, audit=False) as pool,
            pool.sandbox() as sb,
        ):
            await sb.call("run_shell", {"command": "echo x >> /workspace/a.txt"})
            read = await sb.call("read_file", {"path": "/workspace/src/m.py"})
            return read.result["content"], (await sb.changes()).changed

    content, changed = asyncio.run(main())
    assert content == "print(1)\n" and changed == ("a.txt",)


def test_a_pooled_sandbox_takes_its_workspace_mode_from_its_pool(engine: Any, repo: Path) -> None:
    with Pool(workspace=repo, size=1, audit=False) as pool:
        with pytest.raises(UsageError, match="workspace mode from its pool"):
            Sandbox(pool=pool, workspace_mode="copy")
        with pool.sandbox() as sb:  # the read-only pool is as before
            assert not sb.call("write_file", {"path": "/workspace/x", "content": "x"}).ok
