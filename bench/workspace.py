"""The writable workspace copy beside the read-only mount, ``changes()``, and snapshots and resume, in one run.

    python -m bench.workspace [--runs 3] [--image IMAGE] [--profile] [--json PATH]

Two workspaces, made once under /tmp:

- ``repo``: this repository as ``git archive HEAD`` exports it (tracked files only: no .venv, build
  or .git; ``workspace_gitignore`` stays False, as the export holds nothing ignored);
- ``tree``: 100,000 files of 100 B in 1,000 directories.

Timed on the host, ``--runs`` times (min/median/max; the order of the blocks below is reversed
every other run), each figure from ``Sandbox(...)`` construction through ``start()`` to the
answer of the first ``sb.call("ping")``:

1. ``start``: each workspace in ``workspace_mode="ro"`` (bind-mounted read-only) and ``"copy"`` (a
   tmpfs the runner fills over the upload protocol at start), and the ratio copy/ro of the medians.
   The repo uses the default policy; the tree uses TREE_POLICY (a 1 GiB copy, 2 GiB of memory,
   longer timeouts) in both modes, so the ratio is the mode's alone. And the tree with ``workspace_cache``
   (the copy laid over the tree the engine keeps, toolcage.engine.copycache): its first start (noted,
   copied as without) and its second (kept: a run fills the cache, then this one lays it), once each
   before the runs, and a start of the kept tree in each run against the read-only start (goal <= 3x).
2. ``changes()``: in the repo copy, 10 tracked files are edited with one ``run_shell`` (a line
   appended to each); ``sb.changes()`` is timed and the diff's size kept (checked: exactly those 10
   paths changed, nothing added or removed).
3. snapshots: a sandbox of SNAP_POLICY (256 MiB of scratch, 1 GiB of memory) with no workspace is
   started cold (the baseline), 50 MiB of /dev/urandom are written in 5 files under /scratch,
   ``sb.snapshot(path)`` is timed, then ``Sandbox(SNAP_POLICY, resume=path)`` start to first ping
   (checked: the files' sha256 equal). The same for the repo copy after its edits:
   ``sb.snapshot(path)``, then ``Sandbox(workspace=repo, resume=path)`` (checked: its ``changes()``
   gives the same diff), against the repo copy's own start. The snapshots' sizes are kept.

4. the pool for coding tasks: a ``Pool(workspace=repo, workspace_mode="copy", size=1)`` whose slot waits
   ready (waited for before the clock starts): ``pool.sandbox()`` adopt to first ping, the slot filled with a
   fresh copy of the repo; and ``pool.sandbox(resume=path)`` with the repo's snapshot of 3. Against the cold
   copy start and the cold resume of the same run.

Every start is also split (from the upload calls' timings, taken by a Sandbox subclass that only
observes): ``init`` (the constructor: its workspace check walks the tree; a resume verifies its
snapshot there), ``container`` (the start without the fill), ``host`` (the fill outside the upload
calls: the host's walks, tar headers, reads, base64 and sha256 of each chunk), ``first`` (the first
upload call: it waits for the worker to be ready, as the read-only start's first ping does),
``chunks`` (the other upload calls: JSON, transport and the worker's extraction), ``final`` (the
calls with ``done``: the extraction's tail, the move into place, the copy's list) and ``ping``.
The read-only tree run also times two floors inside its sandbox, under the policy's CPU quota: GNU tar
copying the mounted tree into a tmpfs (a native copy: no host, no protocol), and the same tree extracted
from a tar already in the tmpfs (the files any copy into a tmpfs must make, and nothing else); the tree
copy's start is given against a read-only start plus each. ``--profile`` adds a cProfile of one tree copy
start, with the host's time grouped. The load
average is printed: the machine may be busy with other work. Reported, no goal.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import json
import os
import platform
import pstats
import shlex
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import toolcage
from toolcage import DEFAULT_IMAGE, CallResult, Pool, Sandbox

MiB = 1 << 20
REPO = Path(__file__).resolve().parent.parent
TREE_DIRS, TREE_PER_DIR, TREE_BYTES = 1000, 100, 100
TREE_FILES = TREE_DIRS * TREE_PER_DIR
EDITS = 10
SCRATCH_FILES, SCRATCH_FILE_BYTES = 5, 10 * MiB

TREE_POLICY: dict[str, Any] = {
    "extends": "default",
    # 100,000 files take a tmpfs page each (~400 MiB of the copy), counted against memory; the scratch holds
    # the floor's native copy (Bench.tree_ro), made in the read-only run only
    "limits": {"workspace_copy": "1g", "scratch": "1g", "memory": "2g"},
    "timeouts": {"run_s": 900, "idle_s": 900, "call_s": 600},
}
# the floors, timed in the sandbox (prints nanoseconds twice, then the files made): GNU tar extracts the tree
# from a tar already in the tmpfs (the extraction alone: the files made, nothing read from the mount), then
# copies the mounted tree into a tmpfs (a native copy: tar -c | tar -x)
NATIVE_COPY = (
    "mkdir /scratch/native /scratch/again && tar -C /workspace -cf /scratch/tree.tar . "
    "&& s2=$(date +%s%N) && tar -C /scratch/again -xf /scratch/tree.tar && e2=$(date +%s%N) "
    "&& rm -rf /scratch/again /scratch/tree.tar && s=$(date +%s%N) && tar -C /workspace -cf - . "
    "| tar -C /scratch/native -xf - && e=$(date +%s%N) && echo $((e - s)) $((e2 - s2)) "
    "$(find /scratch/native -type f | wc -l) && rm -rf /scratch/native"
)
SNAP_POLICY: dict[str, Any] = {
    "extends": "default",
    "limits": {"scratch": "256m", "memory": "1g"},
    "timeouts": {"run_s": 600, "idle_s": 600, "call_s": 300},
}
EDIT_LINE = "# edited by bench.workspace"
WRITE_SCRATCH = (
    "set -e; mkdir -p /scratch/data; "
    f"for i in $(seq 1 {SCRATCH_FILES}); do head -c {SCRATCH_FILE_BYTES} /dev/urandom > /scratch/data/blob$i.bin; "
    "done; "
    "cd /scratch/data && sha256sum blob*.bin"
)
HASH_SCRATCH = "cd /scratch/data && sha256sum blob*.bin"


# the workspaces --------------------------------------------------------------------------------------


def export_repo(dest: Path) -> str:
    """This repository's HEAD, as ``git archive`` exports it, into ``dest``; the commit."""
    commit = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
    archive = dest.with_suffix(".tar")
    subprocess.run(["git", "-C", str(REPO), "archive", "--format=tar", "-o", str(archive), commit], check=True)
    dest.mkdir()
    with tarfile.open(archive) as tf:
        tf.extractall(dest, filter="data")
    archive.unlink()
    return commit


