"""The diff changes() returns, made by git in a bounded child (toolcage.files.gitplumb), from sides on disk
(toolcage.files.changesides): what git apply takes, the bounds, the scrubbed environment. No Docker; git."""

from __future__ import annotations

import io
import os
import subprocess
import time
from pathlib import Path

import pytest

from toolcage.files import changesides, gitdiff, gitplumb
from toolcage.files.changesides import Side


class Sides:
    """Sides written into a work directory the way changes() writes them."""

    def __init__(self, root: Path) -> None:
        self.work = root / "work"
        self.work.mkdir(mode=0o700)
        self.n = 0

    def file(self, data: bytes, mode: str = gitdiff.FILE) -> Side:
        self.n += 1
        return changesides.stream(io.BytesIO(data), len(data), mode, str(self.work / f"s{self.n}"), 1 << 40)

    def link(self, target: bytes) -> Side:
        self.n += 1
        return changesides.link_side(target, str(self.work / f"s{self.n}"))


def materialise(root: Path, files: dict[bytes, Side]) -> None:
    """``files`` made under ``root`` (a tree to run git apply in)."""
    for name, side in files.items():
        path = os.path.join(os.fsencode(root), name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        assert side.file is not None
        data = Path(side.file).read_bytes()
        if side.mode == gitdiff.LINK:
            os.symlink(data, path)
        else:
            Path(os.fsdecode(path)).write_bytes(data)
            os.chmod(path, 0o755 if side.mode == gitdiff.EXEC else 0o644)


def snapshot(root: Path) -> dict[bytes, tuple[str, bytes]]:
    out: dict[bytes, tuple[str, bytes]] = {}
    broot = os.fsencode(root)
    for dirpath, _dirs, names in os.walk(broot):
        for name in names:
            path = os.path.join(dirpath, name)
            rel = os.path.relpath(path, broot)
            if os.path.islink(path):
                out[rel] = (gitdiff.LINK, os.readlink(path))
            else:
                mode = gitdiff.EXEC if os.stat(path).st_mode & 0o100 else gitdiff.FILE
                out[rel] = (mode, Path(os.fsdecode(path)).read_bytes())
    return out


def plan_of(old: dict[bytes, Side], new: dict[bytes, Side]) -> tuple[gitplumb.Plan, list[str | None]]:
    plan = gitplumb.Plan()
    whys = [plan.add(os.fsdecode(n), old.get(n), new.get(n)) for n in sorted(set(old) | set(new))]
    return plan, whys


def test_the_diff_of_hostile_names_modes_links_and_binaries_applies(tmp_path: Path) -> None:
    """git's diff of the two sides applies with git apply and gives the new tree: names with a newline, a
    quote, a backslash, bytes that are not UTF-8, a trailing space; a mode change; a file that became a
    symlink; a binary file; a removal; a file without a final newline."""
    s = Sides(tmp_path)
    old = {
        b"a.txt": s.file(b"one\ntwo\nthree\n"),
        b"run.sh": s.file(b"#!/bin/sh\n", gitdiff.EXEC),
        b"was-file": s.file(b"x\n"),
        b"gone": s.file(b"bye\n"),
        b"bin.dat": s.file(bytes(range(256))),
        b"latin\xe9.txt": s.file(b"caf\xe9\n"),
    }
    new = {
        b"a.txt": s.file(b"one\n2\nthree"),
        b"run.sh": s.file(b"#!/bin/sh\n"),
        b"was-file": s.link(b"a.txt"),
        b"bin.dat": s.file(bytes(range(255, -1, -1)) + b"\0"),
        b"latin\xe9.txt": s.file(b"caf\xe9 au lait\n"),
        b"new\nline": s.file(b"nl\n"),
        b'q"uote\\back': s.file(b"q\n"),
        b"trail ": s.file(b"t\n"),
        b"sub/deep/f": s.file(b"deep\n"),
    }
    plan, whys = plan_of(old, new)
    assert whys == [None] * len(whys)
    not_shown: list[dict[str, str]] = []
    diff = plan.run(str(s.work), 30, 1 << 20, not_shown)
    assert not not_shown
    assert "GIT binary patch" in diff  # bin.dat, and the Latin-1 file (not UTF-8: the diff stays UTF-8)
    diff.encode("utf-8")
    host = tmp_path / "host"
    host.mkdir()
    materialise(host, old)
    done = subprocess.run(["git", "apply", "-"], cwd=host, input=diff.encode(), capture_output=True)
    assert done.returncode == 0, done.stderr
    want = {n: (side.mode, Path(side.file or "").read_bytes()) for n, side in new.items()}
    assert snapshot(host) == want


def test_past_the_text_bounds_a_side_is_a_binary_patch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A side with more lines than TEXT_MAX_LINES is diffed as a binary patch (linear to make), which applies."""
    monkeypatch.setattr(gitplumb, "TEXT_MAX_LINES", 1000)
    s = Sides(tmp_path)
    flood = b"\n" * 5000
    plan, whys = plan_of({}, {b"flood": s.file(flood)})
    assert whys == [None]
    diff = plan.run(str(s.work), 30, 1 << 20, [])
    assert "GIT binary patch" in diff and "\n+\n" not in diff
    host = tmp_path / "host"
    host.mkdir()
    done = subprocess.run(["git", "apply", "-"], cwd=host, input=diff.encode(), capture_output=True)
    assert done.returncode == 0, done.stderr
    assert (host / "flood").read_bytes() == flood


def test_past_show_max_a_side_is_changed_not_shown(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A side larger than SHOW_MAX_BYTES is not planned: the reason says so, and the diff is empty."""
    monkeypatch.setattr(gitplumb, "SHOW_MAX_BYTES", 100)
    s = Sides(tmp_path)
    plan, whys = plan_of({b"big": s.file(b"a\n")}, {b"big": s.file(b"b\n" * 100)})
    assert whys[0] is not None and "larger than 100 bytes" in whys[0]
    assert not plan


def test_past_max_diff_bytes_whole_files_are_left_out(tmp_path: Path) -> None:
    """The diff keeps whole files within its cap; the files past it are named as not shown."""
    s = Sides(tmp_path)
    plan, _ = plan_of({}, {b"a": s.file(b"small\n"), b"b": s.file(b"x" * 5000 + b"\n")})
    not_shown: list[dict[str, str]] = []
    diff = plan.run(str(s.work), 30, 1000, not_shown)
    assert "diff --git a/a b/a" in diff and "b/b" not in diff
    assert [x["path"] for x in not_shown] == ["b"] and "max_diff_bytes" in not_shown[0]["reason"]


def test_git_reads_no_config_attributes_or_external_diff_of_the_callers(tmp_path: Path) -> None:
    """GIT_* variables, a global config and attributes with an external diff or textconv that would run a
    command are all ignored: the diff is git's own, and the command never runs."""
    marker = tmp_path / "ran"
    home = tmp_path / "home"
    home.mkdir()
    run = f"touch {marker}"
    (home / ".gitconfig").write_text(f'[diff]\n\texternal = {run}\n[diff "x"]\n\ttextconv = {run}\n')
    (home / "attrs").write_text("* diff=x\n")
    env = {
        "HOME": str(home),
        "GIT_EXTERNAL_DIFF": f"touch {marker}",
        "GIT_CONFIG_PARAMETERS": f"'core.attributesFile'='{home}/attrs' 'diff.external'='touch {marker}'",
        "GIT_CONFIG_GLOBAL": str(home / ".gitconfig"),
    }
    mp = pytest.MonkeyPatch()
    for k, v in env.items():
        mp.setenv(k, v)
    try:
        s = Sides(tmp_path)
        plan, _ = plan_of({b"f": s.file(b"a\n")}, {b"f": s.file(b"b\n")})
        diff = plan.run(str(s.work), 30, 1 << 20, [])
    finally:
        mp.undo()
    assert "-a\n+b\n" in diff
    assert not marker.exists()


def test_a_diff_past_its_deadline_is_refused(tmp_path: Path) -> None:
    """git past the deadline is stopped: DiffFailed, never a runner that waits."""
    s = Sides(tmp_path)
    repo = gitplumb.Repo(str(s.work), deadline=time.monotonic() + 30)
    repo.deadline = 0.0
    with pytest.raises(gitplumb.DiffFailed, match="deadline"):
        repo.run(["write-tree"])


def test_without_git_on_the_host_the_error_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No git on the host: a clear DiffFailed naming git, never a traceback or an empty diff."""
    monkeypatch.setattr(gitplumb.shutil, "which", lambda name: None)
    with pytest.raises(gitplumb.DiffFailed, match="git is not installed"):
        gitplumb.Repo(str(tmp_path), deadline=float("inf"))


def test_a_side_on_disk_keeps_zeros_as_holes_and_counts_lines(tmp_path: Path) -> None:
    """stream() writes runs of zeros as holes (a sparse file sent as zeros takes no disk), counts lines and
    tells UTF-8 text (a character split across pieces too) from binary."""
    size = 64 << 20
    side = changesides.stream(io.BytesIO(bytes(size)), size, gitdiff.FILE, str(tmp_path / "z"), size)
    st = os.stat(tmp_path / "z")
    assert st.st_size == size and st.st_blocks * 512 < (1 << 20)
    assert not side.text and side.lines == 0
    euro = "€".encode()
    text = b"a" * (changesides.PIECE - 1) + euro + b"\nb\n"
    got = changesides.stream(io.BytesIO(text), len(text), gitdiff.FILE, None, len(text))
    assert got.text and got.lines == 2 and got.file is None
    bad = changesides.stream(io.BytesIO(b"\xff\n"), 2, gitdiff.FILE, None, 2)
    assert not bad.text
    with pytest.raises(changesides.OverBudget):
        changesides.stream(io.BytesIO(b"abc"), 3, gitdiff.FILE, None, 2)


@pytest.mark.parametrize("launcher", ["prlimit", "python"])
def test_git_runs_under_its_memory_limit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, launcher: str) -> None:
    """git starts under RLIMIT_AS (through prlimit, or the Python wrapper where prlimit is missing): with
    a limit far too small for it, it fails (DiffFailed); with GIT_MEMORY, the same command works."""
    which = gitplumb.shutil.which
    if launcher == "python":
        monkeypatch.setattr(gitplumb.shutil, "which", lambda name: None if name == "prlimit" else which(name))
    assert which("prlimit") is not None, "prlimit (util-linux) is on the CI hosts"
    s = Sides(tmp_path)
    repo = gitplumb.Repo(str(s.work), deadline=time.monotonic() + 30)
    assert len(repo.run(["write-tree"]).strip()) == 40
    repo.memory = 4 << 20
    with pytest.raises(gitplumb.DiffFailed):
        repo.run(["write-tree"])


def test_when_git_fails_the_files_are_changed_not_shown(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A text pass that fails is retried as binary patches; when that fails too, each file is named once in
    not_shown with git's error, and the diff is empty (never a partial file)."""
    s = Sides(tmp_path)
    plan, _ = plan_of({b"f": s.file(b"a\n")}, {b"f": s.file(b"b\n"), b"g": s.file(b"new\n")})
    calls: list[bool] = []

    def fail(repo: gitplumb.Repo, old: object, new: object, out: str, *, binary: bool, tag: str) -> None:
        calls.append(binary)
        raise gitplumb.DiffFailed("changes(): git diff-tree passed the diff's deadline")

    monkeypatch.setattr(gitplumb, "diff_into", fail)
    not_shown: list[dict[str, str]] = []
    assert plan.run(str(s.work), 30, 1 << 20, not_shown) == ""
    assert calls == [False, True]
    assert [x["path"] for x in not_shown] == ["f", "g"] and all("deadline" in x["reason"] for x in not_shown)


def test_touched_paths_are_the_resumed_ones_and_the_hints_each_once_sorted_and_cheap() -> None:
    """What a snapshot records as changed: a resumed snapshot's paths and the worker's hints, each once,
    sorted; a hint that is not a plain workspace path is dropped; 100,000 hostile hints cost well under a
    second (membership by dict, not by list)."""
    from toolcage.files.changes import touched_paths
    from toolcage.results import CallResult

    many = [f"/workspace/d/{i}" for i in range(100_000)]
    hints = {"changed": ["/workspace/b", "/etc/passwd", "/workspace/../x", *many], "removed": ["/workspace/a", 7]}

    def call(tool: str, params: dict[str, object]) -> CallResult:
        assert tool == "workspace_changes" and params == {"gitignore": True}
        return CallResult("ok", tool, "fake", result=hints)

    t0 = time.monotonic()
    got = touched_paths(call, gitignore=True, prior=["a", "z", "a"])
    assert time.monotonic() - t0 < 10  # by list, 10^10 comparisons: hours; by dict, 0.3 s (3.3 s in a loaded full pass)
    assert got == sorted({"a", "b", "z", *(m.removeprefix("/workspace/") for m in many)})
