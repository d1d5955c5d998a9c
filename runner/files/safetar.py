"""The safe half of a download: a hostile tar stream extracted into a staging directory, checked entry by entry.

Threat: every byte is chosen by code in the sandbox (toolcage.files.download fetches it). Refused, the whole
download with them: absolute names, ``..``, hard links, devices, FIFOs, unknown entry types, sparse and
oversized headers, and any entry under (or named like) a symlink or file the archive made. Skipped and
reported, by the rule every door out uses (toolcage.files.outbound.door_problem): ``.git`` and every name git
takes for it, with all beneath it (git on the host would read its config, ``core.fsmonitor``, and run its
hooks), a ``HEAD`` that would make a directory a bare repository, a symlink whose target leaves the target
directory (absolute, climbing with ``..``, coming back up through a symlink, or through a host symlink that
leads out) or names ``.git``; and a name with control characters. setuid, setgid, sticky and group/other write
bits are cleared; caps on bytes and entries are checked at each header. Symlinks are made last, each checked
against every link of the archive; nothing is opened through a symlink. Python's ``tarfile.data_filter``
checks each entry too, as a second layer."""

from __future__ import annotations

import contextlib
import os
import re
import stat
import tarfile
from collections.abc import Callable
from dataclasses import dataclass, field

from toolcage.errors import DownloadError as DownloadError  # re-exported: the download door raises them
from toolcage.errors import DownloadLimit as DownloadLimit
from toolcage.errors import DownloadUsage as DownloadUsage
from toolcage.files.outbound import BARE_MARKS, BARE_REASON, GIT_REASON, bare_mark, git_part
from toolcage.files.outbound import bare_head as bare_head  # re-exported: the diff's doors import them from here
from toolcage.files.outbound import door_problem as door_problem
from toolcage.files.outbound import show as show
from toolcage.worker.tools.paths import Parents, dir_beneath

_MAX_HEADER = 1 << 20  # a PAX or GNU long-name header's payload
# Directories an entry may be nested in. Threat: a 4,096-byte name holds 2,000 levels ('a/a/...'), and the
# staging's removal (shutil.rmtree recurses a level a frame in Python 3.11) raised RecursionError: a traceback,
# and the staging left in the target (a helper session's attack). No tree a tool makes comes near it.
MAX_DEPTH = 256
_MAX_SKIPPED = 1000  # skipped entries named in the result (all are counted)
_PIECE = 1 << 20
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")
_META_TYPES = (tarfile.GNUTYPE_LONGNAME, tarfile.GNUTYPE_LONGLINK, tarfile.XHDTYPE, tarfile.XGLTYPE, b"X")


@dataclass
class DownloadResult:
    """What a download wrote into ``local_dir``: entries, bytes of file content, what it skipped and why."""

    local_dir: str
    files: int = 0
    dirs: int = 0
    symlinks: int = 0
    bytes: int = 0
    skipped: list[dict[str, str]] = field(default_factory=list)
    skipped_count: int = 0

    def skip(self, name: str, reason: str) -> None:
        self.skipped_count += 1
        if len(self.skipped) < _MAX_SKIPPED:
            self.skipped.append({"path": show(name), "reason": reason})


class Info(tarfile.TarInfo):
    """Refuses, before tarfile reads it, a header whose payload would be held in memory whole."""

    def _proc_member(self, tf: tarfile.TarFile) -> tarfile.TarInfo:
        if self.type in _META_TYPES and self.size > _MAX_HEADER:
            raise DownloadError(f"download: a {self.size}-byte tar header (more than {_MAX_HEADER}) was refused")
        if self.type == tarfile.GNUTYPE_SPARSE:
            raise DownloadError("download: a sparse entry was refused")
        return super()._proc_member(tf)  # type: ignore[misc,no-any-return]


Content = Callable[[tarfile.TarFile, tarfile.TarInfo], "Callable[[int], bytes | memoryview] | None"]


