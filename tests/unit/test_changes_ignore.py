"""changes() leaves out what the host repository's ignore rules leave out (issue 35): git's own rules,
read in the host's repository, never the sandbox's copy; listed in Changes.ignored, never silently."""

from __future__ import annotations

import io
import os
import subprocess
import tarfile
from pathlib import Path
from typing import Any

import pytest

from toolcage import CallResult
from toolcage.files import gitplumb
from toolcage.files.changes import collect

pytestmark = pytest.mark.skipif(subprocess.run(["git", "--version"], capture_output=True).returncode, reason="git")


class FakeWorker:
    """The worker's side of changes(): the hints it names and a tar stream of the new sides."""

    def __init__(self, files: dict[str, bytes], removed: tuple[str, ...] = ()) -> None:
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
            for name, body in files.items():
                info = tarfile.TarInfo(name)
                info.size, info.mode = len(body), 0o644
                tf.addfile(info, io.BytesIO(body))
        self.stream, self.pos = buf.getvalue(), 0
        self.hints = {"changed": [f"/workspace/{n}" for n in files], "removed": [f"/workspace/{n}" for n in removed]}
        self.asked: list[str] = []

    def __call__(self, tool: str, params: dict[str, Any]) -> CallResult:
        if tool == "workspace_changes":
            return CallResult("ok", tool, "fake", result=self.hints)
        if "path" in params:
            self.pos = 0
            self.asked += [p.removeprefix("/workspace/") for p in params.get("paths") or ()]
        data = self.stream[self.pos : self.pos + 65536]
        res = {
            "stream": "s1",
            "offset": self.pos,
            "frame": data,  # the chunk as the transport hands on its data frame
            "done": self.pos + len(data) >= len(self.stream),
            "skipped": [],
        }
        self.pos += len(data)
        return CallResult("ok", tool, "fake", result=res)


def git(cwd: Path, *args: str, stdin: bytes | None = None) -> None:
    env = {"PATH": os.environ["PATH"], "HOME": str(cwd), "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull}
    cfg = ["-c", "user.name=t", "-c", "user.email=t@t", "-c", "init.defaultBranch=main"]
    subprocess.run(["git", *cfg, *args], cwd=cwd, env=env, input=stdin, check=True, capture_output=True)


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A host repository: caches ignored at the top, *.tmp in sub/, secret* in .git/info/exclude, build/
    ignored with one file tracked there anyway, an untracked ignored log."""
    ws = tmp_path / "repo"
    (ws / "sub").mkdir(parents=True)
    (ws / "build").mkdir()
    (ws / ".gitignore").write_text(".pytest_cache/\n__pycache__/\n*.log\nbuild/\nnm\n")
    (ws / "sub" / ".gitignore").write_text("*.tmp\n")
    (ws / "main.py").write_text("print(1)\n")
    (ws / "build" / "keep.txt").write_text("kept\n")
    (ws / "old.log").write_text("log\n")
    git(ws, "init", "-q")
    (ws / ".git" / "info").mkdir(exist_ok=True)
    (ws / ".git" / "info" / "exclude").write_text("secret*\n")
    git(ws, "add", ".gitignore", "sub/.gitignore", "main.py")
    git(ws, "add", "-f", "build/keep.txt")
    git(ws, "commit", "-q", "-m", "init")
    return ws


def test_a_sandbox_that_rewrites_its_gitignore_hides_no_edit(repo: Path) -> None:
    """The attack: the copy's .gitignore says `*`, and its edits are still all shown (the host's rules
    decide), its .gitignore edit among them; only what the host's rules ignore is left out, and listed."""
    fake = FakeWorker(
        {
            ".gitignore": b"*\n",
            "main.py": b"print('edited')\n",
            "evil.py": b"import os\n",
            "sub/.gitignore": b"*\n",
            "sub/new.py": b"x = 1\n",
            ".pytest_cache/v/cache/nodeids": b"[]\n",
        }
    )
    got = collect(fake, repo, gitignore=False)
    assert got.added == ("evil.py", "sub/new.py")
    assert got.changed == (".gitignore", "main.py", "sub/.gitignore")
    assert got.ignored == (".pytest_cache/v/cache/nodeids",)
    assert "a/.pytest_cache" not in got.diff and "\n+*\n" in got.diff
    assert got.to_dict()["ignored"] == [".pytest_cache/v/cache/nodeids"]


