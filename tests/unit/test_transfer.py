"""Sandbox.download's extractor against hand-made hostile tar streams (toolcage.files.download): each attack
is refused or skipped by its own check, with its own message, and leaves nothing behind."""

from __future__ import annotations

import io
import os
import stat
import tarfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest

from toolcage.files import download as transfer
from toolcage.files import safetar
from toolcage.files.download import DownloadError, DownloadLimit, DownloadUsage
from toolcage.results import CallResult

Entry = tuple[tarfile.TarInfo, bytes]


def info(name: str, kind: bytes = tarfile.REGTYPE, *, data: bytes = b"", mode: int = 0o644, link: str = "") -> Entry:
    ti = tarfile.TarInfo(name)
    ti.type, ti.mode, ti.linkname, ti.size = kind, mode, link, len(data) if kind == tarfile.REGTYPE else 0
    return ti, data


def tar_bytes(entries: Iterable[Entry]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(
        fileobj=buf, mode="w", format=tarfile.PAX_FORMAT, encoding="utf-8", errors="surrogateescape"
    ) as t:
        for ti, data in entries:
            t.addfile(ti, io.BytesIO(data) if ti.isreg() else None)
    return buf.getvalue()


class Worker:
    """A fake worker: serves ``stream`` (bytes, or an iterator of pieces) in chunks, counting calls."""

    def __init__(self, stream: bytes | Iterator[bytes], chunk: int = 64 * 1024) -> None:
        self.pieces = (
            iter([stream[i : i + chunk] for i in range(0, len(stream), chunk)] or [b""])
            if isinstance(stream, bytes)
            else stream
        )
        self.calls = 0
        self.skipped: list[dict[str, str]] = []

    def __call__(self, params: dict[str, Any]) -> CallResult:
        self.calls += 1
        data = next(self.pieces, None)
        done = data is None
        data = data or b""
        assert params.get("frame") is True  # every chunk is asked for as a data frame
        result = {
            "stream": "s1",
            "frame": data,  # as the transport hands it on (the frame's bytes in place of its size)
            "done": done,
            "skipped": self.skipped if self.calls == 1 else [],
            "skipped_count": len(self.skipped) if self.calls == 1 else 0,
        }
        return CallResult("ok", "download", "run", result=result)


def fetch(tmp: Path, entries: Iterable[Entry] | bytes, **kw: Any) -> transfer.DownloadResult:
    raw = entries if isinstance(entries, bytes) else tar_bytes(entries)
    return transfer.download(Worker(raw), "/scratch/out", tmp / "out", **kw)


def left(tmp: Path) -> list[str]:
    """Everything under tmp/out (a failed download leaves nothing, not even its staging directory)."""
    out = tmp / "out"
    return sorted(str(p.relative_to(out)) for p in out.rglob("*")) if out.exists() else []


def refused(tmp: Path, entries: Iterable[Entry] | bytes, match: str, cls: type[Exception] = DownloadError) -> None:
    with pytest.raises(cls, match=match):
        fetch(tmp, entries)
    assert left(tmp) == []


def test_good_tree(tmp_path: Path) -> None:
    """A tree with a text and binary file, a subdirectory and an inside symlink lands as sent."""
    got = fetch(
        tmp_path,
        [
            info("a.txt", data=b"hello\n", mode=0o755),
            info("sub", tarfile.DIRTYPE, mode=0o750),
            info("sub/b.bin", data=bytes(range(256)) * 10, mode=0o600),
            info("link", tarfile.SYMTYPE, link="sub/b.bin"),
        ],
    )
    out = tmp_path / "out"
    assert (out / "a.txt").read_text() == "hello\n" and stat.S_IMODE((out / "a.txt").stat().st_mode) == 0o755
    assert (out / "sub/b.bin").read_bytes() == bytes(range(256)) * 10
    assert stat.S_IMODE((out / "sub/b.bin").stat().st_mode) == 0o600
    assert stat.S_IMODE((out / "sub").stat().st_mode) == 0o750
    assert os.readlink(out / "link") == "sub/b.bin"
    assert (got.files, got.dirs, got.symlinks, got.bytes) == (2, 1, 1, 6 + 2560)
    assert left(tmp_path) == ["a.txt", "link", "sub", "sub/b.bin"]


def test_absolute_name_refused(tmp_path: Path) -> None:
    """An absolute name is refused by its own check."""
    refused(tmp_path, [info("/tmp/evil", data=b"x")], "is an absolute path")


def test_dotdot_refused(tmp_path: Path) -> None:
    """A name with '..' is refused, and nothing is written beside local_dir."""
    refused(tmp_path, [info("ok.txt", data=b"1"), info("a/../../evil", data=b"x")], "climbs out")
    assert not (tmp_path / "evil").exists()


@pytest.mark.parametrize("target", ["/etc", "../outside", "a/../../x"])
def test_symlink_out_skipped(tmp_path: Path, target: str) -> None:
    """A symlink whose target leaves local_dir is not made, and is reported."""
    got = fetch(tmp_path, [info("a", tarfile.DIRTYPE), info("l", tarfile.SYMTYPE, link=target)])
    assert not os.path.lexists(tmp_path / "out/l")
    assert got.skipped[0]["path"] == "l" and "symlink" in got.skipped[0]["reason"]


def test_symlink_up_through_symlink_skipped(tmp_path: Path) -> None:
    """'..' after an archive symlink (lexically inside, physically outside) is caught."""
    got = fetch(
        tmp_path,
        [
            info("x/y/z", tarfile.DIRTYPE),
            info("x/y/z/d", tarfile.SYMTYPE, link="../../.."),  # physically local_dir itself
            info("e", tarfile.SYMTYPE, link="x/y/z/d/.."),  # lexically x/y/z; physically local_dir/..
        ],
    )
    assert os.path.islink(tmp_path / "out/x/y/z/d")
    assert not os.path.lexists(tmp_path / "out/e")
    assert "climbs back up" in got.skipped[0]["reason"]


@pytest.mark.parametrize("target", ["/etc", "sub"])
def test_write_through_archive_symlink_refused(tmp_path: Path, target: str) -> None:
    """An entry under a symlink the archive made (pointing out or in) is refused."""
    entries = [info("sub", tarfile.DIRTYPE), info("s", tarfile.SYMTYPE, link=target), info("s/passwd", data=b"x")]
    refused(tmp_path, entries, "through a symlink")


def test_symlink_then_same_name_refused(tmp_path: Path) -> None:
    """A second entry with a symlink's name (a swap) is refused."""
    refused(tmp_path, [info("s", tarfile.SYMTYPE, link="/etc"), info("s", tarfile.DIRTYPE)], "comes twice")


def test_entry_under_a_file_refused(tmp_path: Path) -> None:
    """An entry under a name the archive made a file is refused."""
    refused(tmp_path, [info("f", data=b"1"), info("f/g", data=b"2")], "through a file")


@pytest.mark.parametrize("link", ["/etc/passwd", "../x", "a.txt"])
def test_hardlink_refused(tmp_path: Path, link: str) -> None:
    """Hard links are refused, wherever they point."""
    refused(tmp_path, [info("a.txt", data=b"1"), info("h", tarfile.LNKTYPE, link=link)], "hard link")


@pytest.mark.parametrize(
    ("kind", "what"), [(tarfile.CHRTYPE, "device"), (tarfile.BLKTYPE, "device"), (tarfile.FIFOTYPE, "FIFO")]
)
def test_special_files_refused(tmp_path: Path, kind: bytes, what: str) -> None:
    """Device nodes and FIFOs are refused."""
    refused(tmp_path, [info("dev", kind)], what)


def test_unknown_type_refused(tmp_path: Path) -> None:
    """An entry type tar has no meaning for (as a socket would need) is refused."""
    refused(tmp_path, [info("sock", b"s")], "entry type")


def test_mode_bits_cleared(tmp_path: Path) -> None:
    """setuid, setgid, sticky and group/other write bits never reach the host."""
    fetch(tmp_path, [info("d", tarfile.DIRTYPE, mode=0o3777), info("d/f", data=b"x", mode=0o6777)])
    assert stat.S_IMODE((tmp_path / "out/d/f").stat().st_mode) == 0o755
    assert stat.S_IMODE((tmp_path / "out/d").stat().st_mode) == 0o755


def test_control_characters_skipped_and_escaped(tmp_path: Path) -> None:
    """A name with control characters is not written; the report shows it escaped."""
    got = fetch(tmp_path, [info("evil\x1b]0;x\x07\n.txt", data=b"x"), info("ok", data=b"y")])
    assert left(tmp_path) == ["ok"]
    assert got.skipped[0]["path"] == "evil\\x1b]0;x\\x07\\x0a.txt"


def test_invalid_utf8_name_kept_and_escaped(tmp_path: Path) -> None:
    """A name that is not UTF-8 lands with its exact bytes; an error about one shows it escaped."""
    name = os.fsdecode(b"caf\xe9")
    fetch(tmp_path, [info(name, data=b"x")])
    assert os.listdir(os.fsencode(tmp_path / "out")) == [b"caf\xe9"]
    with pytest.raises(DownloadError) as err:
        transfer.download(Worker(tar_bytes([info("/" + name, data=b"x")])), "/scratch/out", tmp_path / "o2")
    assert "caf\\xe9" in err.value.message
    err.value.message.encode("utf-8")  # printable


def test_byte_cap(tmp_path: Path) -> None:
    """Files past max_bytes stop the download with a clear error."""
    with pytest.raises(DownloadLimit, match="max_bytes"):
        fetch(tmp_path, [info("a", data=b"x" * 600), info("b", data=b"x" * 600)], max_bytes=1000)
    assert left(tmp_path) == []


def test_sparse_huge_file_refused_at_its_header(tmp_path: Path) -> None:
    """A 1 TiB file (a sparse one in the sandbox) is refused at its header, before its data is fetched."""
    ti = tarfile.TarInfo("huge")
    ti.size = 1 << 40
    header = ti.tobuf(tarfile.PAX_FORMAT)
    zeros = (bytes(1 << 20) for _ in range(1 << 20))
    worker = Worker(iter([header, *[next(zeros) for _ in range(3)]]))
    with pytest.raises(DownloadLimit, match="past the cap"):
        transfer.download(worker, "/scratch/huge", tmp_path / "out")
    assert worker.calls <= 2 and left(tmp_path) == []


def test_file_count_cap_in_bounded_memory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A flood of empty files stops at max_files, and tarfile does not keep the headers it read."""

    def flood() -> Iterator[bytes]:
        for i in range(10**6):
            yield tarfile.TarInfo(f"f{i}").tobuf(tarfile.PAX_FORMAT)

    def batches() -> Iterator[bytes]:
        it = flood()
        while batch := b"".join(x for _, x in zip(range(256), it, strict=False)):
            yield batch

    kept: list[int] = []
    member = safetar.Extractor.member

    def spy(self: Any, tf: tarfile.TarFile, m: tarfile.TarInfo) -> None:
        kept.append(len(tf.members))  # type: ignore[attr-defined]
        member(self, tf, m)

    monkeypatch.setattr(safetar.Extractor, "member", spy)
    worker = Worker(batches())
    with pytest.raises(DownloadLimit, match="max_files"):
        transfer.download(worker, "/scratch/many", tmp_path / "out", max_files=2000)
    assert len(kept) == 2001 and max(kept) == 0
    assert worker.calls < 20 and left(tmp_path) == []


def test_oversized_pax_header_refused(tmp_path: Path) -> None:
    """A PAX header too big to hold is refused before it is read."""
    ti = tarfile.TarInfo("././@PaxHeader")
    ti.type, ti.size = tarfile.XHDTYPE, 64 << 20
    refused(tmp_path, ti.tobuf(tarfile.USTAR_FORMAT) + bytes(4096), "tar header")


def test_gnu_sparse_refused(tmp_path: Path) -> None:
    """A GNU sparse entry is refused."""
    ti = tarfile.TarInfo("s")
    ti.type = tarfile.GNUTYPE_SPARSE
    refused(tmp_path, ti.tobuf(tarfile.GNU_FORMAT) + bytes(2048), "a sparse entry")


def test_garbage_refused(tmp_path: Path) -> None:
    """A stream that is not tar is a clear error."""
    refused(tmp_path, b"\xff" * 4096, "broken tar stream")


@pytest.mark.parametrize("frame", [3, "abc", None, b"x" * (transfer.MAX_CHUNK + 1)])
def test_a_chunk_that_is_no_frame_is_refused(tmp_path: Path, frame: Any) -> None:
    """An answer whose chunk is not a data frame's bytes (its size left as is, text, nothing) or is over the cap."""

    def call(params: dict[str, Any]) -> CallResult:
        res = {"stream": "s", "frame": frame, "done": True}
        return CallResult("ok", "download", "run", result=res)

    with pytest.raises(DownloadError, match="malformed chunk"):
        transfer.download(call, "/scratch/x", tmp_path / "out")


def test_failure_keeps_nothing_and_spares_existing(tmp_path: Path) -> None:
    """A refusal after good entries leaves no new file and the old ones as they were."""
    (tmp_path / "out").mkdir()
    (tmp_path / "out/a.txt").write_text("old")
    with pytest.raises(DownloadError):
        fetch(tmp_path, [info("a.txt", data=b"new"), info("b.txt", data=b"b"), info("/x", data=b"x")])
    assert left(tmp_path) == ["a.txt"] and (tmp_path / "out/a.txt").read_text() == "old"


def test_merge_into_existing(tmp_path: Path) -> None:
    """A download into a directory that has files merges: same names replaced, others kept."""
    (tmp_path / "out/sub").mkdir(parents=True)
    (tmp_path / "out/keep").write_text("k")
    (tmp_path / "out/sub/a").write_text("old")
    fetch(tmp_path, [info("sub", tarfile.DIRTYPE), info("sub/a", data=b"new")])
    assert (tmp_path / "out/sub/a").read_text() == "new" and (tmp_path / "out/keep").read_text() == "k"


def test_merge_never_through_a_local_symlink(tmp_path: Path) -> None:
    """A local symlink where the download has a directory is not followed."""
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "out").mkdir()
    (tmp_path / "out/sub").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(DownloadUsage, match="exists as a file or link"):
        fetch(tmp_path, [info("sub", tarfile.DIRTYPE), info("sub/a", data=b"x")])
    assert list((tmp_path / "elsewhere").iterdir()) == []


