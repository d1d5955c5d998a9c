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


FIRST_THEN_WAIT = (
    "import sys, time\nprint('first line', flush=True)\nprint('to stderr', file=sys.stderr, flush=True)\n"
    "time.sleep(900)"
)
SEEN_WITHIN_S = 120  # the lines come within ~0.1 s when streamed; the call sleeps 900 s, so never when not


def stream_then_interrupt(*args: str) -> tuple[list[str], int, Any, str]:
    """``toolcage run run_python --stream ARGS`` through pipes, its code printing two lines and then sleeping
    for 900 s: the stderr lines read up to the second (which must come while the call sleeps); then SIGINT.
    Returns those lines, the exit code, the JSON on stdout and the rest of stderr."""
    import queue
    import signal
    import subprocess
    import sys
    import threading

    params = json.dumps({"code": FIRST_THEN_WAIT, "timeout_s": 1000})
    argv = [sys.executable, "-m", "toolcage.cli", "run", "run_python", "--stream", "--params", params,
            "--call-s", "1000", "--run-s", "1200", *args]  # fmt: skip
    lines: queue.Queue[str] = queue.Queue()
    seen: list[str] = []
    with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as proc:
        assert proc.stdout is not None and proc.stderr is not None
        stderr = proc.stderr

        def read() -> None:
            for line in stderr:
                lines.put(line)
            lines.put("")  # the end of stderr

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        try:
            while not seen or seen[-1] != "to stderr\n":
                try:
                    seen.append(lines.get(timeout=SEEN_WITHIN_S))
                except queue.Empty:
                    raise AssertionError(f"the call's output was not shown while it ran: {seen}") from None
                assert seen[-1], f"stderr ended before the call's output was shown: {seen}"
            proc.send_signal(signal.SIGINT)
            proc.wait(timeout=60)  # its stdout, one small JSON document, fits the pipe
            out = proc.stdout.read()
            reader.join(timeout=10)
        finally:
            if proc.poll() is None:
                proc.kill()
    rest = []
    while not lines.empty():
        rest.append(lines.get())
    return seen, proc.returncode, json.loads(out), "".join(rest)


def test_stream_shows_the_output_while_the_call_runs_and_ctrl_c_keeps_it() -> None:
    """`run --stream` showed nothing until the end, and Ctrl-C's result dropped the output: now both (no Docker)."""
    seen, code, doc, err = stream_then_interrupt("--sandbox", "none")
    assert seen[-2:] == ["first line\n", "to stderr\n"], seen
    assert code == 130 and doc["status"] == "interrupted", (doc, err)
    assert doc["output"] == "first line\nto stderr\n"
    assert "Traceback" not in err


def test_streamed_output_is_escaped_for_the_terminal(capsys: pytest.CaptureFixture[str]) -> None:
    """What the sandbox prints reaches stderr with its lines and tabs, its escape sequences shown, not obeyed."""
    from toolcage.cli.output import CallOutput

    shown = CallOutput(show=True, is_output=True, keep=1 << 20)
    shown({"progress": 10, "message": "a\tb\n\x1b[2K\rforged"})
    shown.end()
    err = capsys.readouterr().err
    assert err == "a\tb\n\\x1b[2K\\x0dforged\n"
    assert shown.text == "a\tb\n\x1b[2K\rforged"  # kept as it came: the JSON result escapes it its own way


def test_the_output_kept_for_an_interrupted_run_is_bounded_by_the_runner() -> None:
    """More output than ``keep`` (a worker that does not coalesce, or floods): the first ``keep`` characters are
    kept and the rest dropped, with ``truncated`` set; the runner's memory does not follow the sandbox's."""
    from toolcage.cli.output import CallOutput

    shown = CallOutput(show=False, is_output=True, keep=10)
    for _ in range(1000):
        shown({"progress": 1, "message": "0123456"})
    assert shown.text == "0123456012" and shown.truncated
    small = CallOutput(show=False, is_output=True, keep=10)
    small({"progress": 1, "message": "0123456789"})
    assert small.text == "0123456789" and not small.truncated


def test_no_stream_through_a_pipe_by_default() -> None:
    """stderr is not a terminal and --stream was not given: the output is in the JSON result only."""
    out = CliRunner().invoke(cli, ["run", "run_python", "--sandbox", "none", "--params", '{"code": "print(6 * 7)"}'])
    assert out.exit_code == 0, out.output
    assert "\n42\n" not in f"\n{out.stderr}" and json.loads(out.stdout)["result"]["stdout"] == "42\n"


def test_an_empty_workspace_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`--workspace ""` (an unset variable) was Path("") == ".": the current directory, mounted unasked. Refused now."""
    from toolcage.errors import WorkspaceError
    from toolcage.workspace import validate_workspace

    monkeypatch.chdir(tmp_path)
    with pytest.raises(WorkspaceError, match="empty path"):
        validate_workspace("")
    out = CliRunner().invoke(cli, ["run", "run_python", "--params", '{"code": "1"}', "--workspace", ""])
    assert out.exit_code == 2 and json.loads(out.stdout)["error"]["reason"] == "workspace", out.output