def test_nested_gitignore_info_exclude_and_tracked_files_follow_git(repo: Path, tmp_path: Path) -> None:
    """A nested .gitignore, .git/info/exclude and an ignored directory apply; a tracked file in an ignored
    directory is shown (git never ignores a tracked file); an ignored host file the copy removed is not a
    removal. Ignored paths are never read: not asked of the worker, not in download_to, not in the diff."""
    fake = FakeWorker(
        {
            "sub/x.tmp": b"t\n",
            "x.tmp": b"top\n",
            "secretnotes": b"s\n",
            "build/keep.txt": b"kept, edited\n",
            "build/out.bin": b"\0\1",
            "pkg/__pycache__/m.cpython-311.pyc": b"\0",
        },
        removed=("old.log",),
    )
    got = collect(fake, repo, gitignore=False, download_to=tmp_path / "files")
    assert got.added == ("x.tmp",) and got.changed == ("build/keep.txt",) and got.removed == ()
    assert got.ignored == ("build/out.bin", "old.log", "pkg/__pycache__/m.cpython-311.pyc", "secretnotes", "sub/x.tmp")
    assert sorted(fake.asked) == ["build/keep.txt", "x.tmp"]
    assert sorted(str(p.relative_to(tmp_path / "files")) for p in (tmp_path / "files").rglob("*") if p.is_file()) == [
        "build/keep.txt",
        "x.tmp",
    ]
    git(repo, "apply", "-", stdin=got.diff.encode())  # the host takes it, and gets no cache
    assert (repo / "build" / "keep.txt").read_text() == "kept, edited\n" and not (repo / "sub" / "x.tmp").exists()


def test_beneath_an_ignored_host_symlink_is_ignored(repo: Path, tmp_path: Path) -> None:
    """git answers nothing beneath a symlink: the host's ignored `nm` symlink is asked about instead, and
    what the copy made beneath it (a directory there) is ignored with it."""
    (tmp_path / "elsewhere").mkdir()
    (repo / "nm").symlink_to(tmp_path / "elsewhere")
    got = collect(FakeWorker({"nm/pkg/index.js": b"x\n", "a.py": b"a\n"}), repo, gitignore=False)
    assert got.added == ("a.py",) and got.ignored == ("nm/pkg/index.js",)


def test_names_like_pathspec_magic_are_names(repo: Path) -> None:
    """A file named `:!x` or `:(top)y.log` is that name to git (no magic, no fatal error that would drop
    every rule): the first is shown, the second ignored as a *.log."""
    got = collect(FakeWorker({":!x": b"1\n", ":(top)y.log": b"2\n", "z.log": b"3\n"}), repo, gitignore=False)
    assert got.added == (":!x",) and got.ignored == (":(top)y.log", "z.log")


def test_without_a_repository_or_in_an_ignored_directory_nothing_is_ignored(repo: Path, tmp_path: Path) -> None:
    """No git work tree: no rules. A workspace that its repository ignores (a build or scratch directory)
    is not the repository's content: no rules either. repo_ignores=False: none asked."""
    files = {".pytest_cache/x": b"1\n", "a.log": b"2\n"}
    plain = tmp_path / "plain"
    plain.mkdir()
    assert collect(FakeWorker(files), plain, gitignore=False).added == (".pytest_cache/x", "a.log")
    inside = repo / "build" / "ws"
    inside.mkdir()
    assert collect(FakeWorker(files), inside, gitignore=False).added == (".pytest_cache/x", "a.log")
    got = collect(FakeWorker(files), repo, gitignore=False, repo_ignores=False)
    assert got.added == (".pytest_cache/x", "a.log") and got.ignored == ()


def test_rules_are_read_in_a_subdirectory_workspace_from_the_top(repo: Path) -> None:
    """A workspace that is a subdirectory of its repository: the top's rules apply there too."""
    got = collect(FakeWorker({"x.tmp": b"1\n", "run.log": b"2\n", "y.py": b"3\n"}), repo / "sub", gitignore=False)
    assert got.added == ("y.py",) and got.ignored == ("run.log", "x.tmp")


def test_the_git_child_is_scrubbed_and_bounded(repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The caller's GIT_* environment and global excludes file are not git's: GIT_DIR pointing elsewhere
    and a global core.excludesFile ignoring *.py change nothing; past its deadline it says so."""
    other = tmp_path / "other"
    git(tmp_path, "init", "-q", str(other))
    (tmp_path / "global").write_text("*.py\n")
    (tmp_path / "gitconfig").write_text(f"[core]\n\texcludesFile = {tmp_path / 'global'}\n")
    monkeypatch.setenv("GIT_DIR", str(other / ".git"))
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(tmp_path / "gitconfig"))
    got = collect(FakeWorker({"a.py": b"1\n", "b.log": b"2\n"}), repo, gitignore=False)
    assert got.added == ("a.py",) and got.ignored == ("b.log",)
    with pytest.raises(gitplumb.DiffFailed, match="deadline"):
        gitplumb.host_ignored(str(repo), ["a.py"], str(tmp_path), deadline=0.0)
