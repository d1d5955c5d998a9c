"""Sandbox.download from the attacker's side: the sandbox builds the hostile tree, the host must hold.

Named cases, each with what is observed: a symlink to /etc (inside the tree, and as the path asked
for) is neither followed in the sandbox nor made on the host; a FIFO is skipped without hanging; a
setuid file arrives without the bit; a flood of empty files and a sparse 1 TiB file stop at the caps
with a clear error and nothing kept; a symlink swapped in and out while downloads run never brings a
byte of /etc out. Run under runc and gVisor (TOOLCAGE_SANDBOX=gvisor).
"""

from __future__ import annotations

import os
import stat
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from toolcage import Sandbox
from toolcage.files.download import DownloadLimit, DownloadUsage

pytestmark = pytest.mark.usefixtures("no_leaks")


@pytest.fixture
def sandbox(engine: Any) -> Iterator[Sandbox]:
    policy = {"timeouts": {"call_s": 120, "run_s": 600}, "limits": {"concurrency": 2}}
    with Sandbox(policy, tool="download-attacks") as sb:
        yield sb


def shell(sb: Sandbox, command: str) -> None:
    r = sb.call("run_shell", {"command": command})
    assert r.ok and r.result["exit_code"] == 0, r


def everything(root: Path) -> dict[str, bytes | str]:
    """Each path under root: a symlink's target, a file's bytes (nothing else may be there)."""
    out: dict[str, bytes | str] = {}
    for p in root.rglob("*"):
        rel = str(p.relative_to(root))
        if p.is_symlink():
            out[rel] = os.readlink(p)
        elif p.is_file():
            out[rel] = p.read_bytes()
        else:
            assert p.is_dir() and not p.is_symlink(), rel
    return out


def test_symlink_to_etc(sandbox: Sandbox, tmp_path: Path) -> None:
    """Symlinks to /etc (absolute, and by '..') are skipped; asked for directly, the path is refused."""
    shell(sandbox, "mkdir -p t1 && echo ok > t1/ok && ln -s /etc t1/etc && ln -s ../../../../../etc/passwd t1/pw")
    shell(sandbox, "ln -sfn /etc etclink")
    got = sandbox.download("/scratch/t1", tmp_path / "dl")
    assert everything(tmp_path / "dl") == {"ok": b"ok\n"}
    assert {d["path"] for d in got.skipped} == {"etc", "pw"}
    with pytest.raises(DownloadUsage, match="symlink"):
        sandbox.download("/scratch/etclink", tmp_path / "dl2")
    assert not (tmp_path / "dl2").exists()


def test_fifo_skipped(sandbox: Sandbox, tmp_path: Path) -> None:
    """A FIFO is skipped by the worker (no hang) and never made on the host."""
    shell(sandbox, "mkdir -p t2 && mkfifo t2/fifo && echo ok > t2/ok")
    t0 = time.monotonic()
    got = sandbox.download("/scratch/t2", tmp_path / "dl")
    assert time.monotonic() - t0 < 30
    assert everything(tmp_path / "dl") == {"ok": b"ok\n"}
    assert got.skipped[0]["path"] == "fifo" and "FIFO" in got.skipped[0]["reason"]


def test_setuid_cleared(sandbox: Sandbox, tmp_path: Path) -> None:
    """setuid, setgid and sticky bits set in the sandbox do not reach the host."""
    shell(sandbox, "mkdir -p t3/d && echo x > t3/su && chmod 6755 t3/su && chmod 3777 t3/d")
    sandbox.download("/scratch/t3", tmp_path / "dl")
    assert stat.S_IMODE((tmp_path / "dl/su").stat().st_mode) == 0o755
    assert stat.S_IMODE((tmp_path / "dl/d").stat().st_mode) == 0o755


@pytest.mark.runc_only(
    "the cap is the runner's (it counts the stream's entries as they come); making 100,000 files "
    "under gVisor alone took 30 s of CI"
)
def test_flood_of_empty_files_stops_at_the_cap(sandbox: Sandbox, tmp_path: Path) -> None:
    """100,000 empty files stop at max_files with a clear error, nothing kept, in a bounded time."""
    r = sandbox.call(
        "run_python", {"code": "import os\nos.mkdir('t4')\nfor i in range(100_000):\n    open(f't4/{i}', 'w').close()"}
    )
    assert r.ok and r.result["exit_code"] == 0, r
    t0 = time.monotonic()
    with pytest.raises(DownloadLimit, match="max_files"):
        sandbox.download("/scratch/t4", tmp_path / "dl", max_files=5_000)
    assert time.monotonic() - t0 < 60
    assert not (tmp_path / "dl").exists()
    shell(sandbox, "rm -rf t4")


def test_sparse_terabyte_is_skipped_as_what_it_is(sandbox: Sandbox, tmp_path: Path) -> None:
    """A sparse 1 TiB file is skipped as sparse, named in ``skipped``, long before its data: nothing of its
    size reaches the host's disk (the worker's rule; the runner's cap, the sandbox's size, stops a worker
    that sends it anyway: tests/security/test_snapshot_bounds.py)."""
    shell(sandbox, "mkdir -p t5 && truncate -s 1T t5/huge && echo mine > t5/small")
    t0 = time.monotonic()
    got = sandbox.download("/scratch/t5", tmp_path / "dl")
    assert time.monotonic() - t0 < 30
    (why,) = [s["reason"] for s in got.skipped if s["path"] == "huge"]
    assert why.startswith("in the sandbox: sparse: 1099511627776 bytes, "), why  # gVisor's tmpfs holds a page
    assert everything(tmp_path / "dl") == {"small": b"mine\n"}


def test_symlink_swapped_while_downloading(sandbox: Sandbox, tmp_path: Path) -> None:
    """A directory and a file swapped for symlinks to /etc over and over during 10 downloads: no byte of
    /etc comes out, and nothing lands outside the target directories."""
    shell(sandbox, "mkdir -p t6/d && head -c 6000000 /dev/urandom > t6/big && echo mine > t6/d/f && echo mine > t6/g")
    swap = (
        "end=$(($(date +%s)+10)); while [ $(date +%s) -lt $end ]; do"
        " rm -rf t6/d; ln -s /etc t6/d; rm -f t6/d; mkdir t6/d; echo mine > t6/d/f;"
        " rm -f t6/g; ln -s /etc/passwd t6/g; rm -f t6/g; echo mine > t6/g; done"
    )
    swapper = threading.Thread(target=sandbox.call, args=("run_shell", {"command": swap}))
    swapper.start()
    raced = 0  # downloads that met a symlink where a file or directory had been
    try:
        time.sleep(1)
        for i in range(10):
            dl = tmp_path / f"dl{i}"
            raced += bool(sandbox.download("/scratch/t6", dl).skipped)
            for rel, value in everything(dl).items():
                if isinstance(value, str):
                    raise AssertionError(f"a symlink was made: {rel} -> {value}")
                if rel != "big":
                    assert value == b"mine\n", (rel, value[:80])
    finally:
        swapper.join()
    assert raced > 0  # the race was run, not missed
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"dl{i}" for i in range(10)]
