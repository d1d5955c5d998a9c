"""Strings from inside the sandbox never reach the operator's terminal as control sequences."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import structlog
from click.testing import CliRunner

from toolcage import logs, textsafe
from toolcage.cli import main as cli_mod
from toolcage.errors import WorkerCrashed
from toolcage.lifecycle.audit import Audit

# erase line + carriage return, OSC title, one-byte CSI, right-to-left override, DEL, a newline
PAYLOADS = ["\x1b[2K\rFAKE ok", "\x1b]0;title\x07", "\u009b31m", "\u202eevil", "del\x7f", "line\nforged"]
EVIL = "".join(PAYLOADS)
# what a terminal would interpret: C0 but the newline that ends our own lines, DEL, C1, bidi
RAW = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def assert_clean(text: str) -> None:
    assert not RAW.search(text), repr(text)
    assert not any(line.startswith("forged") for line in text.split("\n")), text


@pytest.mark.parametrize("payload", PAYLOADS)
def test_escape_makes_controls_visible(payload: str) -> None:
    """escape() shows each control character as a visible \\xNN or \\uNNNN escape."""
    out = textsafe.escape(payload)
    assert not RAW.search(out) and "\n" not in out
    assert any(e in out for e in ("\\x1b", "\\x9b", "\\u202e", "\\x7f", "\\x0a"))


def test_escape_keeps_ordinary_text() -> None:
    """Printable text, including non-Latin scripts and emoji, is left alone."""
    assert textsafe.escape("GET https://api.example/ü/日本 ✓") == "GET https://api.example/ü/日本 ✓"


def test_json_stays_json_and_ascii() -> None:
    """dumps() is valid JSON that decodes back to the same strings, with no raw control characters."""
    out = textsafe.dumps({"k": EVIL}, indent=2)
    assert json.loads(out) == {"k": EVIL}
    assert not RAW.search(out.replace("\n", ""))


def _audit_log(tmp_path: Path) -> Path:
    path = tmp_path / "audit.jsonl"
    a = Audit(path)
    a.event("egress.decision", run_id="r1" + EVIL, url="https://x/" + EVIL, method=EVIL, reason=EVIL, allowed=False)
    a.event("run.call", run_id="r1", tool=EVIL, status="error", error={"message": EVIL})
    return path


def test_audit_human_output_is_escaped(tmp_path: Path) -> None:
    """`toolcage audit` shows sandbox-chosen fields escaped, one line per record."""
    res = CliRunner().invoke(cli_mod.cli, ["audit", "--audit-log", str(_audit_log(tmp_path))])
    assert res.exit_code == 0, res.output
    assert_clean(res.output)
    assert len(res.output.strip().split("\n")) == 2
    assert "\\x1b[2K\\x0dFAKE ok" in res.output and "\\u202eevil" in res.output


def test_audit_json_output_is_escaped(tmp_path: Path) -> None:
    """`toolcage audit --json` stays JSON lines, with C1, bidi and DEL escaped as \\uXXXX."""
    res = CliRunner().invoke(cli_mod.cli, ["audit", "--json", "--audit-log", str(_audit_log(tmp_path))])
    assert res.exit_code == 0, res.output
    assert_clean(res.output)
    recs = [json.loads(line) for line in res.output.strip().split("\n")]
    assert recs[0]["method"] == EVIL


@pytest.mark.parametrize("as_json", [False, True])
def test_log_lines_are_escaped(capsys: pytest.CaptureFixture[str], as_json: bool) -> None:
    """-v/-vv logs (console or JSON) never carry a raw control character from a log field."""
    logs.configure(verbose=2, json_logs=as_json)
    try:
        log = structlog.get_logger("toolcage").bind(run_id="r1")
        log.debug("worker.stderr", line=EVIL)
        log.info("egress.denied", host=EVIL, method=EVIL, **{"k" + EVIL: [EVIL]})
        try:
            raise ValueError(EVIL)
        except ValueError:
            log.exception("run.failed")
    finally:
        structlog.reset_defaults()
    err = capsys.readouterr().err
    assert_clean(err)
    if not as_json:
        assert "\\x1b[2K\\x0dFAKE ok" in err and "\\u202eevil" in err
    else:
        assert all(json.loads(line) for line in err.strip().split("\n"))


def test_cli_error_message_is_escaped(capsys: pytest.CaptureFixture[str]) -> None:
    """An error printed by the CLI (a message the worker chose) is escaped on stderr and in JSON."""
    from toolcage.cli import output

    output.use_json(True)
    try:
        assert output.report(WorkerCrashed("worker said " + EVIL, stderr_tail=EVIL), []) == 3
    finally:
        output.use_json(None)
    out = capsys.readouterr()
    assert_clean(out.err)
    assert_clean(out.out.replace("\n", ""))
    assert json.loads(out.out)["error"]["stderr_tail"] == EVIL


def test_ps_table_is_escaped(monkeypatch: pytest.MonkeyPatch) -> None:
    """`toolcage ps` escapes labels and shows rich markup literally."""
    import toolcage.engine.docker_adapter
    import toolcage.ops.views

    row: dict[str, Any] = {
        "name": "toolcage-x-1",
        "run_id": "1",
        "tool": "[bold red]tool" + EVIL,
        "policy": EVIL,
        "age_s": 1.0,
        "memory_bytes": None,
        "owner": "h:1",
        "container_id": "abc",
    }
    monkeypatch.setattr(toolcage.engine.docker_adapter.Engine, "default", classmethod(lambda cls: object()))
    monkeypatch.setattr(toolcage.ops.views, "live_runs", lambda engine: [row])
    res = CliRunner().invoke(cli_mod.cli, ["ps"], env={"COLUMNS": "400"})
    assert res.exit_code == 0, res.output
    assert_clean(res.output)
    assert "[bold red]tool" in res.output


def test_doctor_text_is_escaped(capsys: pytest.CaptureFixture[str]) -> None:
    """doctor's table escapes probe observations, container names and findings."""
    report = {
        "engine": {"version": "20.10", "api": "1.41"},
        "image": {"tag": "toolcage-worker:x", "current": True},
        "daemon": {
            "seccomp": True,
            "apparmor": False,
            "selinux": False,
            "userns": False,
            "rootless": False,
            "cgroup_version": "1",
            "storage_driver": "overlay2",
        },
        "containers": [{"name": "toolcage-" + EVIL, "findings": []}],
        "probes": [{"name": "p", "what": "w", "passed": False, "observed": EVIL}],
    }
    from toolcage.cli import doctor

    report["engine"]["ok"] = True  # type: ignore[index]
    doctor._doctor_text(report, ["probe p failed: " + EVIL])
    out = capsys.readouterr()
    assert_clean(out.out + out.err)
