"""Snapshots: what a session holds (/scratch, and /workspace when it is a writable copy), as an archive the
user owns, and a fresh sandbox resumed from one.

``Sandbox.snapshot(target)`` reads the worker's tar streams of /scratch and of the workspace copy
(toolcage.transfer.members: hostile input, checked entry by entry, never extracted on the host) and
writes one tar (PAX) to ``target``, a path or a binary stream: ``scratch/…`` and ``workspace/…``
entries (files, directories and symlinks, with their modes and mtimes; setuid, setgid and sticky
bits cleared), then ``manifest.json``, last: the format version, the run, each entry's type, mode,
size, link target and sha256, the paths the run had changed against its workspace, and an HMAC-SHA256
of all of it under a key the host keeps (``~/.local/state/toolcage/snapshot.key``, made on first use,
0600; never in a sandbox). ``SnapshotInfo.sha256`` is the whole archive's digest.

``Sandbox(resume=archive)`` checks the archive before any container starts: the manifest's HMAC (a
snapshot edited, or made with another key, is refused), its format version, then every entry against
the manifest (name, type, mode, size, sha256, in order, none extra, none missing). Only then does the
fresh sandbox start, with a writable workspace copy when the snapshot has one; the entries go in
through the worker's ``upload`` (which checks them again). No container is ever reused.

A snapshot never holds a secret's value: every file, name and symlink target is scanned for each of the
run's secret values, in every form the worker's redaction recognises (toolcage.worker.redaction: as they
are, hex, base64 at any alignment, JSON, HTML and percent escapes, UTF-16 and UTF-32), and the snapshot is
refused, naming the file (with the value redacted from the name), if one is found. A file whose value the
worker's redaction already cut out of the download stream is found by halving the tree's list.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import io
import json
import os
import secrets
import shutil
import stat
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from toolcage import transfer
from toolcage.errors import SandboxError, UsageError
from toolcage.policies import contract
from toolcage.safetar import DownloadResult, show
from toolcage.textsafe import escape
from toolcage.worker.redaction import Redactor, text_forms

if TYPE_CHECKING:
    from toolcage.results import CallResult

    ToolCall = Callable[[str, dict[str, Any]], CallResult]

FORMAT = "toolcage-snapshot"
VERSION = 1
MANIFEST = "manifest.json"
ROOTS = {"scratch": contract.SCRATCH, "workspace": contract.WORKSPACE}
DEFAULT_MAX_BYTES = 16 << 30
DEFAULT_MAX_FILES = 1_000_000
DEFAULT_LIST = 100_000  # entries listed to find the file that holds a secret value
_PIECE = 1 << 20
_MAX_MANIFEST = 512 << 20


class SnapshotError(SandboxError):
    """A snapshot could not be made (a refused stream, a cap, a secret in a file)."""

    status = "error"
    reason = "snapshot_failed"


class SnapshotInvalid(UsageError):
    """A snapshot that cannot be resumed: tampered with, made with another key or by another format
    version, not a snapshot at all, or unreadable."""

    reason = "snapshot_invalid"


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
    state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state) / "toolcage" / "snapshot.key"


def host_key(create: bool) -> bytes:
    """The host's snapshot key (32 random bytes, 0600, in a 0700 directory), made on first use when ``create``.
    Threat: a sandbox reading it through a workspace forges snapshots this host resumes; uid 65532 cannot read a
    0600 file of the runner's through a mount or a copy (toolcage.mountview), and no workspace may hold it."""
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


def _mac(key: bytes, manifest: dict[str, Any]) -> str:
    body = json.dumps({k: v for k, v in manifest.items() if k != "mac"}, sort_keys=True, separators=(",", ":"))
    return hmac.new(key, body.encode("utf-8", "surrogateescape"), hashlib.sha256).hexdigest()


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


