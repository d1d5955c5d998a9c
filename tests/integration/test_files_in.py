"""Files into a real sandbox (issue 24 item 1): Sandbox.upload, AsyncSandbox.upload and ``toolcage run
--upload`` send a tree (text, binary, modes, symlinks) that comes back byte-exact through download, and
a 20 MiB file in bounded runner memory; /workspace and a missing local path are clear errors; under
--sandbox none as well."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import stat
import subprocess
import sys
import tracemalloc
from pathlib import Path
from typing import Any

import pytest

from toolcage import Sandbox
from toolcage.aio import AsyncSandbox
from toolcage.files.upload import UploadUsage

pytestmark = pytest.mark.usefixtures("no_leaks")


def make_tree(root: Path) -> str:
    (root / "sub" / "deeper").mkdir(parents=True)
    (root / "a.txt").write_text("hello\n")
    blob = os.urandom(70000)
    (root / "sub" / "b.bin").write_bytes(blob)
    (root / "sub" / "deeper" / "c").write_text("x")
    (root / "a.txt").chmod(0o755)
    (root / "sub" / "b.bin").chmod(0o600)
    (root / "sub").chmod(0o750)
    (root / "link").symlink_to("a.txt")
    (root / "sub" / "up").symlink_to("../a.txt")
    return hashlib.sha256(blob).hexdigest()


def check_tree(dl: Path, digest: str) -> None:
    assert (dl / "a.txt").read_text() == "hello\n"
    assert hashlib.sha256((dl / "sub/b.bin").read_bytes()).hexdigest() == digest
    assert (dl / "sub/deeper/c").read_text() == "x"
    assert stat.S_IMODE((dl / "a.txt").stat().st_mode) == 0o755
    assert stat.S_IMODE((dl / "sub/b.bin").stat().st_mode) == 0o600
    assert stat.S_IMODE((dl / "sub").stat().st_mode) == 0o750
    assert os.readlink(dl / "link") == "a.txt" and os.readlink(dl / "sub/up") == "../a.txt"


@pytest.mark.parametrize("sandbox", [None, "none"])
def test_tree_round_trip(engine: Any, tmp_path: Path, sandbox: str | None) -> None:
    """A tree uploaded, checked inside, then downloaded: byte-exact, modes and symlinks kept."""
    digest = make_tree(tmp_path / "src")
    with Sandbox(tool="files-in", sandbox=sandbox) as sb:
        got = sb.upload(tmp_path / "src", "/scratch/in")
        r = sb.call("run_shell", {"command": "sha256sum in/sub/b.bin && cat in/link"})
        assert r.ok and r.result["stdout"].split() == [digest, "in/sub/b.bin", "hello"], r
        sb.download("/scratch/in", tmp_path / "back")
    assert (got.files, got.dirs, got.symlinks, got.remote_dir) == (3, 2, 2, "/scratch/in")
    check_tree(tmp_path / "back", digest)


def test_errors(engine: Any, tmp_path: Path) -> None:
    """/workspace is read-only, a missing local path is bad input (exit 2); the sandbox goes on."""
    (tmp_path / "f").write_text("x")
    with Sandbox(tool="files-in") as sb:
        with pytest.raises(UploadUsage, match="in the workspace, which is read-only") as err:
            sb.upload(tmp_path / "f", "/workspace/in")
        assert err.value.exit_code == 2
        with pytest.raises(UploadUsage, match="No such file"):
            sb.upload(tmp_path / "nope", "/scratch/in")
        r = sb.call("run_shell", {"command": "ls -A /scratch"})
        assert r.ok and r.result["stdout"] == "", r  # no spool or staging left behind


def test_64_mib_in_bounded_memory(engine: Any, tmp_path: Path) -> None:
    """A 64 MiB file goes in whole while the runner holds far less than it: 2 MiB chunks (data frames), the
    call in flight with its request line (a copy of its chunk), and up to three more made ahead on their own
    thread (15 MiB here). The audit writer holds a chunk's size, not the chunk: when it lagged on a loaded host
    it held every chunk it had not written yet (49 MiB once). A runner that held the file would pass 64."""
    big = tmp_path / "big"
    with open(big, "wb") as f:
        for _ in range(64):
            f.write(os.urandom(1 << 20))
    digest = hashlib.sha256(big.read_bytes()).hexdigest()
    with Sandbox(tool="files-in") as sb:
        tracemalloc.start()
        try:
            sb.upload(big, "/scratch")
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        r = sb.call("run_shell", {"command": "sha256sum big"})
    assert r.result["stdout"].split()[0] == digest
    assert peak < 32 << 20, f"peak {peak / (1 << 20):.1f} MiB for a 64 MiB file"


def test_async_upload(engine: Any, tmp_path: Path) -> None:
    """AsyncSandbox.upload does what Sandbox.upload does."""
    digest = make_tree(tmp_path / "src")

    async def main() -> str:
        async with AsyncSandbox(tool="files-in") as sb:
            await sb.upload(tmp_path / "src", "/scratch/in")
            r = await sb.call("run_shell", {"command": "sha256sum in/sub/b.bin"})
            return str(r.result["stdout"].split()[0])

    assert asyncio.run(main()) == digest


@pytest.mark.parametrize("sandbox", [[], ["--sandbox", "none"]])
def test_cli_upload(engine: Any, tmp_path: Path, sandbox: list[str]) -> None:
    """`toolcage run ... --upload LOCAL:REMOTE` (twice) sends before the call and reports it."""
    digest = make_tree(tmp_path / "src")
    (tmp_path / "one.csv").write_text("1,2\n")
    params = json.dumps({"command": "sha256sum in/sub/b.bin && cat data/one.csv"})
    argv = [sys.executable, "-m", "toolcage.cli", "run", "run_shell", "--params", params, *sandbox]
    argv += ["--upload", "./src:/scratch/in", "--upload", "./one.csv:/scratch/data"]
    p = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert out["result"]["stdout"].split() == [digest, "in/sub/b.bin", "1,2"]
    assert [u["files"] for u in out["uploads"]] == [3, 1]
    argv[-3:] = ["./missing:/scratch/x"]
    p = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "no such local file" in p.stderr, p.stderr
