"""Connectors: the user's ``@tool`` handlers, each call in a fresh child that holds nothing of the worker's.

``sandbox.configure`` (once, from the runner) brings the run's secret values and the
mounted tool sources; a first child imports the sources and lists their tools. Each call
then runs in its own child (``worker.connectors.handler_host``) under the same containment as
``run_python`` (call timeout, output caps, process group killed, the sweep after the call).
The child's socket is its only way to ask the worker for anything; every message on it is
hostile input: bounded lines, known operations only, a fetch only through SafeFetch, a
secret only by name (added here, never handed over unless the policy exposes it).
"""

from __future__ import annotations

import base64
import json
import socket
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from toolcage.policies import codes, contract
from toolcage.worker import calls, logs
from toolcage.worker.errors import (
    BadParams,
    CallTimeout,
    ConfigError,
    HandlerCrashed,
    HandlerFailed,
    HandlerOOM,
    ResultTooLarge,
    WorkerError,
)
from toolcage.worker.protocol import LineSplitter
from toolcage.worker.secrets import STORE
from toolcage.worker.settings import Settings

_MAX_NOTES = 1000  # log and progress lines one call may write (a handler cannot flood the log)
# Threat: a handler making thousands of refused fetches with long URLs, each a decision kept for the
# audit, until its call's answer is longer than the runner accepts, which kills the sandbox. URLs are
# bounded, and past this many bytes of records a call's fetches are refused.
_MAX_URL = 8192
_MAX_RECORDS = 512 * 1024
# codes a handler may answer with; anything else it claims becomes HANDLER_ERROR
_HANDLER_CODES = frozenset(
    {codes.TOOL_ERROR, codes.EGRESS_DENIED, codes.FETCH_FAILED, codes.INVALID_PARAMS, codes.HANDLER_ERROR}
)


@dataclass
class WithMeta:
    """A value plus what the runner audits about its call (names and origins, never values)."""

    value: Any
    meta: dict[str, Any]


def handler_argv() -> list[str]:
    # -P: `-m` would put the working directory (/scratch, written by tool code) first on sys.path, so a
    # planted json.py or toolcage/ would run in the child that holds the call's params and secrets
    return [
        sys.executable,
        "-P",
        *(["-S"] if sys.flags.no_site else []),
        "-m",
        "toolcage.worker.connectors.handler_host",
    ]


def handler_env() -> dict[str, str]:
    """The child finds toolcage where the worker does, and the image's extra packages after it."""
    from toolcage.worker.tools.proc import python_path

    path = python_path(worker_lib=True)
    return {"PYTHONPATH": path} if path else {}