class _SecretScan:
    """Finds any of the run's secret values, in any recognised form, in a file's bytes read piece by piece,
    and in names and link targets."""

    def __init__(self, values: list[str]) -> None:
        needles: set[bytes] = set()
        self.redactors = []
        for v in values:
            if len(v) < 4:
                continue
            needles |= {n.literal.encode("utf-8", "surrogatepass") for n in text_forms(v) if n.literal}
            needles |= {v.encode(codec, "surrogatepass") for codec in _WIDE}
            self.redactors.append(Redactor({"value": v}))
        self.needles = sorted(needles, key=len)
        self.tail = max((len(n) for n in self.needles), default=1) - 1

    def hit(self, data: bytes) -> bool:
        return any(n in data for n in self.needles)

    def shown(self, name: str) -> str:
        """``name`` as a message may show it: each value in it replaced by ``[secret value]``."""
        out = show(name)
        for r in self.redactors:
            out = r.text(out)
        return out

    def found(self, pieces: Iterator[bytes]) -> Iterator[tuple[bytes, bool]]:
        carry = b""
        for piece in pieces:
            window = carry + piece
            yield piece, self.hit(window)
            carry = window[-self.tail :] if self.tail else b""


_WIDE = ("utf-16-le", "utf-16-be", "utf-32-le", "utf-32-be")
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


def _culprit(call: ToolCall, top: str, root: str, scan: _SecretScan, max_bytes: int, max_files: int) -> str | None:
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
                if m.isreg() and any(hit for _, hit in scan.found(_pieces(src, m.size))):
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


def _pieces(src: IO[bytes], size: int) -> Iterator[bytes]:
    left = size
    while left:
        piece = src.read(min(_PIECE, left))
        if not piece:
            raise SnapshotError("snapshot: a file ended before its size in the sandbox's stream; nothing was written")
        left -= len(piece)
        yield piece


def write(
    call: ToolCall,
    target: str | os.PathLike[str] | IO[bytes],
    *,
    workspace: bool,
    meta: dict[str, Any],
    secret_values: list[str],
    key: bytes | None = None,
    max_bytes: int = DEFAULT_MAX_BYTES,
    max_files: int = DEFAULT_MAX_FILES,
) -> SnapshotInfo:
    """Write the session's snapshot to ``target`` (module doc). A path is written beside itself and renamed
    into place only when the whole snapshot is good."""
    key = key if key is not None else host_key(create=True)
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
    scan = _SecretScan(secret_values)
    sink = _HashingWriter(out)
    entries: list[dict[str, Any]] = []
    counts = {"files": 0, "dirs": 0, "symlinks": 0, "bytes": 0}
    skipped = DownloadResult("")
    try:
        buffered = io.BufferedWriter(sink, _PIECE)
        with tarfile.open(
            fileobj=buffered, mode="w|", format=tarfile.PAX_FORMAT, encoding="utf-8", errors="surrogateescape"
        ) as tf:
            for top, root in ROOTS.items():
                if top == "workspace" and not workspace:
                    continue
                try:
                    for name, m, src in transfer.members(
                        _download(call), {"path": root},
                        max_bytes=max_bytes, max_files=max_files, result=skipped,
                    ):  # fmt: skip
                        if name.split("/", 1)[0] == ".toolcage-upload-" or name.startswith(".toolcage-upload-"):
                            continue  # an upload's staging, in flight
                        entries.append(_add(tf, f"{top}/{name}", m, src, scan, counts))
                except _Redacted:
                    found = _culprit(call, top, root, scan, max_bytes, max_files)
                    raise _refused(f"'{found}' holds" if found else f"a file under {root} holds") from None
            manifest = {
                "format": FORMAT,
                "version": VERSION,
                "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                **meta,
                "workspace_copy": workspace,
                "entries": entries,
            }
            manifest["mac"] = _mac(key, manifest)
            body = json.dumps(manifest, sort_keys=True, indent=1).encode("utf-8", "surrogateescape")
            info = tarfile.TarInfo(MANIFEST)
            info.size, info.mode, info.mtime = len(body), 0o644, int(time.time())
            tf.addfile(info, io.BytesIO(body))
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
    tf: tarfile.TarFile, name: str, m: tarfile.TarInfo, src: IO[bytes], scan: _SecretScan, counts: dict[str, int]
) -> dict[str, Any]:
    if scan.hit(os.fsencode(name)):
        raise _refused(f"the name '{scan.shown(name)}' holds")
    if m.issym() and scan.hit(os.fsencode(m.linkname)):
        raise _refused(f"'{scan.shown(name)}' is a symlink whose target holds")
    info = tarfile.TarInfo(name)
    info.mode, info.mtime = stat.S_IMODE(m.mode) & 0o777, int(m.mtime)
    entry: dict[str, Any] = {"name": name, "mode": info.mode, "mtime": info.mtime}
    if m.isdir():
        info.type = tarfile.DIRTYPE
        entry["type"] = "dir"
        counts["dirs"] += 1
        tf.addfile(info)
        return entry
    if m.issym():
        info.type, info.linkname = tarfile.SYMTYPE, m.linkname
        entry.update(type="symlink", target=m.linkname)
        counts["symlinks"] += 1
        tf.addfile(info)
        return entry
    info.size = m.size
    digest = hashlib.sha256()

    class _Reader(io.RawIOBase):
        def __init__(self) -> None:
            self.gen = scan.found(_pieces(src, m.size))
            self.buf = b""

        def readable(self) -> bool:
            return True

        def readinto(self, b: Any) -> int:
            while not self.buf:
                try:
                    piece, hit = next(self.gen)
                except StopIteration:
                    return 0
                if hit:
                    raise _refused(f"'{scan.shown(name)}' holds")
                digest.update(piece)
                self.buf = piece
            n = min(len(b), len(self.buf))
            b[:n] = self.buf[:n]
            self.buf = self.buf[n:]
            return n

    tf.addfile(info, io.BufferedReader(_Reader(), _PIECE))
    entry.update(type="file", size=m.size, sha256=digest.hexdigest())
    counts["files"] += 1
    counts["bytes"] += m.size
    return entry


