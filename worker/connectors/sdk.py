"""The connector API (``toolcage.sdk``): ``@tool`` turns a typed, documented function into a tool.

A handler runs in a child of the worker that holds no protocol descriptor and no secret.
Everything it needs from outside goes through its :class:`Context`: ``fetch`` (SafeFetch
in the worker: the run's policy, caps and redirect rules, and the secret named by ``auth``
added there, never here), ``progress``, ``log``, and the workspace and scratch paths.

    from toolcage.sdk import Context, tool

    @tool
    def list_issues(ctx: Context, repo: str, state: str = "open") -> dict:
        \"\"\"List the issues of a GitHub repository.\"\"\"
        r = ctx.fetch(f"https://api.github.com/repos/{repo}/issues", params={"state": state}, auth="GITHUB_TOKEN")
        return {"issues": [i["title"] for i in r.json()]}

The name is the function's, the description its docstring, the params schema its type hints
(validated strictly, like the built-in tools': a wrong type is a -32602 error, not a crash).
"""

from __future__ import annotations

import base64
import json as _json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar, overload
from urllib.parse import urlencode, urlsplit, urlunsplit

from toolcage.policies.contract import SCRATCH
from toolcage.worker.errors import EgressDenied, FetchFailed, ToolError

F = TypeVar("F", bound=Callable[..., Any])
TOOL_ATTR = "__toolcage_tool__"


@dataclass(frozen=True)
class ToolInfo:
    """What ``@tool`` records on a function (read by the worker's handler host)."""

    name: str
    description: str | None


@overload
def tool(fn: F, /) -> F: ...


@overload
def tool(*, name: str | None = None, description: str | None = None) -> Callable[[F], F]: ...


def tool(fn: F | None = None, /, *, name: str | None = None, description: str | None = None) -> F | Callable[[F], F]:
    """Mark a function as a tool: ``@tool`` or ``@tool(name=..., description=...)``.

    The first parameter receives the :class:`Context`; the others are the tool's params.
    """

    def mark(f: F) -> F:
        setattr(f, TOOL_ATTR, ToolInfo(name or f.__name__, description))
        return f

    return mark(fn) if fn is not None else mark


@dataclass
class Response:
    """What ``Context.fetch`` returns (the body is capped at the policy's output cap)."""

    status: int
    reason: str
    headers: list[tuple[str, str]]
    content: bytes
    url: str
    truncated: bool = False

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 400

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", errors="replace")

    def json(self) -> Any:
        return _json.loads(self.content)

    def header(self, name: str, default: str | None = None) -> str | None:
        """The first value of a response header (case-insensitive)."""
        lower = name.lower()
        return next((v for k, v in self.headers if k.lower() == lower), default)

    def raise_for_status(self) -> Response:
        if self.status >= 400:
            raise ToolError(f"HTTP {self.status} {self.reason} from {self.url}", {"status": self.status})
        return self


class Link(Protocol):
    """How a Context reaches the worker (a socket in the sandbox; anything in a test)."""

    def ask(self, message: dict[str, Any]) -> dict[str, Any]: ...

    def tell(self, message: dict[str, Any]) -> None: ...


class Logger:
    """``ctx.log.info("event", key=value)``: lines in the worker's log (stderr), secrets redacted."""

    def __init__(self, link: Link) -> None:
        self._link = link

    def _emit(self, level: str, event: str, fields: dict[str, Any]) -> None:
        self._link.tell({"op": "log", "level": level, "event": str(event), "fields": _jsonable(fields)})

    def info(self, event: str, **fields: Any) -> None:
        self._emit("info", event, fields)

    def warning(self, event: str, **fields: Any) -> None:
        self._emit("warning", event, fields)

    def error(self, event: str, **fields: Any) -> None:
        self._emit("error", event, fields)


@dataclass
class Context:
    """A handler's only way out of its process: fetch, progress, log, and where its files are."""

    link: Link
    scratch: Path = Path(SCRATCH)
    workspace: Path | None = None  # None: the run has no workspace
    run_id: str = "local"
    log: Logger = field(init=False)

    def __post_init__(self) -> None:
        self.log = Logger(self.link)

    def fetch(
        self,
        url: str,
        *,
        method: str = "GET",
        params: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
        json: Any = None,
        data: bytes | str | None = None,
        auth: str | None = None,
        timeout: float | None = None,
    ) -> Response:
        """An HTTP request through SafeFetch. ``auth="NAME"`` has the worker add the secret NAME's
        header (as the policy binds it); the handler never sees the value. Raises EgressDenied
        or FetchFailed (uncaught, they become the call's error, as with ``http_fetch``)."""
        hdrs = dict(headers or {})
        body: bytes | None = None
        if json is not None:
            body = _json.dumps(json).encode()
            hdrs.setdefault("Content-Type", "application/json")
        elif data is not None:
            body = data.encode() if isinstance(data, str) else bytes(data)
        if params:
            parts = urlsplit(url)
            query = "&".join(q for q in (parts.query, urlencode(dict(params), doseq=True)) if q)
            url = urlunsplit(parts._replace(query=query))
        answer = self.link.ask(
            {
                "op": "fetch",
                "url": url,
                "method": method.upper(),
                "headers": hdrs,
                "body": base64.b64encode(body).decode() if body is not None else None,
                "auth": auth,
                "timeout_s": timeout,
            }
        )
        return Response(
            status=answer["status"],
            reason=answer["reason"],
            headers=[(k, v) for k, v in answer["headers"]],
            content=base64.b64decode(answer["body"]),
            url=answer["url"],
            truncated=answer["truncated"],
        )

    def progress(self, progress: float, total: float | None = None, message: str | None = None) -> None:
        """Report how far the call has come (shown in the worker's log)."""
        self.link.tell({"op": "progress", "progress": progress, "total": total, "message": message})

    def secret(self, name: str) -> str:
        """The value of a secret the policy marks ``unsafe_expose_to_handler`` (for an SDK that must
        hold the token itself). Any other secret: EgressDenied. Prefer ``fetch(..., auth=name)``."""
        return str(self.link.ask({"op": "secret", "name": name})["value"])


def _jsonable(value: Any) -> Any:
    try:
        return _json.loads(_json.dumps(value, default=repr))
    except (TypeError, ValueError):
        return repr(value)


__all__ = ["Context", "EgressDenied", "FetchFailed", "Link", "Logger", "Response", "ToolError", "tool"]
