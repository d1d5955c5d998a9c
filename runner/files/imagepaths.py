"""Writable paths of the image (``writable=``): a tmpfs per path, filled with the image's own content there by
the runner, and the diff of what the run changed in it (issue 36, points 3 and 4).

Why this mechanism (docs/design/own-images.md, "Writable image paths"): a writable container root writes
into the storage driver's upper directory on the host disk, uncapped; ``--storage-opt size=`` is not portable;
a tmpfs volume is not filled from the image. A tmpfs at the path (``HostConfig.Tmpfs``, toolcage.engine.hostconfig)
is capped by the kernel (a writer past it gets ENOSPC, the sandbox lives on), charged to the run's memory,
private to the run and gone with its container. It starts empty, so the runner fills it:

- the engine reads the image's tree at the path as root (``GET /containers/{id}/archive?path=PATH`` of a
  container created from the image and never started: no code of the image runs, and the engine reads the
  layers whatever the sandbox's runtime), so root-only files are copied too (the sandbox user could not);
- the runner spools that tar into a private temp file, bounded (``2 * cap`` plus headers, a deadline, at most
  ``MAX_ENTRIES`` entries), and rewrites it into the tar the sandbox gets: names under the path only (no
  absolute name, no ``..``), setuid/setgid/sticky bits dropped, owner the sandbox user, hard links made plain
  files, device nodes, FIFOs and sockets left out (named in ``skipped``); symlinks are kept as the image has
  them (a link to /proc/1 or /etc/shadow is a name, never followed by the runner: nothing here opens one);
- what the tree takes in a tmpfs (whole 4 KiB pages per file) is checked against the cap before anything is
  sent: a tree that would not fit is refused with the size it needs;
- the tar is sent over the protocol's ``upload`` (toolcage.files.upload, worker.tools.upload: staged, then
  renamed into place), so it works under gVisor, whose tmpfs lives in the sentry where the engine cannot write.

The rewritten tar is kept (in the runner's 0700 temp directory, at most the cap plus headers) until the run
ends: ``Sandbox.changes(path=...)`` extracts it and compares it with the path's tree now, with the workspace
copy's code (toolcage.files.changes).
"""

from __future__ import annotations

import contextlib
import os
import posixpath
import shutil
import tarfile
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, cast

from toolcage.errors import SandboxError, UsageError
from toolcage.policies import contract
from toolcage.textsafe import escape
from toolcage.worker.tools.paths import dir_beneath

if TYPE_CHECKING:
    from toolcage.engine.api import EngineAPI
    from toolcage.files.changes import Changes, ToolCall
    from toolcage.files.upload import Call

MIB = 1 << 20
PAGE = 4096  # a tmpfs keeps each file in whole pages
MAX_ENTRIES = 200_000  # entries of one path's tree (a 100,000-file repository fits; a million does not)
FETCH_SECONDS = 300.0  # the engine's archive of one path, all of it
# (which paths may be writable, and their sizes, are checked before anything starts: toolcage.engine.writable)


class _Archives(Protocol):
    def archive(self, cid: str, path: str) -> tuple[Iterator[bytes], dict[str, Any]] | None: ...


@dataclass
class Original:
    """One writable path's tree as the image has it, as the sandbox got it: the rewritten tar (``tar``)."""

    path: str
    cap: int
    tar: str
    files: int = 0
    dirs: int = 0
    symlinks: int = 0
    bytes: int = 0
    need: int = 0  # what it takes in a tmpfs (whole pages)
    skipped: list[dict[str, str]] = field(default_factory=list)
    read_ms: float = 0.0
    fill_ms: float = 0.0

    def fields(self) -> dict[str, Any]:
        return {
            "path": self.path, "files": self.files, "dirs": self.dirs, "symlinks": self.symlinks,
            "bytes": self.bytes, "read_ms": round(self.read_ms, 1), "fill_ms": round(self.fill_ms, 1),
            "skipped": len(self.skipped),
        }  # fmt: skip


