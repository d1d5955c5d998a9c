"""Sandbox.upload: the worker's extractor (toolcage.worker.tools.upload) against hand-made hostile tars,
each refused by its own check with its own message, leaving nothing behind; and the host half
(toolcage.files.upload) through the tool in-process: chunks bounded, special files and missing paths refused."""

from __future__ import annotations

import base64
import errno
import hashlib
import io
import os
import stat
import tarfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

from tests.framed import call_tool
from toolcage.files import upload as host
from toolcage.files.upload import UploadError, UploadUsage
from toolcage.policies import validate_policy
from toolcage.results import CallResult
from toolcage.worker.errors import WorkerError
from toolcage.worker.settings import Settings
from toolcage.worker.tools import Catalog

Entry = tuple[tarfile.TarInfo, bytes]


def info(name: str, kind: bytes = tarfile.REGTYPE, *, data: bytes = b"", mode: int = 0o644, link: str = "") -> Entry:
    ti = tarfile.TarInfo(name)
    ti.type, ti.mode, ti.linkname, ti.size = kind, mode, link, len(data) if kind == tarfile.REGTYPE else 0
    return ti, data


def tar_bytes(entries: Iterable[Entry]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as t:
        for ti, data in entries:
            t.addfile(ti, io.BytesIO(data) if ti.isreg() else None)
    return buf.getvalue()


class InProcess:
    """The upload tool as Sandbox.call would reach it; records each chunk's raw size."""

    def __init__(self, s: Settings) -> None:
        self.s, self.sizes = s, []
        self.tool = Catalog().get("upload")

    def __call__(self, params: dict[str, Any]) -> CallResult:
        if "data" in params:
            self.sizes.append(len(base64.b64decode(params["data"])))
        if isinstance(params.get("frame"), bytes):
            self.sizes.append(len(params["frame"]))
        try:
            res = call_tool(self.tool, self.s, params)
        except WorkerError as exc:
            err = {"code": exc.code, "message": str(exc), "data": getattr(exc, "data", None)}
            return CallResult("error", "upload", "run", error=err)
        return CallResult("ok", "upload", "run", result=res)


@pytest.fixture
def scratch(tmp_path: Path) -> Path:
    (tmp_path / "ws").mkdir()
    (tmp_path / "scratch").mkdir()
    return tmp_path / "scratch"


@pytest.fixture
def call(scratch: Path) -> InProcess:
    raw = validate_policy({"timeouts": {"call_s": 5, "run_s": 20}}).canonical_json()
    return InProcess(Settings(raw, str(scratch.parent / "ws"), str(scratch), "test"))


def send(call: InProcess, entries: Iterable[Entry] | bytes, target: str = "/scratch/in", chunk: int = 700) -> Any:
    """Send a tar (made from ``entries``) in chunks straight to the worker tool; its last answer."""
    raw = entries if isinstance(entries, bytes) else tar_bytes(entries)
    opened = call({"path": target})
    assert opened.ok, opened.error
    pieces = [raw[i : i + chunk] for i in range(0, len(raw), chunk)] or [b""]
    for i, piece in enumerate(pieces):
        params = {
            "stream": opened.result["stream"],
            "data": base64.b64encode(piece).decode(),
            "sha256": hashlib.sha256(piece).hexdigest(),
            "done": i == len(pieces) - 1,
        }
        res = call(params)
        if not res.ok:
            return res
    return res


def everything(scratch: Path) -> list[str]:
    return sorted(str(p.relative_to(scratch)) for p in scratch.rglob("*"))


def refused(call: InProcess, scratch: Path, entries: Iterable[Entry], match: str) -> None:
    res = send(call, entries)
    assert not res.ok and match in res.error["message"], res.error
    assert "nothing was kept" in res.error["message"]
    assert everything(scratch) == []  # no target, no spool, no staging


def test_good_tree(call: InProcess, scratch: Path) -> None:
    res = send(
        call,
        [
            info("d", tarfile.DIRTYPE, mode=0o750),
            info("d/a.txt", data=b"hello\n", mode=0o640),
            info("d/b.bin", data=bytes(range(256)) * 40, mode=0o755),
            info("d/l", tarfile.SYMTYPE, link="a.txt"),
        ],
    )
    assert res.ok and res.result["files"] == 2 and res.result["symlinks"] == 1, res.error
    d = scratch / "in" / "d"
    assert (d / "a.txt").read_bytes() == b"hello\n" and (d / "b.bin").read_bytes() == bytes(range(256)) * 40
    assert stat.S_IMODE((d / "b.bin").stat().st_mode) == 0o755 and stat.S_IMODE((d / "a.txt").stat().st_mode) == 0o640
    assert stat.S_IMODE(d.stat().st_mode) == 0o750 and os.readlink(d / "l") == "a.txt"
    assert sorted(os.listdir(scratch)) == ["in"]  # spool and staging gone


def test_absolute_name_refused(call: InProcess, scratch: Path) -> None:
    refused(call, scratch, [info("/etc/evil", data=b"x")], "is an absolute path")


def test_dotdot_refused(call: InProcess, scratch: Path) -> None:
    refused(call, scratch, [info("a/../../evil", data=b"x")], "climbs out with '..'")


@pytest.mark.parametrize("target", ["/tmp", "..", "."])
def test_write_through_archive_symlink_refused(call: InProcess, scratch: Path, target: str) -> None:
    refused(call, scratch, [info("l", tarfile.SYMTYPE, link=target), info("l/evil", data=b"x")], "through a symlink")


def test_symlink_then_same_name_refused(call: InProcess, scratch: Path) -> None:
    """A file entry after a symlink of its name would be opened through it (or replace it)."""
    refused(call, scratch, [info("l", tarfile.SYMTYPE, link="/tmp/x"), info("l", data=b"x")], "comes twice")


def test_entry_under_a_file_refused(call: InProcess, scratch: Path) -> None:
    refused(call, scratch, [info("f", data=b"x"), info("f/g", data=b"y")], "through a file")


def test_hardlink_refused(call: InProcess, scratch: Path) -> None:
    refused(call, scratch, [info("a", data=b"x"), info("h", tarfile.LNKTYPE, link="/etc/passwd")], "hard link")


@pytest.mark.parametrize(
    ("kind", "what"), [(tarfile.CHRTYPE, "device node"), (tarfile.BLKTYPE, "device node"), (tarfile.FIFOTYPE, "FIFO")]
)
def test_special_entries_refused(call: InProcess, scratch: Path, kind: bytes, what: str) -> None:
    refused(call, scratch, [info("s", kind)], what)


def test_unknown_type_refused(call: InProcess, scratch: Path) -> None:
    refused(call, scratch, [info("u", b"Z")], "entry type")


def test_setuid_bits_cleared(call: InProcess, scratch: Path) -> None:
    res = send(call, [info("s", data=b"#!/bin/sh\n", mode=0o6755), info("k", tarfile.DIRTYPE, mode=0o1777)])
    assert res.ok, res.error
    assert stat.S_IMODE((scratch / "in" / "s").stat().st_mode) == 0o755
    assert stat.S_IMODE((scratch / "in" / "k").stat().st_mode) == 0o777


def test_failure_keeps_nothing_under_a_final_name(call: InProcess, scratch: Path) -> None:
    """A good file before a refused entry is not in place: everything is staged, then renamed."""
    (scratch / "in").mkdir()
    (scratch / "in" / "a").write_bytes(b"old")
    res = send(call, [info("a", data=b"new"), info("b", data=b"y"), info("/abs", data=b"z")])
    assert not res.ok
    assert everything(scratch) == ["in", "in/a"] and (scratch / "in" / "a").read_bytes() == b"old"


def test_merge_into_existing_replaces_files(call: InProcess, scratch: Path) -> None:
    (scratch / "in" / "d").mkdir(parents=True)
    (scratch / "in" / "d" / "keep").write_bytes(b"k")
    (scratch / "in" / "d" / "a").write_bytes(b"old")
    assert send(call, [info("d/a", data=b"new")]).ok
    assert (scratch / "in" / "d" / "a").read_bytes() == b"new" and (scratch / "in" / "d" / "keep").exists()


def test_sandbox_symlink_at_target_never_followed(call: InProcess, scratch: Path, tmp_path: Path) -> None:
    """Code in the sandbox made /scratch/in a symlink out: the upload is refused, nothing lands outside."""
    out = tmp_path / "outside"
    out.mkdir()
    (scratch / "in").symlink_to(out)
    res = send(call, [info("a", data=b"x")])
    assert not res.ok and "cannot use /scratch/in as the target directory" in res.error["message"]
    assert list(out.iterdir()) == [] and sorted(os.listdir(scratch)) == ["in"]


def test_sandbox_symlink_inside_target_not_merged_through(call: InProcess, scratch: Path, tmp_path: Path) -> None:
    out = tmp_path / "outside"
    out.mkdir()
    (scratch / "in").mkdir()
    (scratch / "in" / "d").symlink_to(out)
    res = send(call, [info("d/a", data=b"x")])
    assert not res.ok and "exists as a file or symlink" in res.error["message"]
    assert list(out.iterdir()) == []


def test_workspace_refused(call: InProcess, scratch: Path) -> None:
    res = call({"path": "/workspace/in"})
    assert not res.ok and "in the workspace, which is read-only" in res.error["message"]
    assert everything(scratch) == []


def test_chunk_hash_mismatch_refused(call: InProcess, scratch: Path) -> None:
    sid = call({"path": "in"}).result["stream"]
    res = call({"stream": sid, "data": base64.b64encode(b"abc").decode(), "sha256": "0" * 64, "done": True})
    assert not res.ok and "sha256" in res.error["message"] and everything(scratch) == []


def test_scratch_full_is_clear_and_cleans_up(call: InProcess, scratch: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """ENOSPC while spooling: a clear error naming limits.scratch, and the spool file removed."""
    from toolcage.worker.tools import upload as tool

    real = os.write

    def full(fd: int, data: Any) -> int:
        if len(data) > 100:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(fd, data)

    monkeypatch.setattr(tool.os, "write", full)
    res = send(call, [info("big", data=b"x" * 5000)], chunk=1 << 20)
    assert not res.ok and "/scratch is full" in res.error["message"] and "limits.scratch" in res.error["message"]
    assert res.error["data"] == {"reason": "scratch_full"} and everything(scratch) == []


def test_scratch_full_while_extracting_removes_staging(
    call: InProcess, scratch: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from toolcage.worker.tools import upload as tool

    def full(self: Any, tf: Any, m: Any, pfd: int, name: str) -> None:
        os.close(os.open(name, os.O_WRONLY | os.O_CREAT, 0o600, dir_fd=pfd))  # a partial file in staging
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(tool.Extractor, "write", full)
    res = send(call, [info("a", data=b"x")])
    assert not res.ok and "/scratch is full" in res.error["message"] and everything(scratch) == []


def test_abort_drops_the_spool(call: InProcess, scratch: Path) -> None:
    sid = call({"path": "in"}).result["stream"]
    call({"stream": sid, "data": base64.b64encode(b"abc").decode(), "sha256": hashlib.sha256(b"abc").hexdigest()})
    assert call({"stream": sid, "abort": True}).ok and everything(scratch) == []


# the host half


def test_host_round_trip_and_bounded_chunks(call: InProcess, scratch: Path, tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    big = os.urandom(9 << 20)
    (src / "sub" / "big.bin").write_bytes(big)
    (src / "t.txt").write_text("text\n")
    (src / "run.sh").write_bytes(b"#!/bin/sh\n")
    (src / "run.sh").chmod(0o755)
    (src / "link").symlink_to("t.txt")
    (src / "out").symlink_to("/etc")  # sent as a link, never followed
    got = host.upload(call, src, "/scratch/in")
    assert (got.files, got.dirs, got.symlinks, got.bytes) == (3, 1, 2, len(big) + 15)
    assert (scratch / "in" / "sub" / "big.bin").read_bytes() == big
    assert stat.S_IMODE((scratch / "in" / "run.sh").stat().st_mode) == 0o755
    assert os.readlink(scratch / "in" / "out") == "/etc" and not (scratch / "in" / "passwd").exists()
    assert max(call.sizes) <= host.CHUNK and len(call.sizes) >= (9 << 20) // host.CHUNK


def test_host_single_file_goes_by_its_name(call: InProcess, scratch: Path, tmp_path: Path) -> None:
    (tmp_path / "one.csv").write_text("1,2\n")
    host.upload(call, tmp_path / "one.csv", "data")
    assert (scratch / "data" / "one.csv").read_text() == "1,2\n"


def test_host_missing_path_is_usage(call: InProcess, scratch: Path, tmp_path: Path) -> None:
    with pytest.raises(UploadUsage, match="No such file") as exc:
        host.upload(call, tmp_path / "nope", "/scratch/in")
    assert exc.value.exit_code == 2 and everything(scratch) == []


def test_host_special_file_refused_before_sending(call: InProcess, scratch: Path, tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "a").write_text("x")
    os.mkfifo(src / "pipe")
    with pytest.raises(UploadUsage, match="is a FIFO"):
        host.upload(call, src, "/scratch/in")
    assert call.sizes == [] and everything(scratch) == []


def test_host_workspace_is_usage(call: InProcess, tmp_path: Path) -> None:
    (tmp_path / "f").write_text("x")
    with pytest.raises(UploadUsage, match="in the workspace, which is read-only"):
        host.upload(call, tmp_path / "f", "/workspace/in")


def test_host_refusal_is_upload_error(scratch: Path, tmp_path: Path) -> None:
    def worker(params: dict[str, Any]) -> CallResult:
        if "path" in params:
            return CallResult("ok", "upload", "run", result={"stream": "s"})
        return CallResult("error", "upload", "run", error={"code": -32000, "message": "upload refused: 'x'"})

    (tmp_path / "f").write_text("x")
    with pytest.raises(UploadError, match="upload refused") as exc:
        host.upload(worker, tmp_path / "f", "in")
    assert exc.value.exit_code == 3


def _tree_for_scan(top: Path) -> Path:
    (top / "src" / "deep").mkdir(parents=True)
    (top / "src" / "deep" / "a.py").write_text("a\n")
    (top / "src" / "b.txt").write_text("b" * 5000)
    (top / "build").mkdir()
    (top / "build" / "out.o").write_bytes(b"\0" * 10)
    (top / ".gitignore").write_text("build/\n")
    (top / "link").symlink_to("src/b.txt")
    (top / "secret.txt").write_text("s")
    (top / "secret.txt").chmod(0o600)  # the sandbox user could not read it through the mount: withheld
    return top


@pytest.mark.parametrize("gitignore", [False, True])
def test_a_scan_is_sent_as_the_walk_would_send_it(tmp_path: Path, gitignore: bool) -> None:
    """The copy's size check walks the tree once (host.scan); the copy then sends its names without a second
    walk, byte for byte the tar a walk makes, with the same names withheld; one gone since is left out."""
    top = _tree_for_scan(tmp_path / "w")
    walked = host._Withheld()
    expected = b"".join(host._tar(str(top), gitignore, walked))
    got = host.scan(top, gitignore)
    assert got.names is not None and got.entries == len(got.names)
    assert (got.entries, got.size) == host.measure(top, gitignore)
    assert b"".join(host._tar(str(top), gitignore, got.withheld, got.names)) == expected
    assert list(got.withheld) == list(walked) and (os.geteuid() == 0 or "secret.txt" in walked)
    (top / "src" / "deep" / "a.py").unlink()
    sent = b"".join(host._tar(str(top), gitignore, host._Withheld(), got.names))
    with tarfile.open(fileobj=io.BytesIO(sent)) as again:
        assert "src/deep/a.py" not in again.getnames() and "src/b.txt" in again.getnames()


def test_a_scan_past_its_bound_keeps_no_names(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Host memory: a tree of more than SCAN_KEEP entries is counted, not kept; its copy walks it again."""
    top = _tree_for_scan(tmp_path / "w")
    monkeypatch.setattr(host, "SCAN_KEEP", 3)
    got = host.scan(top)
    assert got.names is None and got.entries > 3


class _Scripted:
    """A worker's answers in order, and the params of each call."""

    def __init__(self, *answers: CallResult) -> None:
        self.answers, self.calls = list(answers), []

    def __call__(self, params: dict[str, Any]) -> CallResult:
        self.calls.append(params)
        return self.answers.pop(0)


def _ok(**result: Any) -> CallResult:
    return CallResult("ok", "upload", "run", result=result)


def test_a_worker_from_before_native_is_asked_again_without_it() -> None:
    """An image derived from an older worker image refuses the parameter by name: the copy goes on through its
    Python extraction, and its counts are the worker's."""
    from toolcage.files import upload

    refused = CallResult(
        "error", "upload", "run", error={"code": -32602, "message": "bad", "data": [{"field": "native"}]}
    )
    old = _Scripted(refused, _ok(stream="s", frames=True), _ok(stream="s", done=True, files=7, dirs=2, bytes=9))
    got = upload.send(old, iter([b"x" * 10]), "/workspace", base=True, sent=upload.Sent(files=1))
    assert old.calls[0].get("native") is True and "native" not in old.calls[1], old.calls
    assert (got.files, got.dirs, got.bytes) == (7, 2, 9)


def test_a_native_copys_counts_are_the_runners() -> None:
    """GNU tar names entries, not kinds: when the worker says it extracted natively, the counts are what the
    runner's walk sent."""
    from toolcage.files import upload

    new = _Scripted(_ok(stream="s", frames=True), _ok(stream="s", done=True, native=True, files=3, dirs=1))
    sent = upload.Sent(files=5, dirs=2, symlinks=1, bytes=40)
    got = upload.send(new, iter([b"x" * 10]), "/workspace", base=True, sent=sent)
    assert (got.files, got.dirs, got.symlinks, got.bytes) == (5, 2, 1, 40)
    assert len(new.calls) == 2 and new.calls[0].get("native") is True


def test_a_deflated_chunk_is_handed_over_in_bounded_pieces() -> None:
    """A chunk that inflates to far more than it is (here 40 MiB from about 40 KiB) reaches the extractor in
    pieces of at most _INFLATED bytes, all of it; a chunk that does not inflate, one cut short, and one on a
    stream that did not offer deflate are refused with nothing kept."""
    import zlib
    from types import SimpleNamespace

    from toolcage.worker.tools import upload as worker_upload

    pieces: list[int] = []
    native = SimpleNamespace(native=True, write=lambda data: pieces.append(len(data)))
    worker_upload._Stream.write_deflated(native, zlib.compress(bytes(40 << 20), 1))  # type: ignore[arg-type]
    assert sum(pieces) == 40 << 20 and max(pieces) <= worker_upload._INFLATED, pieces
    for bad, why in (
        (b"not zlib", "does not inflate"),
        (zlib.compress(b"x" * 1000)[:-6], "not one whole zlib stream"),
        (zlib.compress(b"x") + b"more", "not one whole zlib stream"),
    ):
        with pytest.raises(WorkerError, match=why):
            worker_upload._Stream.write_deflated(native, bad)  # type: ignore[arg-type]
    plain = SimpleNamespace(native=False, write=lambda data: None)
    with pytest.raises(WorkerError, match="did not offer it"):
        worker_upload._Stream.write_deflated(plain, zlib.compress(b"x"))  # type: ignore[arg-type]


def test_the_runner_deflates_only_a_tar_of_mostly_padding() -> None:
    """A chunk that is mostly zeros (the tar of small files) goes deflated; source text and random bytes go
    as they are, untried."""
    from toolcage.files import upload

    d = upload._Deflate()
    small_files = (b"x" * 100 + bytes(924)) * 2048  # each 100-byte file: its header and its padding
    assert d.chunk(small_files).get("deflated") is True
    text = b"def f(x):\n    return x + 1\n" * 70_000
    assert d.chunk(text) == {"frame": text}
    noise = os.urandom(1 << 20)
    assert d.chunk(noise) == {"frame": noise}


def test_the_walk_is_os_walk_by_scandir(tmp_path: Path) -> None:
    """upload._walk gives what os.walk gives, in its order: the caller's pruning and sorting of dirnames
    decide what is walked next, a symlink to a directory is listed with the directories and never entered,
    and a directory swapped for a symlink after it was listed is not walked into (asked with an lstat before
    each, as os.walk does)."""
    for d in ("b/y", "a/x/deep", "c", "skip/me"):
        (tmp_path / d).mkdir(parents=True)
    for f in ("a/1", "a/x/deep/2", "b/3", "top"):
        (tmp_path / f).write_text(f)
    (tmp_path / "ln").symlink_to("a")
    (tmp_path / "out").symlink_to("/etc")

    def ours() -> list[tuple[str, list[str], list[str]]]:
        got = []
        for dirpath, rel, dirnames, filenames, found in host._walk(str(tmp_path)):
            assert rel == ("" if dirpath == str(tmp_path) else os.path.relpath(dirpath, tmp_path))
            assert all(found[n].path == os.path.join(dirpath, n) for n in dirnames + filenames)
            dirnames[:] = sorted(d for d in dirnames if d != "skip")
            got.append((dirpath, list(dirnames), sorted(filenames)))
        return got

    def theirs() -> list[tuple[str, list[str], list[str]]]:
        got = []
        for dirpath, dirnames, filenames in os.walk(tmp_path):
            dirnames[:] = sorted(d for d in dirnames if d != "skip")
            got.append((dirpath, list(dirnames), sorted(filenames)))
        return got

    assert ours() == theirs()
    assert not any(p.endswith(("/ln", "/out")) for p, _, _ in ours())  # listed, never entered

    # a directory replaced by a link between its listing and its walk: the link is not followed
    walk = host._walk(str(tmp_path))
    _, _, dirnames, _, _ = next(walk)
    dirnames[:] = ["a"]
    (tmp_path / "a").rename(tmp_path / "a-moved")
    (tmp_path / "a").symlink_to("/etc")
    assert [p for p, *_ in walk] == []


def test_the_walk_asks_each_directory_when_it_enters_it(tmp_path: Path) -> None:
    """A later sibling swapped for a link while an earlier sibling's subtree is walked is not entered: the
    lstat is asked when the directory is entered, as os.walk does, not when its parent was listed (an
    attack on the first version of _walk: the copy then sent a file the link led to)."""
    ws, outside = tmp_path / "ws", tmp_path / "outside"
    (ws / "a/inner").mkdir(parents=True)
    (ws / "a/inner/f").write_text("f")
    (ws / "b").mkdir()
    outside.mkdir()
    (outside / "SECRET").write_text("host secret")
    walk = host._walk(str(ws))
    _, _, dirnames, _, _ = next(walk)
    dirnames.sort()  # a, then b
    seen = [next(walk)[0]]  # inside a now
    (ws / "b").rename(tmp_path / "b-moved")
    (ws / "b").symlink_to(outside)
    seen += [dirpath for dirpath, *_ in walk]
    assert seen == [str(ws / "a"), str(ws / "a/inner")]
    names = [name for _, name, _ in host._entries(str(ws))]
    assert "b/SECRET" not in names and "b" in names


def test_the_copy_never_reads_through_a_directory_swapped_for_a_link_after_the_scan(tmp_path: Path) -> None:
    """The copy's tar reaches each entry through its parent's descriptor, opened beneath the workspace without
    following a link (upload._Beneath). Opened by path (O_NOFOLLOW guards the last component only), a
    directory swapped for a link after the scan led the copy to the file of the same name behind it, whose
    bytes went into the sandbox."""
    ws, outside = tmp_path / "ws", tmp_path / "outside"
    (ws / "b").mkdir(parents=True)
    (ws / "b/passwd").write_text("the workspace's own")
    (ws / "c").mkdir()
    (ws / "c/keep").write_text("kept")
    outside.mkdir()
    (outside / "passwd").write_text("HOST SECRET")
    scanned = host.scan(ws)
    (ws / "b").rename(tmp_path / "b-moved")
    (ws / "b").symlink_to(outside)
    data = b"".join(host._tar(scanned.local, False, scanned.withheld, scanned.names, host.Sent(), scanned.files))
    assert b"HOST SECRET" not in data
    with tarfile.open(fileobj=io.BytesIO(data)) as tf:
        got = {m.name: m for m in tf.getmembers()}
    assert got["b"].issym() and "b/passwd" not in got and "c/keep" in got  # the link is sent as a link


def test_a_worker_from_before_listed_is_asked_again_with_native_alone() -> None:
    """A worker that takes native but not listed refuses it by name: the copy goes on natively, GNU tar naming
    the entries as before, and no names follow the tar."""
    from toolcage.files import upload

    refused = CallResult(
        "error", "upload", "run", error={"code": -32602, "message": "bad", "data": [{"field": "listed"}]}
    )
    old = _Scripted(refused, _ok(stream="s", frames=True), _ok(stream="s", done=True, native=True))
    upload.send(old, iter([b"x" * 10]), "/workspace", base=True, sent=upload.Sent(files=1, listed=["a"]))
    assert old.calls[0].get("listed") is True and old.calls[1].get("native") is True, old.calls
    assert "listed" not in old.calls[1] and len(old.calls) == 3 and old.calls[2].get("done") is True, old.calls
    assert not any(c.get("names") for c in old.calls), old.calls


@pytest.fixture
def copy_worker(scratch: Path, monkeypatch: pytest.MonkeyPatch) -> InProcess:
    """The upload tool of a run with a workspace copy, its runtime's GNU tar the host's (the same program)."""
    import shutil

    from toolcage.worker.tools import untar

    found = shutil.which("tar")
    if found is None:
        pytest.fail("no tar on this host: the worker image's runtime carries GNU tar, and so must the test host")
    monkeypatch.setattr(untar, "TAR", found)
    raw = validate_policy({"timeouts": {"call_s": 5, "run_s": 20}}).canonical_json()
    return InProcess(Settings(raw, str(scratch.parent / "ws"), str(scratch), "test", workspace_copy=True))


class _Recorded:
    """``call``, with the params of each call kept."""

    def __init__(self, call: InProcess) -> None:
        self.call, self.calls = call, []

    def __call__(self, params: dict[str, Any]) -> CallResult:
        self.calls.append(params)
        return self.call(params)


def test_a_listed_copy_names_its_entries_and_the_worker_keeps_those_names(
    copy_worker: InProcess, scratch: Path, tmp_path: Path
) -> None:
    """The runner names the tar's files and symlinks after the tar (GNU tar then names nothing as it extracts):
    the worker's base for changes() is exactly those names, however odd (a newline, a backslash, bytes that
    are no UTF-8, a link), without the directories; the tree is extracted whole."""
    from toolcage.worker.tools import workspace

    tree = tmp_path / "tree"
    (tree / "sub").mkdir(parents=True)
    odd = ["plain", "new\nline", "back\\slash", os.fsdecode(b"b\xffad"), "x" * 150]
    for n in odd:
        (tree / "sub" / n).write_bytes(b"abc")
    (tree / "link").symlink_to("sub/plain")
    rec = _Recorded(copy_worker)
    got = host.upload(rec, tree, "/workspace", base=True, checked=True, scanned=host.scan(tree))
    assert rec.calls[0].get("listed") is True and rec.calls[-1].get("names") is True, rec.calls
    assert rec.calls[-1].get("done") is True and not any(c.get("done") for c in rec.calls[:-1]), rec.calls
    want = {"link", *(f"sub/{n}" for n in odd)}
    assert set(workspace._bases["/workspace"][0].split("\0")) == want
    assert (got.files, got.symlinks, got.dirs) == (len(odd), 1, 1)
    ws = scratch.parent / "ws"
    assert sorted(os.listdir(ws / "sub")) == sorted(odd) and os.readlink(ws / "link") == "sub/plain"


def test_a_listed_stream_takes_names_only_after_its_tar_and_needs_them(copy_worker: InProcess, scratch: Path) -> None:
    """Names on a stream that did not offer to take them, a chunk of tar after the names, and a listed stream
    that ends with no names are refused, with nothing kept."""
    raw = tar_bytes([info("a", data=b"x")])
    opened = copy_worker({"path": "/workspace", "base": True, "native": True})  # not listed
    assert opened.ok and "listed" not in opened.result, opened.result
    res = copy_worker({"stream": opened.result["stream"], "frame": b"a", "names": True, "done": True})
    assert not res.ok and "did not offer" in res.error["message"], res.error
    for after_names in (True, False):
        opened = copy_worker({"path": "/workspace", "base": True, "native": True, "listed": True})
        assert opened.result.get("listed") is True, opened.result
        sid = opened.result["stream"]
        assert copy_worker({"stream": sid, "frame": raw}).ok
        if after_names:
            assert copy_worker({"stream": sid, "frame": b"a", "names": True}).ok
            res = copy_worker({"stream": sid, "frame": raw, "done": True})
            assert not res.ok and "after its names" in res.error["message"], res.error
        else:
            res = copy_worker({"stream": sid, "frame": b"", "done": True})
            assert not res.ok and "named none" in res.error["message"], res.error
        assert "nothing was kept" in res.error["message"]
    assert os.listdir(scratch.parent / "ws") == []


def test_a_file_changed_between_the_scan_and_the_copy_is_checked_again(
    copy_worker: InProcess, scratch: Path, tmp_path: Path
) -> None:
    """The copy takes the scan's verdict for a file only while it is the same inode with the same ctime: one
    made 0600 after the scan, one replaced by a 0600 file, and one whose ACL denies the sandbox user since are
    withheld (read again, as the mount would refuse them); one left alone is sent without a second ACL read."""
    import struct

    tree = tmp_path / "tree"
    tree.mkdir()
    for n in ("chmodded", "replaced", "acl", "alone"):
        (tree / n).write_bytes(b"secret " + n.encode())
    scanned = host.scan(tree)
    (tree / "chmodded").chmod(0o600)
    (tree / "new").write_bytes(b"other")
    (tree / "new").chmod(0o600)
    os.replace(tree / "new", tree / "replaced")
    # setfacl -m u:65532:--- acl (the kernel's xattr form: user::rw-, user:65532:---, group::r--, mask::r--,
    # other::r--); the mode stays 0644
    entries = [(0x01, 6, 0xFFFFFFFF), (0x02, 0, 65532), (0x04, 4, 0xFFFFFFFF), (0x10, 4, 0xFFFFFFFF)]
    entries.append((0x20, 4, 0xFFFFFFFF))
    acl = struct.pack("<I", 2) + b"".join(struct.pack("<HHI", *e) for e in entries)
    os.setxattr(tree / "acl", "system.posix_acl_access", acl)
    assert (tree / "acl").stat().st_mode & 0o777 == 0o644
    got = host.upload(copy_worker, tree, "/workspace", base=True, checked=True, scanned=scanned)
    ws = scratch.parent / "ws"
    withheld = {"chmodded", "replaced", "acl"}
    assert set(got.withheld) == withheld, got.withheld
    assert sorted(os.listdir(ws)) == sorted({"chmodded", "replaced", "acl", "alone"} - withheld)
    assert (ws / "alone").read_bytes() == b"secret alone"


@pytest.mark.parametrize("bound", ["SCAN_KEEP", "NAMES_MAX"])
def test_a_copy_whose_names_the_runner_does_not_keep_is_named_by_gnu_tar(
    copy_worker: InProcess, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, bound: str
) -> None:
    """Past the scan's bound on the names it keeps (host memory), or when the names would not fit the worker's
    bound on what it takes after the tar, the runner offers no names: GNU tar names the entries as it makes
    them, the copy is whole and the worker's base is the same."""
    from toolcage.worker.tools import workspace

    tree = tmp_path / "tree"
    (tree / "sub").mkdir(parents=True)
    for n in ("a", "b", "new\nline"):
        (tree / "sub" / n).write_bytes(b"x")
    monkeypatch.setattr(host, bound, 1 if bound == "SCAN_KEEP" else 8)
    scanned = host.scan(tree)
    rec = _Recorded(copy_worker)
    got = host.upload(rec, tree, "/workspace", base=True, checked=True, scanned=scanned)
    assert rec.calls[0].get("native") is True and "listed" not in rec.calls[0], rec.calls[0]
    assert not any(c.get("names") for c in rec.calls), rec.calls
    assert set(workspace._bases["/workspace"][0].split("\0")) == {"sub/a", "sub/b", "sub/new\nline"}
    assert got.files == 3
