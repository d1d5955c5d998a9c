"""The CLI without Docker: usage and policy errors exit 2 with one clear line, never a traceback."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from toolcage.cli.main import cli

FIX = Path(__file__).resolve().parent.parent / "fixtures" / "policies"


def test_tools_lists_builtins() -> None:
    """`toolcage tools` lists every built-in tool; --json adds schemas."""
    out = CliRunner().invoke(cli, ["tools"])
    assert out.exit_code == 0 and "run_python" in out.output and "write_file" in out.output
    listing = json.loads(CliRunner().invoke(cli, ["tools", "--json"]).output)
    assert {t["name"] for t in listing} >= {"run_python", "grep"}


def test_bad_params_json_exits_2() -> None:
    """Malformed --params is a usage error (exit 2) with a clear message."""
    out = CliRunner().invoke(cli, ["run", "run_python", "--params", "{nope"])
    assert out.exit_code == 2 and "not valid JSON" in out.output and "Traceback" not in out.output


def test_params_must_be_object() -> None:
    """--params must be a JSON object."""
    out = CliRunner().invoke(cli, ["run", "run_python", "--params", "[1, 2]"])
    assert out.exit_code == 2 and "JSON object" in out.output


def test_bad_policy_exits_2() -> None:
    """A broken policy file is exit 2 naming the field."""
    out = CliRunner().invoke(
        cli, ["run", "run_python", "--params", "{}", "--policy", str(FIX / "bad-memory-unit.yaml")]
    )
    assert out.exit_code == 2 and "limits.memory" in out.output


def test_bad_workspace_exits_2() -> None:
    """A forbidden workspace is exit 2 with the reason."""
    out = CliRunner().invoke(cli, ["run", "run_python", "--params", '{"code": "1"}', "--workspace", "/etc"])
    assert out.exit_code == 2 and "/etc" in out.output


def test_sandbox_none_runs_locally() -> None:
    """--sandbox none runs the same worker as a local process and warns that nothing is isolated."""
    out = CliRunner().invoke(cli, ["run", "run_python", "--params", '{"code": "print(6*7)"}', "--sandbox", "none"])
    assert out.exit_code == 0, out.output
    assert "NOTHING IS ISOLATED" in out.output and '"stdout": "42\\n"' in out.output


def test_sandbox_none_tool_error_exit_1() -> None:
    """A tool that reports an error exits 1; unknown tools and bad params exit 2."""
    r = CliRunner()
    assert r.invoke(cli, ["run", "run_shell", "--params", '{"command": "exit 3"}', "--sandbox", "none"]).exit_code == 1
    assert r.invoke(cli, ["run", "nope", "--params", "{}", "--sandbox", "none"]).exit_code == 2
    assert r.invoke(cli, ["run", "run_python", "--params", '{"x": 1}', "--sandbox", "none"]).exit_code == 2


def test_policy_test_command() -> None:
    """`toolcage policy test` prints the decision; exit 0 allowed, 1 denied, 2 usage or policy error."""
    r = CliRunner()
    ok = r.invoke(
        cli,
        ["policy", "test", "connector-http", "https://api.github.com/zen", "--resolve", "api.github.com=140.82.112.6"],
    )
    assert ok.exit_code == 0 and json.loads(ok.output)["allowed"] is True
    method = r.invoke(
        cli,
        [
            "policy",
            "test",
            "connector-http",
            "https://api.github.com/",
            "--method",
            "DELETE",
            "--resolve",
            "api.github.com=140.82.112.6",
        ],
    )
    assert method.exit_code == 1 and "method DELETE is not allowed" in json.loads(method.output)["reason"]
    private = r.invoke(
        cli,
        [
            "policy",
            "test",
            "connector-http",
            "https://api.github.com/",
            "--resolve",
            "api.github.com=10.1.2.3",
            "--resolve",
            "api.github.com=140.82.112.6",
        ],
    )
    assert private.exit_code == 1 and "10.1.2.3, which is private" in json.loads(private.output)["reason"]
    literal = r.invoke(cli, ["policy", "test", "connector-http", "http://169.254.169.254/"])
    assert literal.exit_code == 1
    assert r.invoke(cli, ["policy", "test", "connector-http", "https://x/", "--resolve", "bad"]).exit_code == 2
    assert r.invoke(cli, ["policy", "test", "no-such-policy", "https://x/"]).exit_code == 2


def test_docker_unreachable_is_one_sentence_exit_3(monkeypatch: object) -> None:
    """With no engine to talk to, `toolcage run` says what to do in one sentence and exits 3."""
    import os
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    out = subprocess.run(
        [sys.executable, "-m", "toolcage.cli", "run", "run_python", "--params", '{"code": "1"}'],
        capture_output=True,
        text=True,
        cwd=root,
        env={**os.environ, "DOCKER_HOST": "unix:///nonexistent/docker.sock"},
        timeout=60,
    )
    assert out.returncode == 3
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "Cannot reach the Docker engine" in lines[0] and "Traceback" not in out.stderr


def test_commands_of_other_modules_load_when_asked_for() -> None:
    """Importing the command loads none of the other commands' modules (`toolcage run` does not pay for
    them), yet --help lists every command and each one runs."""
    import subprocess
    import sys

    code = (
        "import sys, toolcage.cli.main; "
        "print(sorted(m for m in ('toolcage.cli.image', 'toolcage.cli.mcp', 'toolcage.cli.ops', 'docker', "
        "'yaml', 'pydantic') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
    listed = CliRunner().invoke(cli, ["--help"]).output.split("Commands:")[1].split()
    for name in ("audit", "doctor", "gc", "image", "mcp", "policy", "ps", "run", "serve", "tools"):
        assert name in listed
        assert CliRunner().invoke(cli, [name, "--help"]).exit_code == 0, name
