"""The snapshot archive's seal (format version 2): what a resume checks before it parses a byte of the tar.

Threat: an archive handed to ``Sandbox(resume=)`` is hostile until it is shown to be this host's. Version 1
signed a manifest that was the tar's last member, so every header before it was parsed first: an unsigned
390 MiB archive of 100,000 long names took 991 MiB and 14 s before it was refused. Version 2 ends the tar
with a seal at a fixed place: its last 2 KiB are a 512-byte ``signature.json`` header, its 512 bytes of
JSON (the format, its version, the length and sha256 of every byte before the seal, an HMAC-SHA256 of
those under the host's key) and the two zero blocks that end a tar. A resume reads those 2 KiB, checks
the HMAC, hashes the bytes the seal covers (constant memory, one pass), and only then opens the tar.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import io
import json
import os
import shutil
import tarfile
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import IO, Any, NamedTuple, cast

from toolcage.errors import SnapshotError, SnapshotInvalid
from toolcage.files import download as transfer
from toolcage.files.safetar import show
from toolcage.textsafe import escape

FORMAT = "toolcage-snapshot"
VERSION = 2
NAME = "signature.json"
MANIFEST = "manifest.json"
ROOTS = ("scratch", "workspace")
MAX_FILES = 100_000  # entries a snapshot holds, scratch and workspace together: written and resumed alike
MAX_MANIFEST = 16 << 20  # bytes of manifest (the run's changed paths): written and resumed alike
_DATA = 512
TAIL = 2 * tarfile.BLOCKSIZE + 2 * tarfile.BLOCKSIZE  # the seal's header and data, then the end of the tar
_PIECE = 1 << 20


class Unsealed(Exception):
    """The seal is missing, forged, of another version, or does not match the bytes it covers (the
    message says which; toolcage.files.snapshot raises it as SnapshotInvalid)."""


class Seal(NamedTuple):
    length: int  # bytes before the seal's header
    sha256: str  # their digest


def _mac(key: bytes, fields: dict[str, Any]) -> str:
    body = json.dumps({k: v for k, v in fields.items() if k != "mac"}, sort_keys=True, separators=(",", ":"))
    return hmac.new(key, body.encode(), hashlib.sha256).hexdigest()


def seal(key: bytes, length: int, sha256: str, made_by: str) -> bytes:
    """The archive's last 2 KiB, for ``length`` bytes before it whose digest is ``sha256``."""
    fields: dict[str, Any] = {"format": FORMAT, "version": VERSION, "toolcage": made_by, "length": length}
    fields["sha256"] = sha256
    fields["mac"] = _mac(key, fields)
    data = json.dumps(fields, sort_keys=True).encode()
    assert len(data) <= _DATA
    info = tarfile.TarInfo(NAME)
    info.size, info.mode, info.mtime = _DATA, 0o644, int(time.time())
    head = info.tobuf(tarfile.USTAR_FORMAT, "ascii", "strict")
    return head + data.ljust(_DATA, b" ") + bytes(2 * tarfile.BLOCKSIZE)


