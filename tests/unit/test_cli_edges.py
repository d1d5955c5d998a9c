"""Rough edges a new user hit (issue 35), without Docker: each failed before its fix."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from tests.unit.test_worker_protocol import req, run_worker
from toolcage.cli.main import cli


@pytest.mark.parametrize(
    "argv",
    [
        ["run"],
        ["run", "run_python", "--parms", "{}"],
        ["run", "run_python", "--timeout", "soon"],
        ["run", "a", "b"],
        ["runn"],
        ["ps", "--nope"],
        ["policy", "test", "default"],
        ["image", "build", "--nope"],
        ["mcp", "wrap", "--nope"],
    ],
)
def test_a_usage_error_is_one_stderr_line(argv: list[str]) -> None:
    """click's usage errors were two lines (the error, then "Try '... --help' for help."): now one, naming --help."""
    out = CliRunner().invoke(cli, argv)
    assert out.exit_code == 2, out.output
    lines = out.stderr.splitlines()
    assert len(lines) == 1, out.stderr
    assert lines[0].startswith("toolcage: ") and "--help'." in lines[0]


def test_the_program_alone_prints_its_help_not_one_escaped_line() -> None:
    """`toolcage` with no command printed its whole help as one line of \\x0a escapes: now the help itself."""
    out = CliRunner().invoke(cli, [], prog_name="toolcage")
    assert out.exit_code == 2
    assert out.stderr.startswith("Usage: toolcage") and "\\x0a" not in out.stderr
    assert "\n  run " in out.stderr


@pytest.mark.parametrize("kind", ["file", "missing"])
def test_every_workspace_problem_is_reason_workspace(tmp_path: Path, kind: str) -> None:
    """A workspace that is a file was click's `usage`, a missing one `workspace`: both are `workspace` now."""
    path = tmp_path / "w"
    if kind == "file":
        path.write_text("not a directory\n")
    out = CliRunner().invoke(cli, ["run", "run_python", "--params", '{"code": "1"}', "--workspace", str(path)])
    assert out.exit_code == 2, out.output
    assert json.loads(out.stdout)["error"]["reason"] == "workspace"
    assert out.stderr.count("\n") == 1 and str(path) in out.stderr


@pytest.mark.parametrize("kind", ["file", "missing"])
def test_the_library_says_workspace_for_both_too(tmp_path: Path, kind: str) -> None:
    """Sandbox(workspace=...) raises WorkspaceError (reason workspace) for a file and a missing path alike."""
    from toolcage import Sandbox
    from toolcage.errors import WorkspaceError

    path = tmp_path / "w"
    if kind == "file":
        path.write_text("x")
    with pytest.raises(WorkspaceError) as caught:
        Sandbox(workspace=path, sandbox="none")
    assert caught.value.reason == "workspace"


def test_a_typo_d_tool_gets_did_you_mean() -> None:
    """`run run_pythn` listed the tools only: now it names the closest first (stderr and JSON)."""
    out = CliRunner().invoke(cli, ["run", "run_pythn", "--params", "{}"])
    assert out.exit_code == 2
    assert "unknown tool 'run_pythn': did you mean 'run_python'?" in out.stderr
    assert json.loads(out.stdout)["error"]["did_you_mean"] == ["run_python"]
    far = CliRunner().invoke(cli, ["run", "zzzzzz", "--params", "{}"])
    assert "did you mean" not in far.stderr and json.loads(far.stdout)["error"]["did_you_mean"] == []


def test_the_worker_names_the_closest_tools_for_an_unknown_method(tmp_path: Path) -> None:
    """The worker answered a bare "Method not found": it names the closest tools now, code -32601 and data kept."""
    out, _ = run_worker([req("run_pythn", {}, 1), req("zzzzzz", {}, 2), req("x" * 5000, {}, 3)], tmp_path)
    errors: dict[Any, Any] = {o["id"]: o["error"] for o in out}
    assert errors[1] == {"code": -32601, "message": "Method not found: 'run_pythn'; did you mean 'run_python'?",
                         "data": "run_pythn"}  # fmt: skip
    assert errors[2]["message"] == "Method not found" and errors[2]["code"] == -32601
    assert errors[3]["message"] == "Method not found"  # a long name is not compared, nor echoed twice
