"""Many small files in one round trip each way: ``Sandbox.write_files`` and ``Sandbox.read_files``.

``write_files({path: content})`` makes one tar in memory per root and sends it through the worker's
``upload`` (checked and extracted there as any upload, renamed into place only when all of it is
good); ``read_files(paths)`` asks the worker's ``download`` for just those paths (``paths=``) and reads
the one tar stream it answers in memory (toolcage.files.download.members: hostile input, never written to
disk). 1,000 files cost a few calls, not 1,000. Paths follow the tools' rule: ``/scratch/…`` or
``/workspace/…``, and a relative path is relative to /scratch.
"""

from __future__ import annotations

import tarfile
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from toolcage.errors import UsageError
from toolcage.files import download as transfer
from toolcage.files import upload
from toolcage.files.safetar import DownloadResult, DownloadUsage, show
from toolcage.policies import contract

if TYPE_CHECKING:
    from toolcage.results import CallResult

    ToolCall = Callable[[str, dict[str, Any]], CallResult]

_ROOTS = (contract.WORKSPACE, contract.SCRATCH)


def split(path: str, error: type[UsageError] = DownloadUsage) -> tuple[str, str]:
    """``(root, relative path)`` of a path as the tools take it; ``error`` if it is not beneath a root."""
    full = path if path.startswith("/") else f"{contract.SCRATCH}/{path}"
    for root in _ROOTS:
        if full.startswith(root + "/"):
            rel = transfer.safe_name(full[len(root) + 1 :])
            if rel is not None:
                return root, rel
    raise error(
        f"'{show(path)}' is not a file path under {contract.SCRATCH} or {contract.WORKSPACE} (no '..', not a root)"
    )


def write_files(call: ToolCall, files: Mapping[str, bytes | str], mode: int = 0o644) -> upload.UploadResult:
    """Write each ``{path: content}`` (text is written as UTF-8), one upload per root (module doc)."""
    by_root: dict[str, dict[str, bytes]] = {}
    for path, content in files.items():
        root, rel = split(path, upload.UploadUsage)
        by_root.setdefault(root, {})[rel] = content.encode() if isinstance(content, str) else bytes(content)
    total = upload.UploadResult(contract.SCRATCH)
    for root, entries in by_root.items():
        got = upload.send(lambda params: call("upload", params), _tar(entries, mode), root, shown=root)
        total.files += got.files
        total.bytes += got.bytes
        total.dirs += got.dirs
    return total


def _tar(entries: dict[str, bytes], mode: int) -> Iterator[bytes]:
    now = int(time.time())
    for rel in sorted(entries):
        data = entries[rel]
        info = tarfile.TarInfo(rel)
        info.size, info.mode, info.mtime = len(data), mode & 0o777, now
        yield info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")
        yield data
        if len(data) % tarfile.BLOCKSIZE:
            yield bytes(tarfile.BLOCKSIZE - len(data) % tarfile.BLOCKSIZE)
    yield bytes(2 * tarfile.BLOCKSIZE)


def read_files(
    call: ToolCall, paths: Iterable[str], *, missing_ok: bool = False, max_bytes: int = 256 << 20
) -> dict[str, bytes]:
    """Each regular file of ``paths``, by the path as given; DownloadUsage naming the missing ones unless
    ``missing_ok`` (then they are left out). At most ``max_bytes`` in all (DownloadLimit past it)."""
    wanted: dict[str, dict[str, str]] = {}  # root -> rel -> path as given
    for path in paths:
        root, rel = split(path)
        wanted.setdefault(root, {})[rel] = path
    out: dict[str, bytes] = {}
    for root, rels in wanted.items():
        seen = DownloadResult("")
        for name, m, src in transfer.members(
            lambda params: call("download", params),
            {"path": root, "paths": [f"{root}/{r}" for r in sorted(rels)]},
            max_bytes=max_bytes,
            max_files=len(rels) + 1,
            result=seen,
        ):
            if name in rels and m.isreg():
                data = src.read(m.size)
                if len(data) != m.size:
                    raise transfer.DownloadError(f"read_files: '{show(name)}' ended before its size")
                out[rels[name]] = data
    missing = [p for rels in wanted.values() for p in rels.values() if p not in out]
    if missing and not missing_ok:
        raise DownloadUsage(
            f"read_files: no such file (or not a regular file): {', '.join(repr(show(p)) for p in missing[:20])}"
            + (f" and {len(missing) - 20} more" if len(missing) > 20 else ""),
            data={"missing": [show(p) for p in missing[:1000]]},
        )
    return out


__all__ = ["read_files", "split", "write_files"]
