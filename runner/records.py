"""What the audit log says about a run's calls, in one place: ``run.call`` and the SafeFetch decisions a result carries.

The Sandbox hands over results; only this module knows where ``http_fetch`` puts its
decisions (``result.decisions``, or ``error.data`` of an egress denial, -32010).
"""

from __future__ import annotations

from typing import Any

from toolcage.results import CallResult

EGRESS_DENIED = -32010
UNAUDITED = frozenset({"sandbox.usage"})  # the runner's own bookkeeping, not a call of the user's


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


def audit_call(audit: Any, run_id: str, params: dict[str, Any] | None, r: CallResult) -> None:
    """``run.call`` (params only as size and digest), then one ``egress.decision`` per SafeFetch decision."""
    if audit is None or r.tool in UNAUDITED:
        return
    audit.event_later(
        "run.call",
        run_id=run_id,
        tool=r.tool,
        status=r.status,
        duration_ms=r.wall_ms,
        error_code=r.error["code"] if r.error else None,
        _params=params or {},
        **({"secrets_sent": secrets_sent(r)} if r.meta is not None else {}),
    )
    for d in safefetch_decisions(r):
        audit.event_later(
            "egress.decision",
            run_id=run_id,
            source="safefetch",
            allowed=d.get("allowed"),
            url=d.get("url"),
            method=d.get("method"),
            reason=d.get("reason"),
        )
