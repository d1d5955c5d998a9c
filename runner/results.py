"""How a call or a run ended: one ``status`` field, always a ``Status`` (a str: JSON shows the bare name),
which carries the CLI exit code it means: the one status -> exit code table."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any

from toolcage.policies import codes


class Status(StrEnum):
    """How a call or a run ended, and the CLI's exit code for it (0 ok, 1 the tool failed, 3 the
    sandbox failed or stopped it, 130 interrupted)."""

    OK = "ok"
    ERROR = "error"
    TIMEOUT = "timeout"
    OOM_KILLED = "oom_killed"
    OUTPUT_CAPPED = "output_capped"
    SIGNAL = "signal"
    CRASHED = "crashed"
    IMAGE_MISSING = "image_missing"
    INTERRUPTED = "interrupted"
    CANCELLED = "cancelled"
    NODE_LOST = "node_lost"  # toolcage.ray: the run's node or its engine agent died
    ENGINE_UNAVAILABLE = "engine_unavailable"  # toolcage.ray: the node's engine stopped answering
    NO_CAPACITY = "no_capacity"  # toolcage.ray: no node admitted the run within the caller's wait

    @property
    def exit_code(self) -> int:
        return _EXIT_CODE[self]


# the one status -> exit code table (a test checks every Status has its line)
_EXIT_CODE = {
    Status.OK: 0,
    Status.ERROR: 1,
    Status.OUTPUT_CAPPED: 1,
    Status.SIGNAL: 1,
    Status.TIMEOUT: 3,
    Status.OOM_KILLED: 3,
    Status.CRASHED: 3,
    Status.IMAGE_MISSING: 3,
    Status.CANCELLED: 3,
    Status.NODE_LOST: 3,
    Status.ENGINE_UNAVAILABLE: 3,
    Status.NO_CAPACITY: 3,
    Status.INTERRUPTED: 130,
}


STATUSES = tuple(s.value for s in Status)  # the names, for callers that compare strings
_ERROR_STATUS = {
    codes.CALL_TIMEOUT: Status.TIMEOUT,
    codes.HANDLER_OOM: Status.OOM_KILLED,
    codes.RESULT_TOO_LARGE: Status.OUTPUT_CAPPED,
    codes.REQUEST_CANCELLED: Status.CANCELLED,
}
META_KEY = "toolcage"  # the member of an answer that carries what the runner audits (never shown to callers)


def without_meta(msg: Any) -> Any:
    """An answer (or batch) as callers see it: without the worker's audit member."""
    if isinstance(msg, list):
        return [without_meta(m) for m in msg]
    if isinstance(msg, dict) and META_KEY in msg:
        return {k: v for k, v in msg.items() if k != META_KEY}
    return msg


def classify_result(result: Any) -> Status:
    """Status of a successful JSON-RPC result: a child process reports how it ended (a background process's
    ``state``, ``exit_code`` and ``signal`` describe it, not the call: that call is ok)."""
    if isinstance(result, dict) and "exit_code" in result and "state" not in result:
        if result.get("oom_killed"):
            return Status.OOM_KILLED
        if result.get("timed_out"):
            return Status.TIMEOUT
        if result.get("signal"):
            return Status.SIGNAL
        if result.get("truncated"):
            return Status.OUTPUT_CAPPED
        if result.get("exit_code") != 0:
            return Status.ERROR
    return Status.OK


def classify_error(code: int) -> Status:
    return _ERROR_STATUS.get(code, Status.ERROR)


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
    """The outcome of one tool call; ``status`` (a ``Status``; a plain string given is made one) says how it ended."""

    status: str
    tool: str
    run_id: str
    result: Any = None
    error: dict[str, Any] | None = None
    wall_ms: float = 0.0
    # what the worker reports for the audit log (a connector call's egress decisions, the secrets it
    # sent where): names and origins, never values; not part of the result callers see
    meta: dict[str, Any] | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "status", Status(self.status))

    @property
    def ok(self) -> bool:
        return self.status == Status.OK

    @property
    def exit_code(self) -> int:
        """The CLI's exit code for this call (``Status.exit_code``)."""
        return Status(self.status).exit_code

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

    def __post_init__(self) -> None:
        object.__setattr__(self, "status", Status(self.status))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class NetworkChange:
    """A live network policy change, in force when this is returned (``Sandbox.update_network``)."""

    run_id: str
    old_sha256: str  # the run's whole policy before and after (only its network differs)
    new_sha256: str
    cut: int  # relayed connections the new policy no longer allows, ended
    audit_only: bool  # network.unsafe_audit_only: refusals are recorded, not enforced
    took_ms: float  # from the call to the proxy's confirmation: the change in force
    requested_by: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
