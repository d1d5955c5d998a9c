"""Path confinement: resolve every path (symlinks too) and refuse anything outside the roots.

The kernel boundary is the container's mount namespace (read-only /workspace, tmpfs
scratch); this check gives a clear error instead of a confusing one, and is the only
guard when the worker runs with ``--sandbox none``.
"""

from __future__ import annotations

import os

from worker.errors import PathEscape, ToolError


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def confine(path: str, roots: tuple[str, ...], base: str) -> str:
    """Resolve ``path`` (relative to ``base``) and return it if it lies under one of ``roots``."""
    if "\x00" in path:
        raise PathEscape("path contains a NUL byte", {"path": path})
    joined = os.path.join(base, path)  # an absolute path replaces base
    resolved = os.path.realpath(joined)
    if not any(_inside(resolved, r) for r in roots):
        raise PathEscape(
            f"path {path!r} resolves outside the allowed directories ({', '.join(roots)})",
            {"path": path, "resolved": resolved, "allowed": list(roots)},
        )
    return resolved


def must_exist(path: str, original: str) -> os.stat_result:
    try:
        return os.stat(path)
    except FileNotFoundError:
        raise ToolError(f"no such file or directory: {original!r}", {"path": original}) from None
    except PermissionError:
        raise ToolError(f"permission denied: {original!r}", {"path": original}) from None
