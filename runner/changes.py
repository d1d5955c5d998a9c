"""``Sandbox.changes()``: what a run did to its writable workspace copy, as git's diff and a list of paths.

The worker names the paths that may have changed (``workspace_changes``: hints, chosen by the sandbox);
the runner fetches those paths' current entries (``download`` with ``paths``: one tar stream, read in
memory, never written to disk by a name the sandbox chose), reads the same paths in the host's
workspace (by directory fd, never through a symlink of the host's tree, never outside it) and decides
itself what was added, changed and removed, and writes the diff (toolcage.gitdiff). So the sandbox can
at most hide its own edits: it cannot make the diff name a path outside the workspace (every name is
checked to be a plain relative path, and ``.git`` is never one, nor a name git takes for it), nor put
in it bytes its files do not hold, nor make the runner read what the copy never held (with
``gitignore``, a path the host's .gitignore files leave out of the copy is never read), nor a path
beneath a host symlink or file that stays (so ``git apply`` always takes the diff). What changes()
holds, old and new sides, stays within ``max_bytes``. The diff is against the host's directory as it
is when ``changes()`` is called.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import stat
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from toolcage import gitdiff, transfer
from toolcage.errors import SandboxError, UsageError
from toolcage.policies import codes, contract
from toolcage.policies.gitignore import Rules, ignored, with_own
from toolcage.safetar import DownloadResult, nofollow_dir, show
from toolcage.textsafe import escape

if TYPE_CHECKING:
    from toolcage.results import CallResult
    from toolcage.transfer import Call

    ToolCall = Callable[[str, dict[str, Any]], CallResult]  # Sandbox.call

DEFAULT_MAX_BYTES = 1 << 30  # changed files' content changes() holds (new and old sides)
DEFAULT_MAX_FILES = 100_000
_PREFIX = contract.WORKSPACE + "/"


class ChangesError(SandboxError):
    """The changes could not be gathered (a refused stream, a cap, a worker that cannot tell)."""

    status = "error"
    reason = "changes_failed"


class ChangesUsage(UsageError):
    """Bad input: changes() in a run without a workspace copy, or without the host directory to compare."""

    reason = "changes_usage"


@dataclass(frozen=True)
class Changes:
    """What the run changed in its workspace copy, against the host's workspace: paths relative to it."""

    added: tuple[str, ...] = ()
    changed: tuple[str, ...] = ()  # content, mode, or a symlink's target
    removed: tuple[str, ...] = ()
    diff: str = ""  # git's format: ``git apply`` takes it in the host's directory (binary files included)
    files_dir: str | None = None  # where download_to wrote the added and changed files
    skipped: tuple[dict[str, str], ...] = field(default_factory=tuple)  # names refused, with why

    def __bool__(self) -> bool:
        return bool(self.added or self.changed or self.removed)

    @property
    def paths(self) -> tuple[str, ...]:
        return tuple(sorted(self.added + self.changed + self.removed))

    def to_dict(self) -> dict[str, Any]:
        return {
            "added": [show(p) for p in self.added],
            "changed": [show(p) for p in self.changed],
            "removed": [show(p) for p in self.removed],
            "files_dir": self.files_dir,
            "skipped": list(self.skipped),
        }


def _result(res: Any, what: str) -> dict[str, Any]:
    if res.ok and isinstance(res.result, dict):
        return dict(res.result)
    err = res.error or {}
    if err.get("code") == codes.METHOD_NOT_FOUND:
        raise ChangesError(f"{what}: this worker image cannot tell its changes; rebuild it (toolcage image build)")
    raise ChangesError(f"{what} failed ({res.status}): {escape(str(err.get('message', '')))}")


def _unwire(path: str) -> str | None:
    """A path as the tools name it (``/workspace/…``, quoted when not UTF-8) as a relative path, or None."""
    if len(path) >= 3 and path.startswith('"/') and path.endswith('"'):
        raw, body, i = bytearray(), path[1:-1], 0
        while i < len(body):
            c = body[i]
            if c == "\\" and body[i + 1 : i + 2] == "x" and i + 4 <= len(body):
                try:
                    raw.append(int(body[i + 2 : i + 4], 16))
                except ValueError:
                    return None
                i += 4
            elif c == "\\" and i + 1 < len(body):
                raw += body[i + 1].encode()
                i += 2
            else:
                raw += c.encode("utf-8", "surrogateescape")
                i += 1
        path = os.fsdecode(bytes(raw))
    if not path.startswith(_PREFIX):
        return None
    return clean(path[len(_PREFIX) :])


# What git's verify_path takes for .git, and so refuses (``git apply`` then refuses the whole diff), and what
# a case-insensitive host opens as its .git: any case, trailing dots and spaces, an NTFS stream (``:``),
# the NTFS short name, code points HFS+ ignores. A symlink named like .gitmodules is refused by git too.
_HFS_IGNORED = dict.fromkeys([0x200C, 0x200D, 0x200E, 0x200F, *range(0x202A, 0x202F), *range(0x206A, 0x2070), 0xFEFF])
_GITMODULES = re.compile(r"\.gitmodules|gitmod~[1-4]|gi7eba~[1-9]")


