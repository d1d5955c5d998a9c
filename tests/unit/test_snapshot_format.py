"""The snapshot's seal, its bounded reading and its secret scan in process (toolcage.files.snapseal,
toolcage.files.snapscan), with the worker's real download tool as the sandbox's side: no Docker."""

from __future__ import annotations

import base64
import codecs
import gzip
import hashlib
import io
import os
import resource
import tarfile
import time
import zlib
from pathlib import Path
from typing import Any

import pytest

from tests.unit.test_download_tool import InProcess, settings
from toolcage.files import download as transfer
from toolcage.files import snapshot
from toolcage.files.snapscan import INFLATE_FILE, SecretScan
from toolcage.files.snapshot import SnapshotError, SnapshotInvalid
from toolcage.policies import validate_policy

KEY = b"k" * 32
VALUE = "tcsecret_" + "0123456789abcdef" * 2


@pytest.fixture
def roots(tmp_path: Path) -> tuple[Path, Path]:
    ws, scratch = tmp_path / "ws", tmp_path / "scratch"
    ws.mkdir()
    scratch.mkdir()
    (scratch / "a.txt").write_text("hello\n")
    (scratch / "d").mkdir()
    (scratch / "d" / "b.bin").write_bytes(os.urandom(3000))
    os.symlink("/etc/passwd", scratch / "pw")
    return ws, scratch


def make(
    roots: tuple[Path, Path], target: Path | io.BytesIO, values: tuple[str, ...] = (), **kw: Any
) -> snapshot.SnapshotInfo:
    worker = InProcess(settings(*roots))
    return snapshot.write(
        lambda tool, params: worker(params), target, workspace=False, meta={"toolcage": "t", "changed": []},
        secret_values=list(values), key=KEY, **kw,
    )  # fmt: skip


def test_a_snapshot_round_trips_through_its_seal(roots: tuple[Path, Path], tmp_path: Path) -> None:
    """What write() made, verify() takes, and tar_of() gives back every entry; the seal is the last 2 KiB."""
    info = make(roots, tmp_path / "s.tar")
    assert (info.files, info.dirs, info.symlinks) == (2, 1, 1)
    got = snapshot.verify(tmp_path / "s.tar", KEY)
    assert got.entries == 4 and got.manifest["version"] == 2 and "entries" not in got.manifest
    with tarfile.open(fileobj=io.BytesIO(b"".join(got.tar_of("scratch")))) as tf:
        assert sorted(m.name for m in tf) == ["a.txt", "d", "d/b.bin", "pw"]
    with tarfile.open(tmp_path / "s.tar") as tf:
        assert [m.name for m in tf][-2:] == ["manifest.json", "signature.json"]


def test_a_snapshot_written_to_a_stream_resumes_from_a_stream(roots: tuple[Path, Path]) -> None:
    """A binary stream as the target and as the source (spooled, then removed): the same checks, the same files."""
    buf = io.BytesIO()
    info = make(roots, buf)
    assert info.path is None and info.sha256 == hashlib.sha256(buf.getvalue()).hexdigest()
    got = snapshot.verify(io.BytesIO(buf.getvalue()), KEY)
    assert got.spooled and got.entries == 4
    with tarfile.open(fileobj=io.BytesIO(b"".join(got.tar_of("scratch")))) as tf:
        assert len(tf.getmembers()) == 4
    got.close()
    assert not os.path.exists(got.path)


def test_a_file_changed_after_verify_is_caught_while_it_is_resumed(roots: tuple[Path, Path], tmp_path: Path) -> None:
    """A byte changed between verify() and the upload: tar_of() raises before the tar's end blocks."""
    make(roots, tmp_path / "s.tar")
    got = snapshot.verify(tmp_path / "s.tar", KEY)
    raw = bytearray((tmp_path / "s.tar").read_bytes())
    raw[raw.index(b"hello\n")] ^= 1
    (tmp_path / "s.tar").write_bytes(bytes(raw))
    with pytest.raises(SnapshotInvalid, match="changed while it was resumed"):
        b"".join(got.tar_of("scratch"))


