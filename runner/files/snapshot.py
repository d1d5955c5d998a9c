"""Snapshots: what a session holds (/scratch, and /workspace when it is a writable copy), as an archive the
user owns, and a fresh sandbox resumed from one.

``Sandbox.snapshot(target)`` reads the worker's tar streams of /scratch and of the workspace copy
(toolcage.files.download.members: hostile input, checked entry by entry, never extracted on the host) and
writes one tar (PAX) to ``target``, a path or a binary stream: ``scratch/…`` and ``workspace/…``
entries (files, directories and symlinks, with their modes and mtimes; setuid, setgid and sticky
bits cleared), then ``manifest.json`` (the format version, the run, its counts, the paths the run had
changed against its workspace), then the seal (toolcage.files.snapseal): the length and sha256 of every byte
before it under an HMAC-SHA256 with a key the host keeps (``~/.local/state/toolcage/snapshot.key``, made
on first use, 0600; never in a sandbox). ``SnapshotInfo.sha256`` is the whole archive's digest.

Threat: the host's memory. Nothing is kept per entry but a 16-byte digest of its name (for duplicates) and
11 bytes of its mtime (for the scan): the entries are written as they come and the manifest holds no list
of them. Writing and resuming share their caps (MAX_FILES entries, MAX_MANIFEST bytes of manifest, names
of 4,096 bytes), so a snapshot that was written can be resumed.

``Sandbox(resume=archive)`` checks the archive before any container starts: the seal first (the
archive's last 2 KiB: a forged or missing one is refused before a tar header is parsed), the bytes it
covers, then the tar's structure (plain names under scratch/ or workspace/, files, directories and
symlinks only, no special bits, no name twice, the manifest then the seal last). The entries go into a
fresh sandbox through the worker's ``upload`` (which checks them again), read a second time with their
bytes hashed against the seal again. No container is ever reused.

A snapshot never holds a secret's value in the forms toolcage.files.snapscan finds (files, names, link targets,
mtimes; docs/security.md says what it cannot see): the snapshot is refused, naming the file (with the value
redacted from the name). A file whose value the worker's redaction already cut out of the download stream is
found by halving the tree's list.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import secrets
import stat
import tarfile
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from toolcage.errors import UsageError
from toolcage.files import download as transfer
from toolcage.files import snapseal
from toolcage.files.safetar import DownloadResult, show
from toolcage.files.snapscan import SecretScan
from toolcage.files.snapseal import SnapshotError, SnapshotInvalid, Verified
from toolcage.policies import contract
from toolcage.textsafe import escape
from toolcage.workspace import state_dir

if TYPE_CHECKING:
    from toolcage.results import CallResult

    ToolCall = Callable[[str, dict[str, Any]], CallResult]

FORMAT, VERSION = snapseal.FORMAT, snapseal.VERSION
MANIFEST = "manifest.json"
ROOTS = {"scratch": contract.SCRATCH, "workspace": contract.WORKSPACE}
DEFAULT_MAX_BYTES = transfer.DEFAULT_MAX_BYTES  # the Sandbox passes its policy's bound (transfer.out_bound)
MAX_FILES, MAX_MANIFEST = snapseal.MAX_FILES, snapseal.MAX_MANIFEST  # written and resumed alike
DEFAULT_MAX_FILES = MAX_FILES
DEFAULT_LIST = 100_000  # entries listed to find the file that holds a secret value
_PIECE = 1 << 20


@dataclass(frozen=True)
class SnapshotInfo:
    """What ``snapshot()`` wrote: where (None for a stream), the archive's sha256, entries and bytes."""

    path: str | None
    sha256: str
    files: int
    dirs: int
    symlinks: int
    bytes: int
    workspace: bool  # it holds a workspace copy
    skipped: tuple[dict[str, str], ...] = field(default_factory=tuple)

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "sha256": self.sha256,
            "files": self.files,
            "dirs": self.dirs,
            "symlinks": self.symlinks,
            "bytes": self.bytes,
            "workspace": self.workspace,
            "skipped": list(self.skipped),
        }


def key_path() -> Path:
    return state_dir() / "snapshot.key"


