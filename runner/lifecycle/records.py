"""What the audit log says about a run's calls, in one place: ``run.call``, the SafeFetch decisions a result
carries, and how a run's refused egress is folded into counts.

The Sandbox hands over results; only this module knows where ``http_fetch`` puts its
decisions (``result.decisions``, or ``error.data`` of an egress denial, -32010).

Threat: a sandbox filling the host's disk through the audit log. Every refused request was an
fsynced record (a flood wrote 3.3 MB per 10 s, about 12 GB in an 8-hour session). A run's first
REFUSALS_RECORDED refusals (proxy and SafeFetch together) are records of their own; after that
they are counted per (source, reason, target origin) and written as ``egress.refusals_folded``
every FOLD_FLUSH_S and at the run's end, each saying how many it folds. Memory stays bounded
too: at most FOLD_KEYS keys per record (the rest in ``other``) and FOLD_RUNS runs per process.
"""

from __future__ import annotations

import atexit
import threading
from collections import OrderedDict
from typing import Any
from urllib.parse import urlsplit

from toolcage import telemetry
from toolcage.lifecycle import audit as audit_mod
from toolcage.policies.codes import EGRESS_DENIED
from toolcage.policies.contract import USAGE
from toolcage.results import CallResult

UNAUDITED = frozenset({USAGE})  # the runner's own bookkeeping, not a call of the user's
REFUSALS_RECORDED = 100  # a run's refused egress decisions written one by one; after them, counted
FOLD_FLUSH_S = 10.0  # how often the counts are written while a flood lasts
FOLD_KEYS = 64  # distinct (source, reason, target) counted per folded record; beyond, in "other"
FOLD_RUNS = 1024  # runs whose counts one process keeps (the least recent is flushed and let go)
KEY_CHARS = 200


def safefetch_decisions(r: CallResult) -> list[dict[str, Any]]:
    """The egress decisions SafeFetch reported in one call's result or error. A connector call's
    come from the worker's own record (``meta``), never from what its handler answered."""
    if r.meta is not None:
        egress = r.meta.get("egress")
        return [d for d in egress if isinstance(d, dict)] if isinstance(egress, list) else []
    if r.error and r.error.get("code") == EGRESS_DENIED and isinstance(r.error.get("data"), dict):
        return [{"allowed": False, **r.error["data"]}]
    decisions = r.result.get("decisions") if isinstance(r.result, dict) else None
    return [d for d in decisions if isinstance(d, dict)] if isinstance(decisions, list) else []


def secrets_sent(r: CallResult) -> list[dict[str, Any]]:
    """Which secrets a connector call had the worker send, and to which origin (names only)."""
    sent = (r.meta or {}).get("secrets_sent")
    keep = ("secret", "origin", "method")
    return [{k: s.get(k) for k in keep} for s in sent if isinstance(s, dict)] if isinstance(sent, list) else []


def _frames_as_sizes(params: dict[str, Any]) -> dict[str, Any]:
    """``params`` with a data frame (an upload's chunk, raw bytes) as its size, as the record's digest takes it
    (toolcage.lifecycle.audit.param_digest): the record is made later, on the audit writer's thread, and the
    queue must not hold the chunks meanwhile. Threat: a writer that lags (a loaded host, a slow disk) would
    keep every chunk of an upload, the runner's memory growing with the file's size."""
    if not any(isinstance(v, bytes | bytearray | memoryview) for v in params.values()):
        return params
    return {
        k: audit_mod.frame_size(v) if isinstance(v, bytes | bytearray | memoryview) else v for k, v in params.items()
    }


def audit_call(audit: Any, run_id: str, params: dict[str, Any] | None, r: CallResult, call_id: object = None) -> None:
    """``run.call`` (params only as size and digest), then one ``egress.decision`` per SafeFetch decision; the
    call's ``execute_tool`` span and metrics when the application set an OpenTelemetry provider (``call_id``:
    the JSON-RPC id)."""
    if r.tool not in UNAUDITED:
        telemetry.call_ended(run_id, r, safefetch_decisions, call_id)
    if audit is None or r.tool in UNAUDITED:
        return
    audit.event_later(
        "run.call",
        run_id=run_id,
        tool=r.tool,
        status=r.status,
        duration_ms=r.wall_ms,
        error_code=r.error["code"] if r.error else None,
        _params=_frames_as_sizes(params or {}),
        **({"secrets_sent": secrets_sent(r)} if r.meta is not None else {}),
    )
    for d in safefetch_decisions(r):
        refused = d.get("allowed") is not True
        if refused and not admit_refusal(audit, run_id, "safefetch", d.get("reason"), d.get("url")):
            continue  # counted: in the run's next egress.refusals_folded
        audit.event_later(
            "egress.decision",
            run_id=run_id,
            source="safefetch",
            allowed=d.get("allowed"),
            url=d.get("url"),
            method=d.get("method"),
            reason=d.get("reason"),
        )