@dataclass
class Verified:
    """A snapshot checked against its manifest, ready to go into a fresh sandbox."""

    path: str  # the archive (a spooled copy when it came as a stream)
    manifest: dict[str, Any]
    spooled: bool = False

    @property
    def workspace(self) -> bool:
        return bool(self.manifest.get("workspace_copy"))

    @property
    def changed(self) -> list[str]:
        return [p for p in self.manifest.get("changed") or () if isinstance(p, str)]

    def tar_of(self, top: str) -> Iterator[bytes]:
        """A tar (PAX) of the archive's ``top/…`` entries, named beneath it, for the worker's upload; each
        file's bytes checked against the manifest again as they are read."""
        want = {e["name"]: e for e in self.manifest["entries"]}
        with tarfile.open(self.path, mode="r:", encoding="utf-8", errors="surrogateescape") as tf:
            for m in tf:
                if not m.name.startswith(top + "/"):
                    continue
                info = tarfile.TarInfo(m.name[len(top) + 1 :])
                info.type, info.mode, info.mtime, info.linkname = m.type, m.mode & 0o777, m.mtime, m.linkname
                info.size = m.size if m.isreg() else 0
                yield info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")
                if m.isreg():
                    src = tf.extractfile(m)
                    assert src is not None
                    digest = hashlib.sha256()
                    for piece in _pieces(src, m.size):
                        digest.update(piece)
                        yield piece
                    if digest.hexdigest() != want[m.name].get("sha256"):
                        raise SnapshotInvalid(f"snapshot: '{show(m.name)}' changed while it was resumed")
                    if m.size % tarfile.BLOCKSIZE:
                        yield bytes(tarfile.BLOCKSIZE - m.size % tarfile.BLOCKSIZE)
        yield bytes(2 * tarfile.BLOCKSIZE)

    def close(self) -> None:
        if self.spooled:
            with contextlib.suppress(OSError):
                os.unlink(self.path)


