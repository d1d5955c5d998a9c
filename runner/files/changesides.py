"""The two sides of each path ``changes()`` compares, held on disk in a private directory, never in memory.

Threat: the new sides are the sandbox's bytes (a flood of newlines, a sparse file sent as its zeros), the
old ones the host's files, which must be read without following a symlink of the host's tree out of it.
Each side is streamed in 1 MiB pieces into a file of the runner's own name in a 0700 temp directory
(runs of zeros become holes, so a file of zeros takes no disk), hashed and its lines counted on the way:
the runner's memory is one piece whatever the size, and what it reads is capped by the caller.
"""

from __future__ import annotations

import codecs
import contextlib
import errno
import hashlib
import os
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from toolcage.files.gitdiff import EXEC, FILE, LINK
from toolcage.files.safetar import show
from toolcage.policies.gitignore import Rules, ignored, with_own
from toolcage.worker.tools.paths import dir_beneath

PIECE = 1 << 20


class OverBudget(Exception):
    """More bytes than the caller may still read."""


class Unreadable(Exception):
    """A host file that cannot be read (permissions, I/O): the message says which."""


@dataclass(frozen=True)
class Side:
    """One side of one path: git mode, size, sha256, lines, the runner's copy (None: not kept), and whether
    it is text (UTF-8 without NUL: the diff stays UTF-8, as it was when Python wrote it)."""

    mode: str
    size: int
    digest: bytes
    lines: int = 0
    file: str | None = None
    text: bool = False

    def same(self, other: Side | None) -> bool:
        return other is not None and (self.mode, self.size, self.digest) == (other.mode, other.size, other.digest)


def link_side(target: bytes, file: str) -> Side:
    """A symlink's side: its target is its content (git's ``120000``)."""
    with open(file, "xb") as f:
        f.write(target)
    try:
        text = b"\0" not in target and bool(target.decode("utf-8"))
    except UnicodeDecodeError:
        text = False
    return Side(LINK, len(target), hashlib.sha256(target).digest(), 0, file, text)


def stream(src: IO[bytes], size: int, mode: str, file: str | None, budget: int) -> Side:
    """``size`` bytes of ``src`` as a side, kept in ``file`` (None: hashed only), OverBudget past ``budget``
    and OSError(EIO) when ``src`` ends early."""
    if size > budget:
        raise OverBudget
    digest, lines, text = hashlib.sha256(), 0, True
    utf8 = codecs.getincrementaldecoder("utf-8")()

    def seen(piece: bytes) -> None:
        nonlocal lines, text
        digest.update(piece)
        lines += piece.count(b"\n")
        if text:
            try:
                text = b"\0" not in piece and utf8.decode(piece) is not None
            except UnicodeDecodeError:
                text = False

    out = os.open(file, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600) if file is not None else None
    try:
        copy_holes(src, out, size, seen)
    finally:
        if out is not None:
            os.close(out)
    if text:
        try:
            utf8.decode(b"", final=True)
        except UnicodeDecodeError:
            text = False
    return Side(mode, size, digest.digest(), lines, file, text)


def copy_holes(src: IO[bytes], out: int | None, size: int, seen: Callable[[bytes], None] | None = None) -> None:
    """``size`` bytes of ``src`` into the fd ``out`` (None: read only), piece by piece; a piece of zeros
    becomes a hole, so the zeros a sandbox sends (a sparse file) take no disk here."""
    left = size
    while left:
        piece = src.read(min(PIECE, left))
        if not piece:
            raise OSError(errno.EIO, "the content ended before its size")
        left -= len(piece)
        if seen is not None:
            seen(piece)
        if out is not None:
            if piece.count(0) == len(piece):
                os.lseek(out, len(piece), os.SEEK_CUR)
            else:
                view = memoryview(piece)
                while view:
                    view = view[os.write(out, view) :]
    if out is not None:
        os.ftruncate(out, size)


