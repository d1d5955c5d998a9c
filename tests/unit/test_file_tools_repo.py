"""Repository-aware file tools (issue 24, item 5): .gitignore (checked against real git where it
exists), include/exclude globs, read_file by line range, and grep's line-at-a-time semantics kept
while it searches whole files first. No Docker."""

from __future__ import annotations

import os
import random
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from toolcage.policies import validate_policy
from toolcage.policies.gitignore import Rules, ignored
from toolcage.worker.errors import BadParams
from toolcage.worker.settings import Settings
from toolcage.worker.tools import Catalog

GITIGNORES = {
    ".gitignore": "\n".join(
        [
            "# comment",
            ".venv/",
            "*.log",
            "!keep.log",
            "/build",
            "docs/**/*.tmp",
            "**/cache",
            "out/**",
            "!out/readme.md",
            "data/*/raw",
            "secret[0-9].txt",
            "x?.txt",
            "trail\\ ",
            "\\#hash",
            "dironly/",
            "",
        ]
    ),
    "src/.gitignore": "*.gen.py\n!important.gen.py\n/local.txt\nnested/deep/\n",
    "src/lib/.gitignore": "!*.log\n",
}
FILES = [
    ".venv/bin/python",
    ".venv/lib/site.py",
    "app.log",
    "keep.log",
    "build/x.o",
    "src/build/y.o",
    "docs/a/b/c.tmp",
    "docs/c.tmp",
    "docs/ok.md",
    "a/cache/z",
    "cache/z2",
    "out/a.txt",
    "out/readme.md",
    "out/sub/b.txt",
    "data/set1/raw/r.csv",
    "data/set1/clean.csv",
    "data/raw/r2.csv",
    "secret1.txt",
    "secretA.txt",
    "x1.txt",
    "xy1.txt",
    "trail ",
    "#hash",
    "dironly/f",
    "sub/dironly",
    "src/main.py",
    "src/a.gen.py",
    "src/important.gen.py",
    "src/local.txt",
    "src/pkg/local.txt",
    "src/nested/deep/f.py",
    "src/nested/f.py",
    "src/lib/debug.log",
    "README.md",
]


def settings(ws: Path, scratch: Path, output_cap: int | None = None) -> Settings:
    raw: dict[str, Any] = {"timeouts": {"call_s": 5, "run_s": 20}}
    if output_cap:
        raw["limits"] = {"output_cap": output_cap}
    return Settings(validate_policy(raw).canonical_json(), str(ws), str(scratch), "test")


def call(s: Settings, name: str, **params: object) -> dict[str, Any]:
    tool = Catalog().get(name)
    return tool.handler(s, tool.validate(params))


@pytest.fixture
def repo(tmp_path: Path) -> tuple[Path, Path]:
    ws, scratch = tmp_path / "ws", tmp_path / "scratch"
    scratch.mkdir()
    for rel in FILES:
        f = ws / rel
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(f"needle in {rel}\n")
    for rel, text in GITIGNORES.items():
        (ws / rel).write_text(text)
    (ws / ".git").mkdir()
    (ws / ".git" / "config").write_text("needle\n")
    return ws, scratch


def _files(result: dict[str, Any], root: str = "/workspace/") -> set[str]:
    return {e["path"].removeprefix(root) for e in result["entries"] if e["type"] == "file"}


EXPECTED_KEPT = {
    ".gitignore",
    "keep.log",
    "src/build/y.o",
    "docs/ok.md",
    "out/readme.md",
    "data/set1/clean.csv",
    "data/raw/r2.csv",
    "secretA.txt",
    "xy1.txt",
    "sub/dironly",
    "src/.gitignore",
    "src/main.py",
    "src/important.gen.py",
    "src/pkg/local.txt",
    "src/nested/f.py",
    "src/lib/.gitignore",
    "src/lib/debug.log",
    "README.md",
}


def test_list_files_gitignore_matches_expected(repo: tuple[Path, Path]) -> None:
    """Nested .gitignore files, !, dir/, /anchored, ** and classes: what is left is what git leaves."""
    s = settings(*repo)
    assert _files(call(s, "list_files", recursive=True, gitignore=True, max_entries=1000)) == EXPECTED_KEPT
    (repo[0] / "src" / "nested" / ".git").write_text("gitdir: ../../.git/modules/nested\n")  # a submodule's
    assert "src/nested/.git" not in _files(call(s, "list_files", recursive=True, gitignore=True))
    # default off: everything is listed, .git and the venv included
    everything = _files(call(s, "list_files", recursive=True, max_entries=1000))
    assert {".venv/bin/python", ".git/config", "app.log"} <= everything


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git on the host")
def test_gitignore_agrees_with_real_git(repo: tuple[Path, Path]) -> None:
    """`git ls-files --others --exclude-standard` (untracked, not ignored) lists the same files."""
    ws, _ = repo
    shutil.rmtree(ws / ".git")
    env = {**os.environ, "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1"}
    subprocess.run(["git", "init", "-q", str(ws)], check=True, env=env)
    out = subprocess.run(
        ["git", "-C", str(ws), "-c", "core.quotePath=off", "ls-files", "-z", "--others", "--exclude-standard"],
        check=True,
        env=env,
        capture_output=True,
    ).stdout
    by_git = {x for x in out.decode().split("\0") if x}
    assert by_git == EXPECTED_KEPT
    assert _files(call(settings(*repo), "list_files", recursive=True, gitignore=True)) == by_git


