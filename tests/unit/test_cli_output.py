"""The CLI's one output convention and its host-side checks, without Docker."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from toolcage.cli.main import cli
from toolcage.errors import DockerUnavailable


@pytest.fixture
def no_sandbox(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any attempt to build a Sandbox fails the test: the checks must come first."""
    import toolcage.sandbox

    def boom(*a: Any, **k: Any) -> None:
        raise AssertionError("a sandbox was started")

    monkeypatch.setattr(toolcage.sandbox, "Sandbox", boom)


def test_unknown_tool_refused_before_any_sandbox_and_lists_tools(no_sandbox: None) -> None:
    """`run nosuch` exits 2 without starting a sandbox, naming the valid tools (stderr and JSON)."""
    out = CliRunner().invoke(cli, ["run", "nosuch", "--params", "{}"])
    assert out.exit_code == 2, out.output
    assert "unknown tool 'nosuch'" in out.stderr and "run_python" in out.stderr
    doc = json.loads(out.stdout)
    assert doc["status"] == "error" and "grep" in doc["error"]["valid_tools"]


def test_bad_params_refused_before_any_sandbox(no_sandbox: None) -> None:
    """Bad params for a built-in tool exit 2 naming each field, without starting a sandbox."""
    out = CliRunner().invoke(cli, ["run", "run_python", "--params", '{"code": 1, "nope": 2}'])
    assert out.exit_code == 2
    assert "code: must be a string" in out.stderr and "nope: unknown field" in out.stderr
    assert {e["field"] for e in json.loads(out.stdout)["error"]["errors"]} == {"code", "nope"}


def test_derived_image_may_have_more_tools(monkeypatch: pytest.MonkeyPatch) -> None:
    """With an image that is not toolcage-worker, an unknown name is left to the worker."""
    from toolcage.precheck import check_call

    check_call("my_tool", {}, image="registry.local/acme-tools:1")  # no error
    with pytest.raises(Exception, match="unknown tool"):
        check_call("my_tool", {}, image="toolcage-worker:0.1.0")


def test_click_usage_error_of_a_json_command_prints_json() -> None:
    """click's own usage errors follow the convention: JSON on stdout for run, one line on stderr."""
    out = CliRunner().invoke(cli, ["run", "run_python", "--timeout", "soon"])
    assert out.exit_code == 2
    assert json.loads(out.stdout)["error"]["reason"] == "usage"
    assert out.stderr.startswith("toolcage: ") and "--timeout" in out.stderr


def test_click_usage_error_of_a_human_command_prints_no_stdout() -> None:
    """Without --json, a usage error writes nothing on stdout."""
    out = CliRunner().invoke(cli, ["ps", "--nope"])
    assert out.exit_code == 2 and out.stdout == "" and "toolcage: " in out.stderr


def test_timeout_over_policy_warns_in_plain_text(no_sandbox: None) -> None:
    """--timeout above the policy's run deadline is clamped with a plain-text warning on stderr."""
    out = CliRunner().invoke(cli, ["run", "nosuch", "--timeout", "999"])
    assert "toolcage: warning: --timeout 999s is more than the policy's run deadline; using 60s" in out.stderr


def test_ps_json_age_is_seconds() -> None:
    """`ps --json` rows give age_s as a number of seconds, not "90s"."""
    from toolcage.ops.views import live_runs

    started = time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime(time.time() - 90))

    class Eng:
        def containers(self, label: str, all: bool = True) -> list[dict[str, Any]]:
            labels = {"toolcage.run_id": "r", "toolcage.started_at": started}
            return [{"Id": "c" * 64, "Names": ["/t"], "Labels": labels}]

    rows = live_runs(Eng(), with_memory=False)  # type: ignore[arg-type]
    assert isinstance(rows[0]["age_s"], float) and 89 <= rows[0]["age_s"] <= 95


def test_doctor_with_docker_down_prints_the_report(monkeypatch: pytest.MonkeyPatch) -> None:
    """doctor with no engine prints its report with the engine check failed, and exits 1."""
    import toolcage.engine.docker_adapter

    def down(cls: Any) -> Any:
        raise DockerUnavailable("Cannot reach the Docker engine (test).")

    monkeypatch.setattr(toolcage.engine.docker_adapter.Engine, "default", classmethod(down))
    out = CliRunner().invoke(cli, ["doctor"])
    assert out.exit_code == 1 and "engine      FAILED: Cannot reach the Docker engine" in out.stdout
    doc = json.loads(CliRunner().invoke(cli, ["doctor", "--json"]).stdout)
    assert doc["engine"]["ok"] is False and doc["findings"]


def test_audit_unknown_run_says_so(tmp_path: Path) -> None:
    """`audit --run ID` with no records of that run says so and exits 1."""
    log = tmp_path / "a.jsonl"
    from toolcage.lifecycle.audit import Audit

    Audit(log).event("run.started", run_id="aaaa1111")
    out = CliRunner().invoke(cli, ["audit", "--audit-log", str(log), "--run", "nosuchid"])
    assert out.exit_code == 1 and "no records of run 'nosuchid'" in out.stderr
    assert CliRunner().invoke(cli, ["audit", "--audit-log", str(log), "--run", "aaaa1111"]).exit_code == 0


def test_image_help_promises_only_build() -> None:
    """`toolcage image --help` does not promise an inspect command that does not exist."""
    out = CliRunner().invoke(cli, ["image", "--help"])
    assert out.exit_code == 0 and "inspect" not in out.stdout.lower() and "build" in out.stdout