def test_missing_remote_is_usage_error(tmp_path: Path) -> None:
    """The worker's error for the first call (a missing path) is bad input: exit code 2."""

    def call(params: dict[str, Any]) -> CallResult:
        err = {"code": -32001, "message": "no such file or directory: '/scratch/nope'", "data": {}}
        return CallResult("error", "download", "run", error=err)

    with pytest.raises(DownloadUsage, match="no such file") as exc:
        transfer.download(call, "/scratch/nope", tmp_path / "out")
    assert exc.value.exit_code == 2


def test_failed_download_removes_the_directory_it_made(tmp_path: Path) -> None:
    """A local_dir the download made is gone again when the download fails."""
    with pytest.raises(DownloadError):
        fetch(tmp_path, [info("/abs", data=b"x")])
    assert not (tmp_path / "out").exists()


def test_endless_empty_chunks_refused(tmp_path: Path) -> None:
    """A worker that answers empty chunks and never ends the stream is stopped, not waited on forever."""

    def call(params: dict[str, Any]) -> CallResult:
        res = {"stream": "s", "frame": b"", "done": False}
        return CallResult("ok", "download", "run", result=res)

    with pytest.raises(DownloadError, match="empty chunks"):
        transfer.download(call, "/scratch/x", tmp_path / "out")


