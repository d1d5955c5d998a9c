"""The audit log: hash chain, tamper detection, concurrent writers, no secret values."""

from __future__ import annotations

import json
import multiprocessing
from pathlib import Path

import pytest

from toolcage.lifecycle.audit import Audit, param_digest, read, verify


def write(path: Path, n: int) -> None:
    a = Audit(path)
    for i in range(n):
        a.event("run.call", run_id="r1", i=i)


def test_chain_verifies(tmp_path: Path) -> None:
    """A freshly written log verifies, with consecutive sequence numbers."""
    log = tmp_path / "audit.jsonl"
    write(log, 5)
    assert verify(log) == []
    assert [r["seq"] for r in read(log)] == [1, 2, 3, 4, 5]


def _lines(log: Path) -> list[str]:
    return log.read_text().splitlines(keepends=True)


def test_edit_detected(tmp_path: Path) -> None:
    """Changing a value in a line is found."""
    log = tmp_path / "audit.jsonl"
    write(log, 4)
    lines = _lines(log)
    rec = json.loads(lines[1])
    rec["i"] = 99
    lines[1] = json.dumps(rec, sort_keys=True, separators=(",", ":")) + "\n"
    log.write_text("".join(lines))
    problems = verify(log)
    assert any("line 2" in p and "edited" in p for p in problems)


def test_drop_detected(tmp_path: Path) -> None:
    """Removing a line is found."""
    log = tmp_path / "audit.jsonl"
    write(log, 4)
    lines = _lines(log)
    del lines[2]
    log.write_text("".join(lines))
    assert any("line 3" in p for p in verify(log))


def test_reorder_detected(tmp_path: Path) -> None:
    """Swapping two lines is found."""
    log = tmp_path / "audit.jsonl"
    write(log, 4)
    lines = _lines(log)
    lines[1], lines[2] = lines[2], lines[1]
    log.write_text("".join(lines))
    assert verify(log)


def test_concurrent_writers_do_not_interleave(tmp_path: Path) -> None:
    """Four processes writing at once leave one intact chain with every record."""
    log = tmp_path / "audit.jsonl"
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=write, args=(log, 50)) for _ in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    assert verify(log) == []
    assert len(list(read(log))) == 200


def test_params_recorded_as_size_and_hash_only(tmp_path: Path) -> None:
    """Parameter values never reach the log file: a run.call record holds only their size and sha256."""
    d = param_digest({"token": "s3cr3t-value"})
    assert set(d) == {"params_bytes", "params_sha256"}
    log = tmp_path / "audit.jsonl"
    a = Audit(log)
    a.event_later("run.call", run_id="x", tool="run_python", _params={"token": "s3cr3t-value", "code": "print(42)"})
    a.drain()
    raw = log.read_bytes()
    assert raw and b"s3cr3t" not in raw and b"print(42)" not in raw
    (rec,) = [r for r in read(log) if r["event"] == "run.call"]
    assert rec["params_sha256"] and rec["params_bytes"] > 0 and "_params" not in rec


def test_background_writer_drains(tmp_path: Path) -> None:
    """Queued records are on disk after drain(), in order, and the chain holds."""
    log = tmp_path / "audit.jsonl"
    a = Audit(log)
    a.event("run.started", run_id="x")
    for i in range(20):
        a.event_later("run.call", run_id="x", i=i)
    a.event("run.finished", run_id="x")
    events = [r["event"] for r in read(log)]
    assert events[0] == "run.started" and events[-1] == "run.finished" and len(events) == 22
    assert verify(log) == []


def test_log_level_never_filters_audit(tmp_path: Path) -> None:
    """Audit records are written whatever level the app's structlog filters at."""
    import logging

    import structlog

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.CRITICAL))
    try:
        log = tmp_path / "audit.jsonl"
        Audit(log).event("run.started", run_id="x")
        assert [r["event"] for r in read(log)] == ["run.started"]
    finally:
        structlog.reset_defaults()


def test_event_writes_queued_records_first_without_waiting(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """event() writes the queued records ahead of its own, in one go: it does not wait out the
    writer's batch window (a run's close came 15-20 ms later for it)."""
    import time

    from toolcage.lifecycle import audit as audit_mod

    monkeypatch.setattr(audit_mod, "BATCH_WINDOW_S", 30.0)  # the writer thread sleeps through the test
    log = tmp_path / "audit.jsonl"
    a = Audit(log)
    a.event("run.started", run_id="x")
    a.event_later("run.call", run_id="x", _params={"code": "pass"})
    a.event_later("run.call", run_id="x", i=2)
    t0 = time.monotonic()
    a.event("run.finished", run_id="x")
    assert time.monotonic() - t0 < 5.0
    assert [r["event"] for r in read(log)] == ["run.started", "run.call", "run.call", "run.finished"]
    assert verify(log) == []


def test_a_forged_repair_does_not_hide_a_torn_line(tmp_path: Path) -> None:
    """A torn line is accepted only with the audit.repaired record that names its exact bytes."""
    log = tmp_path / "audit.jsonl"
    write(log, 2)
    with open(log, "ab") as f:
        f.write(b'{"event":"run.call","i":')  # torn
    write(log, 1)  # repairs it
    assert verify(log) == []
    assert [r["event"] for r in read(log)] == ["run.call", "run.call", "audit.repaired", "run.call"]
    lines = log.read_bytes().splitlines(keepends=True)
    lines[2] = b'{"event":"run.call","i":9}x\n'  # other torn bytes under the same repair record
    log.write_bytes(b"".join(lines))
    assert verify(log) == ["line 3: not JSON"]


def test_a_whole_last_record_without_its_newline_is_not_a_tear(tmp_path: Path) -> None:
    """A last record missing only its newline gets one; no repair record, the chain goes on."""
    log = tmp_path / "audit.jsonl"
    write(log, 2)
    log.write_bytes(log.read_bytes().rstrip(b"\n"))
    write(log, 1)
    assert [r["seq"] for r in read(log)] == [1, 2, 3] and verify(log) == []


def test_records_wait_while_the_log_cannot_be_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """While appends fail, queued records are kept (up to RETAIN_MAX, the rest counted in audit.lost) and
    written in order once appends work again; event() raises AuditError and drops only its own record."""
    from toolcage.errors import AuditError
    from toolcage.lifecycle import audit as audit_mod
    from toolcage.lifecycle.audit_file import AuditFile

    monkeypatch.setattr(audit_mod, "RETAIN_MAX", 5)
    real = AuditFile.commit
    broken = {"on": True}

    def commit(self: AuditFile, records: list[dict[str, object]]) -> None:
        if broken["on"]:
            raise AuditError("could not write the audit log: No space left on device")
        real(self, records)

    monkeypatch.setattr(AuditFile, "commit", commit)
    log = tmp_path / "audit.jsonl"
    a = Audit(log)
    for i in range(8):
        a._pending.append(("run.call", {"run_id": "r", "i": i}))  # queued, as event_later does, minus the thread
    with pytest.raises(AuditError):
        a.event("run.finished", run_id="r")
    broken["on"] = False
    a.drain()
    recs = list(read(log))
    assert [r.get("i") for r in recs if r["event"] == "run.call"] == [0, 1, 2, 3, 4]
    assert [(r["event"], r.get("count")) for r in recs[5:]] == [("audit.lost", 3)]
    assert recs[5]["events"] == {"run.call": 3}
    assert verify(log) == []