@pytest.mark.parametrize(
    ("edit", "why"),
    [
        (lambda raw: raw[:-1024], "no toolcage snapshot signature"),
        (lambda raw: raw + bytes(512), "no toolcage snapshot signature"),
        (lambda raw: raw.replace(b"hello\n", b"hellO\n"), "changed after it was made"),
        (
            lambda raw: raw[:-1536] + raw[-1536:-1024].replace(b'"sha256": "', b'"sha256": "0')[:512] + raw[-1024:],
            "another host's key",
        ),
        (lambda raw: b"", "no toolcage snapshot signature"),
    ],
    ids=["cut", "padded", "a byte", "the seal edited", "empty"],
)
def test_an_edited_archive_is_refused(roots: tuple[Path, Path], tmp_path: Path, edit: Any, why: str) -> None:
    """Each edit is refused by the seal, with its reason."""
    make(roots, tmp_path / "s.tar")
    bad = tmp_path / "bad.tar"
    bad.write_bytes(edit((tmp_path / "s.tar").read_bytes()))
    with pytest.raises(SnapshotInvalid, match=why):
        snapshot.verify(bad, KEY)


def test_an_unsigned_archive_is_refused_without_reading_its_headers(tmp_path: Path) -> None:
    """A tar of 2,000 long names and no seal: refused in well under a second, its headers never parsed."""
    bad = tmp_path / "bad.tar"
    with open(bad, "wb") as f:
        for i in range(2000):
            f.write(tarfile.TarInfo(f"scratch/{i:05d}" + "n" * 3900).tobuf(tarfile.PAX_FORMAT))
        f.write(bytes(1024))
    t = time.monotonic()
    with pytest.raises(SnapshotInvalid, match="format version 1"):
        snapshot.verify(bad, KEY)
    assert time.monotonic() - t < 0.5


def test_the_writer_refuses_more_entries_than_a_resume_takes(roots: tuple[Path, Path], tmp_path: Path) -> None:
    """max_files cannot pass MAX_FILES, and past it the snapshot is refused with nothing written."""
    with pytest.raises(SnapshotError, match="max_files"):
        make(roots, tmp_path / "s.tar", max_files=2)
    assert not list(tmp_path.glob("s.tar*")) and not list(tmp_path.glob(".toolcage-snapshot-*"))


def test_the_policy_bounds_what_leaves(tmp_path: Path) -> None:
    """out_bound is the scratch's and the workspace copy's sizes together, whatever the stream claims."""
    pol = validate_policy({"limits": {"scratch": "64MiB", "workspace_copy": "128MiB"}})
    assert transfer.out_bound(pol.limits) == 192 << 20


def test_a_huge_pax_header_in_a_snapshot_stream_is_refused_unread(tmp_path: Path) -> None:
    """A hostile worker's 64 MiB PAX header (a name the runner would hold whole) is refused at its header."""
    from tests.unit.test_transfer import Worker

    ti = tarfile.TarInfo("././@PaxHeader")
    ti.type, ti.size = tarfile.XHDTYPE, 64 << 20
    stream = ti.tobuf(tarfile.USTAR_FORMAT) + bytes(4096)
    got = transfer.members(Worker(stream), {"path": "/scratch"}, max_bytes=1 << 30, max_files=10,
                           result=transfer.DownloadResult(""))  # fmt: skip
    with pytest.raises(transfer.DownloadError, match="tar header"):
        list(got)


def test_a_sparse_file_is_skipped_by_the_worker(tmp_path: Path) -> None:
    """A 1 GiB file with no blocks, where the sandbox writes: named as skipped, "sparse: ...", never sent."""
    ws, scratch = tmp_path / "ws", tmp_path / "scratch"
    ws.mkdir()
    scratch.mkdir()
    with open(scratch / "hole.bin", "wb") as f:
        f.truncate(1 << 30)
    (scratch / "kept.txt").write_text("kept\n")
    worker = InProcess(settings(ws, scratch))
    got = transfer.download(worker, "/scratch", tmp_path / "out", max_bytes=1 << 20)
    assert (tmp_path / "out" / "kept.txt").read_text() == "kept\n"
    assert not (tmp_path / "out" / "hole.bin").exists()
    assert got.skipped == [{"path": "hole.bin", "reason": "in the sandbox: sparse: 1073741824 bytes, 0 on disk"}]


