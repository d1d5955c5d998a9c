"""The writable workspace copy's side of ``Sandbox.changes``: which paths may have changed since the copy.

With ``workspace_mode: copy`` the host uploads the workspace into /workspace (a tmpfs of
``limits.workspace_copy``) with ``upload``'s ``base`` flag; :func:`record_base` then keeps the list of
files and symlinks it made, and a ctime threshold: every later write, chmod, rename or utime of a
file sets its ctime at or past it (the kernel sets ctime, code cannot set it back). The
``workspace_changes`` tool answers the paths that are new, touched since, or gone: hints only. The
host downloads those paths, compares each with its own copy of the workspace and writes the diff
itself (toolcage.files.changes), so a hostile answer can hide the sandbox's own edits at most, never name
a path outside the workspace or put bytes in the diff that the sandbox's files do not hold.
"""

from __future__ import annotations

import os
import stat
import sys
import time
from typing import Any

from toolcage.policies.gitignore import Rules, ignored, with_own
from toolcage.worker.errors import ToolError
from toolcage.worker.settings import WORKSPACE, Settings
from toolcage.worker.tools import Tool
from toolcage.worker.tools._params import doc, params
from toolcage.worker.tools.names import to_wire
from toolcage.worker.tools.paths import root_fd

_STAGE = ".toolcage-upload-"  # upload's staging directories (worker.tools.upload)
_CLOCK_REALTIME_COARSE = 5  # Linux's clock id: the clock file times are set from
MAX_PATHS = 100_000  # paths one answer names (the rest: truncated)

# per root (/workspace, or a writable path of the image the runner filled: writable=): the copy's files and
# symlinks, "\0"-joined (compact: 100,000 paths in ~5 MB), and the ctime threshold: a file whose ctime is at
# or past it was touched after the copy
_bases: dict[str, tuple[str, int]] = {}


def _coarse_ns() -> int:
    try:
        return time.clock_gettime_ns(_CLOCK_REALTIME_COARSE)
    except OSError:  # pragma: no cover - every Linux has it
        return time.time_ns()


def record_base(base: str, root: str = WORKSPACE) -> None:
    """The copy just made under ``root`` (its files and symlinks, "\0"-joined: ``upload`` keeps them so), and the
    time after it: wait until the clock file times come from has moved past every time the copy set."""
    start = _coarse_ns()
    while (now := _coarse_ns()) <= start:
        time.sleep(0.001)
    _bases[root] = (base, now)


@params
class ChangesParams:
    gitignore: bool = doc("skip what the copy's .gitignore files ignore (as the copy was made)", False)
    root: str = doc(f"{WORKSPACE}, or a writable path of the image the run was given (writable=)", WORKSPACE)


def _git_dir(name: str) -> bool:
    return name == ".git"


def _is_link(dfd: int, name: str) -> bool:
    try:
        return stat.S_ISLNK(os.stat(name, dir_fd=dfd, follow_symlinks=False).st_mode)
    except OSError:
        return False


def changes(s: Settings, p: ChangesParams) -> dict[str, Any]:
    if p.root != WORKSPACE:
        if p.root not in s.image_roots or p.root not in _bases:
            raise ToolError(f"{p.root} is not a writable path of the image in this run (writable=)", {"root": p.root})
        real = p.root
    elif not s.workspace_copy or s.workspace is None:
        raise ToolError(
            f"this run has no writable copy of the workspace (workspace_mode copy): {WORKSPACE} is "
            "read-only, nothing in it can have changed",
            {},
        )
    else:
        real = s.workspace
    if p.root == WORKSPACE and p.root not in _bases and "toolcage.worker.copyfs" in sys.modules:
        from toolcage.worker import copyfs

        if copyfs.lower_fd() is not None:  # a cached copy (workspace_cache): its files are the cached tree's,
            _bases[p.root] = (copyfs.base_names(), copyfs.laid_ns())  # all made before the overlay was laid
    recorded, threshold_ns = _bases.get(p.root, ("", 0))
    base = set(recorded.split("\0")) if recorded else set()
    for _ in range(_WALK_TRIES):
        try:
            return _changes(p, real, base, threshold_ns)
        except OSError:
            # os.fwalk lists a directory it has opened without catching the error: a directory removed under
            # it (code racing the walk) fails the whole walk where getdents says so (gVisor: ENOENT)
            continue
    raise ToolError(
        f"{p.root} kept changing while it was read ({_WALK_TRIES} tries): call changes again when its code is done",
        {"root": p.root},
    )


_WALK_TRIES = 5


def _changes(p: ChangesParams, real: str, base: set[str], threshold_ns: int) -> dict[str, Any]:
    changed: list[str] = []
    seen: set[str] = set()
    truncated = False
    with root_fd(real) as rfd:
        walker = os.fwalk(".", dir_fd=rfd, follow_symlinks=False)
        rules: dict[str, tuple[Rules, ...]] = {"": ()}
        for dirpath, dirnames, filenames, dfd in walker:
            rel = "" if dirpath == "." else dirpath[2:]
            prefix = f"{rel}/" if rel else ""
            stack = rules.pop(rel, ())
            if p.gitignore:
                stack = with_own(stack, dfd, rel)
            keep_dirs, links = [], []
            for d in dirnames:
                if _git_dir(d) or (not rel and d.startswith(_STAGE)):
                    continue
                if _is_link(dfd, d):  # a symlink to a directory: an entry of its own, as git has it; never entered
                    links.append(d)
                    continue
                if p.gitignore and stack and ignored(stack, prefix + d, True):
                    continue
                keep_dirs.append(d)
                rules[prefix + d] = stack
            dirnames[:] = keep_dirs
            for name in filenames + links:
                path = prefix + name
                if _git_dir(name) or (p.gitignore and stack and ignored(stack, path, False)):
                    continue
                try:
                    st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
                except OSError:
                    continue
                if not (stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode)):
                    continue
                seen.add(path)
                if path not in base or st.st_ctime_ns >= threshold_ns:
                    if len(changed) >= MAX_PATHS:
                        truncated = True
                        continue
                    changed.append(path)
        removed: list[str] = []
        for path in sorted(base - seen):
            try:
                st = os.stat(path, dir_fd=rfd, follow_symlinks=False)
                gone = not (stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode))
            except OSError:
                gone = True
            if gone:
                if len(removed) >= MAX_PATHS:
                    truncated = True
                    break
                removed.append(path)
    changed.sort()
    return {
        "changed": [to_wire(f"{p.root}/{x}") for x in changed],
        "removed": [to_wire(f"{p.root}/{x}") for x in removed],
        "base_files": len(base),
        "truncated": truncated,
    }


TOOLS = [
    Tool(
        "workspace_changes",
        f"In a run with a writable copy of the workspace: the paths under {WORKSPACE} that "
        "were added or touched since the copy was made (changed) and those removed, as hints; .git is never "
        "named. Hosts use Sandbox.changes(), which compares each with the host's files and writes the diff.",
        ChangesParams,
        changes,
    ),
]