@dataclass
class Link:
    """The worker's end of one handler child's socket: answers its asks, keeps its final word."""

    settings: Settings
    sock: socket.socket
    deadline: float
    final: dict[str, Any] | None = None
    violation: str | None = None
    decisions: list[dict[str, Any]] = field(default_factory=list)
    secrets_sent: list[dict[str, Any]] = field(default_factory=list)
    notes: int = 0
    loading: bool = False  # the discovery child: import-time code may not fetch or read secrets (nothing audits it)
    secrets_read: set[str] = field(default_factory=set)
    recorded: int = 0  # bytes of decisions and secrets_sent kept for the audit (at most _MAX_RECORDS and one fetch)

    def __post_init__(self) -> None:
        limit = 4 * self.settings.policy.limits.output_cap + (1 << 20)
        self._lines = LineSplitter(limit)

    def send(self, message: dict[str, Any]) -> None:
        """Answer the child, within the call's deadline: a child that asks and never reads cannot
        hold the worker (it is cut off, and its call ends as a crash)."""
        self.sock.settimeout(max(self.deadline - time.monotonic(), 0.001))
        try:
            self.sock.sendall(json.dumps(message).encode() + b"\n")
        except OSError:
            self.violation = self.violation or "it did not read the worker's answer"

    def on_readable(self) -> bool:
        """Handle what the child sent; False once its socket is closed or it broke the rules."""
        try:
            data = self.sock.recv(1 << 16)
        except OSError:
            data = b""
        if not data:
            return False
        for line in self._lines.feed(data):
            if line is None:
                return self._violate("a message over the size limit")
            try:
                msg = json.loads(line)
            except ValueError:
                return self._violate("a message that is not JSON")
            if not isinstance(msg, dict) or self.final is not None:
                return self._violate("a message after its answer, or not an object")
            if not self._handle(msg) or self.violation:
                return False
        return True

    def _violate(self, what: str) -> bool:
        self.violation = what
        return False

    def _handle(self, msg: dict[str, Any]) -> bool:
        op = msg.get("op")
        if op in ("result", "error", "catalog"):
            self.final = msg
            return True
        if op in ("fetch", "secret") and self.loading:
            message = "connectors may not fetch or read secrets while they load (at import time)"
            self.send({"op": "failed", "code": codes.TOOL_ERROR, "message": message, "data": {"reason": "loading"}})
            return True
        if op == "fetch":
            self._fetch(msg)
            return True
        if op == "secret":
            try:
                name = str(msg.get("name"))
                self.send({"op": "secret", "value": STORE.exposed(name)})
                if name not in self.secrets_read:  # once per name and call: a loop of reads cannot grow the log
                    self.secrets_read.add(name)
                    logs.info("handler.secret_read", secret=name)
            except WorkerError as exc:
                self.send({"op": "failed", "code": exc.code, "message": exc.message, "data": exc.data})
            return True
        if op in ("log", "progress"):
            self.notes += 1
            if self.notes <= _MAX_NOTES:
                # the handler's words go in as values, never as keys of the worker's own event
                said = {k: v for k, v in msg.items() if k not in ("op", "level")}
                text = STORE.clip(json.dumps(said, default=repr), 2000)
                if msg.get("level") in ("warning", "error"):
                    logs.warning(f"handler.{op}", handler=text)
                else:
                    logs.info(f"handler.{op}", handler=text)
                call = calls.current()
                if op == "progress" and call is not None:  # to the caller, when it asked
                    call.report(msg.get("progress"), msg.get("total"), msg.get("message"))
            return True
        return self._violate(f"an unknown operation {str(op)[:40]!r}")

    def _fetch(self, msg: dict[str, Any]) -> None:
        from toolcage.worker.egress.safefetch import SafeFetch, proxy_from_env
        from toolcage.worker.tools.net import log_decision

        def record(url: str, method: str, d: Any) -> None:
            self.decisions.append({"url": url, "method": method, **d.to_dict()})
            self.recorded += len(json.dumps(self.decisions[-1]))
            log_decision(url, method, d)

        if self.recorded >= _MAX_RECORDS:
            message = "fetch: this call made too many requests (its record for the audit is full)"
            self.send(
                {
                    "op": "failed",
                    "code": codes.FETCH_FAILED,
                    "message": message,
                    "data": {"reason": "too_many_requests"},
                }
            )
            return
        fetcher = SafeFetch(self.settings.policy, proxy=proxy_from_env(), on_decision=record, secrets=STORE)
        try:
            url, method, headers = msg["url"], msg["method"], msg.get("headers") or {}
            auth, requested = msg.get("auth"), msg.get("timeout_s")
            if not (isinstance(url, str) and isinstance(method, str) and isinstance(headers, dict)):
                raise BadParams("fetch: url and method must be strings, headers an object")
            if len(url) > _MAX_URL:
                raise BadParams(f"fetch: the url is longer than {_MAX_URL} characters")
            if not all(isinstance(k, str) and isinstance(v, str) for k, v in headers.items()):
                raise BadParams("fetch: header names and values must be strings")
            if auth is not None and not isinstance(auth, str):
                raise BadParams("fetch: auth must name a secret")
            body = base64.b64decode(msg["body"], validate=True) if msg.get("body") is not None else None
            left = self.deadline - time.monotonic()
            timeout = min(requested, left) if isinstance(requested, int | float) and requested > 0 else left
            r = fetcher.fetch(url, method, headers, body, max(timeout, 0.001), auth=auth)
        except WorkerError as exc:
            # its message and data can quote a URL the bound host chose (a redirect carrying the token)
            message, data = STORE.redact_text(exc.message), STORE.redact(exc.data)
            self.send({"op": "failed", "code": exc.code, "message": message, "data": data})
        except (KeyError, TypeError, ValueError) as exc:
            message = STORE.redact_text(f"fetch: bad request ({exc})")
            self.send({"op": "failed", "code": codes.INVALID_PARAMS, "message": message})
        else:
            # the handler never holds a secret, even if the bound host echoes it back
            self.send(
                {
                    "op": "fetched",
                    "status": r.status,
                    "reason": STORE.redact_text(r.reason),
                    "headers": [[STORE.redact_text(k), STORE.redact_text(v)] for k, v in r.headers],
                    "body": base64.b64encode(r.body).decode(),  # redacted by SafeFetch, before its cut
                    "url": STORE.redact_text(r.url),  # a redirect's Location may carry it too
                    "truncated": r.truncated,
                }
            )
        finally:
            self.secrets_sent.extend(fetcher.secrets_sent)
            self.recorded += sum(len(json.dumps(s)) for s in fetcher.secrets_sent)

    def meta(self) -> dict[str, Any]:
        return {"egress": self.decisions, "secrets_sent": self.secrets_sent}


