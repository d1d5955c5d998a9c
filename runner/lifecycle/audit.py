"""The audit log: append-only JSON lines, hash-chained, fsynced in batches, safe for concurrent runners.

Each record carries ``seq``, ``prev`` (the previous record's hash) and ``hash`` (sha256 of
``prev`` and the record's canonical JSON without ``hash``), so ``toolcage audit --verify``
finds an edited, dropped or reordered line. Writers take an exclusive ``flock`` for
read-last-hash + append + fsync, so concurrent runners never interleave or fork the
chain. Secrets never enter: call parameters are recorded only as size and sha256.

The caller's thread only queues an event (its fields and the time); the writer thread, woken once
per batch, makes the records (digest, canonical JSON encoded once: ``audit_file.Record``), chains,
appends and fsyncs them. Its GIL time is about a third of what it was with structlog making the
records and the JSON encoded twice, and the caller no longer wakes it per record.

Faults: an append is all or nothing (``toolcage.lifecycle.audit_file``); records that could not be
written (disk full) stay queued here, first in line, and are written once there is room,
so one run's failed write never costs another run its records.

Limit: truncating the end of the file leaves a valid shorter chain; ship the log to
append-only storage if that matters.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import json
import os
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from toolcage import logs
from toolcage.errors import AuditError
from toolcage.lifecycle.audit_file import GENESIS, AuditFile, Record, now
from toolcage.lifecycle.audit_file import chain as _chain
from toolcage.policies import contract
from toolcage.workspace import state_dir

BATCH_WINDOW_S = 0.02
ENV = contract.ENV_AUDIT_LOG
CHUNK = 1024  # records per append (one lock, one write, one fsync), each all or nothing
RETAIN_MAX = 50_000  # records kept in memory while the log cannot be written; beyond it, counted
RETRY_S, RETRY_MAX_S = 0.1, 5.0  # the writer's back-off while the log cannot be written


def default_path() -> Path:
    if os.environ.get(ENV):
        return Path(os.environ[ENV]).expanduser()
    return state_dir() / "audit.jsonl"


class Audit:
    """Write audit events. ``event`` writes and fsyncs before returning; ``event_later`` queues the
    event (and its time) for a writer thread that makes and writes the record (per-call records: an
    fsync per call would halve the call rate), and ``drain`` writes whatever is queued now. Records reach
    the file in the order they were given: whoever writes takes everything queued so far, under one lock. The
    writer is woken once per batch (by the record that finds the queue empty), gathers for
    BATCH_WINDOW_S, and writes the batch with one lock and one fsync.

    When the log cannot be written (disk full), records already made stay in memory, first in
    line, and the writer thread tries again (backing off to RETRY_MAX_S); beyond RETAIN_MAX the
    newest are counted instead, and an ``audit.lost`` record says how many. ``event`` raises
    AuditError and drops its own record (its caller is told); the others wait."""

    def __init__(self, path: str | os.PathLike[str] | None = None) -> None:
        self.path = Path(path).expanduser() if path else default_path()
        self._file = AuditFile(self.path)
        self._pending: list[tuple[Any, ...]] = []  # (event, fields[, time]) queued by event_later, not yet taken
        self._queue_lock = threading.Lock()  # guards _pending (held for an append or a swap, nothing more)
        self._wake = threading.Event()  # set by the record that finds _pending empty (and by _retain)
        self._start_lock = threading.Lock()  # guards _thread
        self._lock = threading.Lock()  # one writer at a time: taking and writing are one step
        self._thread: threading.Thread | None = None
        self._retained: list[Record] = []  # made, not on disk (a failed append): written first
        self._lost: dict[str, int] = {}  # events not kept while the log could not be written, by name
        self._failing = False

    def event(self, event: str, /, **fields: Any) -> None:
        # the queued records go first, in the same write and fsync (a close no longer waits out the
        # writer's batch window)
        self._write((event, fields))

    def event_later(self, event: str, /, **fields: Any) -> None:
        item = (event, fields, time.time())  # the record is made by the writer, timestamped now
        with self._queue_lock:
            first = not self._pending
            self._pending.append(item)
        if first:  # the writer sleeps until a batch begins (the others find it gathering or writing)
            self._ensure_writer()
            self._wake.set()

    def _ensure_writer(self) -> None:
        with self._start_lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._writer, name="toolcage-audit", daemon=True)
                self._thread.start()

    def _writer(self) -> None:
        backoff = RETRY_S
        while True:
            self._wake.wait()
            # gather for a moment, then write everything queued under one lock and one fsync: fewer
            # wake-ups of this thread mean less GIL contention with the calls being made meanwhile
            time.sleep(backoff if self._failing else BATCH_WINDOW_S)
            # cleared before the batch is taken: a record queued after the take finds _pending empty and
            # sets it again, one queued before is in this batch
            self._wake.clear()
            try:
                self._write()
                backoff = RETRY_S
            except AuditError:
                backoff = min(backoff * 2, RETRY_MAX_S)  # logged by _write; tried again (_retain set _wake)

    def _write(self, last: tuple[str, dict[str, Any]] | None = None) -> None:
        """What could not be written before, everything queued so far, then ``last``: chained,
        appended and fsynced at once (in chunks of CHUNK records, each all or nothing)."""
        own = _make(*last) if last is not None else None
        with self._lock:
            with self._queue_lock:
                items, self._pending = self._pending, []
            made = [_make(*item) for item in items]
            if own is not None:
                made.append(own)
            records, self._retained = self._retained, []
            if self._lost:
                lost, self._lost = self._lost, {}
                records.append(
                    Record({"event": "audit.lost", "count": sum(lost.values()), "events": lost, "ts": now()})
                )
            records += made
            done = 0
            try:
                while done < len(records):
                    self._file.commit(records[done : done + CHUNK])
                    done += CHUNK
            except AuditError as exc:
                self._retain([r for r in records[done:] if r is not own])
                if not self._failing:  # once per outage, not once per retry
                    logs.get_logger().error(
                        "audit.write_failed", path=str(self.path), error=exc.message, retained=len(self._retained)
                    )
                self._failing = True
                raise
            if self._failing:
                logs.get_logger().warning("audit.write_resumed", path=str(self.path), written=len(records))
            self._failing = False

    def _retain(self, records: list[Record]) -> None:
        """Keep records for the next try; beyond RETAIN_MAX, count the newest instead (memory stays bounded)."""
        room = RETAIN_MAX - len(self._retained)
        for r in records[max(room, 0) :]:
            self._lost[r.event] = self._lost.get(r.event, 0) + 1
        self._retained.extend(records[: max(room, 0)])
        if self._retained:
            self._ensure_writer()
            self._wake.set()

    def drain(self) -> None:
        """Write what is queued now (returns once it is on disk, or once writing failed: the writer
        thread then tries again, and the failure is on the runner's log)."""
        with contextlib.suppress(AuditError):
            self._write()


def _make(event: str, fields: dict[str, Any], at: float | None = None) -> Record:
    """The record for one event: its fields, ``event``, ``ts`` (UTC, of ``at``, epoch seconds, or now) and the
    parameters as size and sha256 only (``_params``). The app's log level has no say: records are made here,
    not by a logger."""
    if "_params" in fields:
        params = fields["_params"]
        digest = _NO_PARAMS if type(params) is dict and not params else param_digest(params)
        fields = {k: v for k, v in fields.items() if k != "_params"} | digest
    ts = now() if at is None else datetime.fromtimestamp(at, UTC).isoformat().replace("+00:00", "Z")
    return Record({**fields, "event": event, "ts": ts})


_SHARED: dict[Path, Audit] = {}
_NO_PARAMS = {"params_bytes": 2, "params_sha256": hashlib.sha256(b"{}").hexdigest()}  # param_digest({}): most calls


def shared(path: str | os.PathLike[str] | None = None) -> Audit:
    """One Audit (one writer thread) per log file per process."""
    key = Path(path).expanduser() if path else default_path()
    if key not in _SHARED:
        _SHARED[key] = Audit(key)
    return _SHARED[key]


@atexit.register
def _drain_shared() -> None:
    """At exit, a last try for what is still queued or waiting for room (the writer is a daemon thread)."""
    for a in list(_SHARED.values()):
        a.drain()


def frame_size(value: Any) -> Any:
    """A data frame (an upload's chunk, raw bytes: toolcage.worker.protocol) digests as its size alone."""
    if isinstance(value, bytes | bytearray | memoryview):
        return {"frame_bytes": len(value)}
    return str(value)


def param_digest(params: Any) -> dict[str, Any]:
    """Parameters as size and hash only: never their values (they may hold secrets)."""
    raw = json.dumps(params, sort_keys=True, separators=(",", ":"), default=frame_size).encode()
    return {"params_bytes": len(raw), "params_sha256": hashlib.sha256(raw).hexdigest()}


def read(path: Path) -> Iterator[dict[str, Any]]:
    """The records, in order; a line that is no JSON object (a torn line) is skipped: ``verify`` names it."""
    with open(path, "rb") as f:
        for line in f:
            if line.strip():
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue
                if isinstance(rec, dict):
                    yield rec


def verify(path: Path) -> list[str]:
    """Every problem in the chain, as sentences naming the line; empty when intact. Torn lines are
    a problem unless the record right after them is the ``audit.repaired`` that names their bytes."""
    problems: list[str] = []
    prev = GENESIS
    expected_seq = 1
    torn: list[tuple[int, bytes]] = []  # lines that are no record, since the last one that is
    try:
        f = open(path, "rb")  # noqa: SIM115
    except FileNotFoundError:
        return [f"{path}: no audit log"]
    with f:
        for n, raw in enumerate(f, 1):
            line = raw[:-1] if raw.endswith(b"\n") else raw
            try:
                rec = json.loads(line)
            except ValueError:
                rec = None
            if not isinstance(rec, dict):
                torn.append((n, line))
                continue
            if torn:
                if not _repairs(rec, b"\n".join(t for _, t in torn)):
                    problems += [f"line {k}: not JSON" for k, _ in torn]
                torn = []
            claimed = rec.pop("hash", None)
            if rec.get("prev") != prev:
                problems.append(f"line {n}: does not follow line {n - 1} (a line was dropped, inserted or reordered)")
            if rec.get("seq") != expected_seq:
                problems.append(f"line {n}: sequence {rec.get('seq')} where {expected_seq} was expected")
            if _chain(rec.get("prev", ""), rec)[1] != claimed:
                problems.append(f"line {n}: content does not match its hash (edited)")
            prev = claimed or ""
            expected_seq = (rec.get("seq") or expected_seq) + 1
    problems += [f"line {k}: not JSON (torn; the next write closes it with audit.repaired)" for k, _ in torn]
    return problems


def _repairs(rec: dict[str, Any], torn: bytes) -> bool:
    """Is ``rec`` the audit.repaired record written for exactly these torn bytes?"""
    return (
        rec.get("event") == "audit.repaired"
        and rec.get("torn_bytes") == len(torn)
        and rec.get("torn_sha256") == hashlib.sha256(torn).hexdigest()
    )
