"""``Sandbox``: one hardened container (or, for development, one local process) per run.

Lifecycle: create → attach → start → calls over JSON-RPC → remove. The container is
removed on every exit path (normal close, exceptions, SIGINT/SIGTERM via the CLI's
handlers, interpreter exit) unless ``keep=True``; a hard run deadline kills it.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import json
import os
import queue
import secrets
import shutil
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import jsonrpcclient

from toolcage import __version__, logs, ownership
from toolcage import audit as audit_mod
from toolcage.audit import Audit
from toolcage.config import PROXY_SOCKET, RunSpec, container_config, container_name
from toolcage.errors import (
    ProtocolError,
    SandboxError,
    SandboxOOM,
    SandboxTimeout,
    ToolcageError,
    UsageError,
    WorkerCrashed,
)
from toolcage.policies import Policy, load_policy
from toolcage.results import CallResult, RunSummary, classify_error, classify_result
from toolcage.transport import EOF_MARK, Broken, DockerAttachTransport, ProcessTransport, StreamParser
from toolcage.workspace import readable_by_sandbox, validate_workspace

DEFAULT_IMAGE = f"toolcage-worker:{__version__}"
CALL_GRACE_S = 2.0  # the worker enforces call timeouts; the runner waits this much longer
NONE_WARNING = (
    "WARNING: --sandbox none: the tool runs as a plain process on this host with your privileges. "
    "NOTHING IS ISOLATED (no container, no read-only workspace, no network block). Development only."
)

# how --sandbox none starts the worker (tests swap in misbehaving workers)
LOCAL_WORKER_ARGV = [sys.executable, "-m", "toolcage.worker"]

_LIVE: set[Sandbox] = set()
_LIVE_LOCK = threading.Lock()


def _cleanup_live() -> None:
    with _LIVE_LOCK:
        live = list(_LIVE)
    for sb in live:
        try:
            sb.close()
        except Exception:  # noqa: S110 - best effort at interpreter exit
            pass


atexit.register(_cleanup_live)


def resolve_policy(policy: str | Path | Policy, run_timeout: float | None = None) -> Policy:
    p = policy if isinstance(policy, Policy) else load_policy(policy)
    if run_timeout is not None:
        if run_timeout <= 0:
            raise UsageError("--timeout must be a positive number of seconds")
        # A caller may tighten the deadline, never loosen the policy's.
        run_s = min(run_timeout, p.timeouts.run_s)
        p = p.with_run_deadline(run_s)
    return p


class Sandbox:
    """A sandboxed worker for one run. Use as a context manager; ``call`` tools on it."""

    def __init__(
        self,
        policy: str | Path | Policy = "default",
        *,
        workspace: str | os.PathLike[str] | None = None,
        tool: str = "session",
        sandbox: str = "container",
        image: str | None = None,
        keep: bool = False,
        run_timeout: float | None = None,
        engine: Any = None,
        egress_network: str | None = None,
        egress_proxy: str | None = None,
        ca_file: str | os.PathLike[str] | None = None,
        audit: Any = None,
    ) -> None:
        if sandbox not in ("container", "none"):
            raise UsageError(f"unknown sandbox kind {sandbox!r}: use 'container' or 'none'")
        self.policy = resolve_policy(policy, run_timeout)
        self.workspace = validate_workspace(workspace) if workspace is not None else None
        self.tool = tool
        self.kind = sandbox
        self.image = image or os.environ.get("TOOLCAGE_IMAGE", DEFAULT_IMAGE)
        self.keep = keep
        self.run_id = secrets.token_hex(4)
        self.name = container_name(tool, self.run_id)
        self.container_id: str | None = None
        self._engine = engine
        self.egress_network = egress_network
        self.egress_proxy = egress_proxy if egress_proxy is not None else os.environ.get("TOOLCAGE_EGRESS_PROXY")
        self._egress: Any = None
        self.ca_pem = self._read_ca(ca_file)
        # audit: None -> the default log ($TOOLCAGE_AUDIT_LOG or ~/.local/state/toolcage/audit.jsonl),
        # a path -> that log, an Audit -> it, False -> no audit log
        self.audit: Audit | None = (
            None if audit is False else audit if isinstance(audit, Audit) else audit_mod.shared(audit)
        )
        self._audited = False
        self._transport: DockerAttachTransport | ProcessTransport | None = None
        self._parser: StreamParser | None = None
        self._lock = threading.Lock()
        self._timer: threading.Timer | None = None
        self._deadline_hit = False
        self._dead: SandboxError | None = None
        self._closed = False
        self._running = False  # set once start() succeeded
        self._input_closed = False
        self._started = 0.0
        self._deadline = 0.0
        self._calls = 0
        self._tmpdirs: list[str] = []
        self.summary: RunSummary | None = None
        self.log = logs.get_logger(run_id=self.run_id, name=self.name)
        if self.workspace is not None and sandbox == "container" and not readable_by_sandbox(self.workspace):
            self.log.warning(
                "workspace.unreadable",
                workspace=str(self.workspace),
                hint="the sandbox user (uid 65532) cannot read it: `chmod o+rX` the files it should see",
            )

    @staticmethod
    def _read_ca(ca_file: str | os.PathLike[str] | None) -> str | None:
        """An extra CA bundle SafeFetch trusts (corporate TLS inspection, test CAs)."""
        if ca_file is None:
            return None
        try:
            pem = Path(ca_file).read_text(encoding="ascii")
        except (OSError, UnicodeDecodeError) as exc:
            raise UsageError(f"cannot read CA file {ca_file}: {exc}") from None
        if "-----BEGIN CERTIFICATE-----" not in pem:
            raise UsageError(f"CA file {ca_file} holds no PEM certificate")
        return pem

    # lifecycle ------------------------------------------------------------------------
    def __enter__(self) -> Sandbox:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> Sandbox:
        self._started = time.monotonic()
        self._deadline = self._started + self.policy.timeouts.run_s
        parser = StreamParser(
            max_line=16 * self.policy.limits.output_cap + (1 << 20),
            on_stderr_line=lambda line: self.log.debug("worker.stderr", line=line),  # shown with -vv
            on_broken=self._on_protocol_violation,
        )
        self._parser = parser
        with _LIVE_LOCK:
            _LIVE.add(self)
        started = {
            "kind": self.kind,
            "policy": self.policy.name,
            "policy_sha256": self.policy.sha256(),
            "workspace": str(self.workspace) if self.workspace else None,
        }
        if self.audit is not None:
            # on disk before the container exists: a runner killed right after creating it still leaves a trace
            image = self._image_info()
            host_pid, _ = ownership.owner()
            self.audit.event(
                "run.started",
                run_id=self.run_id,
                name=self.name,
                tool=self.tool,
                image=self.image,
                image_id=(image or {}).get("Id"),
                owner=host_pid,
                network=self.policy.network.mode,
                **started,
            )
            self._audited = True
        try:
            if self.kind == "container":
                self._start_container(parser)
            else:
                self._start_process(parser)
        except BaseException:
            self.close()
            raise
        self._running = True
        self._timer = threading.Timer(self.policy.timeouts.run_s, self._on_deadline)
        self._timer.daemon = True
        self._timer.start()
        self.log.info("run.started", container_id=self.container_id, **started)
        return self

    def _image_info(self) -> dict[str, Any] | None:
        if self.kind != "container":
            return None
        try:
            if self._engine is None:
                from toolcage.docker_adapter import Engine

                self._engine = Engine.default()
            return self._engine.image(self.image)  # type: ignore[no-any-return]
        except ToolcageError:
            return None  # start() reports the engine or the image as missing, with the fix

    def _on_protocol_violation(self, reason: str) -> None:
        """The stream broke (reader thread): kill the sandbox now, even if no call is waiting."""
        if self._dead is None:
            self._dead = ProtocolError(
                f"protocol error: {reason}; the sandbox was killed", run_id=self.run_id
            )
        self.log.warning("run.protocol_violation", reason=reason)
        self._kill()

    def _run_spec(self) -> RunSpec:
        host_pid, started = ownership.owner()
        return RunSpec(
            run_id=self.run_id,
            tool=self.tool,
            image=self.image,
            policy_name=self.policy.name,
            started_at=datetime.now(UTC).isoformat(timespec="milliseconds"),
            deadline=time.time() + self.policy.timeouts.run_s,
            owner=host_pid,
            owner_started=started,
            workspace=self.workspace,
        )

    def _start_container(self, parser: StreamParser) -> None:
        if self._engine is None:
            from toolcage.docker_adapter import Engine

            self._engine = Engine.default()
        from toolcage.reaper import reap_in_background

        reap_in_background(self._engine, self.log, self.audit)
        spec = self._run_spec()
        if self.policy.network.mode == "proxy":
            from toolcage.egress import Egress, audit_decisions

            self._egress = Egress(
                self._engine,
                self.policy,
                spec,
                self.egress_network,
                self.egress_proxy,
                self.log,
                on_decision=audit_decisions(self.audit, self.run_id),  # written as they happen, not at close
            )
            volume, env = self._egress.up()
            env["TOOLCAGE_PROXY_SOCKET"] = PROXY_SOCKET
            if self.ca_pem:
                env["TOOLCAGE_CA_PEM"] = self.ca_pem
            spec = dataclasses.replace(spec, proxy_volume=volume, extra_env=env)
        config = container_config(self.policy, spec)
        self.container_id = self._engine.create(config, self.name)
        sock, closer = self._engine.attach(self.container_id)
        self._transport = DockerAttachTransport(sock, parser, closer)
        self._transport.start()
        self._engine.start(self.container_id)

    def _start_process(self, parser: StreamParser) -> None:
        print(NONE_WARNING, file=sys.stderr)
        scratch = tempfile.mkdtemp(prefix=f"toolcage-{self.run_id}-scratch-")
        self._tmpdirs.append(scratch)
        workspace = str(self.workspace) if self.workspace else ""  # "": no workspace (the worker says so)
        spec = self._run_spec()
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "LANG": os.environ.get("LANG", "C.UTF-8"),
            "TOOLCAGE_POLICY": self.policy.canonical_json(),
            "TOOLCAGE_RUN_ID": self.run_id,
            "TOOLCAGE_DEADLINE": f"{spec.deadline:.3f}",
            "TOOLCAGE_WORKSPACE": workspace,
            "TOOLCAGE_SCRATCH": scratch,
            "TOOLCAGE_WATCH_RUNNER": "1",
            **({"TOOLCAGE_CA_PEM": self.ca_pem} if self.ca_pem else {}),
        }
        self._transport = ProcessTransport(list(LOCAL_WORKER_ARGV), env, scratch, parser)
        self._transport.start()

    def _on_deadline(self) -> None:
        self._deadline_hit = True
        self.log.warning("run.deadline", run_s=self.policy.timeouts.run_s)
        self._kill()

    def _kill(self) -> None:
        try:
            if self.kind == "container" and self.container_id and self._engine is not None:
                self._engine.kill(self.container_id)
            elif isinstance(self._transport, ProcessTransport):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self._transport.proc.pid, 9)
        except ToolcageError:
            pass

    # calls ----------------------------------------------------------------------------
    def call(self, tool: str, params: dict[str, Any] | None = None, *, timeout: float | None = None) -> CallResult:
        """Call a tool in the sandbox. Tool outcomes come back as a CallResult; sandbox failures raise."""
        if params is not None and not isinstance(params, dict):
            raise UsageError("params must be a JSON object")
        with self._lock:
            if self._dead is not None:
                raise self._dead
            if self._transport is None or self._closed:
                raise UsageError("the sandbox is not running: use it as a context manager or call start()")
            # unguessable ids: a forged answer would have to know the id of the call it answers
            request = jsonrpcclient.request(tool, params=params or None, id=secrets.token_hex(8))
            line = (json.dumps(request) + "\n").encode()
            wait = timeout
            if wait is None:
                declared = (params or {}).get("timeout_s")
                base = declared if isinstance(declared, int | float) and declared > 0 else self.policy.timeouts.call_s
                wait = base + CALL_GRACE_S
            started = time.monotonic()
            assert self._parser is not None
            self._parser.expect(request["id"])
            try:
                self._transport.send(line)
            except OSError:
                pass  # the worker is gone; the reader reports how it ended
            msg = self._await(request["id"], started + wait)
            wall_ms = round((time.monotonic() - started) * 1000, 3)
            if tool != "sandbox.usage":
                self._calls += 1
            result = self._result(tool, msg, wall_ms)
            if result is None:
                self._kill()
                raise self._fail(
                    ProtocolError("protocol error: the worker sent a malformed response; the sandbox was killed")
                )
            self._audit_call(tool, params, result)
            return result

    def _result(self, tool: str, msg: dict[str, Any], wall_ms: float) -> CallResult | None:
        """A response as a CallResult (parsed by jsonrpcclient); None if the worker sent a malformed one."""
        try:
            resp = jsonrpcclient.parse(msg)
        except (KeyError, TypeError):  # e.g. "error": "text", or an error without a code
            return None
        if isinstance(resp, jsonrpcclient.Ok):
            return CallResult(classify_result(resp.result), tool, self.run_id, result=resp.result, wall_ms=wall_ms)
        assert isinstance(resp, jsonrpcclient.Error)
        if not isinstance(resp.code, int):
            return None
        err = {"code": resp.code, "message": resp.message, "data": resp.data}
        return CallResult(classify_error(resp.code), tool, self.run_id, error=err, wall_ms=wall_ms)

    def record_call(self, method: str, params: dict[str, Any] | None, response: dict[str, Any], t0: float) -> None:
        """Audit a call that went through raw access (`toolcage serve`)."""
        wall_ms = round((time.monotonic() - t0) * 1000, 3)
        r = self._result(method, response, wall_ms) or CallResult(
            "error", method, self.run_id, error={"code": -32603, "message": "malformed response"}, wall_ms=wall_ms
        )
        self._calls += 1
        self._audit_call(method, params, r)

    def _audit_call(self, tool: str, params: dict[str, Any] | None, r: CallResult) -> None:
        if self.audit is None or tool == "sandbox.usage":
            return
        self.audit.event_later(
            "run.call",
            run_id=self.run_id,
            tool=tool,
            status=r.status,
            duration_ms=r.wall_ms,
            error_code=r.error["code"] if r.error else None,
            _params=params or {},
        )
        decisions = r.result.get("decisions") if isinstance(r.result, dict) else None
        if r.error and r.error.get("code") == -32010 and isinstance(r.error.get("data"), dict):
            decisions = [{"allowed": False, **r.error["data"]}]
        for d in decisions or []:
            self.audit.event_later(
                "egress.decision",
                run_id=self.run_id,
                source="safefetch",
                allowed=d.get("allowed"),
                url=d.get("url"),
                method=d.get("method"),
                reason=d.get("reason"),
            )

    def _await(self, req_id: Any, call_deadline: float) -> dict[str, Any]:
        assert self._parser is not None
        while True:
            remaining = min(call_deadline, self._deadline + 1.0) - time.monotonic()
            try:
                msg = self._parser.messages.get(timeout=max(remaining, 0))
            except queue.Empty:
                self._kill()
                if time.monotonic() >= self._deadline:
                    self._deadline_hit = True
                    raise self._fail(
                        SandboxTimeout(f"run exceeded its deadline of {self.policy.timeouts.run_s:g}s")
                    ) from None
                raise self._fail(
                    SandboxTimeout(
                        "the worker did not answer within the call timeout; the sandbox was killed",
                        reason_detail="call",
                    )
                ) from None
            if msg is EOF_MARK:
                with contextlib.suppress(queue.Full):
                    self._parser.messages.put_nowait(EOF_MARK)  # keep it visible for later callers
                exc = self._explain_exit()
                assert exc is not None
                raise self._fail(exc)
            if isinstance(msg, Broken):
                self._kill()
                raise self._fail(ProtocolError(f"protocol error: {msg.reason}; the sandbox was killed"))
            if isinstance(msg, dict) and msg.get("id") == req_id and ("result" in msg or "error" in msg):
                return msg
            # the parser lets through only answers to pending calls, and one call is pending at a time
            self._kill()
            raise self._fail(ProtocolError("protocol error: an answer to another call; the sandbox was killed"))

    def _fail(self, exc: SandboxError) -> SandboxError:
        exc.details.setdefault("run_id", self.run_id)
        self._dead = exc
        return exc

    def _explain_exit(self, clean_ok: bool = False) -> SandboxError | None:
        """The worker's stream ended: find out why (deadline, OOM, crash); None if it ended cleanly."""
        tail = self._parser.stderr_tail() if self._parser else ""
        exit_code: int | None = None
        oom = False
        if self.kind == "container" and self.container_id and self._engine is not None:
            exit_code = self._engine.wait(self.container_id, timeout=5)
            info = self._engine.inspect(self.container_id) or {}
            state = info.get("State", {})
            oom = bool(state.get("OOMKilled"))
            exit_code = state.get("ExitCode", exit_code)
        elif isinstance(self._transport, ProcessTransport):
            try:
                exit_code = self._transport.proc.wait(timeout=5)
            except Exception:  # noqa: S110
                pass
        if self._deadline_hit:
            return SandboxTimeout(
                f"run exceeded its deadline of {self.policy.timeouts.run_s:g}s; the sandbox was killed"
            )
        if clean_ok and exit_code == 0 and not oom:
            return None
        if oom:
            return SandboxOOM(
                f"the worker was killed by the memory limit ({self.policy.limits.memory} bytes)", exit_code=exit_code
            )
        return WorkerCrashed(
            f"the worker exited unexpectedly (exit code {exit_code})", exit_code=exit_code, stderr_tail=tail[-2000:]
        )

    # raw access for `toolcage serve` ---------------------------------------------------
    def send_raw(self, line: bytes) -> None:
        """Forward one request line as is (the worker validates it)."""
        if self._transport is None or self._parser is None:
            raise UsageError("the sandbox is not running")
        self._parser.expect_answer_to(line)  # before sending: the answer may come at once
        with contextlib.suppress(OSError):
            self._transport.send(line)

    def finish_input(self) -> None:
        """No more requests: close the worker's stdin so it exits after answering."""
        self._input_closed = True
        if self._transport is not None:
            self._transport.close_stdin()

    def receive(self) -> Any:
        """Next message from the worker: a dict/list, EOF_MARK, Broken, or None at the run deadline."""
        assert self._parser is not None
        try:
            return self._parser.messages.get(timeout=max(self._deadline + 1.0 - time.monotonic(), 0))
        except queue.Empty:
            self._kill()
            return None

    def check_exit(self) -> None:
        """After EOF: raise if the worker did not end cleanly (input closed and exit 0)."""
        exc = self._explain_exit(clean_ok=self._input_closed)
        if exc is not None:
            raise self._fail(exc)
        self._dead = None

    def usage(self) -> dict[str, Any]:
        """CPU time and peak memory of the whole sandbox so far (from its cgroup)."""
        res = self.call("sandbox.usage", timeout=5)
        return res.result if isinstance(res.result, dict) else {}

    # teardown -------------------------------------------------------------------------
    def close(self) -> RunSummary | None:
        """End the run: gather usage, remove the container (unless keep), free everything. Idempotent."""
        if self._closed:
            return self.summary
        usage: dict[str, Any] = {}
        if self._running and self._dead is None and self._transport is not None and not self._input_closed:
            with contextlib.suppress(ToolcageError):
                usage = self.usage()
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
        status = self._dead.status if self._dead is not None else "ok"
        try:
            if self._transport is not None:
                self._transport.close_stdin()
            try:
                if self.kind == "container" and self.container_id and self._engine is not None:
                    if self.keep:
                        self.log.warning("run.kept", container=self.name)
                    else:
                        self._engine.remove(self.container_id)
                elif isinstance(self._transport, ProcessTransport):
                    try:
                        self._transport.proc.wait(timeout=2)
                    except Exception:
                        self._kill()
                        self._transport.proc.wait(timeout=5)
            finally:
                if self._egress is not None and not self.keep:
                    self._egress.down()
        finally:
            if self._parser is not None:
                self._parser.close()
            if self._transport is not None:
                self._transport.close()
            for d in self._tmpdirs:
                shutil.rmtree(d, ignore_errors=True)
            with _LIVE_LOCK:
                _LIVE.discard(self)
        self.summary = RunSummary(
            run_id=self.run_id,
            name=self.name,
            status=status,
            wall_ms=round((time.monotonic() - self._started) * 1000, 3) if self._started else 0.0,
            cpu_ms=usage.get("cpu_ms"),
            peak_memory_bytes=usage.get("peak_memory_bytes"),
            calls=self._calls,
        )
        self.log.info("run.finished", **self.summary.to_dict())
        if self.audit is not None and self._audited:
            self.audit.event(
                "run.finished",
                run_id=self.run_id,
                name=self.name,
                container_id=self.container_id,
                status=status,
                duration_ms=self.summary.wall_ms,
                cpu_ms=self.summary.cpu_ms,
                peak_memory_bytes=self.summary.peak_memory_bytes,
                oom_killed=status == "oom_killed" or bool(usage.get("oom_kills")),
                calls=self._calls,
            )
        return self.summary


class AsyncSandbox:
    """The async twin of :class:`Sandbox`: the same run, its blocking calls moved to a thread."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._sync = Sandbox(*args, **kwargs)

    @property
    def run_id(self) -> str:
        return self._sync.run_id

    @property
    def name(self) -> str:
        return self._sync.name

    @property
    def container_id(self) -> str | None:
        return self._sync.container_id

    @property
    def summary(self) -> RunSummary | None:
        """Wall time, CPU time and peak memory of the run, once it is closed (as on Sandbox)."""
        return self._sync.summary

    async def __aenter__(self) -> AsyncSandbox:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def start(self) -> AsyncSandbox:
        import asyncio

        await asyncio.to_thread(self._sync.start)
        return self

    async def call(
        self, tool: str, params: dict[str, Any] | None = None, *, timeout: float | None = None
    ) -> CallResult:
        import asyncio

        return await asyncio.to_thread(self._sync.call, tool, params, timeout=timeout)

    async def close(self) -> RunSummary | None:
        import asyncio

        return await asyncio.to_thread(self._sync.close)