class Originals:
    """The image's trees of one run's writable paths: read from the engine, sent into the sandbox, kept for
    ``changes``; ``close`` removes the temp directory (at the run's end)."""

    def __init__(self) -> None:
        self.dir = tempfile.mkdtemp(prefix="toolcage-imagepaths-")  # 0700
        self.trees: dict[str, Original] = {}

    def read(
        self, engine: EngineAPI, image: str, writable: tuple[tuple[str, int], ...], labels: dict[str, str]
    ) -> None:
        """Each path's tree from the image (module doc); UsageError for a path that is not a directory of the
        image or whose tree does not fit its cap."""
        archives = cast("_Archives", engine) if hasattr(engine, "archive") else None
        if archives is None:
            raise UsageError("writable=: this engine cannot read an image's files (no archive API)")
        config = {
            "Image": image,
            "Entrypoint": ["/nonexistent"],  # never started: the engine reads the image's layers
            "Cmd": [],
            "NetworkDisabled": True,
            "Labels": {**labels, "toolcage.role": "imageread"},
            "HostConfig": {"NetworkMode": "none"},
        }
        name = f"toolcage-imageread-{os.urandom(6).hex()}"
        cid = engine.create(config, name)
        try:
            for path, cap in writable:
                started = time.monotonic()
                tree = self._read_one(archives, cid, path, cap)
                tree.read_ms = (time.monotonic() - started) * 1000
                self.trees[path] = tree
        finally:
            with contextlib.suppress(Exception):
                engine.remove(cid)

    def _read_one(self, engine: _Archives, cid: str, path: str, cap: int) -> Original:
        got = engine.archive(cid, path)
        if got is None:  # the engine makes the mount point (a read-only root too): the run starts with it empty
            empty = os.path.join(self.dir, f"tree-{len(self.trees)}.tar")
            with tarfile.open(empty, mode="x:", format=tarfile.PAX_FORMAT):
                pass
            return Original(path, cap, empty)
        stream, st = got
        mode = int(st.get("mode") or 0)
        if st.get("linkTarget") or not mode & (1 << 31):  # Go's os.ModeDir
            with contextlib.suppress(Exception):
                getattr(stream, "close", lambda: None)()
            raise UsageError(f"writable: {path} is not a directory of the image (a file or a symlink)")
        raw = os.path.join(self.dir, f"raw-{len(self.trees)}.tar")
        bound = 2 * cap + 64 * MIB  # the tree's bytes and every entry's header, for a tree that fits
        deadline = time.monotonic() + FETCH_SECONDS
        size = 0
        try:
            with open(raw, "xb") as f:
                for chunk in stream:
                    size += len(chunk)
                    if size > bound:
                        raise UsageError(
                            f"writable: the image's {path} is more than {bound // MIB} MiB as an archive, far "
                            f"past writable_size ({cap // MIB} MiB); raise writable_size or name a smaller path"
                        )
                    if time.monotonic() > deadline:
                        raise SandboxError(f"writable: reading the image's {path} took more than {FETCH_SECONDS:.0f} s")
                    f.write(chunk)
        finally:
            with contextlib.suppress(Exception):
                getattr(stream, "close", lambda: None)()
        try:
            return _rewrite(raw, os.path.join(self.dir, f"tree-{len(self.trees)}.tar"), path, cap)
        finally:
            os.unlink(raw)

    def fill(self, call: Call, log: Any) -> None:
        """Send each tree into its tmpfs (``upload`` with ``base``: the worker then tracks what changes there)."""
        from toolcage.files import upload

        for tree in self.trees.values():
            # said before: a big tree takes seconds (the upload's 1 MiB calls; 100,000 files took about a minute)
            log.info(
                "writable.filling", path=tree.path, files=tree.files, bytes=tree.bytes, read_ms=round(tree.read_ms)
            )
            started = time.monotonic()
            upload.send(call, _pieces(tree.tar), tree.path, base=True, shown=tree.path)
            tree.fill_ms = (time.monotonic() - started) * 1000
            log.info("writable.filled", **tree.fields())
            if tree.skipped:
                log.warning("writable.skipped", path=tree.path, count=len(tree.skipped), entries=tree.skipped[:20])

    def changes(
        self, call: ToolCall, path: str, *, download_to: str | os.PathLike[str] | None, max_bytes: int
    ) -> Changes:
        """What the run changed under ``path`` against the image's tree there (toolcage.files.changes.collect)."""
        from toolcage.files import changes

        tree = self.trees.get(posixpath.normpath(path))
        if tree is None:
            raise changes.ChangesUsage(
                f"{path} is not a writable path of this run (writable=: {', '.join(self.trees) or 'none'})"
            )
        work = tempfile.mkdtemp(prefix="orig-", dir=self.dir)
        try:
            _extract(tree.tar, work)
            return changes.collect(
                call, Path(work), gitignore=False, root=tree.path, download_to=download_to,
                max_bytes=max_bytes, repo_ignores=False,
            )  # fmt: skip
        finally:
            shutil.rmtree(work, ignore_errors=True)

    def close(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)