# A large entry's content is written from views of the chunks (download._Chunks.content), not through tarfile:
# the same attacks, on that path.


def test_a_large_file_cut_short_is_refused(tmp_path: Path) -> None:
    """A large entry whose stream ends before its size (the worker's last chunk says done) keeps nothing."""
    raw = tar_bytes([info("a", data=b"a"), info("big", data=os.urandom(3 << 20))])
    refused(tmp_path, raw[: len(raw) - (2 << 20)], "ends before its size|broken tar stream")


def test_a_large_file_past_max_bytes_is_stopped_at_its_header(tmp_path: Path) -> None:
    """The cap is checked before a byte of a large entry is read."""
    worker = Worker(tar_bytes([info("big", data=os.urandom(3 << 20))]), chunk=1 << 20)
    with pytest.raises(DownloadLimit, match="max_bytes"):
        transfer.download(worker, "/scratch/out", tmp_path / "out", max_bytes=2 << 20)
    assert left(tmp_path) == [] and worker.calls <= 2  # stopped at the header, not after reading the content


@pytest.mark.parametrize("chunk", [1000, 64 * 1024 + 7, 1 << 20, 4 << 20])
def test_entries_after_a_large_file_are_checked_as_any(tmp_path: Path, chunk: int) -> None:
    """After a large file (behind a PAX header, chunks that cut everything anywhere), the next entries are
    parsed where tarfile would have: a good file arrives whole, then a '..' entry refuses the download."""
    big = os.urandom((2 << 20) + 333)
    entries = [info("p" * 120, data=big), info("small", data=b"s" * 700)]
    worker = Worker(tar_bytes(entries), chunk=chunk)
    transfer.download(worker, "/scratch/out", tmp_path / "out")
    assert (tmp_path / "out" / ("p" * 120)).read_bytes() == big and (tmp_path / "out/small").read_bytes() == b"s" * 700
    (tmp_path / "out").rename(tmp_path / "good")
    refused(tmp_path, [*entries, info("../escape", data=b"x")], "climbs out")
    assert not (tmp_path / "escape").exists()


