"""The worker's download tool (toolcage.worker.tools.download) end to end with the host's extractor,
in process: bounded chunks, symlinks sent as symlinks and never followed, special files skipped."""

from __future__ import annotations

import base64
import os
import stat
import threading
from pathlib import Path
from typing import Any

import pytest

from tests.framed import call_tool
from toolcage.files import download as transfer
from toolcage.files.download import DownloadUsage
from toolcage.policies import validate_policy
from toolcage.results import CallResult
from toolcage.worker.errors import WorkerError
from toolcage.worker.settings import Settings
from toolcage.worker.tools import Catalog


def settings(ws: Path, scratch: Path, output_cap: int | None = None) -> Settings:
    raw: dict[str, Any] = {"timeouts": {"call_s": 5, "run_s": 20}}
    if output_cap:
        raw["limits"] = {"output_cap": output_cap}
    return Settings(validate_policy(raw).canonical_json(), str(ws), str(scratch), "test")


class InProcess:
    """The download tool as Sandbox.call would reach it, recording each chunk's size; ``between`` runs
    after the first chunk (to change the tree mid-download)."""

    def __init__(self, s: Settings, between: Any = None) -> None:
        self.s, self.between, self.sizes = s, between, []
        self.tool = Catalog().get("download")

    def __call__(self, params: dict[str, Any]) -> CallResult:
        try:
            res = call_tool(self.tool, self.s, params)
        except WorkerError as exc:
            err = {"code": exc.code, "message": str(exc), "data": getattr(exc, "data", None)}
            return CallResult("error", "download", "run", error=err)
        self.sizes.append(len(res["frame"]) if "frame" in res else len(base64.b64decode(res["data"])))
        if len(self.sizes) == 1 and self.between is not None:
            self.between()
        return CallResult("ok", "download", "run", result=res)


@pytest.fixture
def roots(tmp_path: Path) -> tuple[Path, Path]:
    ws, scratch = tmp_path / "ws", tmp_path / "scratch"
    ws.mkdir()
    scratch.mkdir()
    return ws, scratch


def test_tree_round_trip(roots: tuple[Path, Path], tmp_path: Path) -> None:
    """Text, binary, modes and an inside symlink arrive; a symlink out, a FIFO and setuid do not."""
    ws, scratch = roots
    out = scratch / "out"
    (out / "sub").mkdir(parents=True)
    (out / "a.txt").write_text("hello\n")
    (out / "sub/b.bin").write_bytes(bytes(range(256)) * 4)
    (out / "sub/b.bin").chmod(0o4755)
    (out / "l").symlink_to("a.txt")
    (out / "etc").symlink_to("/etc")
    os.mkfifo(out / "fifo")
    got = transfer.download(InProcess(settings(ws, scratch)), "/scratch/out", tmp_path / "dl")
    dl = tmp_path / "dl"
    assert (dl / "a.txt").read_text() == "hello\n"
    assert (dl / "sub/b.bin").read_bytes() == bytes(range(256)) * 4
    assert stat.S_IMODE((dl / "sub/b.bin").stat().st_mode) == 0o755
    assert os.readlink(dl / "l") == "a.txt"
    assert not os.path.lexists(dl / "etc") and not os.path.lexists(dl / "fifo")
    reasons = {d["path"]: d["reason"] for d in got.skipped}
    assert "FIFO" in reasons["fifo"] and "absolute" in reasons["etc"]


def test_single_file(roots: tuple[Path, Path], tmp_path: Path) -> None:
    """A file lands in local_dir by its own name; a relative path is relative to /scratch."""
    ws, scratch = roots
    (scratch / "r.csv").write_text("a,b\n")
    transfer.download(InProcess(settings(ws, scratch)), "r.csv", tmp_path / "dl")
    assert (tmp_path / "dl/r.csv").read_text() == "a,b\n"


def test_large_file_in_bounded_chunks(roots: tuple[Path, Path], tmp_path: Path) -> None:
    """A 20 MiB file comes in chunks no larger than the tool's cap (8x the output cap)."""
    ws, scratch = roots
    data = os.urandom(20 << 20)
    (scratch / "big.bin").write_bytes(data)
    call = InProcess(settings(ws, scratch, output_cap=256 * 1024))
    transfer.download(call, "/scratch/big.bin", tmp_path / "dl")
    assert (tmp_path / "dl/big.bin").read_bytes() == data
    assert max(call.sizes) <= 2 << 20 and len(call.sizes) >= 10


def test_top_symlink_out_refused(roots: tuple[Path, Path], tmp_path: Path) -> None:
    """A remote path that is a symlink out of the roots is a path error (exit 2), not followed."""
    ws, scratch = roots
    (scratch / "etc").symlink_to("/etc")
    with pytest.raises(DownloadUsage, match="symlink"):
        transfer.download(InProcess(settings(ws, scratch)), "/scratch/etc", tmp_path / "dl")
    assert not (tmp_path / "dl/passwd").exists()


def test_outside_roots_refused(roots: tuple[Path, Path], tmp_path: Path) -> None:
    """A remote path outside /scratch and /workspace is bad input."""
    ws, scratch = roots
    with pytest.raises(DownloadUsage, match="outside the allowed"):
        transfer.download(InProcess(settings(ws, scratch)), "/etc", tmp_path / "dl")


