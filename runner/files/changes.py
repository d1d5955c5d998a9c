"""``Sandbox.changes()``: what a run did to its writable workspace copy, as git's diff and a list of paths.

The worker names the paths that may have changed (``workspace_changes``: hints, chosen by the sandbox);
the runner fetches those paths' current entries (``download`` with ``paths``: one tar stream, written
piece by piece into a private temp directory under names of the runner's own, toolcage.files.changesides),
reads the same paths in the host's workspace (by directory fd, never through a symlink of the host's
tree, never outside it), decides itself what was added, changed and removed, and has git write the
diff in a bounded child process (toolcage.files.gitplumb). So the sandbox can at most hide its own edits: it
cannot make the diff name a path outside the workspace (every name is checked to be a plain relative
path, and ``.git`` is never one, nor a name git takes for it), nor put in it bytes its files do not
hold, nor a symlink that points out of the workspace (Sandbox.download's rule: named in ``skipped``),
nor make the runner read what the copy never held (a host file the sandbox's user could not read
through the mount, toolcage.files.mountview; with ``gitignore``, a path the host's .gitignore files leave out
of the copy), nor a path beneath a host symlink or file that stays (so
``git apply`` always takes the diff).

What it costs the host, whatever the copy holds: the bytes read (old and new sides) stay within
``max_bytes``, on disk (holes for runs of zeros), the runner's memory within one 1 MiB piece plus the
diff it returns (at most ``max_diff_bytes``); git's work within ``diff_seconds`` and GIT_MEMORY. A side
over TEXT_MAX_BYTES or TEXT_MAX_LINES (or past TEXT_MAX_LINES_TOTAL for the whole diff) is a binary
patch; one over SHOW_MAX_BYTES, one the worker did not send (a sparse file), or past ``max_diff_bytes``
is changed but not shown (``Changes.not_shown``, with why). The diff is against the host's directory
as it is when ``changes()`` is called. git must be installed on the host (ChangesError otherwise).

When the host's workspace is in a git work tree, what that repository's ignore rules leave out (its
``.gitignore`` files at every depth, ``.git/info/exclude``; a tracked file never) is left out too: named in
``Changes.ignored``, never read, never in the diff nor in download_to. By default, not behind a keyword:
tests, builds and tools write caches (``.pytest_cache/``, ``__pycache__/``, ``node_modules/``) into the copy,
and ``git apply`` of a diff holding them plants them in the user's repository, which is the harm whoever
did not know of a keyword meets. The rules are the host's, read by git in the host's repository
(toolcage.files.gitplumb.host_ignored), never the copy's: the sandbox cannot hide an edit by rewriting its
``.gitignore`` (that edit is itself a change, shown). It does not depend on ``workspace_gitignore``, which
decides what enters the copy (and leaves ``.git`` out of it).
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from toolcage.errors import ChangesError, ChangesUsage
from toolcage.files import download as transfer
from toolcage.files import gitdiff, gitplumb, mountview
from toolcage.files.changesides import HostTree, OverBudget, Side, Unreadable, link_side, stream, write_file
from toolcage.files.gitplumb import DIFF_SECONDS, MAX_DIFF_BYTES, SHOW_MAX_BYTES
from toolcage.files.outbound import clean as clean  # re-exported: the rule of a diff's names lives there
from toolcage.files.outbound import door_problem
from toolcage.files.outbound import folded as _folded
from toolcage.files.safetar import DownloadResult, show
from toolcage.policies import codes, contract
from toolcage.textsafe import escape

if TYPE_CHECKING:
    from toolcage.files.download import Call
    from toolcage.results import CallResult

    ToolCall = Callable[[str, dict[str, Any]], CallResult]  # Sandbox.call

DEFAULT_MAX_BYTES = 1 << 30  # changed files' content changes() holds (new and old sides)
DEFAULT_MAX_FILES = 100_000
_PREFIX = contract.WORKSPACE + "/"


@dataclass(frozen=True)
class Changes:
    """What the run changed in its workspace copy, against the host's workspace: paths relative to it."""

    added: tuple[str, ...] = ()
    changed: tuple[str, ...] = ()  # content, mode, or a symlink's target
    removed: tuple[str, ...] = ()
    diff: str = ""  # git's format: ``git apply`` takes it in the host's directory (binary files included)
    files_dir: str | None = None  # where download_to wrote the added and changed files
    skipped: tuple[dict[str, str], ...] = field(default_factory=tuple)  # names refused, with why
    not_shown: tuple[dict[str, str], ...] = field(default_factory=tuple)  # changed, not in the diff: path, why
    # named by the sandbox as changed, left out by the host repository's ignore rules: never read, not in the diff
    ignored: tuple[str, ...] = ()

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
            "not_shown": list(self.not_shown),
            "ignored": [show(p) for p in self.ignored],
        }