def make_tree(dest: Path) -> None:
    body = b"x" * (TREE_BYTES - 1) + b"\n"
    for d in range(TREE_DIRS):
        sub = dest / f"d{d:03d}"
        sub.mkdir(parents=True)
        for f in range(TREE_PER_DIR):
            (sub / f"f{f:03d}.txt").write_bytes(body)


def local_tree(path: Path) -> tuple[int, int]:
    """(files, bytes of content) under ``path``."""
    files = size = 0
    for dirpath, _, names in os.walk(path):
        for name in names:
            files += 1
            size += os.lstat(os.path.join(dirpath, name)).st_size
    return files, size


def pick_edits(repo: Path) -> list[str]:
    """EDITS tracked Python files of the export, the same every run."""
    found = sorted(str(p.relative_to(repo)) for p in (repo / "runner").rglob("*.py") if p.is_file())
    if len(found) < EDITS:
        raise SystemExit(f"the export has {len(found)} Python files under runner/, fewer than {EDITS}")
    return found[:: max(1, len(found) // EDITS)][:EDITS]


# a sandbox whose start is timed ---------------------------------------------------------------------


class TimedSandbox(Sandbox):
    """A Sandbox that notes when its ``upload`` calls ran (the workspace copy and a resume go in through
    them) and when its fill ran; it changes nothing of what the Sandbox does."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.upload_calls: list[tuple[float, float, bool]] = []  # (start, end, done)
        self.fill_span: tuple[float, float] | None = None

    def call(self, tool: str, params: dict[str, Any] | None = None, **kwargs: Any) -> CallResult:
        t = time.perf_counter()
        try:
            return super().call(tool, params, **kwargs)
        finally:
            if tool == "upload":
                self.upload_calls.append((t, time.perf_counter(), bool((params or {}).get("done"))))

    def _fill(self) -> None:  # Sandbox.start's fill (private; if it is renamed, the split loses host/container)
        t = time.perf_counter()
        try:
            super()._fill()
        finally:
            self.fill_span = (t, time.perf_counter())


@dataclass
class Start:
    """One start to first ping, in seconds."""

    total: float
    init: float  # Sandbox(...)
    start: float  # start(): the container, the handshake, the fill
    ping: float
    fill: float | None = None  # the workspace copy or the resume's files (None: no upload calls, or not timed)
    first: float = 0.0  # the first upload call (it opens the stream, and waits for the worker to be ready)
    chunks: float = 0.0  # the other upload calls without done
    final: float = 0.0  # upload calls with done
    calls: list[float] = field(default_factory=list)  # each upload call

    @property
    def container(self) -> float | None:
        if self.fill is not None:
            return self.start - self.fill
        return None if self.calls else self.start

    @property
    def host(self) -> float | None:
        return None if self.fill is None else self.fill - self.first - self.chunks - self.final

    def split(self) -> dict[str, float | None]:
        none = not self.calls
        return {
            "init": self.init,
            "container": self.container,
            "host": self.host,
            "first": None if none else self.first,
            "chunks": None if none else self.chunks,
            "final": None if none else self.final,
            "ping": self.ping,
        }


@contextlib.contextmanager
def started(image: str, policy: Any = "default", **kwargs: Any) -> Iterator[tuple[TimedSandbox, Start]]:
    """A sandbox started and answering ping, with the time that took; closed at the end."""
    with timed_start(lambda: TimedSandbox(policy, image=image, tool="bench-workspace", **kwargs)) as got:
        yield got


@contextlib.contextmanager
def pooled(pool: Pool, **kwargs: Any) -> Iterator[tuple[TimedSandbox, Start]]:
    """As :func:`started`, adopting a slot of ``pool`` that waits ready (it is waited for before the clock)."""
    if not pool.wait_ready(timeout=120):
        raise SystemExit("the copy pool's slot did not come up within 120 s")
    with timed_start(lambda: TimedSandbox(pool=pool, **kwargs)) as got:
        yield got


@contextlib.contextmanager
def timed_start(make: Callable[[], TimedSandbox]) -> Iterator[tuple[TimedSandbox, Start]]:
    t0 = time.perf_counter()
    sb = make()
    t1 = time.perf_counter()
    with sb:
        t2 = time.perf_counter()
        res = sb.call("ping")
        t3 = time.perf_counter()
        if not res.ok or res.result != "pong":
            raise SystemExit(f"ping answered {res.status}: {res.result!r} {res.error!r}")
        s = Start(total=t3 - t0, init=t1 - t0, start=t2 - t1, ping=t3 - t2)
        calls = sb.upload_calls
        if sb.fill_span is not None and calls:
            s.fill = sb.fill_span[1] - sb.fill_span[0]
        if calls:
            s.first = calls[0][1] - calls[0][0]
            s.chunks = sum(b - a for a, b, done in calls[1:] if not done)
            s.final = sum(b - a for a, b, done in calls if done)
            s.calls = [b - a for a, b, _ in calls]
        yield sb, s


def shell(sb: Sandbox, command: str) -> str:
    res = sb.call("run_shell", {"command": command})
    if not res.ok or not isinstance(res.result, dict) or res.result.get("exit_code") != 0:
        detail = res.result.get("stderr", "")[-2000:] if isinstance(res.result, dict) else res.error
        raise SystemExit(f"run_shell {command[:60]!r} failed: {detail}")
    return str(res.result.get("stdout", ""))


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    t = time.perf_counter()
    out = fn()
    return time.perf_counter() - t, out


# one run ---------------------------------------------------------------------------------------------


@dataclass
class Bench:
    image: str
    repo: Path
    tree: Path
    tmp: Path
    edits: list[str]
    samples: dict[str, list[float]] = field(default_factory=dict)
    splits: dict[str, list[dict[str, float | None]]] = field(default_factory=dict)
    upload_calls: dict[str, list[list[float]]] = field(default_factory=dict)  # each start's upload calls (s)
    sizes: dict[str, list[int]] = field(default_factory=dict)  # "snapshot scratch" -> bytes, "diff" -> bytes
    pool: Any = None  # a Pool of one slot with a copy of the repo (workspace_mode="copy"), for the pooled rows

    def note(self, key: str, seconds: float) -> None:
        self.samples.setdefault(key, []).append(seconds)

    def note_start(self, key: str, s: Start) -> None:
        self.note(key, s.total)
        self.splits.setdefault(key, []).append(s.split())
        self.upload_calls.setdefault(key, []).append(s.calls)

    def size(self, key: str, n: int) -> None:
        self.sizes.setdefault(key, []).append(n)

    # the blocks ---------------------------------------------------------------------------------------

    def repo_ro(self) -> None:
        with started(self.image, workspace=self.repo) as (_, s):
            self.note_start("start repo ro", s)

    def tree_ro(self) -> None:
        with started(self.image, TREE_POLICY, workspace=self.tree) as (sb, s):
            self.note_start("start tree ro", s)
            # the floor of any copy that makes the tree's files in the sandbox: GNU tar, natively, from the
            # read-only mount into a tmpfs of the same sandbox (no host, no protocol), timed inside
            out = shell(sb, NATIVE_COPY).split()
            if len(out) != 3 or out[2] != str(TREE_FILES):
                raise SystemExit(f"the native copies in the sandbox made {out[2:] or '?'} files, not {TREE_FILES}")
            self.note("native copy in the sandbox", int(out[0]) / 1e9)
            self.note("native extraction", int(out[1]) / 1e9)

    def tree_copy(self) -> None:
        with started(self.image, TREE_POLICY, workspace=self.tree, workspace_mode="copy") as (sb, s):
            self.note_start("start tree copy", s)
            got = int(shell(sb, "find /workspace -type f | wc -l").strip())
            if got != TREE_FILES:
                raise SystemExit(f"the tree's copy holds {got} files, not {TREE_FILES}")

    def tree_cached(self, key: str = "start tree cached copy") -> None:
        """workspace_cache: the copy laid over the tree the engine keeps (its first start notes the tree, its
        second keeps it: main() makes both before the runs)."""
        with started(self.image, TREE_POLICY, workspace=self.tree, workspace_mode="copy", workspace_cache=True) as (
            sb,
            s,
        ):
            self.note_start(key, s)
            got = int(shell(sb, "find /workspace -type f | wc -l").strip())
            if got != TREE_FILES:
                raise SystemExit(f"the tree's cached copy holds {got} files, not {TREE_FILES}")

    def repo_copy_pooled(self) -> None:
        with pooled(self.pool) as (sb, s):
            self.note_start("pooled repo copy", s)
            if shell(sb, f"test -f /workspace/{shlex.quote(self.edits[0])} && echo there") != "there\n":
                raise SystemExit("the pooled copy lacks the repo's files")

    def repo_copy(self, run: int) -> None:
        snap = self.tmp / f"repo-{run}.snapshot.tar"
        with started(self.image, workspace=self.repo, workspace_mode="copy") as (sb, s):
            self.note_start("start repo copy", s)
            files = " ".join(shlex.quote(f) for f in self.edits)
            shell(sb, f"cd /workspace && for f in {files}; do printf '%s\\n' {shlex.quote(EDIT_LINE)} >> \"$f\"; done")
            seconds, ch = timed(sb.changes)
            if sorted(ch.changed) != sorted(self.edits) or ch.added or ch.removed:
                raise SystemExit(
                    f"changes(): changed {list(ch.changed)}, added {list(ch.added)}, removed {list(ch.removed)}; "
                    f"{self.edits} were edited"
                )
            self.note("changes repo", seconds)
            self.size("diff", len(ch.diff.encode("utf-8", "surrogateescape")))
            seconds, _ = timed(lambda: sb.snapshot(snap))
            self.note("snapshot repo", seconds)
            self.size("snapshot repo", snap.stat().st_size)
        try:
            with started(self.image, workspace=self.repo, resume=snap) as (sb, s):
                self.note_start("resume repo", s)
                again = sb.changes()
                if again.diff != ch.diff:
                    raise SystemExit("the resumed repo copy's changes() differ from the snapshot's run")
            with pooled(self.pool, resume=snap) as (sb, s):
                self.note_start("pooled resume repo", s)
                if sb.changes().diff != ch.diff:
                    raise SystemExit("the repo copy resumed into a pooled slot differs from the snapshot's run")
        finally:
            snap.unlink(missing_ok=True)

    def scratch(self, run: int) -> None:
        snap = self.tmp / f"scratch-{run}.snapshot.tar"
        with started(self.image, SNAP_POLICY) as (sb, s):
            self.note_start("start cold", s)
            sums = shell(sb, WRITE_SCRATCH)
            seconds, _ = timed(lambda: sb.snapshot(snap))
            self.note("snapshot scratch", seconds)
            self.size("snapshot scratch", snap.stat().st_size)
        try:
            with started(self.image, SNAP_POLICY, resume=snap) as (sb, s):
                self.note_start("resume scratch", s)
                if shell(sb, HASH_SCRATCH) != sums:
                    raise SystemExit("the resumed scratch's files differ from the snapshot's run")
        finally:
            snap.unlink(missing_ok=True)

    def one_run(self, run: int) -> None:
        blocks: list[tuple[str, Callable[[], None]]] = [
            ("repo ro", self.repo_ro),
            ("repo copy, changes, snapshot, resume", lambda: self.repo_copy(run)),
            ("pooled repo copy", self.repo_copy_pooled),
            ("tree ro", self.tree_ro),
            ("tree copy", self.tree_copy),
            ("tree cached copy", self.tree_cached),
            ("cold, scratch snapshot, resume", lambda: self.scratch(run)),
        ]
        for name, block in blocks if run % 2 == 0 else reversed(blocks):
            print(f"\rrun {run + 1}: {name}{' ' * 20}", end="", file=sys.stderr, flush=True)
            block()


# the profile ------------------------------------------------------------------------------------------


def _cum(stats: dict[Any, Any], file_end: str, func: str, caller: str | None = None) -> float:
    """Cumulative seconds of the functions named ``func`` in files ending with ``file_end`` (only as called
    from functions named ``caller``, when given)."""
    total = 0.0
    for (filename, _, name), (_, _, _, ct, callers) in stats.items():
        if name != func or not filename.endswith(file_end):
            continue
        if caller is None:
            total += ct
        else:
            total += sum(v[3] for (_, _, cname), v in callers.items() if cname == caller)
    return total


def _own(stats: dict[Any, Any], needle: str) -> float:
    """Own seconds of the built-ins whose name holds ``needle``."""
    return float(sum(v[2] for (filename, _, name), v in stats.items() if filename == "~" and needle in name))


def profile_tree_copy(image: str, tree: Path) -> dict[str, Any]:
    """One tree copy start under cProfile: the host's time grouped, and the top functions by own time."""
    prof = cProfile.Profile()
    t0 = time.perf_counter()
    prof.enable()
    sb = TimedSandbox(TREE_POLICY, image=image, tool="bench-workspace", workspace=tree, workspace_mode="copy")
    init = time.perf_counter() - t0
    with sb:
        sb.call("ping")
        prof.disable()
        total = time.perf_counter() - t0
    ps = pstats.Stats(prof)
    st: dict[Any, Any] = ps.stats  # type: ignore[attr-defined]
    fill = (sb.fill_span[1] - sb.fill_span[0]) if sb.fill_span else 0.0
    calls = sum(b - a for a, b, _ in sb.upload_calls)
    groups = {
        "total": total,
        "init (Sandbox(...))": init,
        "  the workspace check (find_special_file walks the tree)": _cum(st, "workspace.py", "find_special_file"),
        "  the copy's size check (upload.scan walks the tree, once)": _cum(st, "upload.py", "scan"),
        "container start (start without the fill)": _cum(st, "sandbox.py", "start") - fill,
        "fill": fill,
        "  host pre-walk (special files checked before sending)": _cum(st, "upload.py", "upload")
        - _cum(st, "upload.py", "send"),
        "  host tar: walk (os.walk, relpath, lstat)": _cum(st, "upload.py", "_entries", caller="_tar"),
        "  host tar: headers (tarfile.TarInfo.tobuf)": _cum(st, "tarfile.py", "tobuf"),
        "  host tar: open/fstat/pread/close": sum(_own(st, f"posix.{n}") for n in ("open", "fstat", "pread", "close")),
        "  host tar: all of the tar's making (_chunks)": _cum(st, "upload.py", "_chunks"),
        "  host base64 of the chunks": _own(st, "b2a_base64"),
        "  host sha256 of the chunks": _own(st, "sha256") + _own(st, "hexdigest"),
        "  upload calls (round trips)": calls,
        "    host JSON encoding of the requests": _cum(st, "session.py", "encode_request"),
        "    host socket writes": _own(st, "socket.socket"),
        "    waiting for the worker's answers (its decode and extraction)": _own(st, "acquire"),
    }
    top = sorted(st.items(), key=lambda kv: kv[1][2], reverse=True)[:12]
    return {
        "seconds": groups,
        "upload_calls": len(sb.upload_calls),
        "top_own_time": [
            {"function": f"{os.path.basename(f)}:{line}({name})", "own_s": v[2], "cum_s": v[3], "calls": v[1]}
            for (f, line, name), v in top
        ],
    }


# the report --------------------------------------------------------------------------------------------


def summary(seconds: list[float]) -> dict[str, float]:
    return {"s_min": min(seconds), "s_median": statistics.median(seconds), "s_max": max(seconds), "n": len(seconds)}


def median_split(rows: list[dict[str, float | None]]) -> dict[str, float | None]:
    out: dict[str, float | None] = {}
    for k in rows[0]:
        vals = [v for r in rows if (v := r[k]) is not None]
        out[k] = statistics.median(vals) if vals else None
    return out


def docker(*argv: str) -> str:
    res = subprocess.run(["docker", *argv], capture_output=True, text=True)
    return res.stdout.strip() if res.returncode == 0 else f"? ({res.stderr.strip()[-200:]})"


def loadavg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def _drop_cache() -> None:
    """The bench's cached trees (and any other not in use): gone, as ``toolcage gc --copies`` does."""
    from toolcage.engine import copycache
    from toolcage.engine.docker_adapter import Engine

    engine = Engine.default()
    for _kind, name, _why in copycache.stale(engine, copies=True):
        engine.remove_volume(name)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.workspace", description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--image", default=os.environ.get("TOOLCAGE_IMAGE") or DEFAULT_IMAGE)
    ap.add_argument("--profile", action="store_true", help="also cProfile one tree copy start")
    ap.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = ap.parse_args(argv)
    if args.runs < 1:
        ap.error("--runs must be at least 1")

    load_start = loadavg()
    load_runs: list[list[float]] = []
    profile: dict[str, Any] | None = None
    with tempfile.TemporaryDirectory(prefix="toolcage-bench-workspace-", dir="/tmp") as tmpdir:
        tmp = Path(tmpdir)
        print("making the workspaces", end="", file=sys.stderr, flush=True)
        commit = export_repo(tmp / "repo")
        make_tree(tmp / "tree")
        shape = {"repo": local_tree(tmp / "repo"), "tree": local_tree(tmp / "tree")}
        bench = Bench(args.image, tmp / "repo", tmp / "tree", tmp, pick_edits(tmp / "repo"))
        with Pool(
            image=args.image, workspace=tmp / "repo", workspace_mode="copy", size=1, tool="bench-workspace"
        ) as bench.pool:
            print("\rthe tree's cache (its first and second starts)" + " " * 20, end="", file=sys.stderr, flush=True)
            bench.tree_cached("start tree cache, 1st")  # a tree seen the first time: noted, copied as without
            bench.tree_cached("start tree cache, 2nd")  # the second time: kept (a run fills the cache), then laid
            try:
                for run in range(args.runs):
                    load_runs.append(loadavg())
                    bench.one_run(run)
            finally:
                _drop_cache()
        if args.profile:
            print("\rprofiling one tree copy start" + " " * 30, end="", file=sys.stderr, flush=True)
            profile = profile_tree_copy(args.image, tmp / "tree")
    print(file=sys.stderr)
    load_end = loadavg()

    stats = {k: summary(v) for k, v in bench.samples.items()}

    def med(key: str) -> float:
        return stats[key]["s_median"]

    ratios = {
        "repo copy/ro": med("start repo copy") / med("start repo ro"),
        "tree copy/ro": med("start tree copy") / med("start tree ro"),
        "tree cached copy/ro": med("start tree cached copy") / med("start tree ro"),
        "tree cache 1st/copy": med("start tree cache, 1st") / med("start tree copy"),
        "tree cache 2nd/copy": med("start tree cache, 2nd") / med("start tree copy"),
        # the copy's own floor: a read-only start plus the files made natively in the sandbox
        "tree copy/(ro + native copy)": med("start tree copy")
        / (med("start tree ro") + med("native copy in the sandbox")),
        "tree copy/(ro + native extraction)": med("start tree copy")
        / (med("start tree ro") + med("native extraction")),
        "resume scratch/cold": med("resume scratch") / med("start cold"),
        "resume repo/repo copy": med("resume repo") / med("start repo copy"),
        "pooled copy/copy": med("pooled repo copy") / med("start repo copy"),
        "pooled resume/resume": med("pooled resume repo") / med("resume repo"),
    }
    splits = {k: median_split(v) for k, v in bench.splits.items()}
    sizes = {k: statistics.median(v) for k, v in bench.sizes.items()}
    per_file_us = (med("start tree copy") - med("start tree ro")) / TREE_FILES * 1e6

    rows = [
        ("start repo ro", "start to ping", ""),
        ("start repo copy", "start to ping", f"{ratios['repo copy/ro']:.2f}x ro"),
        ("start tree ro", "start to ping", ""),
        ("start tree copy", "start to ping", f"{ratios['tree copy/ro']:.1f}x ro"),
        ("start tree cached copy", "start to ping", f"{ratios['tree cached copy/ro']:.2f}x ro (goal <= 3x)"),
        ("start tree cache, 1st", "start to ping", f"{ratios['tree cache 1st/copy']:.2f}x tree copy (once)"),
        ("start tree cache, 2nd", "start to ping", f"{ratios['tree cache 2nd/copy']:.2f}x tree copy (once)"),
        (
            "native copy in the sandbox",
            "tar ro mount -> tmpfs",
            f"copy start {ratios['tree copy/(ro + native copy)']:.2f}x (ro + this)",
        ),
        (
            "native extraction",
            "tar -x, tmpfs -> tmpfs",
            f"copy start {ratios['tree copy/(ro + native extraction)']:.2f}x (ro + this)",
        ),
        ("changes repo", "changes(), 10 edits", f"diff {sizes['diff']:,.0f} B"),
        ("start cold", "start to ping", "baseline"),
        ("snapshot scratch", "snapshot(path)", f"{sizes['snapshot scratch'] / MiB:.1f} MiB"),
        ("resume scratch", "start to ping", f"{ratios['resume scratch/cold']:.2f}x cold"),
        ("snapshot repo", "snapshot(path)", f"{sizes['snapshot repo'] / MiB:.1f} MiB"),
        ("resume repo", "start to ping", f"{ratios['resume repo/repo copy']:.2f}x repo copy"),
        ("pooled repo copy", "adopt to ping", f"{ratios['pooled copy/copy']:.2f}x repo copy"),
        ("pooled resume repo", "adopt to ping", f"{ratios['pooled resume/resume']:.2f}x resume repo"),
    ]
    print(f"\n{'case':<28}{'what':<24}{'s min':>8}{'s med':>8}{'s max':>8}  ratio / size")
    for key, what, extra in rows:
        s = stats[key]
        print(f"{key:<28}{what:<24}{s['s_min']:>8.3f}{s['s_median']:>8.3f}{s['s_max']:>8.3f}  {extra}")

    def cell(v: float | None) -> str:
        return f"{v:>10.3f}" if v is not None else f"{'-':>10}"

    parts = ("init", "container", "host", "first", "chunks", "final", "ping")
    print(f"\n{'split (s, medians)':<20}" + "".join(f"{p:>10}" for p in parts))
    for key, _, _ in rows:
        if key in splits:
            print(f"{key:<20}" + "".join(cell(splits[key][p]) for p in parts))

    (rf, rb), (tf, tb) = shape["repo"], shape["tree"]
    print(
        f"\nrepo = git archive HEAD ({commit[:7]}) exported under /tmp: {rf:,} files, {rb / MiB:.1f} MiB "
        f"(workspace_gitignore=False); tree = {tf:,} files of {TREE_BYTES} B in {TREE_DIRS:,} directories "
        f"({tb / MiB:.1f} MiB); {args.runs} runs; ratios of the medians"
    )
    print(f"tree copy beyond ro: {per_file_us:.0f} us per file")
    print(
        "native copy in the sandbox = GNU tar from the read-only mount into a tmpfs of the read-only run's sandbox "
        "(tar -c | tar -x), timed inside it, under the policy's CPU quota: a copy with no host and no protocol; "
        "native extraction = the same tree extracted from a tar already in the tmpfs: the files any copy into "
        "a tmpfs must make, and nothing else (its floor)"
    )
    print(
        f"snapshots: scratch = {SCRATCH_FILES} files of {SCRATCH_FILE_BYTES // MiB} MiB from /dev/urandom "
        f"(policy scratch 256m, memory 1g; cold = the same policy, no workspace); repo = the copy after "
        f"{EDITS} edits"
    )
    print(
        "split: init = Sandbox(...) (its workspace check walks the tree; a resume verifies its snapshot); "
        "container = start() without the fill; host = the fill outside the upload calls (walks, tar, base64, "
        "sha256); first = the first upload call (waits for the worker to be ready, as ro's first ping does); "
        "chunks = the other upload calls; final = the calls with done"
    )
    print(f"load average (1, 5, 15 min): {load_start} at start, {load_runs} at each run's start, {load_end} at the end")
    if profile is not None:
        print("\ncProfile of one tree copy start (seconds, inflated by the profiler):")
        for k, v in profile["seconds"].items():
            print(f"  {k:<70}{v:>8.2f}")
        print("  top own time: " + "; ".join(f"{t['function']} {t['own_s']:.2f}" for t in profile["top_own_time"][:8]))

    if args.json is not None:
        report = {
            "when": datetime.now(UTC).isoformat(timespec="seconds"),
            "machine": {
                "cpus": os.cpu_count(),
                "kernel": platform.release(),
                "docker": docker("version", "--format", "{{.Server.Version}}"),
                "loadavg": {"start": load_start, "runs": load_runs, "end": load_end},
            },
            "image": args.image,
            "image_id": docker("image", "inspect", "--format", "{{.Id}}", args.image),
            "toolcage": os.path.dirname(toolcage.__file__),
            "commit": commit,
            "runs": args.runs,
            "workspaces": {
                "repo": {"source": "git archive HEAD", "files": rf, "bytes": rb, "workspace_gitignore": False},
                "tree": {"files": tf, "bytes": tb, "dirs": TREE_DIRS},
            },
            "edits": bench.edits,
            "policies": {"repo": "default", "tree": TREE_POLICY, "snapshot": SNAP_POLICY},
            "stats": stats,
            "ratios_of_medians": ratios,
            "tree_copy_us_per_file": per_file_us,
            "split_medians_s": splits,
            "sizes_bytes": bench.sizes,
            "samples_s": bench.samples,
            "splits_s": bench.splits,
            "upload_calls_s": bench.upload_calls,
            "profile": profile,
        }
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2))
        print(f"\nwrote {args.json}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