def verify(source: str | os.PathLike[str] | IO[bytes], key: bytes | None = None) -> Verified:
    """Check a snapshot (module doc): SnapshotInvalid, before any container starts, if anything is off."""
    spooled = False
    if isinstance(source, str | os.PathLike):
        path = os.fspath(source)
        if not os.path.isfile(path):
            raise SnapshotInvalid(f"snapshot '{show(path)}' does not exist or is not a file")
    else:
        fd, path = tempfile.mkstemp(prefix="toolcage-resume-")
        with os.fdopen(fd, "wb") as f:
            shutil.copyfileobj(source, f, _PIECE)
        spooled = True
    try:
        manifest = _check(path, key if key is not None else host_key(create=False))
    except BaseException:
        if spooled:
            os.unlink(path)
        raise
    return Verified(path, manifest, spooled)


def _check(path: str, key: bytes) -> dict[str, Any]:
    shown = show(path)
    try:
        with tarfile.open(path, mode="r:", encoding="utf-8", errors="surrogateescape") as tf:
            members = tf.getmembers()
            if not members or members[-1].name != MANIFEST or not members[-1].isreg():
                raise SnapshotInvalid(f"'{shown}' is not a toolcage snapshot (no manifest.json at its end)")
            if members[-1].size > _MAX_MANIFEST:
                raise SnapshotInvalid(f"'{shown}': its manifest is too large")
            src = tf.extractfile(members[-1])
            assert src is not None
            try:
                manifest = json.loads(src.read().decode("utf-8", "surrogateescape"))
            except ValueError:
                raise SnapshotInvalid(f"'{shown}': its manifest is not JSON") from None
            if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
                raise SnapshotInvalid(f"'{shown}' is not a toolcage snapshot")
            if manifest.get("version") != VERSION:
                raise SnapshotInvalid(
                    f"'{shown}' is a snapshot of format version {escape(str(manifest.get('version')))}, made by "
                    f"toolcage {escape(str(manifest.get('toolcage')))}; this toolcage resumes version {VERSION} only"
                )
            if not hmac.compare_digest(str(manifest.get("mac", "")), _mac(key, manifest)):
                raise SnapshotInvalid(
                    f"'{shown}' was changed after it was made, or made with another host's key: refused"
                )
            entries = manifest.get("entries")
            if not isinstance(entries, list) or len(entries) != len(members) - 1:
                raise SnapshotInvalid(f"'{shown}': its entries do not match its manifest: refused")
            for m, e in zip(members[:-1], entries, strict=True):
                _check_entry(tf, m, e, shown)
    except (tarfile.TarError, EOFError, OSError, UnicodeError) as exc:
        raise SnapshotInvalid(f"'{shown}' cannot be read as a snapshot ({escape(type(exc).__name__)})") from None
    return manifest


def _check_entry(tf: tarfile.TarFile, m: tarfile.TarInfo, e: Any, shown: str) -> None:
    def bad(why: str) -> SnapshotInvalid:
        return SnapshotInvalid(f"'{shown}': the entry '{show(m.name)}' {why}: refused")

    if not isinstance(e, dict) or e.get("name") != m.name:
        raise bad("is not the one its manifest names there")
    top, _, rest = m.name.partition("/")
    if top not in ROOTS or transfer.safe_name(rest) != rest:
        raise bad("is not a plain path under scratch/ or workspace/")
    if (m.mode & 0o7777) != e.get("mode") or m.mode & 0o7000:
        raise bad("has another mode than its manifest says")
    if int(m.mtime) != e.get("mtime"):
        raise bad("has another mtime than its manifest says")
    kind = "dir" if m.isdir() else "symlink" if m.issym() else "file" if m.isreg() else None
    if kind is None or kind != e.get("type"):
        raise bad("is of another type than its manifest says (or one a snapshot never holds)")
    if kind == "symlink" and m.linkname != e.get("target"):
        raise bad("points elsewhere than its manifest says")
    if kind == "file":
        if m.size != e.get("size"):
            raise bad("has another size than its manifest says")
        src = tf.extractfile(m)
        assert src is not None
        digest = hashlib.sha256()
        for piece in _pieces(src, m.size):
            digest.update(piece)
        if digest.hexdigest() != e.get("sha256"):
            raise bad("does not match its sha256")


__all__ = ["SnapshotError", "SnapshotInfo", "SnapshotInvalid", "Verified", "host_key", "verify", "write"]