def test_ignored_directory_is_not_entered(repo: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    """A gitignored directory is never walked: no file under .venv is even looked at."""
    ws, _ = repo
    for i in range(50):
        (ws / ".venv" / f"m{i}.py").write_text("x\n")
    entered: list[str] = []
    real_fwalk = os.fwalk

    def spy(*a: Any, **k: Any) -> Any:
        for item in real_fwalk(*a, **k):
            entered.append(item[0])
            yield item

    monkeypatch.setattr(os, "fwalk", spy)
    r = call(settings(*repo), "list_files", recursive=True, gitignore=True, max_entries=5)
    assert not any(".venv" in e["path"] for e in r["entries"])
    call(settings(*repo), "grep", pattern="needle", gitignore=True)
    assert not any(d.startswith("./.venv") or d.startswith("./.git") for d in entered), entered


def test_gitignore_of_parents_applies_below_the_top(repo: tuple[Path, Path]) -> None:
    """Listing /workspace/src honours /workspace/.gitignore as well as src's own."""
    s = settings(*repo)
    got = _files(call(s, "list_files", path="/workspace/src", recursive=True, gitignore=True), "/workspace/src/")
    assert got == {".gitignore", "main.py", "important.gen.py", "pkg/local.txt", "nested/f.py", "build/y.o"} | {
        "lib/.gitignore",
        "lib/debug.log",
    }
    (repo[0] / "docs" / "a" / "b" / "d.md").write_text("needle\n")
    got = _files(call(s, "list_files", path="/workspace/docs/a", recursive=True, gitignore=True), "/workspace/docs/a/")
    assert got == {"b/d.md"}  # docs/**/*.tmp from the root's .gitignore


def test_grep_gitignore_include_exclude(repo: tuple[Path, Path]) -> None:
    s = settings(*repo)
    paths = {
        m["path"].removeprefix("/workspace/") for m in call(s, "grep", pattern="needle", gitignore=True)["matches"]
    }
    assert paths == EXPECTED_KEPT - {".gitignore", "src/.gitignore", "src/lib/.gitignore"}
    default = {m["path"] for m in call(s, "grep", pattern="needle", max_matches=1000)["matches"]}
    assert "/workspace/.venv/bin/python" in default and "/workspace/.git/config" in default
    inc = call(s, "grep", pattern="needle", include=["*.py"], exclude=["nested/"])["matches"]
    assert {m["path"] for m in inc} == {
        "/workspace/src/main.py",
        "/workspace/src/a.gen.py",
        "/workspace/src/important.gen.py",
        "/workspace/.venv/lib/site.py",
    }
    anchored = call(s, "grep", pattern="needle", path="/workspace/src", include=["/*.py"])["matches"]
    assert {m["path"] for m in anchored} == {
        "/workspace/src/main.py",
        "/workspace/src/a.gen.py",
        "/workspace/src/important.gen.py",
    }


def test_list_files_include_exclude(repo: tuple[Path, Path]) -> None:
    s = settings(*repo)
    r = call(s, "list_files", recursive=True, include=["*.md"], exclude=[".venv/", ".git/"])
    assert {e["path"] for e in r["entries"]} == {
        "/workspace/README.md",
        "/workspace/docs/ok.md",
        "/workspace/out/readme.md",
    }
    r = call(s, "list_files", exclude=["src", "*.log"])
    names = {e["path"] for e in r["entries"]}
    assert "/workspace/src" not in names and "/workspace/app.log" not in names and "/workspace/docs" in names


def test_bad_globs_are_params_errors(repo: tuple[Path, Path]) -> None:
    with pytest.raises(BadParams):
        call(settings(*repo), "grep", pattern="x", include="*.py")  # a list, not a string
    with pytest.raises(BadParams):
        call(settings(*repo), "list_files", exclude=[""])


@pytest.mark.parametrize(
    ("pattern", "path", "is_dir", "expected"),
    [
        ("*.py", "a/b.py", False, True),
        ("/a.py", "b/a.py", False, False),
        ("a/**/b", "a/b", False, True),
        ("a/**/b", "a/x/y/b", False, True),
        ("**/b", "x/y/b", True, True),
        ("a/**", "a", True, False),
        ("a/**", "a/x/y", False, True),
        ("d/", "d", False, False),
        ("d/", "d", True, True),
        ("[!a]x", "bx", False, True),
        ("[!a]x", "ax", False, False),
        ("[a-c]x", "/x", False, False),
        ("[unclosed", "[unclosed", False, False),
        ("a**b", "axxb", False, True),
        ("a**b", "ax/b", False, False),
        ("\\!x", "!x", False, True),
    ],
)
def test_gitignore_patterns(pattern: str, path: str, is_dir: bool, expected: bool) -> None:
    assert ignored([Rules([pattern])], path, is_dir) is expected


def test_read_file_line_range(tmp_path: Path) -> None:
    ws, scratch = tmp_path / "ws", tmp_path / "scratch"
    ws.mkdir()
    scratch.mkdir()
    (ws / "f.txt").write_text("".join(f"line {i}\n" for i in range(1, 101)))
    s = settings(ws, scratch)
    r = call(s, "read_file", path="/workspace/f.txt", start_line=10, end_line=12)
    assert r["content"] == "line 10\nline 11\nline 12\n"
    assert (r["start_line"], r["end_line"], r["truncated"]) == (10, 12, False)
    r = call(s, "read_file", path="/workspace/f.txt", start_line=99)
    assert r["content"] == "line 99\nline 100\n" and r["end_line"] == 100
    r = call(s, "read_file", path="/workspace/f.txt", end_line=2)
    assert r["content"] == "line 1\nline 2\n" and r["start_line"] == 1
    r = call(s, "read_file", path="/workspace/f.txt", start_line=500)
    assert r["content"] == "" and r["end_line"] == 499
    # offset pages inside the range, as it pages inside the file
    r = call(s, "read_file", path="/workspace/f.txt", start_line=10, end_line=12, offset=8)
    assert r["content"] == "line 11\nline 12\n" and r["start_line"] == 11
    # over the cap: whole lines up to it, then carry on from end_line + 1
    r = call(s, "read_file", path="/workspace/f.txt", start_line=1, max_bytes=20)
    assert r["content"] == "line 1\nline 2\n" and r["end_line"] == 2 and r["truncated"] is True
    # without lines: unchanged
    r = call(s, "read_file", path="/workspace/f.txt", offset=7, max_bytes=7)
    assert r["content"] == "line 2\n" and "start_line" not in r
    with pytest.raises(BadParams, match="before start_line"):
        call(s, "read_file", path="/workspace/f.txt", start_line=5, end_line=4)
    for field in ("start_line", "end_line"):
        with pytest.raises(BadParams) as info:
            call(s, "read_file", path="/workspace/f.txt", **{field: -1})
        assert info.value.data == [{"field": field, "error": "must be greater than or equal to 0"}]


def test_grep_line_numbers_agree_with_read_file(tmp_path: Path) -> None:
    """grep counts lines at \\n only (a \\f or \\u2028 inside a line does not start one), so the line
    it reports is the line read_file's start_line returns; CRLF lines match $ as before."""
    ws, scratch = tmp_path / "ws", tmp_path / "scratch"
    ws.mkdir()
    scratch.mkdir()
    (ws / "f.txt").write_bytes("a\x0cb\nc\u2028d\nneedle\r\nend\n".encode())
    s = settings(ws, scratch)
    [m] = call(s, "grep", pattern="needle$")["matches"]
    assert m["line"] == 3 and m["text"] == "needle"
    assert call(s, "read_file", path="/workspace/f.txt", start_line=3, end_line=3)["content"] == "needle\r\n"


@pytest.mark.parametrize(
    ("pattern", "lines"),
    [
        (r"^b", [2]),
        (r"a$", [1]),
        (r"x(?!\s)", [3]),  # a negative look-ahead sees no next line
        (r"\Ab", [2]),
        (r"a\s*+$", [1]),
        (r"a\nb", []),  # never across lines
        (r"(?s)a.b", []),
    ],
)
def test_grep_whole_file_search_keeps_line_semantics(tmp_path: Path, pattern: str, lines: list[int]) -> None:
    ws, scratch = tmp_path / "ws", tmp_path / "scratch"
    ws.mkdir()
    scratch.mkdir()
    (ws / "f.txt").write_text("a\nb\nx\ny\n")
    assert [m["line"] for m in call(settings(ws, scratch), "grep", pattern=pattern)["matches"]] == lines


def test_new_params_in_schema_and_host_precheck() -> None:
    """tools.list shows the new params; the host precheck refuses bad ones before a container starts."""
    from toolcage.errors import BadToolCall
    from toolcage.precheck import check_call
    from toolcage.worker.tools.schemas import entries

    baked = {e["name"]: e for e in entries()}  # what the image bakes into schemas.json
    for tool, names in {
        "list_files": {"gitignore", "include", "exclude"},
        "grep": {"gitignore", "include", "exclude"},
        "read_file": {"start_line", "end_line"},
    }.items():
        props = baked[tool]["params_schema"]["properties"]  # type: ignore[index]
        assert names <= set(props), (tool, props)
    check_call("grep", {"pattern": "x", "gitignore": True, "include": ["*.py"]})
    for tool, params in [
        ("grep", {"pattern": "x", "gitignore": "yes"}),
        ("list_files", {"include": "*.py"}),
        ("read_file", {"path": "a", "start_line": -1}),
    ]:
        with pytest.raises(BadToolCall):
            check_call(tool, params)


_ATOMS = ["a", "b", "ab", "*", "**", "?", "[ab]", "[!a]", "a*", "*b", ".x"]
_COMPONENTS = ["a", "b", "ab", "ba", "a.x", "bb"]


def _random_pattern(rng: random.Random) -> str:
    p = "/".join(rng.choice(_ATOMS) for _ in range(rng.randint(1, 3)))
    if rng.random() < 0.2:
        p = "/" + p
    if rng.random() < 0.2:
        p += "/"
    return "!" + p if rng.random() < 0.25 else p


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git on the host")
@pytest.mark.parametrize("seed", range(40))
def test_random_gitignores_agree_with_real_git(tmp_path: Path, seed: int) -> None:
    """Random trees and .gitignore files (root and nested; !, dir/, /, **, ?, classes): the files
    list_files keeps are those `git ls-files --others --exclude-standard` lists (900 seeds agreed
    when this was written; 40 run here)."""
    rng = random.Random(seed)
    ws, scratch = tmp_path / "ws", tmp_path / "scratch"
    ws.mkdir()
    scratch.mkdir()
    for _ in range(12):
        f = ws.joinpath(*(rng.choice(_COMPONENTS) for _ in range(rng.randint(1, 3))))
        try:
            f.parent.mkdir(parents=True, exist_ok=True)
            if not f.exists():
                f.touch()
        except (FileExistsError, NotADirectoryError):
            pass
    (ws / ".gitignore").write_text("\n".join(_random_pattern(rng) for _ in range(rng.randint(1, 4))) + "\n")
    sub = ws / rng.choice(["a", "b", "ab"])
    if sub.is_dir() and rng.random() < 0.5:
        (sub / ".gitignore").write_text("\n".join(_random_pattern(rng) for _ in range(rng.randint(1, 3))) + "\n")
    env = {**os.environ, "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1"}
    subprocess.run(["git", "init", "-q", str(ws)], check=True, env=env)
    out = subprocess.run(
        ["git", "-C", str(ws), "ls-files", "-z", "--others", "--exclude-standard"],
        check=True,
        env=env,
        capture_output=True,
    ).stdout
    shutil.rmtree(ws / ".git")
    by_git = {x for x in out.decode().split("\0") if x}
    ours = _files(call(settings(ws, scratch), "list_files", recursive=True, gitignore=True, max_entries=10_000))
    assert ours == by_git, {"gitignore": (ws / ".gitignore").read_text()}


def test_hostile_gitignore_files_are_not_followed(tmp_path: Path) -> None:
    """A .gitignore that is a FIFO does not hang the walk; one that is a symlink out of the root
    is not read (its rules would hide files); a parent's symlinked .gitignore neither."""
    ws, scratch = tmp_path / "ws", tmp_path / "scratch"
    (ws / "fifo").mkdir(parents=True)
    (ws / "link" / "deeper").mkdir(parents=True)
    scratch.mkdir()
    outside = tmp_path / "outside-rules"
    outside.write_text("*\n")
    os.mkfifo(ws / "fifo" / ".gitignore")
    (ws / "link" / ".gitignore").symlink_to(outside)
    for d in ("fifo", "link", "link/deeper"):
        (ws / d / "kept.txt").write_text("x\n")
    s = settings(ws, scratch)
    got = _files(call(s, "list_files", recursive=True, gitignore=True))
    assert {"fifo/kept.txt", "link/kept.txt", "link/deeper/kept.txt"} <= got
    below = call(s, "list_files", path="/workspace/link/deeper", gitignore=True)
    assert [e["path"] for e in below["entries"]] == ["/workspace/link/deeper/kept.txt"]