def _result(res: Any, what: str) -> dict[str, Any]:
    if res.ok and isinstance(res.result, dict):
        return dict(res.result)
    err = res.error or {}
    if err.get("code") == codes.METHOD_NOT_FOUND:
        raise ChangesError(f"{what}: this worker image cannot tell its changes; rebuild it (toolcage image build)")
    raise ChangesError(f"{what} failed ({res.status}): {escape(str(err.get('message', '')))}")


def _unwire(path: str, prefix: str = _PREFIX) -> str | None:
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
    if not path.startswith(prefix):
        return None
    return clean(path[len(prefix) :])


# A symlink named like .gitmodules is refused by git too (what git takes for .git: toolcage.files.outbound).
_GITMODULES = re.compile(r"\.gitmodules|gitmod~[1-4]|gi7eba~[1-9]")


def collect(
    call: ToolCall,
    host: Path | None,
    *,
    gitignore: bool,
    prior: Iterable[str] = (),
    download_to: str | os.PathLike[str] | None = None,
    max_bytes: int = DEFAULT_MAX_BYTES,
    max_files: int = DEFAULT_MAX_FILES,
    diff_seconds: float = DIFF_SECONDS,
    max_diff_bytes: int = MAX_DIFF_BYTES,
    repo_ignores: bool = True,
    root: str = contract.WORKSPACE,
) -> Changes:
    """The run's changes against ``host`` (module doc); ``prior``: paths a resumed snapshot had changed;
    ``diff_seconds``: the deadline of the work git does on the host; ``max_diff_bytes``: the most diff
    returned (files past it are changed, not shown); ``repo_ignores``: leave out what the ignore rules of
    the host's git repository leave out (``Changes.ignored``; the module doc says why by default); ``root``:
    a writable path of the image instead of /workspace (toolcage.files.imagepaths: ``host`` is then the image's
    tree there, as the runner sent it, and nothing of it was withheld from the sandbox)."""
    if host is None:
        raise ChangesUsage(
            "changes() compares the copy with the workspace it was made from, and this run has none: "
            "pass workspace=DIR (with resume=, the directory the snapshot's copy came from)"
        )
    prefix = root + "/"
    asked: dict[str, Any] = {"gitignore": gitignore, **({"root": root} if root != contract.WORKSPACE else {})}
    hints = _result(call("workspace_changes", asked), "changes")
    if hints.get("truncated"):
        raise ChangesError(f"changes: more than {DEFAULT_MAX_FILES} paths changed; download the workspace instead")
    skipped: list[dict[str, str]] = []
    touched: set[str] = set()
    gone: set[str] = set()
    for key, into in (("changed", touched), ("removed", gone)):
        for raw in hints.get(key) or ():
            rel = _unwire(raw, prefix) if isinstance(raw, str) else None
            if rel is None:
                skipped.append({"path": escape(str(raw)), "reason": f"not a plain path in {root}"})
            else:
                into.add(rel)
    for rel in prior:
        if clean(rel) is not None:
            touched.add(rel)
    deadline = time.monotonic() + diff_seconds  # git's work on the host, all of it
    tree = HostTree(host)
    # the sides, on disk in a private (0700) directory: TMPDIR's file system pays up to max_bytes, less holes
    work = tempfile.mkdtemp(prefix="toolcage-changes-")
    try:
        os.mkdir(os.path.join(work, "new"), 0o700)
        os.mkdir(os.path.join(work, "old"), 0o700)
        got = _Gather(call, tree, work, skipped, max_bytes, max_files, root)
        got.fetch(touched, gitignore, gone, deadline if repo_ignores else None)
        return got.compare(download_to, deadline - time.monotonic(), max_diff_bytes)
    finally:
        tree.close()
        shutil.rmtree(work, ignore_errors=True)


