"""``toolcage mcp wrap``: a third-party stdio MCP server in a hardened container, relayed to our stdio.

The container comes from the same backend as every sandbox (``toolcage.backends``: hardening,
limits, labels, run deadline, egress proxy); only its command differs: the launcher
``toolcage.worker.mcp_host`` reads one config line (the server's argv, the secrets as env
vars) and runs the server on the container's stdio. This module moves the bytes and ends the
run; ``toolcage.servers.mcp_relay`` decides what each message may do. The server is hostile: its
lines are bounded, its stderr is a rate-limited, redacted, escaped log and never the
protocol, and whatever ends it (exit, a hung call, a flood, the deadline, a signal) is
answered to every request still pending, naming what happened.
"""

from __future__ import annotations

import json
import os
import re
import sys
import threading
import time
from collections.abc import Mapping
from typing import Any, TextIO

from toolcage import timing
from toolcage.backends import in_container
from toolcage.engine.api import EngineAPI
from toolcage.errors import UsageError
from toolcage.lifecycle import records
from toolcage.lifecycle.audit import Audit
from toolcage.lifecycle.watchdog import Expiry, Watchdog
from toolcage.options import RunOptions
from toolcage.policies import Policy, codes
from toolcage.results import CallResult
from toolcage.rpc.transport import StreamParser, Transport
from toolcage.run import Run
from toolcage.servers.mcp_relay import Actions, Call, Relay, ToolFilter, error
from toolcage.textsafe import dumps, escape
from toolcage.worker.errors import BadParams
from toolcage.worker.protocol import LineSplitter
from toolcage.worker.secrets import SecretStore

TOOL_LABEL = "mcp-wrap"  # the containers' toolcage.tool label and name part: toolcage-mcp-wrap-<run_id>
LAUNCHER = ("python3", "-S", "-m", "toolcage.worker.mcp_host")
MAX_LINE = 16 * 1024 * 1024  # one MCP message, either way
EOF_GRACE_S = 1.0  # after the client closed our stdin: the server's time to exit by itself (SDK clients wait 2 s)
START_TIMEOUT_S = 10.0
STDERR_FLOOD_BYTES = 16 * 1024 * 1024  # stderr past this within one window is a flood: the server is ended
STDERR_WINDOW_S = 5.0
STDERR_LINES_PER_S = 100.0  # shown on our stderr; above it lines are counted, not shown
STDERR_BURST = 500.0
STDERR_LINE_SHOWN = 2000  # characters of one line (after redaction)
NOTE_FIRST = 20  # notes of one kind shown in full; then one in NOTE_EVERY
NOTE_EVERY = 1000
AUDIT_DROPS_FIRST = 100  # dropped client notifications audited one by one; then one in NOTE_EVERY, with a count
EXIT_OK, EXIT_FAILED = 0, 3
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")


def secret_store(values: Mapping[str, str]) -> SecretStore:
    """The secrets as the server's env vars: names that are variable names, values as toolcage
    accepts for any secret (8 characters or more, no control characters); UsageError otherwise."""
    bad = sorted(n for n in values if not _ENV_NAME.fullmatch(n))
    if bad:
        raise UsageError(f"--secret {bad[0]!r}: the name becomes an environment variable: use letters, digits and _")
    try:
        return SecretStore.unbound(dict(values))
    except BadParams as exc:
        names = ", ".join((exc.data or {}).get("secrets") or [])
        raise UsageError(f"--secret {names}: {exc.message}") from None


class _ServerStream(StreamParser):
    """The container's stdout (MCP lines to the relay) and stderr (a bounded, redacted log)."""

    def __init__(self, wrap: McpWrap) -> None:
        super().__init__(MAX_LINE, on_stderr_line=wrap._server_log, redact=wrap.secrets.redact)
        self._wrap = wrap
        self._window = (0.0, 0)  # stderr flood window: its start, bytes in it

    def stdout(self, data: bytes | memoryview) -> None:
        if self.broken:
            return
        for line in self._lines.feed(data):
            if line is None:
                self.broken = True
                self._wrap.end("crashed", "flood", f"the wrapped MCP server sent a line longer than {MAX_LINE} bytes")
                return
            if line.strip():
                self._wrap._from_server(line)

    def stderr(self, data: bytes) -> None:
        if self._wrap.ended is not None:
            return
        now = time.monotonic()
        start, size = self._window if now - self._window[0] < STDERR_WINDOW_S else (now, 0)
        self._window = (start, size + len(data))
        if size + len(data) > STDERR_FLOOD_BYTES:
            mib = STDERR_FLOOD_BYTES >> 20
            self._wrap.end(
                "crashed", "flood", f"the wrapped MCP server wrote over {mib} MiB to stderr within {STDERR_WINDOW_S:g}s"
            )
            return
        super().stderr(data)

    def eof(self) -> None:
        self._wrap._server_eof()