def _folded(part: str) -> str:
    return part.translate(_HFS_IGNORED).split(":", 1)[0].rstrip(". ").lower()


def _dot_git(part: str) -> bool:
    return _folded(part) in (".git", "git~1")


def clean(rel: str) -> str | None:
    """``rel`` if it is a plain relative path that may be in a diff, else None (``.git`` never is, nor any
    name git takes for it)."""
    name = transfer.safe_name(rel)
    if name is None or name != rel or any(_dot_git(p) for p in name.split("/")):
        return None
    return name


class _HostTree:
    """The host's workspace, read by directory fd: never through a symlink, never outside it."""

    def __init__(self, root: Path) -> None:
        self.fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)

    def _dir(self, parts: list[str]) -> int:
        """An fd of the directory ``parts`` beneath the root, never through a symlink (OSError if none)."""
        return nofollow_dir(self.fd, parts, create=False)

    def kind(self, rel: str) -> str | None:
        """``dir``, ``other`` (a file, a symlink, anything else) or None (absent, or beyond a symlink)."""
        parts = rel.split("/")
        try:
            fd = self._dir(parts[:-1])
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
        (toolcage.upload): an ignored directory on the way, or the entry itself."""
        parts = rel.split("/")
        stack: tuple[Rules, ...] = ()
        fd: int | None = os.dup(self.fd)
        try:
            for i, part in enumerate(parts):
                if fd is not None:
                    stack = with_own(stack, fd, "/".join(parts[:i]))
                path, last = "/".join(parts[: i + 1]), i == len(parts) - 1
                if stack and ignored(stack, path, not last):
                    return True
                if last:
                    return bool(stack) and self.kind(rel) == "dir" and ignored(stack, path, True)
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

    def side(self, rel: str, budget: int) -> gitdiff.Side | None:
        """``rel``'s side in the host's tree (None: absent, beyond a symlink, or not a file or symlink),
        reading at most ``budget`` bytes of it (ChangesError past that)."""
        parts = rel.split("/")
        try:
            fd = self._dir(parts[:-1])
        except OSError as exc:
            if exc.errno in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP):
                return None  # absent, or beyond a symlink of the host's tree: not this path
            raise ChangesError(f"changes: cannot read '{show(rel)}' in the workspace: {exc.strerror}") from None
        try:
            st = os.stat(parts[-1], dir_fd=fd, follow_symlinks=False)
            if stat.S_ISLNK(st.st_mode):
                return gitdiff.Side(os.fsencode(os.readlink(parts[-1], dir_fd=fd)), gitdiff.LINK)
            if not stat.S_ISREG(st.st_mode):
                return None
            ffd = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=fd)
            with os.fdopen(ffd, "rb") as f:
                data = f.read(budget + 1) if st.st_size <= budget else b""
            if st.st_size > budget or len(data) > budget:
                raise _OverBudget
            return gitdiff.Side(data, gitdiff.EXEC if st.st_mode & 0o100 else gitdiff.FILE)
        except OSError as exc:
            if exc.errno in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP):
                return None
            raise ChangesError(f"changes: cannot read '{show(rel)}' in the workspace: {exc.strerror}") from None
        finally:
            os.close(fd)

    def close(self) -> None:
        os.close(self.fd)


class _OverBudget(Exception):
    """A host file past what changes() may still hold."""


def _write_file(top: str, rel: str, side: gitdiff.Side) -> None:
    """One added or changed file under ``top`` (made by names already checked; never through a symlink)."""
    parts = rel.split("/")
    top_fd = os.open(top, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fd = nofollow_dir(top_fd, parts[:-1], create=True, mode=0o755)
    finally:
        os.close(top_fd)
    try:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(parts[-1], dir_fd=fd)
        if side.mode == gitdiff.LINK:
            os.symlink(os.fsdecode(side.data), parts[-1], dir_fd=fd)
            return
        mode = 0o755 if side.mode == gitdiff.EXEC else 0o644
        out = os.open(parts[-1], os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=fd)
        with os.fdopen(out, "wb") as f:
            f.write(side.data)
    finally:
        os.close(fd)


def collect(
    call: ToolCall,
    host: Path | None,
    *,
    gitignore: bool,
    prior: Iterable[str] = (),
    download_to: str | os.PathLike[str] | None = None,
    max_bytes: int = DEFAULT_MAX_BYTES,
    max_files: int = DEFAULT_MAX_FILES,
) -> Changes:
    """The run's changes against ``host`` (module doc); ``prior``: paths a resumed snapshot had changed."""
    if host is None:
        raise ChangesUsage(
            "changes() compares the copy with the workspace it was made from, and this run has none: "
            "pass workspace=DIR (with resume=, the directory the snapshot's copy came from)"
        )
    hints = _result(call("workspace_changes", {"gitignore": gitignore}), "changes")
    if hints.get("truncated"):
        raise ChangesError(f"changes: more than {DEFAULT_MAX_FILES} paths changed; download the workspace instead")
    skipped: list[dict[str, str]] = []
    touched: set[str] = set()
    gone: set[str] = set()
    for key, into in (("changed", touched), ("removed", gone)):
        for raw in hints.get(key) or ():
            rel = _unwire(raw) if isinstance(raw, str) else None
            if rel is None:
                skipped.append({"path": escape(str(raw)), "reason": "not a plain path in the workspace"})
            else:
                into.add(rel)
    for rel in prior:
        if clean(rel) is not None:
            touched.add(rel)
    tree = _HostTree(host)
    try:
        return _gather(call, tree, touched, gone, skipped, gitignore, download_to, max_bytes, max_files)
    finally:
        tree.close()