def check(path: str, key: bytes, shown: str) -> Seal:
    """The seal of the archive at ``path``, checked (module doc); Unsealed if anything is off."""
    size = os.path.getsize(path)
    none = Unsealed(
        f"'{shown}' has no toolcage snapshot signature at its end: it is not a toolcage snapshot, or one of "
        f"format version 1 (made by toolcage before snapshots were sealed), which is not resumed: refused"
    )
    if size < TAIL + tarfile.BLOCKSIZE or size % tarfile.BLOCKSIZE:
        raise none
    with open(path, "rb") as f:
        f.seek(size - TAIL)
        tail = f.read(TAIL)
        try:
            info = tarfile.TarInfo.frombuf(tail[: tarfile.BLOCKSIZE], "ascii", "strict")
            fields = json.loads(tail[tarfile.BLOCKSIZE : 2 * tarfile.BLOCKSIZE].decode("ascii"))
        except (tarfile.TarError, ValueError, UnicodeError):
            raise none from None
        if info.name != NAME or info.size != _DATA or any(tail[2 * tarfile.BLOCKSIZE :]):
            raise none
        if not isinstance(fields, dict) or fields.get("format") != FORMAT:
            raise none
        if not hmac.compare_digest(str(fields.get("mac", "")), _mac(key, fields)):
            raise Unsealed(f"'{shown}' was changed after it was made, or made with another host's key: refused")
        if fields.get("version") != VERSION:
            raise Unsealed(
                f"'{shown}' is a snapshot of format version {str(fields.get('version'))[:20]}, made by toolcage "
                f"{str(fields.get('toolcage'))[:40]}; this toolcage resumes version {VERSION} only"
            )
        length, digest = fields.get("length"), fields.get("sha256")
        if not isinstance(length, int) or length != size - TAIL or not isinstance(digest, str):
            raise Unsealed(f"'{shown}' was changed after it was made (its length is not the one signed): refused")
        f.seek(0)
        if _digest(f, length) != digest:
            raise Unsealed(f"'{shown}' was changed after it was made (its bytes are not the ones signed): refused")
    return Seal(length, digest)


def _digest(f: IO[bytes], length: int) -> str:
    h, left = hashlib.sha256(), length
    while left:
        piece = f.read(min(_PIECE, left))
        if not piece:
            break
        h.update(piece)
        left -= len(piece)
    return h.hexdigest()


class Hashed(io.RawIOBase):
    """The first ``length`` bytes of ``f``, hashed as they are read: a resume's second reading of the archive
    is checked against the seal again (the file could have changed since ``check``)."""

    def __init__(self, f: IO[bytes], length: int) -> None:
        self.f, self.left, self.digest = f, length, hashlib.sha256()

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        data = self.f.read(min(len(b), self.left))
        self.left -= len(data)
        self.digest.update(data)
        b[: len(data)] = data
        return len(data)


def pieces(src: IO[bytes], size: int) -> Iterator[bytes]:
    left = size
    while left:
        piece = src.read(min(_PIECE, left))
        if not piece:
            raise SnapshotError("snapshot: a file ended before its size in the sandbox's stream; nothing was written")
        left -= len(piece)
        yield piece


def pad(size: int) -> bytes:
    return bytes(-size % tarfile.BLOCKSIZE)


@dataclass
class Verified:
    """A snapshot whose seal was checked, ready to go into a fresh sandbox."""

    path: str  # the archive (a spooled copy when it came as a stream)
    manifest: dict[str, Any]
    seal: Seal
    spooled: bool = False

    @property
    def workspace(self) -> bool:
        return bool(self.manifest.get("workspace_copy"))

    @property
    def changed(self) -> list[str]:
        return [p for p in self.manifest.get("changed") or () if isinstance(p, str)]

    @property
    def entries(self) -> int:
        counts = self.manifest.get("counts") or {}
        return sum(int(counts.get(k) or 0) for k in ("files", "dirs", "symlinks"))

    def tar_of(self, top: str) -> Iterator[bytes]:
        """A tar (PAX) of the archive's ``top/…`` entries, named beneath it, for the worker's upload; the
        archive's bytes hashed against its seal again as they are read (its end blocks only if they match)."""
        with open(self.path, "rb") as f:
            raw = Hashed(f, self.seal.length)
            with tarfile.open(
                fileobj=io.BufferedReader(raw, _PIECE), mode="r|", encoding="utf-8", errors="surrogateescape"
            ) as tf:
                while (m := tf.next()) is not None:
                    cast(Any, tf).members.clear()  # stream mode keeps every header otherwise
                    if not m.name.startswith(top + "/"):
                        continue
                    info = tarfile.TarInfo(m.name[len(top) + 1 :])
                    info.type, info.mode, info.mtime, info.linkname = m.type, m.mode & 0o777, m.mtime, m.linkname
                    info.size = m.size if m.isreg() else 0
                    yield info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")
                    if m.isreg():
                        src = tf.extractfile(m)
                        assert src is not None
                        yield from pieces(src, m.size)
                        yield pad(m.size)
                while raw.read(_PIECE):
                    pass
            if raw.left or raw.digest.hexdigest() != self.seal.sha256:
                raise SnapshotInvalid(f"snapshot: '{show(self.path)}' changed while it was resumed")
        yield bytes(2 * tarfile.BLOCKSIZE)

    def close(self) -> None:
        if self.spooled:
            with contextlib.suppress(OSError):
                os.unlink(self.path)


