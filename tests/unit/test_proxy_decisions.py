"""The egress decision stream: the proxy's bounded writer and the runner's reader, without Docker."""

from __future__ import annotations

import io
import json
import struct
import threading
from typing import Any

from toolcage.backends.egress import MAX_LINE, DecisionStream, audit_decisions
from toolcage.engine.attach import DockerAttachTransport
from toolcage.worker.egress.decisionlog import MAX_FIELD, DecisionLog, clip


class BlockingOut(io.StringIO):
    """A stdout whose reader is stuck until released."""

    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()

    def write(self, s: str) -> int:
        self.release.wait(5)
        return super().write(s)


def test_clip_marks_long_fields() -> None:
    """Long strings are cut to MAX_FIELD with a marker saying how much; lists are capped."""
    cut = clip("x" * 60000)
    assert cut.startswith("x" * MAX_FIELD) and cut.endswith(f"[truncated {60000 - MAX_FIELD} chars]")
    assert clip("short") == "short" and len(clip(list(range(100)))) == 16


def test_emit_never_blocks_and_drops_are_counted() -> None:
    """With the reader stuck, emit returns at once; overflow becomes one egress.dropped record with the count."""
    out = BlockingOut()
    log = DecisionLog(out, "r1", size=4)
    for i in range(10):
        log.emit("egress.denied", target=f"t{i}")  # would hang here if emit waited for the reader
    out.release.set()
    log.close()
    recs = [json.loads(line) for line in out.getvalue().splitlines()]
    written = [r for r in recs if r["event"] == "egress.denied"]
    dropped = sum(r["count"] for r in recs if r["event"] == "egress.dropped")
    assert dropped > 0 and len(written) + dropped == 10
    assert all(r["run_id"] == "r1" and r["component"] == "egress-proxy" for r in recs)


def test_stream_parses_split_lines_and_ignores_noise() -> None:
    """Records split across reads arrive whole; non-JSON and over-long lines are skipped, not fatal."""
    got: list[dict[str, Any]] = []
    s = DecisionStream(got.append)
    rec = json.dumps({"event": "egress.allowed", "target": "http://a/"}).encode()
    s.stdout(rec[:10])
    s.stdout(rec[10:] + b"\nnot json\n" + b"y" * (MAX_LINE + 10))
    s.stdout(b"z\n[1,2]\n" + json.dumps({"event": "egress.denied", "target": "t" * 2000}).encode() + b"\n")
    assert [r["event"] for r in got] == ["egress.allowed", "egress.denied"]
    assert len(got[1]["target"]) < 600 and "truncated" in got[1]["target"]


def test_stream_reads_docker_frames_through_the_attach_transport() -> None:
    """The runner reuses DockerAttachTransport's demultiplexer: stdout frames are records, stderr is a tail."""
    import socket

    a, b = socket.socketpair()
    got: list[dict[str, Any]] = []
    stream = DecisionStream(got.append)
    t = DockerAttachTransport(a, stream)
    t.start()
    line = json.dumps({"event": "proxy.listening"}).encode() + b"\n"
    b.sendall(struct.pack(">BxxxI", 1, len(line)) + line + struct.pack(">BxxxI", 2, 5) + b"oops\n")
    b.close()
    assert stream.ended.wait(5)
    t.close()
    assert got == [{"event": "proxy.listening"}] and stream.stderr_tail() == "oops\n"


def test_audit_callback_writes_decisions_and_drops() -> None:
    """Each allowed/denied record becomes an egress.decision audit event; egress.dropped carries its count."""
    calls: list[tuple[str, dict[str, Any]]] = []

    class FakeAudit:
        def event_later(self, event: str, /, **fields: Any) -> None:
            calls.append((event, fields))

    write = audit_decisions(FakeAudit(), "run1")
    assert write is not None and audit_decisions(None, "run1") is None
    write({"event": "egress.allowed", "target": "http://a/", "method": "GET", "reason": "ok", "addresses": ["1.2.3.4"]})
    write({"event": "egress.dropped", "count": 7})
    write({"event": "proxy.listening"})
    assert calls[0] == (
        "egress.decision",
        {
            "run_id": "run1",
            "source": "proxy",
            "allowed": True,
            "target": "http://a/",
            "method": "GET",
            "reason": "ok",
            "addresses": ["1.2.3.4"],
            "sni": None,
        },
    )
    assert calls[1] == ("egress.dropped", {"run_id": "run1", "source": "proxy", "count": 7}) and len(calls) == 2


def test_a_runs_refusals_are_folded_into_counts_after_the_first_ones() -> None:
    """Proxy and SafeFetch refusals share one budget per run: the first REFUSALS_RECORDED are records,
    the rest counts per (source, reason, origin), flushed as egress.refusals_folded; allowed ones stay
    records; the distinct keys per record are capped (the rest in ``other``)."""
    from toolcage.lifecycle import records
    from toolcage.results import CallResult

    calls: list[tuple[str, dict[str, Any]]] = []

    class FakeAudit:
        def event_later(self, event: str, /, **fields: Any) -> None:
            calls.append((event, fields))

        def drain(self) -> None: ...

    audit = FakeAudit()
    write = audit_decisions(audit, "fold1")
    assert write is not None
    for i in range(records.REFUSALS_RECORDED - 1):
        write({"event": "egress.denied", "target": f"http://x.test/{i}", "reason": "x.test is not in the allowlist"})
    denied = {"allowed": False, "url": "http://y.test/a", "reason": "y.test is not in the allowlist"}
    r = CallResult("ok", "http_fetch", "fold1", result={"decisions": [denied, denied]})
    records.audit_call(audit, "fold1", {}, r)  # the 100th is a record, the 101st is counted
    for i in range(500):
        write({"event": "egress.denied", "target": f"http://x.test/{i}", "reason": "x.test is not in the allowlist"})
    for i in range(records.FOLD_KEYS + 10):
        write({"event": "egress.denied", "target": f"http://h{i}.test/", "reason": "r"})
    write({"event": "egress.allowed", "target": "http://ok.test/", "reason": "allowed"})
    write({"event": "egress.dropped", "count": 3})
    records.flush_refusals("fold1")
    singles = [f for e, f in calls if e == "egress.decision" and f["allowed"] is False]
    assert len(singles) == records.REFUSALS_RECORDED
    assert [f["target"] for e, f in calls if e == "egress.decision" and f["allowed"]] == ["http://ok.test/"]
    (folded,) = [f for e, f in calls if e == "egress.refusals_folded"]
    assert folded["folded"] == 1 + 500 + records.FOLD_KEYS + 10 and folded["proxy_dropped"] == 3
    assert folded["counts"][0] == {
        "source": "proxy", "reason": "x.test is not in the allowlist", "target": "http://x.test", "count": 500
    }  # fmt: skip
    from_safefetch = {"source": "safefetch", "reason": "y.test is not in the allowlist", "target": "http://y.test"}
    assert {**from_safefetch, "count": 1} in folded["counts"]
    assert len(folded["counts"]) == records.FOLD_KEYS and folded["other"] == 12
    assert sum(c["count"] for c in folded["counts"]) + folded["other"] == folded["folded"]
    records.flush_refusals("fold1")  # nothing new: no record
    assert sum(1 for e, _ in calls if e == "egress.refusals_folded") == 1