def run_handler(settings: Settings, job: dict[str, Any], timeout: float) -> tuple[dict[str, Any], Link]:
    """Start a handler child for one job; return its outcome (run_child's dict) and its link."""
    from toolcage.worker.tools.proc import run_child

    parent, child = socket.socketpair()
    link = Link(settings, parent, time.monotonic() + timeout, loading=job.get("op") == "discover")
    fd = child.detach()  # run_child hands it to the child and closes our copy
    try:
        env = {**handler_env(), contract.ENV_HANDLER_FD: str(fd)}
        # the job goes in on stdin, written as the child reads it (params may be megabytes)
        outcome = run_child(
            handler_argv(),
            settings,
            timeout,
            json.dumps(job),
            link=link,
            extra_env=env,
            pass_fds=(fd,),
            stream_output=False,
            own=True,  # the worker's code, holding secrets: never the environment of a user's own image
        )
    finally:
        parent.close()
    return outcome, link


def _job_paths(settings: Settings) -> dict[str, Any]:
    """Where the handler's files are (the real directories: with --sandbox none they are not at their names)."""
    return {"scratch": settings.scratch, "workspace": settings.workspace, "run_id": settings.run_id}


def _ended_without_answer(outcome: dict[str, Any], link: Link, timeout: float) -> WorkerError:
    if outcome["timed_out"]:
        return CallTimeout(f"the handler did not finish within its timeout of {timeout:g}s")
    data = {
        "exit_code": outcome["exit_code"],
        "signal": outcome["signal"],
        "stderr": STORE.clip(outcome["stderr"], 2000, tail=True),
    }
    if outcome["oom_killed"]:
        return HandlerOOM("the handler was killed by the memory limit", data)
    why = f"it broke its channel ({link.violation})" if link.violation else "it exited without an answer"
    return HandlerCrashed(f"the handler crashed: {why}", data)