WRAP_NEEDS_A_CONTAINER = (
    "toolcage mcp wrap runs a third-party server: it needs a container (--sandbox container, gvisor or auto)"
)


class McpWrap:
    """One wrapped server for one MCP session: start it, relay until either side ends, remove it."""

    def __init__(
        self,
        policy: Policy,
        argv: list[str],
        *,
        image: str,
        workspace: str | os.PathLike[str] | None = None,
        secrets: Mapping[str, str] | None = None,
        tool_filter: ToolFilter | None = None,
        keep: bool = False,
        egress_network: str | None = None,
        egress_proxy: str | None = None,
        audit: Any = None,
        engine: EngineAPI | None = None,
        stdin_fd: int = 0,
        stdout_fd: int = 1,
        err: TextIO | None = None,
        sandbox: str | None = None,
    ) -> None:
        if not argv:
            raise UsageError(
                "give the server's command after --, e.g. `toolcage mcp wrap --pip mcp-server-time -- mcp-server-time`"
            )
        self.options = RunOptions.resolve(
            policy, tool=TOOL_LABEL, sandbox=sandbox, image=image, workspace=workspace, engine=engine,
            egress_network=egress_network, egress_proxy=egress_proxy, audit=audit, keep=keep,
        )  # fmt: skip
        self.policy, self.argv, self.image, self.keep = self.options.policy, list(argv), self.options.image, keep
        self.workspace, self.kind = self.options.workspace, self.options.kind
        self.audit: Audit | None = self.options.audit
        self.secrets = secret_store(secrets or {})
        self.filter = tool_filter or ToolFilter()
        self._run = Run(self.options)
        self.run_id, self.name, self.log = self._run.run_id, self._run.name, self._run.log
        # a container of either kind: the server is third-party code (never "none", which runs on the host)
        if not in_container(self.kind):
            raise UsageError(WRAP_NEEDS_A_CONTAINER)
        self._backend = self._run.make_backend()
        self.relay = Relay(self.filter, time.monotonic)
        self._stdin_fd, self._stdout_fd = stdin_fd, stdout_fd
        self._err = err or sys.stderr
        self._stream = _ServerStream(self)
        self._transport: Transport | None = None
        self._out_lock, self._err_lock, self._end_lock = threading.Lock(), threading.Lock(), threading.Lock()
        self._done = threading.Event()
        self.ended: tuple[str, str] | None = None  # (status, reason) of an early end
        self.exit_code = EXIT_OK
        self._client_closed_at: float | None = None
        self._calls = 0
        self._drops = 0  # client notifications dropped (a request method without an id)
        self._notes: dict[str, int] = {}
        self._tokens, self._tokens_at, self._stderr_dropped = STDERR_BURST, time.monotonic(), 0

    # the run -----------------------------------------------------------------------------
    def run(self) -> int:
        """Serve until the client or the server ends the session; the exit code (0, or 3 when the
        server ended first); SystemExit/KeyboardInterrupt (a signal) pass through after the clean-up."""
        t = self.policy.timeouts
        watchdog: Watchdog | None = None
        try:
            command = self._command()
            self._transport = transport = self._run.begin(
                self._stream, spec_extra={"entrypoint": LAUNCHER}, log_extra={"command": command},
                command=command, secrets=self.secrets.names(), deny_tools=sorted(self.filter.deny),
                allow_tools=sorted(self.filter.allow) if self.filter.allow is not None else None,
            )  # fmt: skip
            assert transport is not None
            config = json.dumps({"argv": self.argv, "env": self.secrets.wire()}) + "\n"
            transport.send(config.encode(), time.monotonic() + START_TIMEOUT_S)
            # the idle clock starts now that the client is read: the start-up (image, egress proxy, a
            # loaded host) must not count as idle, or a short idle_s ends the run before its first request
            self.relay.touch()
            watchdog = Watchdog(
                self._run.deadline, t.idle_s, self.relay.busy, self.relay.last_activity, self._on_expire
            ).start()
            threading.Thread(target=self._read_client, name="toolcage-mcp-client", daemon=True).start()
            killed = False
            while not self._done.wait(0.1):
                late = self.relay.overdue(t.call_s + timing.GRACE_S)
                if late:
                    what = late[0].tool or late[0].method
                    self.end(
                        "timeout",
                        "call_timeout",
                        f"the wrapped MCP server did not answer {what} within {t.call_s:g}s (timeouts.call_s)",
                    )
                closed = self._client_closed_at
                if closed is not None and not killed and time.monotonic() > closed + EOF_GRACE_S:
                    killed = True  # it did not exit when its input ended; the end of its stream ends the run
                    threading.Thread(target=self._backend.kill, name="toolcage-mcp-kill", daemon=True).start()
            return self.exit_code
        except BaseException as exc:
            if not isinstance(exc, Exception):  # SIGINT/SIGTERM (SystemExit from the CLI's handler)
                self.end("interrupted", "interrupted", "toolcage mcp wrap was stopped by a signal", quiet=True)
            elif self.ended is None:  # it never started (image, engine, egress proxy): run.finished says how
                self.ended = (getattr(exc, "status", "crashed"), getattr(exc, "reason", "error"))
            raise
        finally:
            if watchdog is not None:
                watchdog.stop()
            self._close()

    def _command(self) -> list[str]:
        """The command as logged and audited: its arguments redacted, in case a secret was typed there too."""
        return [self.secrets.redact_text(a)[:200] for a in self.argv[:32]]

    def _close(self) -> None:
        try:
            self._stream.close()
            self._backend.remove(self.keep)
        finally:
            if self._transport is not None:
                self._transport.close()
            self._run.finish(self.ended[0] if self.ended is not None else "ok", self._calls)

    # the ways it ends --------------------------------------------------------------------
    def end(self, status: str, reason: str, message: str, *, quiet: bool = False, exit_code: int = EXIT_FAILED) -> None:
        """End the run now (any thread; the first reason wins): kill the server, answer every pending request."""
        with self._end_lock:
            if self.ended is not None:
                return
            self.ended = (status, reason)
            self.exit_code = exit_code  # before the kill: the end of the server's stream may end the run at once
        # Not on this thread: called from the attach reader (a flood), a kill that waits for the container to
        # stop would wait on the engine, which waits for that reader to take the rest of the container's output.
        threading.Thread(target=self._backend.kill, name="toolcage-mcp-kill", daemon=True).start()
        tail = self._stream.stderr_tail(2000)
        self._perform(self.relay.fail_all(status, message, {"reason": reason, "stderr_tail": tail}))
        if not quiet:
            self._say(message)
        self._done.set()

    def _on_expire(self, which: Expiry) -> None:
        t = self.policy.timeouts
        if which == "run":
            self.end(
                "timeout",
                "run_deadline",
                f"the run deadline of {t.run_s:g}s passed (timeouts.run_s); the wrapped MCP server was killed",
            )
        else:
            self.end(
                "timeout", "idle", f"no request for {t.idle_s:g}s (timeouts.idle_s); the wrapped MCP server was killed"
            )

    def _server_eof(self) -> None:
        """The container's streams ended: the server (and so the container) exited (reader thread)."""
        if self.ended is not None or self._client_closed_at is not None:
            self._done.set()
            return
        status = self._backend.exit_status(5.0)
        code = status.exit_code
        tail = self._stream.stderr_tail(2000).strip()
        if status.oom_killed:
            self.end(
                "oom_killed",
                "memory_limit",
                f"the wrapped MCP server was killed by the memory limit ({self.policy.limits.memory} bytes)",
            )
            return
        message = f"the wrapped MCP server exited with code {code}"
        if tail:
            message += f"; its stderr ends: {tail[-500:]}"
        failed = code != 0 or self.relay.busy()
        self.end("crashed" if failed else "ok", "server_exited", message, exit_code=EXIT_FAILED if failed else EXIT_OK)

    # client -> server ----------------------------------------------------------------------
    def _read_client(self) -> None:
        lines = LineSplitter(MAX_LINE)
        while not self._done.is_set():
            try:
                chunk = os.read(self._stdin_fd, 1 << 16)
            except OSError:
                break
            if not chunk:
                break
            for line in lines.feed(chunk):
                if line is None:
                    too_long = f"Invalid Request: a line over {MAX_LINE} bytes"
                    self._to_client(error(None, codes.INVALID_REQUEST, too_long))
                elif line.strip():
                    self._perform(self.relay.from_client(line))
        self._client_closed()

    def _client_closed(self) -> None:
        """The client closed our stdin (or stopped reading our stdout): the session is over; the
        server gets EOF and EOF_GRACE_S to exit, then it is killed."""
        if self._client_closed_at is None:
            self._client_closed_at = time.monotonic()
            if self._transport is not None:
                self._transport.close_stdin()

    # server -> client ----------------------------------------------------------------------
    def _from_server(self, line: bytes) -> None:
        self._perform(self.relay.from_server(line))  # never activity by itself: see toolcage.servers.mcp_relay

    def _perform(self, acts: Actions) -> None:
        for data in acts.to_server:
            if self.ended is not None or self._transport is None:
                break
            try:
                self._transport.send(data, time.monotonic() + self.policy.timeouts.call_s)
            except TimeoutError:
                self.end("timeout", "stalled", "the wrapped MCP server stopped reading its input")
            except OSError:
                pass  # the server is gone: the end of its stream says how
        for msg in acts.to_client:
            self._to_client(msg)
        for event, fields in acts.notes:
            self._note(event, fields)
        for call in acts.calls:
            self._audit_call(call)
        for dropped in acts.dropped:
            self._audit_drop(dropped)

    def _to_client(self, msg: dict[str, Any]) -> None:
        """One message on our stdout: re-serialised (ASCII JSON), with every secret value redacted."""
        data = (dumps(self.secrets.redact(msg), separators=(",", ":")) + "\n").encode()
        with self._out_lock:
            view = memoryview(data)
            try:
                while view:
                    view = view[os.write(self._stdout_fd, view) :]
            except OSError:  # the client is gone
                self._client_closed()

    def _audit_call(self, call: Call) -> None:
        self._calls += 1
        err = {"code": call.error_code, "message": ""} if call.error_code is not None else None
        params = call.arguments if isinstance(call.arguments, dict) else {"arguments": call.arguments}
        result = CallResult(call.status, call.tool, self.run_id, error=err, wall_ms=call.wall_ms)
        records.audit_call(self.audit, self.run_id, params, result)

    def _audit_drop(self, dropped: dict[str, Any]) -> None:
        """``mcp.notification_dropped``: the first AUDIT_DROPS_FIRST, then one in NOTE_EVERY with the count
        so far (a client that floods them cannot fill the disk)."""
        self._drops += 1
        n = self._drops
        if self.audit is None or (n > AUDIT_DROPS_FIRST and n % NOTE_EVERY != 0):
            return
        args = dropped.pop("arguments", None)
        params = args if isinstance(args, dict) else {"arguments": args}
        extra = {"_params": params} if "tool" in dropped else {}  # arguments only as size and digest
        fields = self.secrets.redact(dropped)
        self.audit.event_later("mcp.notification_dropped", run_id=self.run_id, count=n, **fields, **extra)

    # what we say on stderr -----------------------------------------------------------------
    def _say(self, message: str) -> None:
        with self._err_lock:
            self._err.write(f"toolcage: {escape(self.secrets.redact_text(message))}\n")
            self._err.flush()

    def _note(self, event: str, fields: dict[str, Any]) -> None:
        """Something the relay refused or dropped: logged, the first few of each kind, then one in NOTE_EVERY."""
        n = self._notes[event] = self._notes.get(event, 0) + 1
        if n <= NOTE_FIRST or n % NOTE_EVERY == 0:
            self.log.warning(event, count=n, **self.secrets.redact(fields))

    def _server_log(self, line: str) -> None:
        """One line of the server's stderr (already redacted and cut by the stream): escaped, rate-limited."""
        now = time.monotonic()
        self._tokens = min(STDERR_BURST, self._tokens + (now - self._tokens_at) * STDERR_LINES_PER_S)
        self._tokens_at = now
        if self._tokens < 1:
            self._stderr_dropped += 1
            return
        self._tokens -= 1
        with self._err_lock:
            if self._stderr_dropped:
                self._err.write(
                    f"toolcage: warning: {self._stderr_dropped} lines of the server's stderr not shown (rate limit)\n"
                )
                self._stderr_dropped = 0
            self._err.write(f"toolcage: server: {escape(line[:STDERR_LINE_SHOWN])}\n")
            self._err.flush()


__all__ = ["LAUNCHER", "McpWrap", "secret_store"]
