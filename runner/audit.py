"""The audit log: append-only JSON lines, hash-chained, fsynced in batches, safe for concurrent runners.

Each record carries ``seq``, ``prev`` (the previous record's hash) and ``hash`` (sha256 of
``prev`` and the record's canonical JSON without ``hash``), so ``toolcage audit --verify``
finds an edited, dropped or reordered line. Writers take an exclusive ``flock`` for
read-last-hash + append + fsync, so concurrent runners never interleave or fork the
chain. Records are built with structlog (timestamp and level processors); secrets never
enter: call parameters are recorded only as size and sha256.

Limit: truncating the end of the file leaves a valid shorter chain; ship the log to
append-only storage if that matters.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import structlog

GENESIS = "0" * 64
BATCH_WINDOW_S = 0.02
ENV = "TOOLCAGE_AUDIT_LOG"


def default_path() -> Path:
    if os.environ.get(ENV):
        return Path(os.environ[ENV]).expanduser()
    state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state) / "toolcage" / "audit.jsonl"


def _chain(prev: str, record: dict[str, Any]) -> tuple[str, str]:
    """The record's canonical JSON (without "hash") and its chained hash: the one definition
    that the writer and verify() share."""
    body = json.dumps(record, sort_keys=True, separators=(",", ":"), default=str)
    return body, hashlib.sha256((prev + body).encode()).hexdigest()


def _last_record(f: Any) -> dict[str, Any] | None:
    f.seek(0, os.SEEK_END)
    end = f.tell()
    if end == 0:
        return None
    step = 4096
    pos = end
    tail = b""
    while pos > 0:
        pos = max(0, pos - step)
        f.seek(pos)
        tail = f.read(end - pos)
        lines = tail.rstrip(b"\n").split(b"\n")
        if len(lines) > 1 or pos == 0:
            try:
                return dict(json.loads(lines[-1]))
            except ValueError:
                return None
        step *= 4
    return None


class AuditFile:
    """The structlog 'logger' at the end of the chain: writes one chained record per call."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.batch: list[dict[str, Any]] | None = None  # set by the writer thread to write many records at once

    def msg(self, **record: Any) -> None:
        if self.batch is not None:
            self.batch.append(record)
        else:
            self.commit([record])

    info = warning = error = msg

    def commit(self, records: list[dict[str, Any]]) -> None:
        """Chain and append records under an exclusive lock, then fsync once."""
        if not records:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o600)
        with os.fdopen(fd, "r+b") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            try:
                last = _last_record(f)
                prev = last.get("hash", GENESIS) if last else GENESIS
                seq = int(last.get("seq", 0)) if last else 0
                out = []
                for record in records:
                    seq += 1
                    record["seq"] = seq
                    record["prev"] = prev
                    body, prev = _chain(prev, record)
                    # "hash" goes last; verify() recomputes from the record without it, in sorted order
                    out.append(f'{body[:-1]},"hash":"{prev}"}}\n')
                f.write("".join(out).encode())
                f.flush()
                os.fsync(f.fileno())
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)


class Audit:
    """Write audit events. ``event`` writes and fsyncs before returning; ``event_later`` queues
    the record for a writer thread (per-call records: an fsync per call would halve the
    call rate), and ``drain`` writes whatever is queued now. Records reach the file in the
    order they were given: whoever writes takes everything queued so far, under one lock."""

    def __init__(self, path: str | os.PathLike[str] | None = None) -> None:
        self.path = Path(path).expanduser() if path else default_path()
        self._file = AuditFile(self.path)
        self._log = structlog.wrap_logger(
            self._file,
            # its own wrapper: the app's (or the CLI's) log level must never filter audit records
            wrapper_class=structlog.make_filtering_bound_logger(logging.NOTSET),
            processors=[
                structlog.processors.TimeStamper(fmt="iso", utc=True, key="ts"),
                lambda _l, _m, ev: ev,
            ],
        ).bind()  # a concrete bound logger: the lazy proxy would re-bind on every record
        self._pending: list[tuple[str, dict[str, Any]]] = []  # queued by event_later, not yet taken
        self._cond = threading.Condition()  # guards _pending and _thread
        self._lock = threading.Lock()  # one writer at a time: taking and writing are one step
        self._thread: threading.Thread | None = None

    def event(self, event: str, /, **fields: Any) -> None:
        # the queued records go first, in the same write and fsync (a close no longer waits out the
        # writer's batch window)
        self._write((event, fields))

    def event_later(self, event: str, /, **fields: Any) -> None:
        with self._cond:
            self._pending.append((event, fields))
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._writer, name="toolcage-audit", daemon=True)
                self._thread.start()
            self._cond.notify()

    def _writer(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: bool(self._pending))
            # gather for a moment, then write everything queued under one lock and one fsync: fewer
            # wake-ups of this thread mean less GIL contention with the calls being made meanwhile
            time.sleep(BATCH_WINDOW_S)
            self._write()

    def _write(self, last: tuple[str, dict[str, Any]] | None = None) -> None:
        """Everything queued so far, then ``last``: chained, appended and fsynced at once."""
        with self._lock:
            with self._cond:
                items, self._pending = self._pending, []
            if last is not None:
                items.append(last)
            if not items:
                return
            self._file.batch = []
            try:
                for event, fields in items:
                    if "_params" in fields:  # digested here, off the caller's thread when queued
                        fields.update(param_digest(fields.pop("_params")))
                    self._log.info(event, **fields)
                batch = self._file.batch
            finally:
                self._file.batch = None
            self._file.commit(batch)

    def drain(self) -> None:
        """Write what is queued now (returns once it is on disk)."""
        self._write()


_SHARED: dict[Path, Audit] = {}


def shared(path: str | os.PathLike[str] | None = None) -> Audit:
    """One Audit (one writer thread) per log file per process."""
    key = Path(path).expanduser() if path else default_path()
    if key not in _SHARED:
        _SHARED[key] = Audit(key)
    return _SHARED[key]


def param_digest(params: Any) -> dict[str, Any]:
    """Parameters as size and hash only: never their values (they may hold secrets)."""
    raw = json.dumps(params, sort_keys=True, separators=(",", ":"), default=str).encode()
    return {"params_bytes": len(raw), "params_sha256": hashlib.sha256(raw).hexdigest()}


def read(path: Path) -> Iterator[dict[str, Any]]:
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                yield json.loads(line)


def verify(path: Path) -> list[str]:
    """Every problem in the chain, as sentences naming the line; empty when intact."""
    problems: list[str] = []
    prev = GENESIS
    expected_seq = 1
    try:
        f = open(path, encoding="utf-8")  # noqa: SIM115
    except FileNotFoundError:
        return [f"{path}: no audit log"]
    with f:
        for n, line in enumerate(f, 1):
            try:
                rec = json.loads(line)
            except ValueError:
                problems.append(f"line {n}: not JSON")
                continue
            claimed = rec.pop("hash", None)
            if rec.get("prev") != prev:
                problems.append(f"line {n}: does not follow line {n - 1} (a line was dropped, inserted or reordered)")
            if rec.get("seq") != expected_seq:
                problems.append(f"line {n}: sequence {rec.get('seq')} where {expected_seq} was expected")
            if _chain(rec.get("prev", ""), rec)[1] != claimed:
                problems.append(f"line {n}: content does not match its hash (edited)")
            prev = claimed or ""
            expected_seq = (rec.get("seq") or expected_seq) + 1
    return problems