def host_key(create: bool) -> bytes:
    """The host's snapshot key (32 random bytes, 0600, in a 0700 directory), made on first use when ``create``.
    Threat: a sandbox reading it through a workspace forges snapshots this host resumes; uid 65532 cannot read a
    0600 file of the runner's through a mount or a copy (toolcage.files.mountview), and no workspace may hold it."""
    path = key_path()
    try:
        with open(path, "rb") as f:
            if os.fstat(f.fileno()).st_mode & 0o077:
                os.fchmod(f.fileno(), 0o600)  # widened since it was made: the owner's alone again
            key = f.read()
        if len(key) >= 32:
            return key
    except FileNotFoundError:
        if not create:
            raise SnapshotInvalid(
                f"no snapshot key on this host ({path}): a snapshot made on another host needs that host's key "
                "(snapshot_key=)"
            ) from None
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    key = secrets.token_bytes(32)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(key)
    try:
        os.link(tmp, path)  # first writer wins: two processes never use two keys
    except FileExistsError:
        pass
    finally:
        os.unlink(tmp)
    with open(path, "rb") as f:
        return f.read()


class _HashingWriter(io.RawIOBase):
    """A binary sink that hashes what passes through it."""

    def __init__(self, out: IO[bytes]) -> None:
        self.out, self.digest, self.size = out, hashlib.sha256(), 0

    def writable(self) -> bool:
        return True

    def write(self, b: Any) -> int:
        data = bytes(b)
        self.out.write(data)
        self.digest.update(data)
        self.size += len(data)
        return len(data)


_MARK = "[secret "  # what redaction puts in an answer's place of a value (never in base64)


class _Redacted(Exception):
    """A download chunk the worker's (or the runner's) redaction changed: a value was in the stream."""


def _download(call: ToolCall) -> transfer.Call:
    """``call`` bound to the download tool, raising _Redacted for a chunk with a value cut out of it."""

    def one(params: dict[str, Any]) -> CallResult:
        res = call("download", params)
        if res.ok and isinstance(res.result, dict) and _MARK in str(res.result.get("data", "")):
            raise _Redacted
        return res

    return one


def _refused(what: str) -> SnapshotError:
    return SnapshotError(f"snapshot refused: {what} one of the run's secret values; nothing was written")


def _culprit(call: ToolCall, top: str, root: str, scan: SecretScan, max_bytes: int, max_files: int) -> str | None:
    """The entry under ``root`` that holds a value the redaction cut out of its stream: the tree listed, then
    halves of it downloaded until one entry is left (None if it cannot be told)."""
    res = call("list_files", {"path": root, "recursive": True, "max_entries": DEFAULT_LIST})
    if not res.ok or not isinstance(res.result, dict):
        return None
    paths: list[str] = []
    for e in res.result.get("entries") or ():
        path = e.get("path") if isinstance(e, dict) else None
        if not isinstance(path, str):
            continue
        if _MARK in path:  # the name itself holds the value: the listing shows it redacted
            return _under(top, root, path)
        if e.get("type") in ("file", "symlink"):
            paths.append(path)

    def holds(some: list[str]) -> bool:
        try:
            for name, m, src in transfer.members(
                _download(call), {"path": root, "paths": some},
                max_bytes=max_bytes, max_files=max_files, result=DownloadResult(""),
            ):  # fmt: skip
                if scan.hit(os.fsencode(name)) or (m.issym() and scan.hit(os.fsencode(m.linkname))):
                    return True
                if m.isreg() and any(hit for _, hit in scan.found(snapseal.pieces(src, m.size))):
                    return True
        except _Redacted:
            return True
        except (transfer.DownloadError, SnapshotError):
            return False
        return False

    while len(paths) > 1:
        half = len(paths) // 2
        paths = paths[:half] if holds(paths[:half]) else paths[half:]
    return _under(top, root, paths[0]) if paths and holds(paths) else None


def _under(top: str, root: str, wire: str) -> str:
    """A path as the tools show it (``/scratch/x``) as the snapshot names it (``scratch/x``), escaped."""
    return escape(f"{top}/{wire[len(root) + 1 :]}" if wire.startswith(root + "/") else wire)


