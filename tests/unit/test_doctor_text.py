"""doctor's report is data (toolcage.ops.doctor); the CLI prints it (toolcage.cli.doctor)."""

from __future__ import annotations

from typing import Any

import pytest

from toolcage.cli import doctor


def _probe(name: str, what: str, note: str = "") -> dict[str, Any]:
    return {"name": name, "what": what, "passed": True, "observed": {}, "note": note}


def test_the_probe_table_keeps_its_columns_on_long_names(capsys: pytest.CaptureFixture[str]) -> None:
    """Every probe's description, and a note under it, starts in one column however long a probe's name."""
    long_name = "a_probe_whose_name_is_longer_than_the_old_fixed_column"
    report = {
        "engine": {"ok": False, "error": "down"},
        "probes": [_probe("short", "@first"), _probe(long_name, "@second", note="@note"), _probe("mid_name", "@third")],
    }
    doctor._doctor_text(report, [])
    lines = [line for line in capsys.readouterr().out.splitlines() if "@" in line]
    assert len(lines) == 4 and any(long_name in line for line in lines)
    assert len({line.replace("(@", "@").index("@") for line in lines}) == 1, lines  # the note's "(" in that column


def test_the_report_is_data_without_the_cli(monkeypatch: pytest.MonkeyPatch) -> None:
    """ops.doctor.report() returns the findings as data with the engine down (nothing printed, no exit)."""
    import toolcage.engine.docker_adapter
    from toolcage.errors import DockerUnavailable
    from toolcage.ops.doctor import report

    def down(cls: Any) -> Any:
        raise DockerUnavailable("Cannot reach the Docker engine (test).")

    monkeypatch.setattr(toolcage.engine.docker_adapter.Engine, "default", classmethod(down))
    out = report()
    assert out["engine"] == {"ok": False, "error": "Cannot reach the Docker engine (test)."}
    assert out["findings"] == ["engine: Cannot reach the Docker engine (test)."] and out["warnings"] == []
