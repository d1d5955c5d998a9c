"""http_fetch: HTTP for tool code, only through SafeFetch (so only where the policy allows)."""

from __future__ import annotations

import base64
from typing import Annotated, Any, Literal

from annotated_types import Gt

from toolcage.worker import logs
from toolcage.worker.errors import BadParams
from toolcage.worker.settings import Settings
from toolcage.worker.tools import Tool
from toolcage.worker.tools._params import doc, params


@params
class HttpFetchParams:
    url: str = doc("absolute http(s) URL; must be allowed by the policy's network.allow")
    method: Literal["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"] = "GET"
    headers: dict[str, str] | None = doc("request headers (Host and proxy headers are refused)", None)
    body: str | None = doc("request body, as text or base64 (see body_encoding)", None)
    body_encoding: Literal["utf-8", "base64"] = "utf-8"
    timeout_s: Annotated[float, Gt(0)] | None = doc("seconds; default the policy's call timeout", None)


def log_decision(url: str, method: str, d: Any) -> None:
    event = "safefetch.allowed" if d.allowed else "safefetch.denied"
    logs.info(event, url=url, method=method, reason=d.reason, rule=d.rule)
    if not d.allowed:
        logs.flush()


def http_fetch(settings: Settings, p: HttpFetchParams) -> dict[str, Any]:
    from toolcage.worker.egress.safefetch import SafeFetch, proxy_from_env

    try:
        body = (
            (base64.b64decode(p.body, validate=True) if p.body_encoding == "base64" else p.body.encode())
            if p.body is not None
            else None
        )
    except ValueError:
        raise BadParams("body is not valid base64") from None
    from toolcage.worker.secrets import STORE

    # with the run's secrets: a body is redacted before its cut, and a secret's origin gets SafeFetch's transport
    fetcher = SafeFetch(settings.policy, proxy=proxy_from_env(), on_decision=log_decision, secrets=STORE)
    timeout = min(p.timeout_s or settings.policy.timeouts.call_s, settings.policy.timeouts.run_s)
    r = fetcher.fetch(p.url, p.method, p.headers or {}, body, timeout)
    try:
        text, encoding = r.body.decode("utf-8"), "utf-8"
    except UnicodeDecodeError:
        text, encoding = base64.b64encode(r.body).decode("ascii"), "base64"
    return {
        "status": r.status,
        "reason": r.reason,
        "headers": [[k, v] for k, v in r.headers],
        "body": text,
        "encoding": encoding,
        "truncated": r.truncated,
        "url": r.url,
        "decisions": r.decisions,
    }


TOOLS = [
    Tool(
        "http_fetch",
        "HTTP request through SafeFetch: only to hosts, schemes, ports and methods the policy allows; "
        "redirects are re-checked hop by hop.",
        HttpFetchParams,
        http_fetch,
        in_process_timeout=False,
    ),
]