class Connectors:
    """The run's connector tools (empty until ``sandbox.configure`` brings sources)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.sources: list[dict[str, Any]] = []
        self.tools: dict[str, dict[str, Any]] = {}
        self.configured = False

    def configure(self, params: dict[str, Any], builtin: list[str]) -> dict[str, Any]:
        if self.configured:
            raise ConfigError("the sandbox is already configured")
        self.configured = True
        STORE.load(params.get("secrets") or {}, dict(self.settings.policy.secrets))
        sources = params.get("sources") or []
        if not isinstance(sources, list) or not all(_valid_source(s) for s in sources):
            raise BadParams("sources must be a list of {path, kind, label}")
        self.sources = [{**s, "index": i} for i, s in enumerate(sources)]
        if self.sources:
            self._discover(builtin)
        logs.info("sandbox.configured", tools=sorted(self.tools), secrets=STORE.names())
        return {"tools": sorted(self.tools), "secrets": STORE.names()}

    @property
    def _timeout(self) -> float:
        """A handler child's time: the call timeout, never past the run deadline."""
        return min(self.settings.policy.timeouts.call_s, self.settings.policy.timeouts.run_s)

    def _catalog(self, schemas: bool) -> dict[str, Any]:
        """Run a loading child over every source; its catalog (``schemas``: with params schemas)."""
        timeout = self._timeout
        job = {"op": "discover", "sources": self.sources, "schemas": schemas}
        outcome, link = run_handler(self.settings, job, timeout)
        final = link.final
        if final is None or final.get("op") != "catalog" or not isinstance(final.get("tools"), list):
            exc = _ended_without_answer(outcome, link, timeout)
            raise ConfigError(f"loading the connectors failed: {exc.message}", exc.data)
        return final

    def _discover(self, builtin: list[str]) -> None:
        final = self._catalog(schemas=False)  # no pydantic at start: a run that only calls never needs it
        problems = [str(p) for p in final.get("problems") or []]
        tools: dict[str, dict[str, Any]] = {}
        for t in final["tools"]:
            name = t.get("name") if isinstance(t, dict) else None
            if not isinstance(name, str) or not isinstance(t.get("source_index"), int):
                raise ConfigError("loading the connectors failed: a malformed catalog")
            if name in builtin:
                problems.append(f"tool name clash: {name} ({t.get('module')}) is a built-in tool")
            tools[name] = t
        if problems:
            raise ConfigError("the connectors cannot be loaded: " + "; ".join(problems), {"problems": problems})
        self.tools = tools

    @property
    def schemas_ready(self) -> bool:
        return all(t.get("params_schema") is not None for t in self.tools.values())

    def ensure_schemas(self) -> bool:
        """Fill in the params schemas (once, when tools.list first asks); True if a child ran."""
        if not self.tools or all(t.get("params_schema") is not None for t in self.tools.values()):
            return False
        final = self._catalog(schemas=True)
        problems = [str(p) for p in final.get("problems") or []]
        got = {t.get("name"): t for t in final["tools"] if isinstance(t, dict)}
        missing = sorted(n for n in self.tools if not isinstance((got.get(n) or {}).get("params_schema"), dict))
        if problems or missing:
            raise ConfigError("the connectors' schemas cannot be made: " + "; ".join(problems or missing))
        for name, t in self.tools.items():
            t["params_schema"] = got[name]["params_schema"]
        return True

    def describe_one(self, name: str) -> dict[str, Any]:
        """What tools.list shows of a connector tool (read off its function, in a loading child)."""
        keys = ("name", "description", "params_schema", "source", "module")
        return {k: self.tools[name].get(k) for k in keys}

    def call(self, name: str, params: dict[str, Any]) -> WithMeta:
        t = self.tools[name]
        timeout = self._timeout
        job = {
            "op": "call",
            "source": self.sources[t["source_index"]],
            "module": t["module"],
            "tool": name,
            "params": params,
            **_job_paths(self.settings),
        }
        outcome, link = run_handler(self.settings, job, timeout)
        if outcome["stdout"] or outcome["stderr"]:
            logs.info(
                "handler.output",
                tool=name,
                stdout=STORE.clip(outcome["stdout"], 2000, tail=True),
                stderr=STORE.clip(outcome["stderr"], 2000, tail=True),
            )
        final = link.final
        exc: WorkerError | None = None
        if final is None or final.get("op") not in ("result", "error") or outcome["timed_out"] or link.violation:
            # a child that broke its channel's rules (a second answer too) is not believed, even before it
            exc = _ended_without_answer(outcome, link, timeout)
        elif final["op"] == "error":
            code, data = final.get("code"), final.get("data")
            if code == codes.HANDLER_ERROR and isinstance(data, dict) and isinstance(data.get("traceback"), str):
                # the child's own record of an exception: cut here, after redaction (worker.connectors.handler_host)
                data = {**data, "traceback": STORE.clip(data["traceback"], 4000, tail=True)}
            exc = HandlerFailed(STORE.clip(str(final.get("message")), 4000), data)
            exc.code = code if code in _HANDLER_CODES else codes.HANDLER_ERROR
        elif len(json.dumps(final.get("value"))) > self.settings.policy.limits.output_cap:
            exc = ResultTooLarge("the handler's result is larger than the output cap (limits.output_cap)")
        if exc is not None:
            exc.meta = link.meta()
            raise exc
        return WithMeta(final.get("value"), link.meta())  # type: ignore[union-attr]


def _valid_source(s: Any) -> bool:
    return (
        isinstance(s, dict)
        and isinstance(s.get("path"), str)
        and s.get("kind") in ("file", "folder", "package")
        and isinstance(s.get("label"), str)
    )