def _rewrite(raw: str, out: str, path: str, cap: int) -> Original:
    """The engine's tar of ``path`` as the sandbox gets it (module doc): a new tar at ``out``."""
    top = posixpath.basename(path)
    tree = Original(path, cap, out)
    regular: dict[str, tarfile.TarInfo] = {}
    entries = 0
    with (
        tarfile.open(raw, mode="r:", encoding="utf-8", errors="surrogateescape") as src,
        tarfile.open(out, mode="x:", format=tarfile.PAX_FORMAT, encoding="utf-8", errors="surrogateescape") as dst,
    ):
        for m in src:
            entries += 1
            if entries > MAX_ENTRIES:
                raise UsageError(
                    f"writable: the image's {path} holds more than {MAX_ENTRIES} entries; name a smaller path"
                )
            parts = m.name.split("/")
            if parts[0] != top or any(p in ("", ".", "..") for p in parts[1:]):
                tree.skipped.append({"path": escape(m.name), "reason": "a name outside the path"})
                continue
            rel = "/".join(parts[1:])
            if not rel:
                continue  # the path itself: the tmpfs's root
            if m.isreg():
                regular[m.name] = m
            ti = tarfile.TarInfo(rel)
            ti.uid = ti.gid = contract.SANDBOX_UID
            ti.mtime = m.mtime
            ti.mode = m.mode & 0o777  # setuid, setgid and sticky dropped
            data = None
            if m.isdir():
                ti.type = tarfile.DIRTYPE
                tree.dirs += 1
            elif m.issym():
                ti.type, ti.linkname = tarfile.SYMTYPE, m.linkname  # a name: never followed here
                tree.symlinks += 1
            elif m.isreg() or m.islnk():
                target = m if m.isreg() else regular.get(m.linkname)
                if target is None:
                    tree.skipped.append({"path": escape(rel), "reason": "a hard link to a file outside the path"})
                    continue
                ti.type, ti.size = tarfile.REGTYPE, target.size
                tree.need += -(-target.size // PAGE) * PAGE
                if tree.need > cap:
                    raise UsageError(
                        f"writable: the image's {path} takes more than {cap // MIB} MiB in a tmpfs (each file in "
                        "whole 4 KiB pages); raise writable_size (--writable-size), which counts against memory"
                    )
                data = src.extractfile(target)
                tree.files += 1
                tree.bytes += target.size
            else:
                kind = "a device node" if m.ischr() or m.isblk() else "a FIFO or socket"
                tree.skipped.append({"path": escape(rel), "reason": f"{kind}: not copied"})
                continue
            dst.addfile(ti, data)
    return tree


def _pieces(tar: str) -> Iterator[bytes]:
    with open(tar, "rb") as f:
        while piece := f.read(MIB):
            yield piece


def _extract(tar: str, root: str) -> None:
    """The tree the sandbox got, on the host, for the diff's old sides: names are ours (``_rewrite``), parents
    made without following a symlink, symlinks made as they are (the diff reads by directory fd, never
    through one: toolcage.files.changesides.HostTree)."""
    rfd = os.open(root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        with tarfile.open(tar, mode="r:", encoding="utf-8", errors="surrogateescape") as tf:
            for m in tf:
                parts = m.name.split("/")
                try:
                    pfd = dir_beneath(rfd, parts[:-1], True)
                except OSError:
                    continue  # beneath a symlink or file of the tree: not on the old side
                try:
                    if m.isdir():
                        with contextlib.suppress(FileExistsError):
                            os.mkdir(parts[-1], 0o700, dir_fd=pfd)
                    elif m.issym():
                        with contextlib.suppress(FileExistsError):
                            os.symlink(m.linkname, parts[-1], dir_fd=pfd)
                    elif m.isreg():
                        src = tf.extractfile(m)
                        assert src is not None
                        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
                        try:
                            fd = os.open(parts[-1], flags, 0o600 | (m.mode & 0o100), dir_fd=pfd)
                        except OSError:
                            continue
                        with os.fdopen(fd, "wb") as out:
                            shutil.copyfileobj(src, out, MIB)
                finally:
                    os.close(pfd)
    finally:
        os.close(rfd)


__all__ = ["Original", "Originals"]
