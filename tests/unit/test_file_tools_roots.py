"""One path rule for every tool (relative = /scratch), errors naming the resolved path, no-workspace
said plainly, and /workspace and /scratch under --sandbox none (issue 8, items 3 and 4; no Docker)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from toolcage import Sandbox
from toolcage.policies import validate_policy
from toolcage.worker import settings as settings_mod
from toolcage.worker.errors import BadParams, PathEscape, ToolError
from toolcage.worker.settings import Settings
from toolcage.worker.tools import Catalog


@pytest.fixture
def dirs(tmp_path: Path) -> tuple[Path, Path]:
    ws, scratch = tmp_path / "ws", tmp_path / "scratch"
    (ws / "src").mkdir(parents=True)
    scratch.mkdir()
    (ws / "README.md").write_text("project readme\n")
    (ws / "src" / "a.py").write_text("print('a')\n")
    return ws, scratch


def settings(ws: Path | None, scratch: Path) -> Settings:
    policy = validate_policy({"timeouts": {"call_s": 5, "run_s": 20}})
    return Settings(policy.canonical_json(), str(ws) if ws else None, str(scratch), "test")


def call(s: Settings, name: str, **params: object) -> dict[str, Any]:
    tool = Catalog().get(name)
    return tool.handler(s, tool.validate(params))


def test_relative_path_round_trips_through_every_tool(dirs: tuple[Path, Path]) -> None:
    """A file written as 's.txt' is read, listed, grepped and opened by run_python as 's.txt' (all /scratch)."""
    s = settings(*dirs)
    assert call(s, "write_file", path="notes/s.txt", content="round trip\n")["path"] == "/scratch/notes/s.txt"
    assert call(s, "read_file", path="notes/s.txt")["content"] == "round trip\n"
    assert [e["path"] for e in call(s, "list_files", path="notes")["entries"]] == ["/scratch/notes/s.txt"]
    assert call(s, "list_files", path=".")["path"] == "/scratch"
    assert call(s, "grep", pattern="trip", path="notes")["matches"][0]["path"] == "/scratch/notes/s.txt"
    r = call(s, "run_python", code="print(open('notes/s.txt').read(), end='')")
    assert r["stdout"] == "round trip\n", r


def test_results_name_absolute_paths_that_feed_back(dirs: tuple[Path, Path]) -> None:
    """list_files and grep default to /workspace and report absolute paths that read_file accepts as given."""
    s = settings(*dirs)
    listed = call(s, "list_files", recursive=True)
    assert listed["path"] == "/workspace"
    files = sorted(e["path"] for e in listed["entries"] if e["type"] == "file")
    assert files == ["/workspace/README.md", "/workspace/src/a.py"]
    assert [call(s, "read_file", path=f)["content"] for f in files] == ["project readme\n", "print('a')\n"]
    assert call(s, "grep", pattern="print")["matches"][0]["path"] == "/workspace/src/a.py"


# (tool, params, error class, the resolved path the message and data["resolved"] must name)
ERRORS = [
    ("read_file", {"path": "README.md"}, ToolError, "/scratch/README.md"),
    ("read_file", {"path": "/workspace/nope"}, ToolError, "/workspace/nope"),
    ("read_file", {"path": "/workspace/src"}, ToolError, "/workspace/src"),
    ("read_file", {"path": "../etc/passwd"}, PathEscape, "/etc/passwd"),
    ("list_files", {"path": "missing/dir"}, ToolError, "/scratch/missing/dir"),
    ("list_files", {"path": "/workspace/README.md/x"}, ToolError, "/workspace/README.md/x"),
    ("grep", {"pattern": "x", "path": "/workspace/gone"}, ToolError, "/workspace/gone"),
    ("write_file", {"path": "/workspace/new.txt", "content": "x"}, PathEscape, "/workspace/new.txt"),
    ("write_file", {"path": "/workspace/../etc/x", "content": "x"}, PathEscape, "/etc/x"),
    ("write_file", {"path": "sub/..", "content": "x"}, BadParams, "/scratch"),
]


@pytest.mark.parametrize(
    ("tool", "params", "error", "resolved"), ERRORS, ids=[f"{t}:{p['path']}" for t, p, *_ in ERRORS]
)
def test_every_path_error_names_the_resolved_path(
    dirs: tuple[Path, Path], tool: str, params: dict[str, object], error: type[Exception], resolved: str
) -> None:
    """Each path error says which absolute path it tried, in its message and (tool errors) in data.resolved."""
    with pytest.raises(error) as info:
        call(settings(*dirs), tool, **params)
    assert type(info.value) is error
    assert repr(resolved) in str(info.value), str(info.value)
    if error is not BadParams:
        assert info.value.data["resolved"] == resolved  # type: ignore[attr-defined]


def test_relative_miss_says_where_it_looked_and_where_the_workspace_is(dirs: tuple[Path, Path]) -> None:
    """read_file('README.md') misses in /scratch and says to pass '/workspace/README.md'."""
    with pytest.raises(ToolError, match=r"relative to /scratch.*'/workspace/README\.md'"):
        call(settings(*dirs), "read_file", path="README.md")


def test_write_to_workspace_says_it_is_read_only(dirs: tuple[Path, Path]) -> None:
    """write_file under /workspace is refused (-32002) saying the workspace is read-only and writes go to /scratch."""
    with pytest.raises(PathEscape, match=r"read-only.*/scratch") as info:
        call(settings(*dirs), "write_file", path="/workspace/README.md", content="x")
    assert info.value.code == -32002
    assert (dirs[0] / "README.md").read_text() == "project readme\n"


@pytest.mark.parametrize(
    ("tool", "params"),
    [("list_files", {}), ("grep", {"pattern": "x"}), ("read_file", {"path": "/workspace/README.md"})],
)
def test_no_workspace_is_said_not_listed_empty(tmp_path: Path, tool: str, params: dict[str, object]) -> None:
    """Without a workspace, /workspace (list_files' and grep's default) is a tool error naming --workspace."""
    s = settings(None, tmp_path)
    with pytest.raises(ToolError, match=r"no workspace.*--workspace") as info:
        call(s, tool, **params)
    assert info.value.code == -32001 and info.value.data["workspace"] is None  # type: ignore[attr-defined]
    assert call(s, "list_files", path="/scratch")["entries"] == []


def test_workspace_from_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """TOOLCAGE_WORKSPACE names it ('' = none); unset, /workspace counts only if mounted or not empty."""
    monkeypatch.setenv("TOOLCAGE_WORKSPACE", "")
    assert Settings.from_env().workspace is None
    monkeypatch.setenv("TOOLCAGE_WORKSPACE", str(tmp_path))
    assert Settings.from_env().workspace == str(tmp_path)
    monkeypatch.delenv("TOOLCAGE_WORKSPACE")
    image_dir = tmp_path / "workspace"  # stands for the image's empty /workspace
    image_dir.mkdir()
    monkeypatch.setattr(settings_mod, "WORKSPACE", str(image_dir))
    monkeypatch.setattr(settings_mod, "_mounted", lambda path: False)
    assert Settings.from_env().workspace is None
    monkeypatch.setattr(settings_mod, "_mounted", lambda path: path == str(image_dir))
    assert Settings.from_env().workspace == str(image_dir)


def test_sandbox_none_offers_workspace_and_scratch(dirs: tuple[Path, Path]) -> None:
    """--sandbox none: the file tools take /workspace/... and /scratch/...; children get cwd and TOOLCAGE_* vars."""
    ws, _ = dirs
    with Sandbox(sandbox="none", workspace=ws, audit=False) as sb:
        assert sb.call("read_file", {"path": "/workspace/README.md"}).result["content"] == "project readme\n"
        assert sb.call("grep", {"pattern": "readme"}).result["matches"][0]["path"] == "/workspace/README.md"
        assert sb.call("write_file", {"path": "/scratch/out.txt", "content": "w"}).result["path"] == "/scratch/out.txt"
        assert sb.call("read_file", {"path": "out.txt"}).result["content"] == "w"
        code = (
            "import json, os; e = os.environ\n"
            "print(json.dumps([open(e['TOOLCAGE_WORKSPACE'] + '/README.md').read(), open('out.txt').read(),"
            " os.getcwd() == e['TOOLCAGE_SCRATCH']]))"
        )
        r = sb.call("run_python", {"code": code})
        assert json.loads(r.result["stdout"]) == ["project readme\n", "w", True], r
        scratch = json.loads(sb.call("run_shell", {"command": 'printf \'"%s"\' "$PWD"'}).result["stdout"])
        assert sb.call("read_file", {"path": f"{scratch}/out.txt"}).result["path"] == "/scratch/out.txt"


def test_sandbox_none_without_workspace_says_so() -> None:
    """--sandbox none with no workspace: list_files says so (no empty temp dir), children get no TOOLCAGE_WORKSPACE."""
    with Sandbox(sandbox="none", audit=False) as sb:
        r = sb.call("list_files", {})
        assert r.status == "error" and r.error is not None and "--workspace" in r.error["message"], r
        env = sb.call("run_python", {"code": "import os; print('TOOLCAGE_WORKSPACE' in os.environ)"})
        assert env.result["stdout"] == "False\n"
