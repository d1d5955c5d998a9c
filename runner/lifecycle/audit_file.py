"""The audit log on disk: one chained append under an exclusive lock, all of it or nothing.

Why a module of its own: this is the part that must hold when the disk is full or a writer
dies mid-append. A failed append is cut back to where it began, so no other runner ever
builds on a torn line of ours; a torn line found anyway is closed in the open by an
``audit.repaired`` record chained to the last whole record (``audit.verify`` accepts the
torn bytes only with that record right after them), never silently restarted from GENESIS.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import secrets
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from toolcage.errors import AuditError

GENESIS = "0" * 64
SCAN_MAX = 1 << 20  # how far back a writer looks for the last whole record behind a torn line


# json.dumps(x, sort_keys=True, separators=(",", ":"), default=str), without building an encoder per call
CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), default=str)
_json_str = json.encoder.encode_basestring_ascii  # what the encoder ends in for a str (and every key)


def chain(prev: str, record: dict[str, Any]) -> tuple[str, str]:
    """The record's canonical JSON (without "hash") and its chained hash: the one definition
    that the writer and verify() share (``Record.chained`` makes the same text in pieces)."""
    body = CANONICAL.encode(record)
    return body, hashlib.sha256((prev + body).encode()).hexdigest()


# where "prev" and "seq" go in a record's canonical JSON: placeholders no record's content can spell (random per
# process), encoded with the record and split out after
_MARK = secrets.token_hex(16)
_PREV_AT, _SEQ_AT = f'"prev":"{_MARK}p"', f'"seq":"{_MARK}s"'


class Record:
    """A record made ready for the chain by whoever makes it (the caller's thread, not the writer's): its
    canonical JSON, encoded once, in three pieces split where ``prev`` and ``seq`` go, so that chaining it
    under the log's lock is a join and one sha256. ``chained`` gives the text ``chain`` gives for the same
    record with ``seq`` and ``prev`` set (tests/unit/test_audit_record.py compares them)."""

    __slots__ = ("_fields", "_parts", "event")

    def __init__(self, fields: dict[str, Any]) -> None:
        self.event = str(fields.get("event"))
        self._fields: dict[str, Any] | None = None
        self._parts: tuple[str, str, str] = ("", "", "")
        try:
            body = CANONICAL.encode({**fields, "prev": f"{_MARK}p", "seq": f"{_MARK}s"})
        except TypeError:  # keys that do not sort beside "prev" (not from keyword arguments): encoded when chained
            self._fields = {k: v for k, v in fields.items() if k not in ("prev", "seq")}
            return
        head, found, rest = body.partition(_PREV_AT)  # the top level's: sorted, "prev" comes before "seq"
        mid, found2, tail = rest.partition(_SEQ_AT)
        assert found and found2, "the placeholders are in every record encoded with them"
        self._parts = (head, mid, tail)

    def chained(self, prev: str, seq: int) -> tuple[str, str]:
        """The canonical JSON with ``seq`` and ``prev`` (without "hash"), and its chained hash."""
        if self._fields is not None:
            return chain(prev, {**self._fields, "prev": prev, "seq": seq})
        head, mid, tail = self._parts
        body = f'{head}"prev":{_json_str(prev)}{mid}"seq":{int.__repr__(seq)}{tail}'
        return body, hashlib.sha256((prev + body).encode()).hexdigest()


def _record(line: bytes) -> dict[str, Any] | None:
    """A whole chained record, or None (a torn or foreign line)."""
    try:
        rec = json.loads(line)
    except ValueError:
        return None
    if isinstance(rec, dict) and isinstance(rec.get("hash"), str) and isinstance(rec.get("seq"), int):
        return rec
    return None


def _tail(fd: int, end: int) -> tuple[dict[str, Any] | None, bytes, bool]:
    """The last whole record; the bytes after it that are no record (b"": none); whether the file
    lacks its final newline. Reads backwards from ``end``, at most SCAN_MAX."""
    if end == 0:
        return None, b"", False
    step = 4096
    while True:
        pos = max(0, end - step)
        data = os.pread(fd, end - pos, pos)
        parts = data.split(b"\n")
        no_newline = not data.endswith(b"\n")
        if no_newline and (rec := _record(parts[-1])) is not None:
            return rec, b"", True  # whole, only its newline missing
        first = 0 if pos == 0 else 1  # parts[0] may start mid-line
        for i in range(len(parts) - 2, first - 1, -1):
            if (rec := _record(parts[i])) is not None:
                torn = b"\n".join(parts[i + 1 :])
                return rec, torn[:-1] if torn.endswith(b"\n") else torn, no_newline
        if pos == 0:
            torn = data[:-1] if data.endswith(b"\n") else data
            return None, torn, no_newline
        if end - pos >= SCAN_MAX:
            raise AuditError(
                f"the audit log {_name(fd)} ends in over {SCAN_MAX >> 20} MiB that are not audit records;"
                " move it aside (toolcage audit --verify names the lines) and start a new one"
            )
        step *= 4


def _name(fd: int) -> str:
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return "file"


def now() -> str:
    return datetime.now(UTC).isoformat().replace("+00:00", "Z")


class AuditFile:
    """The log file: appends chained records."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def commit(self, records: list[Record]) -> None:
        """Chain and append records under an exclusive lock, then fsync once: all of them, or none.

        Threat: a full disk tearing the chain. A failed append is cut back to where it began
        (AuditError), so no other writer ever finds a torn line of ours; one found anyway (a
        writer killed mid-write) is closed by an ``audit.repaired`` record, never built upon
        from GENESIS."""
        if not records:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            raise AuditError(f"cannot open the audit log {self.path}: {exc.strerror}", path=str(self.path)) from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            end = os.lseek(fd, 0, os.SEEK_END)
            last, torn, no_newline = _tail(fd, end)
            prev = str(last["hash"]) if last else GENESIS
            seq = int(last["seq"]) if last else 0
            out = ["\n"] if no_newline else []
            if torn:
                records = [Record(self._repair(torn, seq)), *records]
            for record in records:
                seq += 1
                body, prev = record.chained(prev, seq)
                # "hash" goes last; verify() recomputes from the record without it, in sorted order
                out.append(f'{body[:-1]},"hash":"{prev}"}}\n')
            view = memoryview("".join(out).encode())
            try:
                while view:  # raw writes: nothing buffered is left to be flushed after a cut-back
                    view = view[os.write(fd, view) :]
                os.fsync(fd)
            except OSError as exc:
                with contextlib.suppress(OSError):  # if this fails too, the next writer repairs the tear
                    os.ftruncate(fd, end)
                raise AuditError(
                    f"could not write the audit log {self.path}: {exc.strerror}", path=str(self.path)
                ) from exc
        finally:
            os.close(fd)  # releases the lock

    @staticmethod
    def _repair(torn: bytes, seq: int) -> dict[str, Any]:
        """The record that closes a torn line in the open: what was torn, after which record, by whom."""
        return {
            "event": "audit.repaired",
            "reason": "the log ended in a torn line (a writer stopped mid-append); the chain goes on from the last"
            " whole record",
            "torn_bytes": len(torn),
            "torn_sha256": hashlib.sha256(torn).hexdigest(),
            "after_seq": seq,
            "pid": os.getpid(),
            "ts": now(),
        }