# A helper session's attacks on the doors around the extractor (2026-11-29): each failed before its fix.


def test_a_tree_nested_too_deep_is_refused_and_leaves_nothing(tmp_path: Path) -> None:
    """2,000 levels fit a 4,096-byte name; the staging's removal recursed a level a frame (RecursionError, the
    staging left in the target). Refused at its header now; a tree at the bound downloads, twice (a merge)."""
    refused(tmp_path, [info("/".join(["a"] * 2000) + "/f", data=b"x")], "nested more than")
    at_bound = [info("/".join(["d"] * (safetar.MAX_DEPTH - 1)) + "/f", data=b"x")]
    for _ in range(2):
        fetch(tmp_path, at_bound)
    assert (tmp_path / "out" / "/".join(["d"] * (safetar.MAX_DEPTH - 1)) / "f").read_bytes() == b"x"
    assert not [n for n in os.listdir(tmp_path / "out") if n.startswith(".toolcage-download-")]


def test_a_clash_found_late_moves_nothing_in(tmp_path: Path) -> None:
    """The merge is checked whole before anything moves: a file where the target has a directory, sorted after
    other entries, leaves the target as it was (before: the entries ahead of it were moved in, a file of the
    host's replaced by the sandbox's)."""
    out = tmp_path / "out"
    (out / "z").mkdir(parents=True)
    (out / "keep.txt").write_text("the host's own")
    entries = [info("a_new.txt", data=b"new"), info("keep.txt", data=b"the sandbox's"), info("z", data=b"f")]
    with pytest.raises(DownloadUsage, match=r"exists as a directory.*nothing was moved in"):
        fetch(tmp_path, entries)
    assert sorted(os.listdir(out)) == ["keep.txt", "z"] and (out / "keep.txt").read_text() == "the host's own"


def test_content_read_by_the_caller_of_members_breaks_as_a_download_error(tmp_path: Path) -> None:
    """members() hands each entry's content to its caller (read_files, snapshots, diffs): a stream that ends
    inside it raised tarfile's ReadError in the caller's read; it is a DownloadError now."""
    raw = tar_bytes([info("f", data=os.urandom(3 << 20))])[: 2 << 20]
    got = transfer.members(Worker(raw), {"path": "/scratch"}, max_bytes=1 << 30, max_files=10,
                           result=safetar.DownloadResult(str(tmp_path)))  # fmt: skip
    with pytest.raises(DownloadError, match="broken tar stream"):
        for _, _, src in got:
            while src.read(1 << 20):
                pass