def write(
    call: ToolCall,
    target: str | os.PathLike[str] | IO[bytes],
    *,
    workspace: bool,
    meta: dict[str, Any],
    secret_values: list[str],
    key: bytes | None = None,
    max_bytes: int = DEFAULT_MAX_BYTES,
    max_files: int = MAX_FILES,
) -> SnapshotInfo:
    """Write the session's snapshot to ``target`` (module doc). A path is written beside itself and renamed
    into place only when the whole snapshot is good. ``max_files`` cannot pass MAX_FILES (what a resume
    takes)."""
    key = key if key is not None else host_key(create=True)
    max_files = min(max_files, MAX_FILES)
    to_path = not hasattr(target, "write")
    final = os.path.abspath(os.fspath(target)) if to_path else None  # type: ignore[arg-type]
    tmp = None
    if final is not None:
        parent = os.path.dirname(final)
        if not os.path.isdir(parent):
            raise UsageError(f"snapshot: the directory '{show(parent)}' does not exist")
        fd, tmp = tempfile.mkstemp(prefix=".toolcage-snapshot-", dir=parent)
        out: IO[bytes] = os.fdopen(fd, "wb")
    else:
        out = target  # type: ignore[assignment]
    scan = SecretScan(secret_values)
    sink = _HashingWriter(out)
    counts = {"files": 0, "dirs": 0, "symlinks": 0, "bytes": 0}
    skipped = DownloadResult("")
    try:
        buffered = io.BufferedWriter(sink, _PIECE)
        for top, root in ROOTS.items():
            if top == "workspace" and not workspace:
                continue
            held = counts["files"] + counts["dirs"] + counts["symlinks"]
            try:
                for name, m, src in transfer.members(
                    _download(call), {"path": root},
                    max_bytes=max_bytes - counts["bytes"], max_files=max_files - held, result=skipped,
                ):  # fmt: skip
                    if name.split("/", 1)[0] == ".toolcage-upload-" or name.startswith(".toolcage-upload-"):
                        continue  # an upload's staging, in flight
                    _add(buffered, f"{top}/{name}", m, src, scan, counts)
            except _Redacted:
                found = _culprit(call, top, root, scan, max_bytes, max_files)
                raise _refused(f"'{found}' holds" if found else f"a file under {root} holds") from None
        if scan.stamped():
            raise _refused("the entries' mtimes spell")
        manifest = {
            "format": FORMAT,
            "version": VERSION,
            "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            **meta,
            "workspace_copy": workspace,
            "counts": counts,
        }
        body = json.dumps(manifest, sort_keys=True, indent=1).encode("utf-8", "surrogateescape")
        if len(body) > MAX_MANIFEST:
            raise SnapshotError(
                f"snapshot: its manifest (the run's changed paths) would take {len(body)} bytes, more than a "
                f"resume reads ({MAX_MANIFEST}); nothing was written"
            )
        info = tarfile.TarInfo(MANIFEST)
        info.size, info.mode, info.mtime = len(body), 0o644, int(time.time())
        buffered.write(info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape") + body + snapseal.pad(len(body)))
        buffered.flush()
        buffered.write(snapseal.seal(key, sink.size, sink.digest.hexdigest(), str(meta.get("toolcage", "?"))))
        buffered.flush()
        if final is not None:
            out.flush()
            os.fsync(out.fileno())
            out.close()
            assert tmp is not None
            os.replace(tmp, final)
            tmp = None
    except transfer.DownloadError as exc:
        raise SnapshotError(f"snapshot: {exc.message}") from None
    finally:
        if tmp is not None:
            with contextlib.suppress(OSError):
                out.close()
            with contextlib.suppress(OSError):
                os.unlink(tmp)
    return SnapshotInfo(final, sink.digest.hexdigest(), workspace=workspace, skipped=tuple(skipped.skipped), **counts)


def _add(
    out: IO[bytes], name: str, m: tarfile.TarInfo, src: IO[bytes], scan: SecretScan, counts: dict[str, int]
) -> None:
    """One entry, written as it comes: its header, then (a file) its bytes, scanned piece by piece."""
    if scan.hit(os.fsencode(name)):
        raise _refused(f"the name '{scan.shown(name)}' holds")
    if m.issym() and scan.hit(os.fsencode(m.linkname)):
        raise _refused(f"'{scan.shown(name)}' is a symlink whose target holds")
    info = tarfile.TarInfo(name)
    info.mode, info.mtime = stat.S_IMODE(m.mode) & 0o777, int(m.mtime)
    scan.stamp(info.mtime)
    if m.isdir():
        info.type = tarfile.DIRTYPE
        counts["dirs"] += 1
    elif m.issym():
        info.type, info.linkname = tarfile.SYMTYPE, m.linkname
        counts["symlinks"] += 1
    else:
        info.size = m.size
        counts["files"] += 1
        counts["bytes"] += m.size
    out.write(info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape"))
    if m.isreg():
        for piece, hit in scan.found(snapseal.pieces(src, m.size)):
            if hit:
                raise _refused(f"'{scan.shown(name)}' holds")
            out.write(piece)
        out.write(snapseal.pad(m.size))


def verify(source: str | os.PathLike[str] | IO[bytes], key: bytes | None = None) -> Verified:
    """Check a snapshot (toolcage.files.snapseal) with ``key``, or this host's: SnapshotInvalid, before any container
    starts, if anything is off."""
    return snapseal.verify(source, key if key is not None else host_key(create=False))


__all__ = ["SnapshotError", "SnapshotInfo", "SnapshotInvalid", "Verified", "host_key", "verify", "write"]