class HostTree:
    """The host's workspace, read by directory fd: never through a symlink, never outside it."""

    def __init__(self, root: Path) -> None:
        self.root = os.path.abspath(root)
        self.fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)

    def kind(self, rel: str) -> str | None:
        """``dir``, ``other`` (a file, a symlink, anything else) or None (absent, or beyond a symlink)."""
        parts = rel.split("/")
        try:
            fd = dir_beneath(self.fd, parts[:-1], create=False)
        except OSError:
            return None
        try:
            st = os.stat(parts[-1], dir_fd=fd, follow_symlinks=False)
        except OSError:
            return None
        finally:
            os.close(fd)
        return "dir" if stat.S_ISDIR(st.st_mode) else "other"

    def ignored(self, rel: str) -> bool:
        """Whether the host's .gitignore files leave ``rel`` out of the copy, as the copy's walk decides
        (toolcage.files.upload): an ignored directory on the way, or the entry itself."""
        parts = rel.split("/")
        rules: tuple[Rules, ...] = ()
        fd: int | None = os.dup(self.fd)
        try:
            for i, part in enumerate(parts):
                if fd is not None:
                    rules = with_own(rules, fd, "/".join(parts[:i]))
                path, last = "/".join(parts[: i + 1]), i == len(parts) - 1
                if rules and ignored(rules, path, not last):
                    return True
                if last:
                    return bool(rules) and self.kind(rel) == "dir" and ignored(rules, path, True)
                if fd is not None:
                    try:
                        nxt: int | None = os.open(
                            part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd
                        )
                    except OSError:
                        nxt = None  # not a directory on the host: no .gitignore of the host's below
                    os.close(fd)
                    fd = nxt
        finally:
            if fd is not None:
                os.close(fd)
        return False

    def side(self, rel: str, file: str, keep_max: int, budget: int) -> Side | None:
        """``rel``'s side in the host's tree (None: absent, beyond a symlink, or not a file or symlink),
        copied into ``file`` when at most ``keep_max`` bytes (else only hashed); OverBudget past
        ``budget`` bytes read, Unreadable when it cannot be read."""
        parts = rel.split("/")
        try:
            fd = dir_beneath(self.fd, parts[:-1], create=False)
        except OSError as exc:
            if exc.errno in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP):
                return None  # absent, or beyond a symlink of the host's tree: not this path
            raise Unreadable(f"changes: cannot read '{show(rel)}' in the workspace: {exc.strerror}") from None
        try:
            st = os.stat(parts[-1], dir_fd=fd, follow_symlinks=False)
            if stat.S_ISLNK(st.st_mode):
                return link_side(os.fsencode(os.readlink(parts[-1], dir_fd=fd)), file)
            if not stat.S_ISREG(st.st_mode):
                return None
            ffd = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=fd)
            with os.fdopen(ffd, "rb", buffering=0) as f:
                size = os.fstat(f.fileno()).st_size
                mode = EXEC if st.st_mode & 0o100 else FILE
                return stream(f, size, mode, file if size <= keep_max else None, budget)
        except OSError as exc:
            if exc.errno in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP):
                return None
            raise Unreadable(f"changes: cannot read '{show(rel)}' in the workspace: {exc.strerror}") from None
        finally:
            os.close(fd)

    def close(self) -> None:
        os.close(self.fd)


def write_file(top: str, rel: str, side: Side) -> None:
    """One added or changed file under ``top`` (made by names already checked; never through a symlink)."""
    assert side.file is not None
    parts = rel.split("/")
    top_fd = os.open(top, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fd = dir_beneath(top_fd, parts[:-1], create=True, mode=0o755)
    finally:
        os.close(top_fd)
    try:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(parts[-1], dir_fd=fd)
        if side.mode == LINK:
            with open(side.file, "rb") as f:
                os.symlink(f.read(), parts[-1], dir_fd=fd)
            return
        mode = 0o755 if side.mode == EXEC else 0o644
        out = os.open(parts[-1], os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=fd)
        try:
            with open(side.file, "rb", buffering=0) as src:
                copy_holes(src, out, side.size)
        finally:
            os.close(out)
    finally:
        os.close(fd)


__all__ = ["PIECE", "HostTree", "OverBudget", "Side", "Unreadable", "copy_holes", "link_side", "stream", "write_file"]