def verify(source: str | os.PathLike[str] | IO[bytes], key: bytes) -> Verified:
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
        shown = show(path)
        try:
            seal = check(path, key, shown)
            manifest = _structure(path, seal, shown)
        except Unsealed as exc:
            raise SnapshotInvalid(str(exc)) from None
        except (tarfile.TarError, EOFError, OSError, UnicodeError) as exc:
            raise SnapshotInvalid(f"'{shown}' cannot be read as a snapshot ({escape(type(exc).__name__)})") from None
    except BaseException:
        if spooled:
            os.unlink(path)
        raise
    return Verified(path, manifest, seal, spooled)


def _structure(path: str, seal: Seal, shown: str) -> dict[str, Any]:
    """The sealed tar's entries checked one by one (a name kept only as a 16-byte digest), and its manifest."""
    seen: set[bytes] = set()
    manifest: Any = None
    with open(path, "rb") as f, tarfile.open(
        fileobj=io.BufferedReader(Hashed(f, seal.length), _PIECE),
        mode="r|", encoding="utf-8", errors="surrogateescape",
    ) as tf:  # fmt: skip
        while (m := tf.next()) is not None:
            cast(Any, tf).members.clear()
            if manifest is not None:
                raise SnapshotInvalid(f"'{shown}': an entry comes after its manifest: refused")
            if m.name == MANIFEST and m.isreg():
                if m.size > MAX_MANIFEST:
                    raise SnapshotInvalid(f"'{shown}': its manifest is larger than {MAX_MANIFEST} bytes")
                src = tf.extractfile(m)
                assert src is not None
                try:
                    manifest = json.loads(src.read(m.size).decode("utf-8", "surrogateescape"))
                except ValueError:
                    raise SnapshotInvalid(f"'{shown}': its manifest is not JSON") from None
                continue
            _check_entry(m, shown)
            digest = hashlib.blake2b(os.fsencode(m.name), digest_size=16).digest()
            if digest in seen or len(seen) >= MAX_FILES:
                raise SnapshotInvalid(f"'{shown}': an entry comes twice, or more than {MAX_FILES} entries: refused")
            seen.add(digest)
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT or manifest.get("version") != VERSION:
        raise SnapshotInvalid(f"'{shown}' is not a toolcage snapshot (no manifest.json before its seal)")
    return manifest


def _check_entry(m: tarfile.TarInfo, shown: str) -> None:
    def bad(why: str) -> SnapshotInvalid:
        return SnapshotInvalid(f"'{shown}': the entry '{show(m.name)}' {why}: refused")

    top, _, rest = m.name.partition("/")
    if top not in ROOTS or transfer.safe_name(rest) != rest:
        raise bad("is not a plain path under scratch/ or workspace/")
    if m.mode & 0o7000:
        raise bad("has a setuid, setgid or sticky bit")
    if not (m.isdir() or m.issym() or m.isreg()) or m.sparse is not None:
        raise bad("is of a type a snapshot never holds")


__all__ = ["MAX_FILES", "MAX_MANIFEST", "SnapshotError", "SnapshotInvalid", "Verified", "check", "seal", "verify"]