def test_symlink_swapped_in_mid_download(roots: tuple[Path, Path], tmp_path: Path) -> None:
    """A file swapped for a symlink to /etc/passwd after the stream began is never followed."""
    ws, scratch = roots
    out = scratch / "out"
    out.mkdir()
    (out / "a.bin").write_bytes(os.urandom(9 << 20))  # the first chunk ends inside it
    (out / "z.txt").write_text("fine")

    def swap() -> None:
        (out / "z.txt").unlink()
        (out / "z.txt").symlink_to("/etc/passwd")

    got = transfer.download(InProcess(settings(ws, scratch), between=swap), "/scratch/out", tmp_path / "dl")
    assert not os.path.lexists(tmp_path / "dl/z.txt")
    assert any(d["path"] == "z.txt" for d in got.skipped)


def test_streams_are_bounded(roots: tuple[Path, Path]) -> None:
    """A worker keeps at most 4 open streams: the oldest is dropped, with a clear error."""
    ws, scratch = roots
    (scratch / "f").write_bytes(os.urandom(9 << 20))
    s = settings(ws, scratch)
    tool = Catalog().get("download")
    first = tool.handler(s, tool.validate({"path": "f", "chunk_bytes": 1024}))
    for _ in range(4):
        tool.handler(s, tool.validate({"path": "f", "chunk_bytes": 1024}))
    with pytest.raises(WorkerError, match="unknown or finished stream"):
        tool.handler(s, tool.validate({"stream": first["stream"]}))


def test_names_that_are_not_utf8_round_trip(roots: tuple[Path, Path], tmp_path: Path) -> None:
    """A file whose name is not UTF-8 arrives under the same bytes; one with an escape sequence is skipped."""
    ws, scratch = roots
    (scratch / "o").mkdir()
    (Path(os.fsdecode(bytes(scratch / "o") + b"/caf\xe9"))).write_text("x")
    (scratch / "o" / "evil\x1b[2J").write_text("y")
    got = transfer.download(InProcess(settings(ws, scratch)), "/scratch/o", tmp_path / "dl")
    assert os.listdir(os.fsencode(tmp_path / "dl")) == [b"caf\xe9"]
    assert got.skipped[0]["path"] == "evil\\x1b[2J"


class Overlap(InProcess):
    """InProcess that notes how many calls were in flight at once."""

    def __init__(self, s: Settings) -> None:
        super().__init__(s)
        self.lock, self.flying, self.most = threading.Lock(), 0, 0

    def __call__(self, params: dict[str, Any]) -> CallResult:
        with self.lock:
            self.flying += 1
            self.most = max(self.most, self.flying)
        try:
            return super().__call__(params)
        finally:
            with self.lock:
                self.flying -= 1


def test_a_large_file_then_many_small_arrive_whole(roots: tuple[Path, Path], tmp_path: Path) -> None:
    """One call at a time, in order; a large entry's content is read from the chunks themselves (after what
    tarfile read past its header, PAX or not), and the small entries after it (with a chunk size that cuts
    headers in two) arrive as they were."""
    ws, scratch = roots
    out = scratch / "out"
    (out / "a").mkdir(parents=True)
    big = os.urandom(3 << 20 | 12345)
    (out / "a/big.bin").write_bytes(big)
    long_name = "a/" + "n" * 150 + ".bin"  # a PAX header before its content
    (out / long_name).write_bytes(big[::-1])
    smalls = {f"a/s{i:03d}": os.urandom(i * 37 % 3000) for i in range(300)}
    for name, data in smalls.items():
        (out / name).write_bytes(data)
    call = Overlap(settings(ws, scratch, output_cap=96 * 1024 + 100))  # chunks of 8x that: not a block multiple
    got = transfer.download(call, "/scratch/out", tmp_path / "dl")
    assert (tmp_path / "dl/a/big.bin").read_bytes() == big
    assert (tmp_path / "dl" / long_name).read_bytes() == big[::-1]
    assert all((tmp_path / "dl" / n).read_bytes() == d for n, d in smalls.items())
    assert got.files == 302 and len(call.sizes) >= 5
    assert call.most == 1  # never two calls on one stream at once: the worker's stream is not shared


def test_the_worker_reads_ahead_and_loses_nothing(roots: tuple[Path, Path]) -> None:
    """The worker reads the next chunk while the last travels: the chunks are the same bytes whatever size
    each call asks for (less than the last one read ahead, too), and what it skipped meanwhile is reported."""
    ws, scratch = roots
    out = scratch / "out"
    out.mkdir()
    for i in range(40):
        (out / f"f{i:02d}").write_bytes(os.urandom(5000))
    os.mkfifo(out / "f39z")  # listed last: skipped while a read-ahead runs
    s = settings(ws, scratch)
    tool = Catalog().get("download")

    def whole(sizes: list[int]) -> tuple[bytes, int]:
        res = call_tool(tool, s, {"path": "/scratch/out", "chunk_bytes": sizes[0], "frame": True})
        data, skipped, i = bytearray(res["frame"]), res["skipped_count"], 1
        while not res["done"]:
            res = call_tool(tool, s, {"stream": res["stream"], "chunk_bytes": sizes[i % len(sizes)], "frame": True})
            assert len(res["frame"]) <= sizes[i % len(sizes)]
            data += res["frame"]
            skipped += res["skipped_count"]
            i += 1
        return bytes(data), skipped

    one, skipped_one = whole([1 << 20])
    mixed, skipped_mixed = whole([30_000, 7_001, 65_536, 512])
    assert mixed[:-1024] == one[:-1024] and len(mixed) == len(one)  # (mtimes are the same: nothing changed)
    assert skipped_one == skipped_mixed == 1