class _Gather:
    """One changes(): the new sides fetched, each path compared, the diff made by git (toolcage.files.gitplumb)."""

    def __init__(
        self,
        call: ToolCall,
        tree: HostTree,
        work: str,
        skipped: list[dict[str, str]],
        max_bytes: int,
        max_files: int,
        root: str = contract.WORKSPACE,
    ) -> None:
        self.call, self.tree, self.work, self.skipped, self.root = call, tree, work, skipped, root
        self.max_bytes, self.max_files = max_bytes, max_files
        self.new: dict[str, Side] = {}
        self.unsent: dict[str, str] = {}  # paths the worker named but did not send (a sparse file): why
        self.considered: set[str] = set()
        self.held = 0  # bytes read, new sides and old
        self.made: dict[str, str] | None = None
        self.ignored: list[str] = []  # left out by the host repository's ignore rules

    def skip(self, rel: str, why: str) -> None:
        self.skipped.append({"path": show(rel), "reason": why})

    def fetch(self, touched: set[str], gitignore: bool, gone: set[str], deadline: float | None = None) -> None:
        """The new sides of ``touched`` streamed from the worker's tar into the work directory; with a
        ``deadline``, what the host repository's ignore rules leave out first set aside (never read)."""
        if gitignore:  # what the host's .gitignore left out never entered the copy: never read, never in the diff
            for rel in sorted(touched | gone, key=os.fsencode):
                if self.tree.ignored(rel):
                    self.skip(rel, "left out of the copy by the host's .gitignore")
                    touched.discard(rel)
                    gone.discard(rel)
        # what the copy withheld (the sandbox's user could not read it through the mount: toolcage.files.mountview)
        # is never read for the diff: its old side would hand the host's 0600 file to whoever reads the diff
        for rel in sorted(touched | gone, key=os.fsencode) if self.root == contract.WORKSPACE else ():
            if self.tree.kind(rel) is not None and not mountview.copied(self.tree.root, rel):
                self.skip(rel, "withheld from the copy (the sandbox's user cannot read it on the host): never read")
                touched.discard(rel)
                gone.discard(rel)
        if deadline is not None:
            for rel in self.repo_ignored(touched | gone, deadline):
                self.ignored.append(rel)
                touched.discard(rel)
                gone.discard(rel)
        self.considered = touched | gone
        if not touched:
            return
        got = DownloadResult("")
        entries = transfer.members(
            call_download(self.call),
            {"path": self.root, "paths": [f"{self.root}/{p}" for p in sorted(touched)]},
            max_bytes=self.max_bytes,
            max_files=self.max_files,
            result=got,
        )
        for i, (name, m, src) in enumerate(entries):
            if name not in touched or m.isdir():
                continue  # a directory, or a name not asked for: not a file of the diff
            file = os.path.join(self.work, "new", str(i))
            if m.issym():
                if len(os.fsencode(m.linkname)) >= 4096:
                    self.skip(name, "a symlink whose target is longer than a path may be")
                    continue
                self.new[name] = link_side(os.fsencode(m.linkname), file)
                continue
            mode = gitdiff.EXEC if m.mode & 0o100 else gitdiff.FILE
            try:
                self.new[name] = stream(src, m.size, mode, file, self.max_bytes - self.held)
            except OSError:
                raise ChangesError(f"changes: '{show(name)}' ended before its size") from None
            except OverBudget:
                raise ChangesError(f"changes: more than {self.max_bytes} bytes of changed files (max_bytes)") from None
            self.held += m.size
        for item in got.skipped:  # e.g. a sparse file: the worker says so rather than send its zeros
            named = transfer.safe_name(item.get("path", ""))
            if named is not None and named in touched and named not in self.new:
                self.unsent[named] = item.get("reason", "skipped in the sandbox")

    def repo_ignored(self, paths: set[str], deadline: float) -> list[str]:
        """Of ``paths``, those the ignore rules of the host's git repository leave out, sorted
        (toolcage.files.gitplumb.host_ignored). git answers nothing for a path beneath a symlink (or a file)
        of the host's: it is asked about that entry instead, and what lies beneath an ignored one is ignored."""
        kinds: dict[str, str | None] = {}
        asked: dict[str, list[str]] = {}
        for rel in paths:
            parts, query = rel.split("/"), rel
            for i in range(1, len(parts)):
                up = "/".join(parts[:i])
                if up not in kinds:
                    kinds[up] = self.tree.kind(up)
                if kinds[up] != "dir":
                    query = up if kinds[up] == "other" else rel  # absent: nothing of the host's beneath
                    break
            asked.setdefault(query, []).append(rel)
        out = gitplumb.host_ignored(self.tree.root, asked, self.work, deadline)
        return sorted((rel for query in out for rel in asked[query]), key=os.fsencode)

    def blocked(self, rel: str, dropped: set[str]) -> bool:
        """A directory of ``rel`` stays a symlink or a file (the host's, or one the copy made there): git
        would refuse to make ``rel`` (beyond a symlink, or under a file)."""
        parts = rel.split("/")
        for i in range(1, len(parts)):
            up = "/".join(parts[:i])
            if up in self.considered and up not in dropped:
                if up in self.new:
                    return True
            elif self.tree.kind(up) == "other":
                return True
        return False

    def door(self, rel: str, now: Side, roots: list[str]) -> str | None:
        """Why the copy's ``rel`` may not be made on the host (None: it may), by the rules of every door out
        (toolcage.files.outbound), for the host's directory and for download_to: a symlink that leads out of it, a
        HEAD that would make its directory a bare repository (git run there would read the sandbox's config)."""
        if self.made is None:  # what the diff makes stands for the host's entry there
            self.made = {}
            for r, s in self.new.items():
                self.made[r] = "link" if s.mode == gitdiff.LINK else "file"
                parts = r.split("/")
                for i in range(1, len(parts)):
                    self.made.setdefault("/".join(parts[:i]), "dir")
        target = None
        if now.mode == gitdiff.LINK:
            assert now.file is not None
            with open(now.file, "rb") as f:
                target = os.fsdecode(f.read())
        for root in roots:
            problem = door_problem(rel, target, root, self.made)
            if problem is not None:
                return problem
        return None

    def compare(self, download_to: str | os.PathLike[str] | None, diff_seconds: float, max_diff_bytes: int) -> Changes:
        files_dir = os.path.abspath(os.fspath(download_to)) if download_to is not None else None
        roots = [self.tree.root] + ([files_dir] if files_dir is not None else [])
        dropped: set[str] = set()
        lists: dict[str, list[str]] = {"added": [], "changed": [], "removed": []}
        not_shown: list[dict[str, str]] = []
        plan = gitplumb.Plan()
        for idx, rel in enumerate(sorted(self.considered, key=os.fsencode)):
            now = self.new.get(rel)
            if now is not None and self.blocked(rel, dropped):
                self.skip(rel, "beneath a symlink or file that stays one")
                dropped.add(rel)
                continue
            if rel in self.unsent:  # in the copy, not sent (a sparse file): changed, not shown, never read
                lists["changed" if self.tree.kind(rel) == "other" else "added"].append(rel)
                not_shown.append({"path": show(rel), "reason": f"not sent by the sandbox: {self.unsent[rel]}"})
                continue
            try:
                old = self.tree.side(
                    rel, os.path.join(self.work, "old", str(idx)), SHOW_MAX_BYTES, self.max_bytes - self.held
                )
            except OverBudget:
                raise ChangesError(
                    f"changes: more than {self.max_bytes} bytes of changed files, old and new sides (max_bytes)"
                ) from None
            except Unreadable as exc:
                raise ChangesError(str(exc)) from None
            if (old is None and now is None) or (now is not None and now.same(old)):
                continue
            self.held += old.size if old is not None else 0
            if any(s is not None and s.mode == gitdiff.LINK for s in (old, now)) and _GITMODULES.fullmatch(
                _folded(rel.rsplit("/", 1)[-1])
            ):
                self.skip(rel, "a symlink named like .gitmodules (git refuses one)")
                dropped.add(rel)
                continue
            problem = self.door(rel, now, roots) if now is not None else None
            if problem is not None:  # a link to /etc, one that climbs out, a bare repository: git apply would make it
                self.skip(rel, problem)
                dropped.add(rel)
                continue
            lists["added" if old is None else "removed" if now is None else "changed"].append(rel)
            why = plan.add(rel, old, now)
            if why is not None:
                not_shown.append({"path": show(rel), "reason": why})
        try:
            diff = plan.run(self.work, diff_seconds, max_diff_bytes, not_shown) if plan else ""
        except gitplumb.DiffFailed as exc:  # git is not installed
            raise ChangesError(str(exc)) from None
        if files_dir is not None:
            os.makedirs(files_dir, exist_ok=True)
            for rel in lists["added"] + lists["changed"]:
                if rel in self.new:
                    write_file(files_dir, rel, self.new[rel])
        return Changes(
            added=tuple(lists["added"]),
            changed=tuple(lists["changed"]),
            removed=tuple(lists["removed"]),
            diff=diff,
            files_dir=files_dir,
            skipped=tuple(self.skipped),
            not_shown=tuple(not_shown),
            ignored=tuple(self.ignored),
        )


def touched_paths(call: ToolCall, *, gitignore: bool, prior: Iterable[str] = ()) -> list[str]:
    """What a snapshot records as changed against the host's workspace: ``prior`` (a resumed snapshot's) and
    the paths the worker names now (hints: checked to be plain relative paths, never read), sorted, each once."""
    seen = dict.fromkeys(prior)  # a dict, not a list: membership stays O(1) for 100,000 hostile hints
    hints = call("workspace_changes", {"gitignore": gitignore})
    if hints.ok and isinstance(hints.result, dict):
        for raw in (hints.result.get("changed") or []) + (hints.result.get("removed") or []):
            rel = _unwire(raw) if isinstance(raw, str) else None
            if rel is not None:
                seen.setdefault(rel)
    return sorted(seen)


def call_download(call: ToolCall) -> Call:
    """``call`` bound to the download tool (the worker's tar stream)."""
    return lambda params: call("download", params)


__all__ = ["Changes", "ChangesError", "ChangesUsage", "collect", "touched_paths"]
