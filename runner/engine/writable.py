"""Which paths of an image a run may make writable (``writable=``), and how big: checked before anything starts.

Each writable path is a tmpfs (``HostConfig.Tmpfs``) the runner fills with the image's content there
(toolcage.files.imagepaths). Refused: the kernel's file systems, toolcage's runtime and the run's own roots
(RESERVED); names that are not plain; paths that nest; sizes that, with /scratch (and a workspace copy),
exceed the run's memory (a tmpfs is memory: a run past its memory limit is killed, where a full tmpfs
answers ENOSPC); and, in an image that runs its own worker, the directories that worker runs from.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from toolcage.errors import UsageError
from toolcage.policies import contract
from toolcage.textsafe import escape

if TYPE_CHECKING:
    from toolcage.policies.model import Limits

MIB = 1 << 20
DEFAULT_SIZE = 256 * MIB
MIN_SIZE = MIB
# kernel file systems, toolcage's runtime and the run's own roots: never an image path made writable
RESERVED = ("/proc", "/sys", "/dev", "/opt/toolcage", contract.WORKSPACE, contract.SCRATCH)
# where a toolcage worker image's own worker runs from (its interpreter, stdlib, loader, libraries, and the
# loader's /etc/ld.so.preload): never writable in such an image, or the sandbox could change the worker's code
# before the worker loads it. A user's own image runs the worker from /opt/toolcage/rt, whose loader and
# libraries read nothing of the image's (toolcage.engine.runtime), so only RESERVED holds there.
WORKER_OWN = ("/usr", "/lib", "/lib32", "/lib64", "/libx32", "/bin", "/sbin", "/etc")
# plain names only: they go into the engine's Tmpfs map and, ":"-joined, into the worker's environment
_PATH = re.compile(r"(?:/[A-Za-z0-9._@+-]+)+")


def check(
    paths: Iterable[Any], size: int | str | None, limits: Limits, copy: bool, in_container: bool
) -> tuple[tuple[str, int], ...]:
    """``writable=`` and ``writable_size`` checked before anything starts: (path, cap) pairs, UsageError with
    the fix otherwise. The caps, with /scratch (and a workspace copy), count against ``memory``: a tmpfs is
    memory, and a run whose writes pass its memory limit is killed where a full tmpfs answers ENOSPC."""
    from toolcage.policies.typed import parse_size

    if not in_container:
        raise UsageError(
            "writable= makes paths of the image writable, and --sandbox none runs no image: use a container"
        )
    try:
        cap = DEFAULT_SIZE if size is None else parse_size(size)
    except ValueError as exc:
        raise UsageError(f"writable_size: {exc}") from None
    if cap < MIN_SIZE:
        raise UsageError(f"writable_size must be at least 1m, not {cap} bytes")
    out: list[str] = []
    for raw in paths:
        if not isinstance(raw, str) or not raw.startswith("/"):
            raise UsageError(f"writable: {escape(str(raw))!r} is not an absolute path of the image (e.g. /testbed)")
        path = posixpath.normpath(raw)
        if path == "/":
            raise UsageError("writable: the whole root cannot be made writable; name its directories (/testbed, /root)")
        if not _PATH.fullmatch(path):
            raise UsageError(f"writable: {escape(path)!r} may hold only letters, digits and . _ @ + - in its names")
        for bad in RESERVED:
            if path == bad or path.startswith(bad + "/") or bad.startswith(path + "/"):
                raise UsageError(f"writable: {path} cannot be made writable: {bad} is the kernel's or toolcage's")
        for other in out:
            if other == path:
                break
            if path.startswith(other + "/") or other.startswith(path + "/"):
                raise UsageError(f"writable: {path} and {other} nest; name one of them")
        else:
            out.append(path)
    used = cap * len(out) + int(limits.scratch) + (int(limits.workspace_copy) if copy else 0)
    if used > int(limits.memory):
        copied = " and the workspace copy" if copy else ""
        raise UsageError(
            f"writable: {len(out)} path(s) of {cap / MIB:.0f} MiB each, with /scratch{copied}, may hold "
            f"{used / MIB:.0f} MiB, more than the run's memory ({int(limits.memory) / MIB:.0f} MiB): a tmpfs is "
            "memory, so raise memory (--memory) or lower writable_size (--writable-size)"
        )
    return tuple((path, cap) for path in out)


def check_worker_image(writable: tuple[tuple[str, int], ...]) -> None:
    """In an image that runs its own worker (toolcage's, or one built FROM it): UsageError for a path the worker
    runs from (WORKER_OWN)."""
    for path, _ in writable:
        for own in WORKER_OWN:
            if path == own or path.startswith(own + "/") or own.startswith(path + "/"):
                raise UsageError(
                    f"writable: {path} cannot be made writable in a toolcage worker image: its worker runs from "
                    f"{own}, and the sandbox could change it; name another path (/testbed, /root, /tmp), or run "
                    "your own image, where the worker runs from toolcage's read-only runtime"
                )


__all__ = ["DEFAULT_SIZE", "MIB", "MIN_SIZE", "RESERVED", "WORKER_OWN", "check", "check_worker_image"]
