"""The rules of ``toolcage mcp wrap``'s relay, as pure functions of the messages (no I/O, no threads).

Threat: the wrapped server is hostile. It may answer requests nobody made (to forge a result
for a call the client makes later), offer or run tools the user filtered out, or send
garbage. So every message is parsed as JSON-RPC; a response reaches the client only if it
answers a request the client made and is still waiting on; a denied tool is removed from
``tools/list`` and a ``tools/call`` naming it is refused here, never sent to the server. A client
notification passes only if its method is a notification's (``notifications/...``): a lax server
would run ``tools/call`` sent without an id, around the filter and unaudited.
The relay also keeps the idle clock: only the client's requests (from when they are sent until
they are answered or cancelled) and its answers to the server's requests are activity, never what
the server sends by itself (a server that chatters must not keep a forgotten run alive).
The caller (``toolcage.servers.mcp_wrap``) does the I/O, outside any lock, from what :class:`Actions` says.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from toolcage.policies.codes import (
    INTERNAL_ERROR,
    INVALID_PARAMS,
    INVALID_REQUEST,
    PARSE_ERROR,
    REQUEST_CANCELLED,
    SANDBOX_ENDED,
)
from toolcage.policies.codes import error_response as error
from toolcage.policies.contract import CANCELLED, id_key

SERVER_ENDED = SANDBOX_ENDED  # as `toolcage serve`: the server ended before answering (data: status, reason)
MAX_PENDING = 1024  # client requests in flight; more is a client bug, refused rather than tracked without bound
MAX_SERVER_REQUESTS = 256  # server -> client requests (sampling, roots, elicitation) awaiting the client


@dataclass(frozen=True)
class ToolFilter:
    """``--allow-tool`` (only these) or ``--deny-tool`` (all but these); at most one kind is given."""

    allow: frozenset[str] | None = None
    deny: frozenset[str] = frozenset()

    def permits(self, name: object) -> bool:
        if not isinstance(name, str):
            return False
        if self.allow is not None:
            return name in self.allow
        return name not in self.deny

    @property
    def active(self) -> bool:
        return self.allow is not None or bool(self.deny)

    def refusal(self, name: object) -> str:
        how = "it is not named by --allow-tool" if self.allow is not None else "--deny-tool"
        return f"tool {str(name)[:200]!r} is blocked by toolcage mcp wrap ({how})"


@dataclass
class Pending:
    """A client request the server has not answered yet."""

    method: str
    params: Any
    started: float

    @property
    def tool(self) -> str | None:
        if self.method != "tools/call" or not isinstance(self.params, dict):
            return None
        name = self.params.get("name")
        return name if isinstance(name, str) else None

    @property
    def arguments(self) -> Any:
        return self.params.get("arguments") if isinstance(self.params, dict) else None


@dataclass(frozen=True)
class Call:
    """One finished ``tools/call``, for the audit log (arguments only ever as size and digest)."""

    tool: str
    arguments: Any
    status: str  # one of toolcage.results.STATUSES
    error_code: int | None
    wall_ms: float


@dataclass
class Actions:
    """What to do after one message: lines for the server, messages for the client, log notes, audit records."""

    to_server: list[bytes] = field(default_factory=list)
    to_client: list[dict[str, Any]] = field(default_factory=list)
    notes: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    calls: list[Call] = field(default_factory=list)
    dropped: list[dict[str, Any]] = field(default_factory=list)  # client notifications dropped: audited

    def note(self, event: str, **fields: Any) -> Actions:
        self.notes.append((event, fields))
        return self


def _line(msg: dict[str, Any]) -> bytes:
    return (json.dumps(msg, separators=(",", ":"), ensure_ascii=False) + "\n").encode()


def _kind(msg: Any) -> str:
    """``request``, ``notification``, ``response`` or ``invalid`` (batches are invalid: MCP dropped them)."""
    if not isinstance(msg, dict) or msg.get("jsonrpc") != "2.0":
        return "invalid"
    rid = msg.get("id")
    has_id = "id" in msg and (isinstance(rid, str) or (isinstance(rid, int | float) and not isinstance(rid, bool)))
    if isinstance(msg.get("method"), str):
        if "params" in msg and not isinstance(msg["params"], dict | list):
            return "invalid"
        if "id" not in msg:
            return "notification"
        return "request" if has_id else "invalid"
    if has_id and (("result" in msg) != ("error" in msg)):
        return "response"
    return "invalid"


def _dropped_notification(msg: dict[str, Any]) -> dict[str, Any]:
    """What the audit log says of a client notification that was dropped (arguments only as size and digest)."""
    params = msg.get("params")
    out: dict[str, Any] = {"method": str(msg["method"])[:200], "reason": "a request method sent as a notification"}
    if msg["method"] == "tools/call" and isinstance(params, dict):
        name = params.get("name")
        out["tool"] = name[:200] if isinstance(name, str) else None
        out["arguments"] = params.get("arguments")
    return out


def _outcome(pending: Pending, msg: dict[str, Any]) -> tuple[str, int | None]:
    err = msg.get("error")
    if err is not None:
        code = err.get("code") if isinstance(err, dict) else None
        return "error", code if isinstance(code, int) and not isinstance(code, bool) else None
    result = msg.get("result")
    return ("error" if isinstance(result, dict) and result.get("isError") is True else "ok"), None


class Relay:
    """Both directions' bookkeeping; thread-safe (the client and the server are read on two threads)."""

    def __init__(self, tool_filter: ToolFilter, clock: Callable[[], float]) -> None:
        self.filter = tool_filter
        self._clock = clock
        self._lock = threading.Lock()
        self._pending: dict[str, tuple[Any, Pending]] = {}  # id key -> (the id as sent, the request)
        self._server_requests: OrderedDict[str, None] = OrderedDict()
        self._epitaph: dict[str, Any] | None = None  # the server is gone: why (every later request gets it)
        self._active_at = clock()  # the client's last activity (see the module docstring)

    def touch(self) -> None:
        """Restart the idle clock: the client's input is being read from now on."""
        with self._lock:
            self._active_at = self._clock()

    def last_activity(self) -> float:
        with self._lock:
            return self._active_at

    # client -> server ---------------------------------------------------------------------
    def from_client(self, line: bytes) -> Actions:
        out = Actions()
        try:
            msg = json.loads(line)
        except ValueError:
            out.to_client.append(error(None, PARSE_ERROR, "Parse error: the line is not JSON"))
            return out
        kind = _kind(msg)
        if kind == "invalid":
            out.to_client.append(error(None, INVALID_REQUEST, "Invalid Request (a batch, or not JSON-RPC 2.0)"))
            return out
        with self._lock:
            if kind == "response":
                key = id_key(msg["id"])
                if key not in self._server_requests:
                    return out.note("mcp.client_answer_dropped", reason="answers no request of the server")
                del self._server_requests[key]
                self._active_at = self._clock()
                out.to_server.append(_line(msg))
                return out
            if kind == "notification":
                if not msg["method"].startswith("notifications/"):
                    # a request method without an id (tools/call of a denied tool): a lax server runs it,
                    # and no answer would ever say so; it is dropped, logged and audited
                    out.dropped.append(_dropped_notification(msg))
                    return out.note("mcp.client_notification_dropped", method=msg["method"][:200])
                if msg["method"] == CANCELLED and isinstance(msg.get("params"), dict):
                    self._cancel(msg["params"].get("requestId"), out)
                out.to_server.append(_line(msg))
                return out
            self._active_at = self._clock()  # any request, even one refused here
            return self._request(msg, out)

    def _request(self, msg: dict[str, Any], out: Actions) -> Actions:
        req_id, method, params = msg["id"], msg["method"], msg.get("params")
        if self._epitaph is not None:
            out.to_client.append({**self._epitaph, "id": req_id})
            return out
        pending = Pending(method, params, self._clock())
        if method == "tools/call" and not self.filter.permits(pending.tool):
            name = params.get("name") if isinstance(params, dict) else None
            out.to_client.append(error(req_id, INVALID_PARAMS, self.filter.refusal(name)))
            if isinstance(name, str):
                out.calls.append(Call(name, pending.arguments, "error", INVALID_PARAMS, 0.0))
            return out.note("mcp.tool_blocked", tool=str(name)[:200])
        key = id_key(req_id)
        if key in self._pending:
            out.to_client.append(error(req_id, INVALID_REQUEST, "a request with this id is still in progress"))
            return out
        if len(self._pending) >= MAX_PENDING:
            out.to_client.append(error(req_id, INTERNAL_ERROR, f"more than {MAX_PENDING} requests in flight"))
            return out
        self._pending[key] = (req_id, pending)
        out.to_server.append(_line(msg))
        return out

    def _cancel(self, req_id: Any, out: Actions) -> None:
        """The client gave up on a request: it ignores a late answer, and so do we (none is owed any more)."""
        if not isinstance(req_id, str | int) or isinstance(req_id, bool):
            return
        entry = self._pending.pop(id_key(req_id), None)
        if entry is not None:
            self._active_at = self._clock()  # the request's end: idle time starts now, not when it was sent
        if entry is not None and entry[1].tool is not None:
            p = entry[1]
            out.calls.append(Call(p.tool or "", p.arguments, "interrupted", REQUEST_CANCELLED, self._ms(p)))

    # server -> client ---------------------------------------------------------------------
    def from_server(self, line: bytes) -> Actions:
        out = Actions()
        try:
            msg = json.loads(line)
        except ValueError:
            return out.note(
                "mcp.server_garbage", reason="a line that is not JSON", line=line[:200].decode("utf-8", "replace")
            )
        kind = _kind(msg)
        if kind == "invalid":
            return out.note("mcp.server_garbage", reason="not a JSON-RPC 2.0 message (or a batch)")
        with self._lock:
            if kind == "notification":
                out.to_client.append(msg)
            elif kind == "request":
                key = id_key(msg["id"])
                if key not in self._server_requests and len(self._server_requests) >= MAX_SERVER_REQUESTS:
                    return out.note("mcp.server_request_dropped", reason=f"over {MAX_SERVER_REQUESTS} unanswered")
                self._server_requests[key] = None
                out.to_client.append(msg)
            else:
                entry = self._pending.pop(id_key(msg["id"]), None)
                if entry is None:
                    # a forged or late answer: never forwarded, or it could stand in for a call made later
                    return out.note("mcp.server_answer_dropped", reason="answers no pending request of the client")
                req_id, pending = entry
                self._active_at = self._clock()  # the request's end: idle time starts now, not when it was sent
                msg = {**msg, "id": req_id}  # the id exactly as the client sent it (1 and 1.0 are one key)
                out.to_client.append(self._answer(pending, msg, out))
        return out

    def _answer(self, pending: Pending, msg: dict[str, Any], out: Actions) -> dict[str, Any]:
        if pending.method == "tools/list" and self.filter.active and "result" in msg:
            result = msg["result"]
            if not isinstance(result, dict) or not isinstance(result.get("tools"), list):
                return error(msg["id"], INTERNAL_ERROR, "the wrapped server sent a malformed tools/list result")
            tools = [t for t in result["tools"] if isinstance(t, dict) and self.filter.permits(t.get("name"))]
            msg = {**msg, "result": {**result, "tools": tools}}
        if pending.tool is not None:
            status, code = _outcome(pending, msg)
            out.calls.append(Call(pending.tool, pending.arguments, status, code, self._ms(pending)))
        return msg

    # the end, and calls that take too long ---------------------------------------------------
    def overdue(self, limit_s: float) -> list[Pending]:
        """Requests waiting longer than ``limit_s`` (a hung server)."""
        now = self._clock()
        with self._lock:
            return [p for _, p in self._pending.values() if now - p.started > limit_s]

    def busy(self) -> bool:
        with self._lock:
            return bool(self._pending)

    def fail_all(self, status: str, message: str, data: dict[str, Any]) -> Actions:
        """The server is gone: every pending request gets ``message``, and so does every later one."""
        out = Actions()
        with self._lock:
            self._epitaph = error(None, SERVER_ENDED, message, {"status": status, **data})
            entries, self._pending = list(self._pending.values()), {}
        for req_id, p in entries:
            out.to_client.append(error(req_id, SERVER_ENDED, message, {"status": status, **data}))
            if p.tool is not None:
                out.calls.append(Call(p.tool, p.arguments, status, SERVER_ENDED, self._ms(p)))
        return out

    def _ms(self, p: Pending) -> float:
        return round((self._clock() - p.started) * 1000, 3)


__all__ = ["Actions", "Call", "Pending", "Relay", "ToolFilter", "error"]
