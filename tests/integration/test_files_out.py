"""Files out of a real sandbox (issue 24 item 1): Sandbox.download, AsyncSandbox.download and
``toolcage run --download`` bring text, binary, a tree with its modes and symlinks and a 20 MiB file
back into a local directory, in bounded runner memory; under --sandbox none as well."""

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

pytestmark = pytest.mark.usefixtures("no_leaks")

TREE = (
    "mkdir -p out/sub/deeper && printf 'hello\\n' > out/a.txt && head -c 70000 /dev/urandom > out/sub/b.bin"
    " && printf x > out/sub/deeper/c && chmod 755 out/a.txt && chmod 600 out/sub/b.bin && chmod 750 out/sub"
    " && ln -s a.txt out/link && ln -s ../a.txt out/sub/up && sha256sum out/sub/b.bin"
)


def check_tree(dl: Path, digest: str) -> None:
    assert (dl / "a.txt").read_text() == "hello\n"
    assert hashlib.sha256((dl / "sub/b.bin").read_bytes()).hexdigest() == digest
    assert (dl / "sub/deeper/c").read_text() == "x"
    assert stat.S_IMODE((dl / "a.txt").stat().st_mode) == 0o755
    assert stat.S_IMODE((dl / "sub/b.bin").stat().st_mode) == 0o600
    assert stat.S_IMODE((dl / "sub").stat().st_mode) == 0o750
    assert os.readlink(dl / "link") == "a.txt" and os.readlink(dl / "sub/up") == "../a.txt"
    assert (dl / "sub/up").read_text() == "hello\n"


@pytest.mark.parametrize("sandbox", [None, "none"])
def test_tree_text_and_binary(engine: Any, tmp_path: Path, sandbox: str | None) -> None:
    """A directory tree (text, binary, modes, symlinks) and a single file come back exactly."""
    with Sandbox(tool="files-out", sandbox=sandbox) as sb:
        r = sb.call("run_shell", {"command": TREE})
        assert r.ok and r.result["exit_code"] == 0, r
        digest = r.result["stdout"].split()[0]
        got = sb.download("/scratch/out", tmp_path / "dl")
        one = sb.download("out/sub/b.bin", tmp_path / "one")
    check_tree(tmp_path / "dl", digest)
    assert (got.files, got.dirs, got.symlinks, got.skipped) == (3, 2, 2, [])
    assert hashlib.sha256((tmp_path / "one/b.bin").read_bytes()).hexdigest() == digest and one.files == 1


def test_workspace_and_errors(engine: Any, tmp_path: Path) -> None:
    """/workspace can be downloaded; a missing path and a path outside the roots are exit-2 errors."""
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "r.md").write_text("readme")
    ws.chmod(0o755)
    (ws / "r.md").chmod(0o644)
    with Sandbox(tool="files-out", workspace=ws) as sb:
        sb.download("/workspace", tmp_path / "dl")
        for bad in ("/scratch/nope", "/etc"):
            with pytest.raises(Exception) as err:
                sb.download(bad, tmp_path / "bad")
            assert getattr(err.value, "exit_code", None) == 2, err.value
        assert sb.call("run_shell", {"command": "true"}).ok  # the sandbox goes on
    assert (tmp_path / "dl/r.md").read_text() == "readme"
    assert not (tmp_path / "bad").exists()


def test_20_mib_in_bounded_memory(engine: Any, tmp_path: Path) -> None:
    """A 20 MiB file arrives whole while the runner holds far less than it (chunks of 8x output_cap)."""
    policy = {"limits": {"output_cap": 64 * 1024}}
    with Sandbox(policy, tool="files-out") as sb:
        r = sb.call("run_shell", {"command": "head -c 20971520 /dev/urandom > big && sha256sum big"})
        digest = r.result["stdout"].split()[0]
        tracemalloc.start()
        try:
            sb.download("/scratch/big", tmp_path / "dl")
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    assert hashlib.sha256((tmp_path / "dl/big").read_bytes()).hexdigest() == digest
    assert peak < 8 << 20, f"peak {peak / (1 << 20):.1f} MiB for a 20 MiB file"


def test_async_download(engine: Any, tmp_path: Path) -> None:
    """AsyncSandbox.download does what Sandbox.download does."""

    async def main() -> str:
        async with AsyncSandbox(tool="files-out") as sb:
            r = await sb.call("run_shell", {"command": TREE})
            await sb.download("/scratch/out", tmp_path / "dl")
            return str(r.result["stdout"].split()[0])

    check_tree(tmp_path / "dl", asyncio.run(main()))


@pytest.mark.parametrize("sandbox", [[], ["--sandbox", "none"]])
def test_cli_download(engine: Any, tmp_path: Path, sandbox: list[str]) -> None:
    """`toolcage run ... --download REMOTE:LOCAL` (twice) fetches after the call and reports it."""
    params = json.dumps({"command": TREE})
    argv = [sys.executable, "-m", "toolcage.cli", "run", "run_shell", "--params", params, *sandbox]
    argv += ["--download", "/scratch/out:./dl", "--download", "/scratch/out/a.txt:./one"]
    p = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    check_tree(tmp_path / "dl", out["result"]["stdout"].split()[0])
    assert (tmp_path / "one/a.txt").read_text() == "hello\n"
    assert [d["files"] for d in out["downloads"]] == [3, 1]
    argv[-3:] = ["/scratch/missing:./x"]
    p = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "no such file" in p.stderr and not (tmp_path / "x").exists(), p.stderr