class Extractor:
    def __init__(
        self,
        staging: str,
        local_dir: str,
        max_bytes: int,
        max_files: int,
        result: DownloadResult,
        content: Content | None = None,
    ) -> None:
        """``content``: how to read a large entry's bytes without tarfile's copies, from the stream that feeds
        it (toolcage.files.download), or None to read them through ``extractfile``."""
        self.staging, self.local_dir, self.result = staging, local_dir, result
        self._content = content
        self.max_bytes, self.max_files = max_bytes, max_files
        self.root = os.open(staging, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        self.kinds: dict[str, str] = {}  # every path the archive made (parents too): "dir", "file" or "link"
        self.links: list[tuple[list[str], str]] = []  # made last, once every name is known
        self.dir_modes: list[tuple[list[str], int]] = []
        self.heads: list[list[str]] = []  # HEAD files: a bare repository's mark, checked once every name is known
        self.gits: set[str] = set()  # .git directories skipped (named once in the result, each entry counted)
        self.entries = 0
        self._parents = Parents(self.root, create=True)  # the last entry's parent, kept open

    def parent(self, parts: list[str]) -> int:
        """The directory ``parts`` beneath the staging (:class:`Parents`: made when missing, the last one
        kept); nothing in the staging can turn into a symlink meanwhile (the archive's links are made in
        :meth:`finish`, after every name is known)."""
        return self._parents.fd(parts)

    def refuse(self, name: str, why: str) -> DownloadError:
        return DownloadError(f"download refused: '{show(name)}' {why}; nothing was kept", path=show(name))

    def parts(self, m: tarfile.TarInfo) -> list[str] | None:
        name = m.name
        if _CONTROL.search(name) or _CONTROL.search(m.linkname):
            self.result.skip(name, "a control character in its name or link target")
            return None
        if name.startswith("/"):
            raise self.refuse(name, "is an absolute path")
        parts = [p for p in name.split("/") if p not in ("", ".")]
        if ".." in parts:
            raise self.refuse(name, "climbs out with '..'")
        raw = os.fsencode(name)
        if len(raw) > 4096 or any(len(os.fsencode(p)) > 255 for p in parts):
            raise self.refuse(name, "is longer than a file name may be")
        if len(parts) > MAX_DEPTH:
            raise self.refuse(name, f"is nested more than {MAX_DEPTH} directories deep")
        if not parts:
            if m.isdir():
                return None  # "./": the directory itself
            raise self.refuse(name, "has no name")
        for i in range(1, len(parts)):
            kind = self.kinds.get("/".join(parts[:i]))
            if kind not in (None, "dir"):
                raise self.refuse(name, f"would be written through a {'symlink' if kind == 'link' else 'file'}")
        if "/".join(parts) in self.kinds:
            raise self.refuse(name, "comes twice in the archive")
        return parts

    def count(self, name: str) -> None:
        self.entries += 1
        if self.entries > self.max_files:
            raise DownloadLimit(
                f"download stopped: more than {self.max_files} entries (max_files); nothing was kept", path=show(name)
            )

    def member(self, tf: tarfile.TarFile, m: tarfile.TarInfo) -> None:
        self.count(m.name)
        if m.sparse is not None:
            raise self.refuse(m.name, "is a sparse file")
        if m.islnk():
            raise self.refuse(m.name, "is a hard link (a download takes none)")
        if m.ischr() or m.isblk():
            raise self.refuse(m.name, "is a device node")
        if m.isfifo():
            raise self.refuse(m.name, "is a FIFO")
        if not (m.isreg() or m.isdir() or m.issym()):
            raise self.refuse(m.name, f"has an entry type a download does not take ({m.type!r})")
        if m.isreg() and m.size > self.max_bytes - self.result.bytes:
            raise DownloadLimit(
                f"download stopped: '{show(m.name)}' is {m.size} bytes, past the cap of {self.max_bytes} bytes"
                " (max_bytes); nothing was kept",
                path=show(m.name),
            )
        parts = self.parts(m)
        if parts is None or self.git(parts):
            return
        for i in range(1, len(parts)):
            self.kinds.setdefault("/".join(parts[:i]), "dir")
        if m.issym():
            self.kinds["/".join(parts)] = "link"
            self.links.append((parts, m.linkname))
            return
        # (tarfile.data_filter is not asked as well: parts() refused what it would (absolute, '..'), and its
        # realpath walk, 11 lstat calls an entry, a quarter of a 10,000-file download, has no symlink to find:
        # the staging holds none until finish(), and every directory is opened O_NOFOLLOW)
        self.kinds["/".join(parts)] = "dir" if m.isdir() else "file"
        if parts[-1] == "HEAD" and not m.isdir():
            self.heads.append(parts)
        pfd = self.parent(parts[:-1])
        if m.isdir():
            with contextlib.suppress(FileExistsError):
                os.mkdir(parts[-1], 0o700, dir_fd=pfd)
            self.dir_modes.append((parts, (m.mode & 0o755) | 0o700))
            self.result.dirs += 1
        else:
            self.write(tf, m, pfd, parts[-1])

    def write(self, tf: tarfile.TarFile, m: tarfile.TarInfo, pfd: int, name: str) -> None:
        read = self._content(tf, m) if self._content is not None else None
        if read is None:
            src = tf.extractfile(m)
            assert src is not None
            read = src.read
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(name, flags, 0o600, dir_fd=pfd)
        try:
            left = m.size
            while left:
                piece = read(min(_PIECE, left))
                if not piece:
                    raise self.refuse(m.name, "ends before its size")
                view = memoryview(piece)
                while view:
                    view = view[os.write(fd, view) :]
                left -= len(piece)
            os.fchmod(fd, m.mode & 0o755)
            os.utime(fd, (m.mtime, m.mtime))
        finally:
            os.close(fd)
        self.result.files += 1
        self.result.bytes += m.size

    def git(self, parts: list[str]) -> bool:
        """Whether the entry is .git or beneath one (door_problem): skipped, its .git named once in the result."""
        at = next((i for i, p in enumerate(parts) if git_part(p)), None)
        if at is None:
            return False
        top = "/".join(parts[: at + 1])
        if top in self.gits:
            self.result.skipped_count += 1
        else:
            self.gits.add(top)
            self.result.skip(top, f"{GIT_REASON}; all beneath it was left out")
        return True

    def finish(self) -> None:
        for parts in self.heads:
            if bare_head(parts, self.local_dir, self.kinds):
                pfd = dir_beneath(self.root, parts[:-1], create=False)
                try:
                    self.result.bytes -= os.stat(parts[-1], dir_fd=pfd, follow_symlinks=False).st_size
                    os.unlink(parts[-1], dir_fd=pfd)
                finally:
                    os.close(pfd)
                self.result.files -= 1
                self.result.skip("/".join(parts), BARE_REASON)
        not_heads = {k: v for k, v in self.kinds.items() if k.split("/")[-1] != "HEAD"}
        for rel in list(self.kinds):  # objects/, refs/ or commondir beside a HEAD the host has (an earlier download's)
            parts = rel.split("/")
            if parts[-1] in BARE_MARKS and bare_mark(parts, self.local_dir, not_heads):
                raise self.refuse(rel, BARE_REASON)
        for parts, target in self.links:
            problem = door_problem("/".join(parts), target, self.local_dir, self.kinds)
            if problem is not None:
                self.result.skip("/".join(parts), problem)
                continue
            pfd = dir_beneath(self.root, parts[:-1], create=True)
            try:
                os.symlink(target, parts[-1], dir_fd=pfd)
            finally:
                os.close(pfd)
            self.result.symlinks += 1
        for parts, mode in reversed(self.dir_modes):
            pfd = dir_beneath(self.root, parts[:-1], create=False)
            try:
                os.chmod(parts[-1], mode, dir_fd=pfd)  # a directory: no entry may share its name
            finally:
                os.close(pfd)

    def close(self) -> None:
        self._parents.close()
        os.close(self.root)


def merge(src: str, dst: str) -> None:
    """Move what ``src`` holds into ``dst``: a file by rename (whole or not at all), a directory merged. Checked
    whole before anything moves: an entry whose kind clashes with what ``dst`` has (a directory where it has
    a file or link, or the other way) is UsageError and ``dst`` is left as it was; before, the entries sorted
    ahead of it had been moved in (files of ``dst`` replaced) when it was found (a helper session's attack).
    A walk with a stack, not a recursion per level."""
    moves: list[tuple[str, str, bool]] = []  # (from, to, replaces a file or link there)
    stack = [(src, dst)]
    while stack:
        src_dir, dst_dir = stack.pop()
        for name in sorted(os.listdir(src_dir)):
            s, d = os.path.join(src_dir, name), os.path.join(dst_dir, name)
            try:
                dst_st = os.lstat(d)
            except FileNotFoundError:
                moves.append((s, d, False))
                continue
            src_is_dir = stat.S_ISDIR(os.lstat(s).st_mode)
            if src_is_dir and stat.S_ISDIR(dst_st.st_mode):
                stack.append((s, d))
            elif src_is_dir or stat.S_ISDIR(dst_st.st_mode):
                raise DownloadUsage(
                    f"download: '{show(d)}' exists as a {'file or link' if src_is_dir else 'directory'}; move it "
                    "away first (nothing was moved in)"
                )
            else:
                moves.append((s, d, True))
    for s, d, replace in moves:
        (os.replace if replace else os.rename)(s, d)
