"""How a call or a run ended: one ``status`` field, always one of STATUSES."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from toolcage.policies import codes

STATUSES = (
    "ok", "error", "timeout", "oom_killed", "output_capped", "signal", "crashed", "image_missing", "interrupted",
    "cancelled",
)  # fmt: skip
_ERROR_STATUS = {
    codes.CALL_TIMEOUT: "timeout",
    codes.HANDLER_OOM: "oom_killed",
    codes.RESULT_TOO_LARGE: "output_capped",
    codes.REQUEST_CANCELLED: "cancelled",
}
META_KEY = "toolcage"  # the member of an answer that carries what the runner audits (never shown to callers)


def without_meta(msg: Any) -> Any:
    """An answer (or batch) as callers see it: without the worker's audit member."""
    if isinstance(msg, list):
        return [without_meta(m) for m in msg]
    if isinstance(msg, dict) and META_KEY in msg:
        return {k: v for k, v in msg.items() if k != META_KEY}
    return msg


def classify_result(result: Any) -> str:
    """Status of a successful JSON-RPC result: a child process reports how it ended."""
    if isinstance(result, dict) and "exit_code" in result:
        if result.get("oom_killed"):
            return "oom_killed"
        if result.get("timed_out"):
            return "timeout"
        if result.get("signal"):
            return "signal"
        if result.get("truncated"):
            return "output_capped"
        if result.get("exit_code") != 0:
            return "error"
    return "ok"


def classify_error(code: int) -> str:
    return _ERROR_STATUS.get(code, "error")


def from_response(tool: str, run_id: str, msg: dict[str, Any], wall_ms: float) -> CallResult | None:
    """A JSON-RPC response as a CallResult (parsed by jsonrpcclient); None if it is malformed."""
    import jsonrpcclient

    try:
        resp = jsonrpcclient.parse(msg)
    except (KeyError, TypeError):  # e.g. "error": "text", or an error without a code
        return None
    meta = msg.get(META_KEY) if isinstance(msg.get(META_KEY), dict) else None
    if isinstance(resp, jsonrpcclient.Ok):
        return CallResult(classify_result(resp.result), tool, run_id, result=resp.result, wall_ms=wall_ms, meta=meta)
    assert isinstance(resp, jsonrpcclient.Error)
    if not isinstance(resp.code, int):
        return None
    err = {"code": resp.code, "message": resp.message, "data": resp.data}
    return CallResult(classify_error(resp.code), tool, run_id, error=err, wall_ms=wall_ms, meta=meta)


@dataclass(frozen=True)
class CallResult:
    """The outcome of one tool call; ``status`` says how it ended."""

    status: str
    tool: str
    run_id: str
    result: Any = None
    error: dict[str, Any] | None = None
    wall_ms: float = 0.0
    # what the worker reports for the audit log (a connector call's egress decisions, the secrets it
    # sent where): names and origins, never values; not part of the result callers see
    meta: dict[str, Any] | None = field(default=None, repr=False, compare=False)

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        del out["meta"]
        return out


@dataclass(frozen=True)
class RunSummary:
    """What the runner knows when a run has ended."""

    run_id: str
    name: str
    status: str
    wall_ms: float
    cpu_ms: float | None
    peak_memory_bytes: int | None
    calls: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