def _gather(
    call: ToolCall,
    tree: _HostTree,
    touched: set[str],
    gone: set[str],
    skipped: list[dict[str, str]],
    gitignore: bool,
    download_to: str | os.PathLike[str] | None,
    max_bytes: int,
    max_files: int,
) -> Changes:
    def skip(rel: str, why: str) -> None:
        skipped.append({"path": show(rel), "reason": why})

    if gitignore:  # what the host's .gitignore left out never entered the copy: never read, never in the diff
        for rel in sorted(touched | gone, key=os.fsencode):
            if tree.ignored(rel):
                skip(rel, "left out of the copy by the host's .gitignore")
                touched.discard(rel)
                gone.discard(rel)
    new: dict[str, gitdiff.Side] = {}
    held = 0  # bytes of content held, new sides and old
    if touched:
        got = DownloadResult(str(download_to or ""))
        wanted = set(touched)
        for name, m, src in transfer.members(
            call_download(call),
            {"path": contract.WORKSPACE, "paths": [_PREFIX + p for p in sorted(touched)]},
            max_bytes=max_bytes,
            max_files=max_files,
            result=got,
        ):
            if name not in wanted or m.isdir():
                continue  # a directory, or a name not asked for: not a file of the diff
            if m.issym():
                new[name] = gitdiff.Side(os.fsencode(m.linkname), gitdiff.LINK)
                continue
            data = src.read(m.size)
            if len(data) != m.size:
                raise ChangesError(f"changes: '{show(name)}' ended before its size")
            held += len(data)
            new[name] = gitdiff.Side(data, gitdiff.EXEC if m.mode & 0o100 else gitdiff.FILE)
    considered = touched | gone
    dropped: set[str] = set()

    def blocked(rel: str) -> bool:
        """A directory of ``rel`` stays a symlink or a file (the host's, or one the copy made there): git
        would refuse to make ``rel`` (beyond a symlink, or under a file)."""
        parts = rel.split("/")
        for i in range(1, len(parts)):
            up = "/".join(parts[:i])
            if up in considered and up not in dropped:
                if up in new:
                    return True
            elif tree.kind(up) == "other":
                return True
        return False

    added: list[str] = []
    changed: list[str] = []
    removed: list[str] = []
    parts: list[str] = []
    for rel in sorted(considered, key=os.fsencode):
        now = new.get(rel)
        if now is not None and blocked(rel):
            skip(rel, "beneath a symlink or file that stays one")
            dropped.add(rel)
            continue
        try:
            old = tree.side(rel, max_bytes - held)
        except _OverBudget:
            raise ChangesError(
                f"changes: more than {max_bytes} bytes of changed files, old and new sides (max_bytes)"
            ) from None
        if old == now:
            continue
        if any(s is not None and s.mode == gitdiff.LINK for s in (old, now)) and _GITMODULES.fullmatch(
            _folded(rel.rsplit("/", 1)[-1])
        ):
            skip(rel, "a symlink named like .gitmodules (git refuses one)")
            dropped.add(rel)
            continue
        held += len(old.data) if old is not None else 0
        (added if old is None else removed if now is None else changed).append(rel)
        parts.append(gitdiff.file_diff(os.fsencode(rel), old, now))
    files_dir = None
    if download_to is not None:
        files_dir = os.path.abspath(os.fspath(download_to))
        os.makedirs(files_dir, exist_ok=True)
        for rel in added + changed:
            _write_file(files_dir, rel, new[rel])
    return Changes(tuple(added), tuple(changed), tuple(removed), "".join(parts), files_dir, tuple(skipped))


def call_download(call: ToolCall) -> Call:
    """``call`` bound to the download tool (the worker's tar stream)."""
    return lambda params: call("download", params)


__all__ = ["Changes", "ChangesError", "ChangesUsage", "collect"]
