"""``audit_file.Record`` (a record encoded once, on the caller's thread, and chained later) gives exactly the
line ``chain`` gives for the same record: the hash chain and ``toolcage audit --verify`` are unchanged."""

from __future__ import annotations

import enum
import random
import threading
import time
from datetime import UTC
from pathlib import Path
from typing import Any

import pytest

from toolcage.lifecycle import audit_file
from toolcage.lifecycle.audit import Audit, _make, param_digest, read, verify
from toolcage.lifecycle.audit_file import GENESIS, Record, chain


class Color(enum.IntEnum):
    RED = 1


def records() -> list[dict[str, Any]]:
    rng = random.Random(40)
    fixed: list[dict[str, Any]] = [
        {},
        {"event": "run.call"},
        {"event": "run.call", "run_id": "r", "tool": "ping", "status": "ok", "duration_ms": 0.512,
         "error_code": None, "params_bytes": 2, "params_sha256": "ab" * 32, "ts": "2026-11-29T03:00:00.000001Z"},
        {"a": 1, "pre": 2, "prev": "forged", "prex": 3, "q": [1, 2], "s": "x", "seq": 99, "seq0": True, "z": False},
        {"hash": "forged", "event": "x"},  # kept as a field, as commit always did
        {"event": "é日本😀\ud800", "url": "http://x/\"quoted\"\\\n", "n": float("nan"), "i": float("inf")},
        {"nested": {"prev": "x", "seq": 1, "b": {"z": 1, "a": [None, 1.5, "s"]}}, "event": "egress.decision"},
        {"path": Path("/tmp/x"), "enum": Color.RED, "big": 10**40, "neg": -0.0, "t": (1, "2")},
        {"counts": [{"source": "proxy", "reason": "denied", "target": "http://a", "count": 3}], "other": 0},
        {"event": f"prev:{audit_file._MARK}p"},  # the placeholder's own text in a value: not where it splits
    ]  # fmt: skip
    keys = ["a", "event", "p", "prev", "prevx", "q", "run_id", "s", "seq", "sez", "ts", "z", "é"]
    values: list[Any] = [None, True, False, 0, -5, 2**70, 1.25, "", "ascii", "é😀", [1, {"k": "v"}], {"x": None}]
    for _ in range(2000):
        fixed.append({rng.choice(keys): rng.choice(values) for _ in range(rng.randrange(0, 8))})
    return fixed


def test_record_chains_as_chain_does() -> None:
    rng = random.Random(41)
    for fields in records():
        prev = rng.choice((GENESIS, "f" * 64, 'a"b'))
        seq = rng.randrange(1, 10**9)
        expected = chain(prev, {**fields, "seq": seq, "prev": prev})
        assert Record(fields).chained(prev, seq) == expected, fields


def test_a_record_with_keys_that_do_not_sort_still_chains() -> None:
    """Keys that are not strings (no keyword argument makes one) are encoded when chained, as before."""
    fields: dict[Any, Any] = {1: "a", 2: "b"}
    rec = Record(fields)
    try:
        expected: Any = chain(GENESIS, {**fields, "seq": 1, "prev": GENESIS})
    except TypeError as exc:
        expected = type(exc)
    try:
        got: Any = rec.chained(GENESIS, 1)
    except TypeError as exc:
        got = type(exc)
    assert got == expected


def test_make_is_what_the_logger_made(tmp_path: Path) -> None:
    """``_make``: the fields, ``event``, a UTC ``ts`` ending in Z, parameters as size and digest only."""
    rec = _make("run.call", {"run_id": "r", "_params": {"token": "s3cr3t"}})
    body, _ = rec.chained(GENESIS, 1)
    assert "s3cr3t" not in body and "_params" not in body
    assert param_digest({"token": "s3cr3t"})["params_sha256"] in body
    empty, _ = _make("run.call", {"_params": {}}).chained(GENESIS, 1)
    assert param_digest({})["params_sha256"] in empty and '"params_bytes":2' in empty
    assert '"event":"run.call"' in body and body.endswith('Z"}') and '"ts":"20' in body


def test_many_threads_queue_in_order_and_nothing_is_lost(tmp_path: Path) -> None:
    """Four threads queueing at once (the writer woken once per batch): every record on disk, each thread's in
    its order, one intact chain."""
    log = tmp_path / "audit.jsonl"
    a = Audit(log)

    def queue(t: int) -> None:
        for i in range(500):
            a.event_later("run.call", run_id=f"t{t}", i=i, _params={"i": i})

    threads = [threading.Thread(target=queue, args=(t,)) for t in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    a.event("run.finished", run_id="x")
    recs = list(read(log))
    assert verify(log) == [] and len(recs) == 2001 and recs[-1]["event"] == "run.finished"
    for t in range(4):
        assert [r["i"] for r in recs if r.get("run_id") == f"t{t}"] == list(range(500))


def test_a_queued_record_is_timestamped_when_queued(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The writer makes the record, but its ``ts`` is when ``event_later`` was called, not when it was written."""
    from datetime import datetime

    from toolcage.lifecycle import audit as audit_mod

    monkeypatch.setattr(audit_mod, "BATCH_WINDOW_S", 30.0)  # the writer thread sleeps through the test
    log = tmp_path / "audit.jsonl"
    a = Audit(log)
    before = datetime.now(UTC)
    a.event_later("run.call", run_id="x")
    after = datetime.now(UTC)
    time.sleep(0.3)
    a.drain()
    (rec,) = list(read(log))
    ts = datetime.fromisoformat(rec["ts"].replace("Z", "+00:00"))
    assert before <= ts <= after and rec["ts"].endswith("Z")


def test_a_calls_data_frame_is_not_held_until_the_record_is_written() -> None:
    """An upload's chunk (a data frame: raw bytes in the params) is queued for the audit writer as its size
    only, with the same digest: a writer that lags never holds the chunks (the runner's memory stays bounded)."""
    from toolcage.lifecycle import records
    from toolcage.results import CallResult

    queued: list[dict[str, Any]] = []

    class Lagging:  # a writer that has not run yet: what it was handed is all it holds
        def event_later(self, event: str, /, **fields: Any) -> None:
            queued.append(fields)

    chunk = b"\0" * (2 << 20)
    params = {"stream": "s1", "frame": chunk, "done": False}
    records.audit_call(Lagging(), "run1", params, CallResult("ok", "upload", "run1", result={}))
    held = queued[0]["_params"]
    assert not any(isinstance(v, bytes | bytearray | memoryview) for v in held.values()), held
    assert param_digest(held) == param_digest(params)
    assert params["frame"] is chunk  # the caller's params are not changed
