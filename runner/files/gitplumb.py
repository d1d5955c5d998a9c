"""git's own diff of two trees, in a child process the runner bounds: what ``changes()`` shows.

Why git and not Python: a line diff in Python (difflib) holds every line as an object (~93 bytes of
RSS per byte of a file of newlines) and is quadratic on a rewrite; git's xdiff is linear-ish, has a
cost cut-off for pathological inputs, and writes the exact format ``git apply`` takes. Threat: the
sides are chosen by the sandbox, so git runs in a throwaway bare repository in the caller's private
temp directory, with a scrubbed environment (no system or global config, no attributes, no hooks,
no external diff or textconv, HOME in the temp directory, no inherited ``GIT_*``), under RLIMIT_AS
and RLIMIT_CPU, and killed at a wall-clock deadline. Nothing the sandbox wrote is ever read by git as
config or attributes: the sides are blobs, hashed from files named by the runner.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from toolcage import logs
from toolcage.errors import DiffFailed
from toolcage.files import gitdiff
from toolcage.files.changesides import Side
from toolcage.files.safetar import show

GIT_MEMORY = 1 << 30  # RLIMIT_AS of each git child (the sides it holds are capped far below)
TEXT_MAX_BYTES = 8 << 20  # a side diffed as text (git's xdiff) is at most this large...
TEXT_MAX_LINES = 200_000  # ...and this many lines (xdiff holds ~45 bytes a line; its CPU grows faster)
TEXT_MAX_LINES_TOTAL = 2_000_000  # lines of all text sides together; past it, binary patches
SHOW_MAX_BYTES = 32 << 20  # a side larger than this is not shown (a binary patch holds it deflated)
MAX_DIFF_BYTES = 128 << 20  # the diff changes() returns; files past it are not shown
DIFF_SECONDS = 60.0  # git's work on the host, all of it
log = logs.get_logger()  # the library's logger: never structlog's default, which prints on stdout


def scrubbed_env(home: str, **extra: str) -> dict[str, str]:
    """The environment of every git this module runs: a private ``home``, no system or global config (so no
    user-wide hooks, excludes, textconv or external diff), no attributes file, no replace objects, no
    optional locks, no prompt, no transport (a hostile workspace's partial-clone config would have check-ignore
    lazily fetch a missing .gitignore blob, running its remote's uploadpack: a shell command; NO_LAZY_FETCH
    from git 2.44, ALLOW_PROTOCOL naming no transport for older ones); nothing else of the caller's environment
    but PATH."""
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": home,
        "LC_ALL": "C",
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": os.devnull,
        "GIT_ATTR_NOSYSTEM": "1",
        "GIT_NO_REPLACE_OBJECTS": "1",
        "GIT_OPTIONAL_LOCKS": "0",
        "GIT_TERMINAL_PROMPT": "0",
        "GIT_NO_LAZY_FETCH": "1",
        "GIT_ALLOW_PROTOCOL": "none",
        **extra,
    }


@dataclass(frozen=True)
class Entry:
    """One side of one path: its name in the tree, its git mode, the runner's file holding its content
    (a symlink's target, for ``120000``)."""

    path: bytes
    mode: str
    file: str


# git is started through util-linux's prlimit (the limits are set before it becomes git), else through
# this Python wrapper (slower to start). Not preexec_fn, which is unsafe when the runner has threads
# (it has: the channel's reader, the pool's), nor prlimit(2) after the start (git would run unlimited first).
_LIMITED = (
    "import os, resource, sys\n"
    "cpu, mem = int(sys.argv[1]), int(sys.argv[2])\n"
    "resource.setrlimit(resource.RLIMIT_AS, (mem, mem))\n"
    "resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu))\n"
    "resource.setrlimit(resource.RLIMIT_CORE, (0, 0))\n"
    "os.execv(sys.argv[3], sys.argv[3:])\n"
)


def _limited(cpu_s: int, memory: int) -> list[str]:
    """The command that starts the next one under RLIMIT_CPU ``cpu_s``, RLIMIT_AS ``memory`` and no core."""
    prlimit = shutil.which("prlimit")
    if prlimit is not None:
        return [prlimit, f"--cpu={cpu_s}", f"--as={memory}", "--core=0", "--"]
    return [sys.executable, "-I", "-S", "-c", _LIMITED, str(cpu_s), str(memory)]


class Repo:
    """A bare repository in ``work`` (a private directory of the caller's), git run with a deadline."""

    def __init__(self, work: str, deadline: float, memory: int = GIT_MEMORY) -> None:
        git = shutil.which("git")
        if git is None:
            raise DiffFailed(
                "changes(): the diff is computed by git, and git is not installed on this host; install it"
                " (the added, changed and removed paths and download_to need it too)"
            )
        self.git, self.deadline, self.memory = git, deadline, memory
        self.dir = os.path.join(work, "repo.git")
        self.env = scrubbed_env(work, GIT_DIR=self.dir)
        # a bare repository is these three (what git checks); made here, it costs no process
        os.makedirs(os.path.join(self.dir, "objects"), mode=0o700)
        os.makedirs(os.path.join(self.dir, "refs"), mode=0o700)
        with open(os.path.join(self.dir, "HEAD"), "x") as f:
            f.write("ref: refs/heads/main\n")

    def run(
        self, args: Sequence[str], stdin: bytes = b"", out: str | None = None, attributes: str = os.devnull
    ) -> bytes:
        """``git args`` (config pinned on the command line), its stdout (or written to the file ``out``)."""
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise DiffFailed("changes(): the diff passed its deadline")
        cmd = [
            *_limited(int(left) + 1, self.memory),
            self.git,
            "-c", f"core.attributesFile={attributes}",
            "-c", "core.hooksPath=/dev/null",
            "-c", "core.quotePath=true",
            "-c", "core.fsmonitor=false",
            "-c", "diff.noprefix=false",
            "-c", "diff.mnemonicPrefix=false",
            "-c", "diff.algorithm=myers",
            "-c", "diff.relative=false",
            *args,
        ]  # fmt: skip
        sink = open(out, "wb") if out is not None else None  # noqa: SIM115 - closed below
        try:
            done = subprocess.run(
                cmd,
                input=stdin,
                stdout=sink if sink is not None else subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=self.env,
                cwd=os.path.dirname(self.dir),
                timeout=left,
                check=False,
            )
        except subprocess.TimeoutExpired:
            raise DiffFailed(f"changes(): git {args[0]} passed the diff's deadline; nothing was shown") from None
        finally:
            if sink is not None:
                sink.close()
        if done.returncode != 0:
            why = done.stderr.decode("utf-8", "replace").strip().splitlines()[-1:] or [f"exit {done.returncode}"]
            raise DiffFailed(f"changes(): git {args[0]} failed: {why[0][:300]}")
        return done.stdout if sink is None else b""

    def hash(self, files: Sequence[str]) -> list[str]:
        """The blob ids of ``files`` (the runner's own names), each written into the repository as is."""
        if not files:
            return []
        got = self.run(["hash-object", "-w", "--no-filters", "--stdin-paths"], "\n".join(files).encode() + b"\n")
        ids = got.decode().split()
        if len(ids) != len(files):
            raise DiffFailed("changes(): git hash-object gave fewer ids than files")
        return ids

    def tree(self, entries: Iterable[tuple[bytes, str, str]], index: str) -> str:
        """The tree of ``(path, mode, blob id)``, built in the index file ``index``."""
        info = b"".join(b"%s %s\t%s\0" % (mode.encode(), bid.encode(), path) for path, mode, bid in entries)
        env = self.env
        self.env = {**env, "GIT_INDEX_FILE": index}
        try:
            if info:
                self.run(["update-index", "-z", "--index-info"], info)
            return self.run(["write-tree"]).decode().strip()
        finally:
            self.env = env

    def diff(self, old: str, new: str, out: str, *, binary: bool) -> None:
        """The patch from tree ``old`` to tree ``new`` into the file ``out``; ``binary``: every file as a
        binary patch (an attributes file of the runner's own: ``* -diff``)."""
        attributes = os.devnull
        if binary:
            attributes = os.path.join(os.path.dirname(self.dir), "binary.attributes")
            with open(attributes, "w") as f:
                f.write("* -diff\n")
        args = ["diff-tree", "-r", "-p", "--binary", "--full-index", "--no-renames", "--no-ext-diff"]
        self.run([*args, "--no-textconv", "--no-color", old, new], out=out, attributes=attributes)


def diff_into(repo: Repo, old: list[Entry], new: list[Entry], out: str, *, binary: bool, tag: str) -> None:
    """Write into ``out`` the patch from the ``old`` sides to the ``new`` ones (each a tree of its own)."""
    ids = repo.hash([e.file for e in old + new])
    base = os.path.dirname(repo.dir)
    a = repo.tree(((e.path, e.mode, i) for e, i in zip(old, ids[: len(old)], strict=True)), f"{base}/{tag}.a.index")
    b = repo.tree(((e.path, e.mode, i) for e, i in zip(new, ids[len(old) :], strict=True)), f"{base}/{tag}.b.index")
    repo.diff(a, b, out, binary=binary)


def read_patches(paths: Sequence[str], headers: dict[bytes, str], cap: int) -> tuple[bytes, set[str]]:
    """The patches in the files ``paths``, at most ``cap`` bytes, whole files only, and the paths (by
    ``headers``: each ``diff --git`` line to its path) left out past the cap. A path's blocks (a file
    that became a symlink has two) are kept or left out together; the runner holds at most ``cap``."""
    kept: list[bytes] = []
    over: set[str] = set()
    room = cap
    group: list[bytes] = []
    size, who, first = 0, None, True

    def flush() -> None:
        nonlocal room
        if size <= room:
            kept.extend(group)
            room -= size
        elif who is not None:
            over.add(who)

    for path in paths:
        with open(path, "rb") as f:
            for line in f:
                if line.startswith(b"diff --git "):
                    name = headers.get(line.rstrip(b"\n"))
                    if first or name is None or name != who:
                        if not first:
                            flush()
                        group, size, who, first = [], 0, name, False
                size += len(line)
                if size <= room:
                    group.append(line)  # past the room the group is left out: never held
    if not first:
        flush()
    return b"".join(kept), over


class Plan:
    """Which path git diffs as text, which as binary, and which is not shown: the bounds in the module doc."""

    def __init__(self) -> None:
        self.text: tuple[list[Entry], list[Entry]] = ([], [])
        self.binary: tuple[list[Entry], list[Entry]] = ([], [])
        self.headers: dict[bytes, str] = {}
        self.lines = 0  # lines given to the text diff, all files

    def __bool__(self) -> bool:
        return bool(self.headers)

    def add(self, rel: str, old: Side | None, now: Side | None) -> str | None:
        """Plan ``rel``'s diff; why it is not shown, or None."""
        sides = [s for s in (old, now) if s is not None]
        if any(s.size > SHOW_MAX_BYTES or s.file is None for s in sides):
            return f"a side is larger than {SHOW_MAX_BYTES} bytes (SHOW_MAX_BYTES)"
        lines = sum(s.lines for s in sides)
        text = all(s.text and s.size <= TEXT_MAX_BYTES and s.lines <= TEXT_MAX_LINES for s in sides)
        if text and self.lines + lines <= TEXT_MAX_LINES_TOTAL:
            self.lines += lines
            into = self.text
        else:  # past the text bounds: a binary patch, linear to make (zlib) and still what git apply takes
            into = self.binary
        raw = os.fsencode(rel)
        for side, entries in ((old, into[0]), (now, into[1])):
            if side is not None:
                assert side.file is not None
                entries.append(Entry(raw, side.mode, side.file))
        self.headers[gitdiff.header(raw)] = rel
        return None

    def run(self, work: str, seconds: float, cap: int, not_shown: list[dict[str, str]]) -> str:
        """git's patch of the plan, at most ``cap`` bytes: what does not fit (or fails) goes to ``not_shown``."""
        start = time.monotonic()
        repo = Repo(work, start + seconds * 2 / 3)  # the text pass: two thirds; if it fails, binary patches
        patches: list[str] = []
        if any(self.text):
            try:
                diff_into(repo, *self.text, os.path.join(work, "text.patch"), binary=False, tag="text")
                patches.append(os.path.join(work, "text.patch"))
            except DiffFailed as exc:
                log.warning("changes.text_diff_failed", error=str(exc))
                self.binary[0].extend(self.text[0])
                self.binary[1].extend(self.text[1])
        repo.deadline = start + seconds
        if any(self.binary):
            try:
                diff_into(repo, *self.binary, os.path.join(work, "binary.patch"), binary=True, tag="binary")
                patches.append(os.path.join(work, "binary.patch"))
            except DiffFailed as exc:
                log.warning("changes.binary_diff_failed", error=str(exc))
                for raw in sorted({e.path for e in self.binary[0] + self.binary[1]}):
                    not_shown.append({"path": show(os.fsdecode(raw)), "reason": f"git failed on it: {exc}"})
        kept, over = read_patches(patches, self.headers, cap)
        not_shown.extend(
            {"path": show(rel), "reason": f"the diff passed {cap} bytes (max_diff_bytes)"} for rel in sorted(over)
        )
        return kept.decode("utf-8", "surrogateescape")


def host_ignored(root: str, paths: Iterable[str], home: str, deadline: float) -> set[str]:
    """Of ``paths`` (plain relative paths under ``root``, the host's workspace), those the ignore rules of the
    git repository ``root`` is in leave out: its ``.gitignore`` files at every depth and ``.git/info/exclude``,
    as the host has them, never the sandbox's copy (a sandbox that rewrites its ``.gitignore`` hides nothing).
    Asked of git itself (``git check-ignore``: every rule of gitignore(5), and a tracked path is never
    ignored), run in ``root`` under the limits of :class:`Repo`, with the scrubbed environment (no system or
    global config, so no user-wide excludes file: the answer is the repository's own), no fsmonitor, no
    hooks, no pathspec magic (each path is given as ``./path``: one named ``:(top)x`` or ``:!x`` is that name;
    ``GIT_LITERAL_PATHSPECS`` would do it, but check-ignore refuses every path under it). Empty
    when ``root`` is in no git work tree, when ``root`` itself is ignored by its repository (a build or
    scratch directory is not the repository's content), and when git refuses the repository (another
    user's: ``safe.directory``), which is logged. ``home``: a private directory (git's HOME)."""
    # sorted: git's ignore stack is kept from one path to the next while they share directories; in a set's
    # order, names alternating between two chains 2,000 directories deep cost it O(depth**1.6) each (20,000
    # of them: past the deadline, so changes() failed for every file)
    names = sorted(paths, key=os.fsencode)
    git = shutil.which("git")
    if not names:
        return set()
    if git is None:
        raise DiffFailed("changes(): the repository's ignore rules are read by git, and git is not installed")
    left = deadline - time.monotonic()
    if left <= 0:
        raise DiffFailed("changes(): the diff passed its deadline")
    env = scrubbed_env(home)
    cmd = [
        *_limited(int(left) + 1, GIT_MEMORY), git,
        "-c", "core.fsmonitor=false", "-c", "core.hooksPath=/dev/null",
        "check-ignore", "-z", "--stdin",
    ]  # fmt: skip
    # ".": is the workspace itself ignored? Every path as ./path: git reads magic only at a pathspec's start
    stdin = b"".join(os.fsencode(n) + b"\0" for n in [".", *(f"./{n}" for n in names)])
    try:
        done = subprocess.run(cmd, input=stdin, capture_output=True, env=env, cwd=root, timeout=left, check=False)
    except subprocess.TimeoutExpired:
        raise DiffFailed("changes(): git check-ignore passed the diff's deadline; nothing was shown") from None
    if done.returncode not in (0, 1):  # 1: nothing is ignored
        said = done.stderr.decode("utf-8", "replace").strip()
        if "not a git repository" not in said:
            log.warning("changes.ignore_rules_unread", error=said.splitlines()[-1][:300] if said else "")
        return set()
    got = {os.fsdecode(n) for n in done.stdout.split(b"\0") if n}
    return set() if "." in got else {n[2:] for n in got if n.startswith("./")} & set(names)


__all__ = ["GIT_MEMORY", "DiffFailed", "Entry", "Plan", "Repo", "diff_into", "host_ignored", "read_patches"]