def network_changed(audit: Any, change: Any, old: Any, new: Any) -> None:
    """``network.changed``: who asked, both policies' digests and networks, the connections cut (on disk at once:
    a change is rare and matters)."""
    if audit is None:
        return
    from toolcage.policies.typed import to_dict

    audit.event(
        "network.changed",
        run_id=change.run_id,
        requested_by=change.requested_by,
        old_sha256=change.old_sha256,
        new_sha256=change.new_sha256,
        old_network=to_dict(old.network),
        new_network=to_dict(new.network),
        cut=change.cut,
        audit_only=change.audit_only,
        took_ms=change.took_ms,
    )


def _origin(target: Any) -> str:
    """What a refusal is counted under: the target's origin (a flood varies paths), cut to KEY_CHARS."""
    text = str(target)
    try:
        parts = urlsplit(text)
    except ValueError:
        return text[:KEY_CHARS]
    return (f"{parts.scheme}://{parts.netloc}" if parts.scheme and parts.netloc else text)[:KEY_CHARS]


class _Refusals:
    """One run's refused egress: the first REFUSALS_RECORDED admitted as records, the rest counted."""

    def __init__(self, audit: Any, run_id: str) -> None:
        self.audit, self.run_id = audit, run_id
        self._lock = threading.Lock()
        self.recorded = 0
        self.total = 0  # folded so far in this run
        self._counts: dict[tuple[str, str, str], int] = {}
        self._other = 0
        self._dropped = 0  # decisions the proxy could not report (its queue was full)
        self._folded = 0  # since the last flush
        self._timer: threading.Timer | None = None

    def admit(self, source: str, reason: Any, target: Any) -> bool:
        with self._lock:
            if self.recorded < REFUSALS_RECORDED:
                self.recorded += 1
                return True
            key = (source, str(reason)[:KEY_CHARS], _origin(target))
            if key in self._counts or len(self._counts) < FOLD_KEYS:
                self._counts[key] = self._counts.get(key, 0) + 1
            else:
                self._other += 1
            self._folded += 1
            self._arm()
            return False

    def admit_dropped(self, count: int) -> bool:
        with self._lock:
            if self.recorded < REFUSALS_RECORDED:
                return True
            self._dropped += count
            self._arm()
            return False

    def _arm(self) -> None:
        """The next flush, FOLD_FLUSH_S from the first count after the last one (lock held)."""
        if self._timer is None:
            self._timer = threading.Timer(FOLD_FLUSH_S, self.flush)
            self._timer.daemon = True
            self._timer.start()

    def flush(self) -> None:
        """Write what was counted since the last flush as one ``egress.refusals_folded`` (nothing: no record)."""
        with self._lock:
            if self._timer is not None and self._timer is not threading.current_thread():
                self._timer.cancel()
            self._timer = None
            if not self._folded and not self._dropped:
                return
            counts, other, dropped, folded = self._counts, self._other, self._dropped, self._folded
            self._counts, self._other, self._dropped, self._folded = {}, 0, 0, 0
            self.total += folded
            total = self.total
        self.audit.event_later(
            "egress.refusals_folded",
            run_id=self.run_id,
            folded=folded,
            folded_total=total,
            recorded=REFUSALS_RECORDED,
            counts=[
                {"source": k[0], "reason": k[1], "target": k[2], "count": n}
                for k, n in sorted(counts.items(), key=lambda kv: -kv[1])
            ],
            other=other,
            proxy_dropped=dropped,
        )


_RUNS: OrderedDict[str, _Refusals] = OrderedDict()
_RUNS_LOCK = threading.Lock()


def _refusals(audit: Any, run_id: str) -> _Refusals:
    evicted: list[_Refusals] = []
    with _RUNS_LOCK:
        entry = _RUNS.get(run_id)
        if entry is None:
            entry = _RUNS[run_id] = _Refusals(audit, run_id)
            while len(_RUNS) > FOLD_RUNS:
                evicted.append(_RUNS.popitem(last=False)[1])
        else:
            _RUNS.move_to_end(run_id)
    for old in evicted:
        old.flush()
    return entry


def admit_refusal(audit: Any, run_id: str, source: str, reason: Any, target: Any) -> bool:
    """True: write this refused decision as its own record; False: it was counted instead."""
    return _refusals(audit, run_id).admit(source, reason, target)


def admit_dropped(audit: Any, run_id: str, count: int) -> bool:
    """The proxy's ``egress.dropped``: True to write it, False once the run's refusals are counted."""
    return _refusals(audit, run_id).admit_dropped(count)


def flush_refusals(run_id: str) -> None:
    """The run ends (or its proxy is down): write its counts now rather than at the next FOLD_FLUSH_S."""
    with _RUNS_LOCK:
        entry = _RUNS.get(run_id)
    if entry is not None:
        entry.flush()


@atexit.register
def _flush_all() -> None:
    """At exit the timers (daemon threads) are gone: write every run's counts, and wait for them."""
    with _RUNS_LOCK:
        entries = list(_RUNS.values())
    for entry in entries:
        entry.flush()
    for audit in {id(e.audit): e.audit for e in entries}.values():
        drain = getattr(audit, "drain", None)  # any object with event_later will do as an audit
        if drain is not None:
            drain()
