"""toolcage.worker.tarheader writes what tarfile writes, byte for byte, on its fast path and off it."""

from __future__ import annotations

import itertools
import tarfile

from toolcage.worker.tarheader import header

NAMES = ["a", "d/e/f", "x" * 100, "x" * 101, "ünï", "a\udcff", "dir/", "sp ace", "n\nl", ""]
LINKS = ["", "t", "../up", "y" * 100, "y" * 101, "ü"]
TIMES = [0, 1.7e9, 1.7e9 + 0.9, 8**11 - 1, 8**11]
SIZES = [0, 5, 8**11 - 1, 8**11]
KINDS = [tarfile.REGTYPE, tarfile.DIRTYPE, tarfile.SYMTYPE]


def test_every_shape_is_tarfiles_own() -> None:
    for name, kind, mode, mtime, size, link in itertools.product(
        NAMES, KINDS, [0o644, 0o7777, 0o104755], TIMES, SIZES, LINKS
    ):
        info = tarfile.TarInfo(name)
        info.type, info.mode, info.mtime, info.size, info.linkname = kind, mode, int(mtime), size, link
        want = info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")
        assert header(name, kind, mode, mtime, size, link) == want, (name, kind, mode, mtime, size, link)


def test_it_reads_back() -> None:
    block = header("d/f.txt", tarfile.REGTYPE, 0o100640, 1_700_000_000.5, 3)
    info = tarfile.TarInfo.frombuf(block[:512], "utf-8", "surrogateescape")
    assert (info.name, info.mode, info.mtime, info.size, info.type) == ("d/f.txt", 0o640, 1_700_000_000, 3, b"0")
