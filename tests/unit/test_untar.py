"""worker.tools.untar: GNU tar's names read back exactly, its failures as the worker's errors (the host's GNU
tar stands in for the runtime's, which is the same program; a script stands in for a failing one)."""

from __future__ import annotations

import io
import os
import shutil
import tarfile
from pathlib import Path

import pytest

from toolcage.worker.errors import NoSpace, ToolError
from toolcage.worker.tarheader import header
from toolcage.worker.tools import untar

NAMES = ["a.txt", "sp ace", "new\nline", "back\\slash", "tab\tx", "caf\u00e9", os.fsdecode(b"b\xffad"), "x" * 150]


def _tar(names: list[str]) -> bytes:
    buf = io.BytesIO()
    buf.write(header("d", tarfile.DIRTYPE, 0o755, 1_700_000_000))
    for n in names:
        buf.write(header(f"d/{n}", tarfile.REGTYPE, 0o644, 1_700_000_000, 3) + b"abc" + bytes(509))
    buf.write(header("d/l", tarfile.SYMTYPE, 0o777, 1_700_000_000, linkname="/etc/passwd"))
    buf.write(bytes(1024))
    return buf.getvalue()


@pytest.fixture
def gnu_tar(monkeypatch: pytest.MonkeyPatch) -> str:
    found = shutil.which("tar")
    if found is None:
        pytest.fail("no tar on this host: the worker image's runtime carries GNU tar, and so must the test host")
    monkeypatch.setattr(untar, "TAR", found)
    return found


def test_every_name_comes_back_exactly(gnu_tar: str, tmp_path: Path) -> None:
    """Names with a newline, a backslash, a tab, bytes that are no UTF-8 and 150 bytes are what tar made,
    kinds told by the trailing slash: what record_base needs for the diff."""
    got = untar.extract(io.BytesIO(_tar(NAMES)), str(tmp_path), "/workspace")
    assert got.kinds == {"d": "dir", "d/l": "file", **{f"d/{n}": "file" for n in NAMES}}
    assert (got.dirs, got.files) == (1, len(NAMES) + 1)
    assert sorted(os.listdir(tmp_path / "d")) == sorted([*NAMES, "l"])
    assert os.readlink(tmp_path / "d" / "l") == "/etc/passwd"
    assert (tmp_path / "d" / "new\nline").read_bytes() == b"abc"


def _fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, said: str) -> None:
    script = tmp_path / "tar"
    script.write_text(f"#!/bin/sh\ncat >/dev/null\necho '{said}' >&2\nexit 2\n")
    script.chmod(0o755)
    monkeypatch.setattr(untar, "TAR", str(script))


def test_a_full_root_is_the_clear_full_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _fake(tmp_path, monkeypatch, "tar: d/a: Cannot write: No space left on device")
    with pytest.raises(NoSpace) as info:
        untar.extract(io.BytesIO(_tar(["a"])), str(tmp_path), "/workspace")
    assert "workspace" in str(info.value) and info.value.data == {"reason": "workspace_full"}


def test_any_other_failure_says_what_tar_said(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _fake(tmp_path, monkeypatch, "tar: Unexpected EOF in archive")
    with pytest.raises(ToolError, match="Unexpected EOF") as info:
        untar.extract(io.BytesIO(_tar(["a"])), str(tmp_path), "/workspace")
    assert not isinstance(info.value, NoSpace)


def test_a_tar_that_stops_reading_does_not_hang_the_feed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """tar exits before it read the archive (the pipe breaks): the error, not a writer blocked for ever."""
    script = tmp_path / "tar"
    script.write_text("#!/bin/sh\necho 'tar: refused' >&2\nexit 2\n")
    script.chmod(0o755)
    monkeypatch.setattr(untar, "TAR", str(script))
    with pytest.raises(ToolError, match="refused"):
        untar.extract(io.BytesIO(bytes(8 << 20)), str(tmp_path), "/workspace")


def test_the_runtime_tar_is_never_one_on_the_path() -> None:
    """The tar that runs is named by its absolute place in toolcage's runtime, and gets no environment of the
    image's (TAR_OPTIONS, LD_*)."""
    assert untar.TAR == "/opt/toolcage/rt/bin/tar"
    import inspect

    src = inspect.getsource(untar.extract)
    assert 'env={"LC_ALL": "C", "PATH": "/nonexistent"}' in src