# --- the secret scan -------------------------------------------------------------------------------------


def _forms(v: bytes) -> dict[str, bytes]:
    return {
        "plain": v,
        "reversed": v[::-1],
        "upper": v.upper(),
        "reversed, upper": v[::-1].upper(),
        "rot13": codecs.encode(v.decode(), "rot13").encode(),
        "base32": base64.b32encode(b"x=" + v),
        "base32, lower": base64.b32encode(b"xyz=" + v).lower(),
        "first half": v[: len(v) // 2 + 1],
        "second half, upper": v[len(v) // 2 :].upper(),
    }


@pytest.mark.parametrize("form", list(_forms(b"x")))
def test_the_scan_finds_each_cheap_form(form: str) -> None:
    """Each form, inside other text, is a hit; the text without it is not."""
    scan = SecretScan([VALUE])
    data = b"some text before " + _forms(VALUE.encode())[form] + b" and after"
    assert scan.hit(data)
    assert not scan.hit(b"some text before and after " + os.urandom(4096))


def test_the_scan_reads_gzip_and_zlib_within_a_budget() -> None:
    """A gzip (two members) or zlib file holding the value is a hit; the value past INFLATE_FILE is not read."""
    scan = SecretScan([VALUE])
    v = VALUE.encode()
    for data in (gzip.compress(b"a") + gzip.compress(b"x " + v), zlib.compress(b"token " + v)):
        assert any(hit for _, hit in scan.found(iter([data[:7], data[7:]])))
    far = zlib.compress(bytes(INFLATE_FILE + (1 << 20)) + v)
    assert not any(hit for _, hit in SecretScan([VALUE]).found(iter([far])))


def test_the_scan_reads_mtimes_as_text() -> None:
    """mtimes that spell the value, four bytes each, big-endian: stamped() is a hit; others are not."""
    v = VALUE.encode()
    scan = SecretScan([VALUE])
    for i in range(0, len(v), 4):
        scan.stamp(int.from_bytes(v[i : i + 4].ljust(4, b"_"), "big"))
    assert scan.stamped()
    other = SecretScan([VALUE])
    for t in range(1_700_000_000, 1_700_000_000 + 5000, 7):
        other.stamp(t)
    assert not other.stamped()


def test_a_flood_of_pieces_costs_the_scan_little() -> None:
    """A buffer full of a value's anchor (a quarter of it) is a hit at once, not a search per copy."""
    scan = SecretScan([VALUE])
    anchor = VALUE.encode()[:11]
    t = time.process_time()
    assert scan.hit((anchor + b"!") * 100_000)
    assert time.process_time() - t < 0.5


def test_a_refused_name_is_shown_without_the_value(roots: tuple[Path, Path], tmp_path: Path) -> None:
    """A file named with half the value, reversed: refused, and the message holds no part of it."""
    half = VALUE[: len(VALUE) // 2 + 1][::-1]
    (roots[1] / "d" / half).write_text("x")
    with pytest.raises(SnapshotError) as caught:
        make(roots, tmp_path / "s.tar", values=(VALUE,))
    assert "scratch/d/[a name that holds a secret value]" in str(caught.value), str(caught.value)
    assert half not in str(caught.value)


def test_the_runner_memory_of_a_scan_is_small() -> None:
    """The scan's state for 100,000 mtimes and a few values stays under 8 MiB."""
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    scan = SecretScan([VALUE, "another-secret-value-0123456789"])
    for t in range(100_000):
        scan.stamp(t)
    assert not scan.stamped()
    assert (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024 < 8 << 20
