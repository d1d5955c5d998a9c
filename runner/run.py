"""One run's identity, records and steps, in one place for every door (Sandbox, a pool's slot, ``mcp wrap``).

A run has an id, a container name and a logger bound to both; its container spec (``RunSpec``) is
built here and nowhere else; its ``run.started`` and ``run.finished`` audit records carry one field
set whichever door made the run (a door adds only what is its own: the pool a slot came from, the
wrapped command). Its steps are here too: ``Run.begin`` (the live set, ``run.started`` audited, the
container started, the watchdog, the ``run.started`` log line) and ``Run.finish`` (the summary, the
``run.finished`` log line and audit record), in one order for every door. Also here: a pooled Sandbox
before it adopts a slot (``NotAdopted``), so ``sandbox`` and ``pool`` need not import each other.
"""

from __future__ import annotations

import atexit
import threading
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from secrets import token_hex
from typing import TYPE_CHECKING, Any

from toolcage import logs, telemetry
from toolcage.backends import Backend, BackendOptions, ExitStatus, make_backend
from toolcage.engine import ownership
from toolcage.engine.labels import RunSpec, container_name
from toolcage.errors import (
    ProtocolError,
    SandboxError,
    SandboxInterrupted,
    SandboxOOM,
    SandboxTimeout,
    UsageError,
    WorkerCrashed,
)
from toolcage.lifecycle import records
from toolcage.lifecycle import removal as removal  # imported before _close_live is registered: see there
from toolcage.lifecycle.watchdog import Watchdog
from toolcage.results import RunSummary
from toolcage.rpc.session import Ended, Session

if TYPE_CHECKING:
    from toolcage.lifecycle.watchdog import Expiry
    from toolcage.options import RunOptions
    from toolcage.rpc.transport import StreamParser, Transport

EXIT_WAIT_S = 5.0  # how long to wait for a worker whose stream ended to report its exit


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


def interrupted_error(run_id: str) -> SandboxError:
    """The run was stopped by its runner (SIGINT, SIGTERM, KeyboardInterrupt) mid-way."""
    return SandboxInterrupted("the run was interrupted; the sandbox was killed", run_id=run_id)


# runs begun and not finished, with what closes each: closed at interpreter exit if still open. The hook
# is registered after removal's and records' (imported above): exit hooks run last in, first out, so the
# live runs close first, then the removals they scheduled are waited for and their refusal counts written
_LIVE: dict[Run, Callable[[], object]] = {}
_LIVE_LOCK = threading.Lock()


@atexit.register
def _close_live() -> None:
    with _LIVE_LOCK:
        closers = list(_LIVE.values())
    for close in closers:
        try:
            close()
        except Exception:  # noqa: S110 - best effort at interpreter exit
            pass


class Run:
    """A run's id, name and log, its RunSpec, its audit records (``run.started``, ``run.finished``), its
    clock and why it ended (the first reason wins; the sandbox is killed from whichever thread saw it)."""

    def __init__(self, options: RunOptions, run_id: str | None = None, **log_context: Any) -> None:
        self.options = options
        self.run_id = run_id or token_hex(4)
        self.name = container_name(options.tool, self.run_id)
        self.log = logs.get_logger(run_id=self.run_id, name=self.name, **log_context)
        self.backend: Backend = NotAdopted()  # what runs it (set by its door)
        self.session: Session | None = None  # its one session with the worker
        self.dead: SandboxError | None = None  # why the run can take no more calls
        self.started = 0.0  # monotonic, set by start_clock()
        self.deadline = 0.0  # monotonic: started + run_s
        self.watchdog: Watchdog | None = None  # started by begin() for a run with a session
        self.audited = False  # its run.started was recorded (so its run.finished is)
        self.calls = 0  # calls answered and audited (run.finished counts them)
        self.input_closed = False  # its worker's stdin was closed on purpose: it exits once it has answered
        self._audit_later = False  # ... queued, not on disk at once (a pooled run): run.finished too

    def adopt(self, options: RunOptions) -> Run:
        """A pool's prestarted run taken over by the run that adopts its slot (with that run's options:
        the pool's, or its own audit log); its id, name, log and session stay; its clock starts now."""
        self.options = options
        self.start_clock()
        return self

    # a run's steps, the same for every door --------------------------------------------------
    def begin(
        self,
        parser: StreamParser | None,
        *,
        closer: Callable[[], object] | None = None,
        image_id: str | None = None,
        spec_extra: Mapping[str, Any] | None = None,
        log_extra: Mapping[str, Any] | None = None,
        **audit_extra: Any,
    ) -> Transport | None:
        """Begin the run, in the order every door follows:

        1. its clock starts (an adopted run's started at adoption, :meth:`adopt`);
        2. ``closer`` enters the live set: it is called at interpreter exit if the run is still open;
        3. ``run.started`` is audited (``audit_extra``: the door's own fields): on disk before the
           container exists, so a runner killed right after creating it still leaves a trace; an
           adopted run's is queued (its slot's ``pool.slot_created`` was on disk before its container);
        4. the container starts from its spec (``spec_extra``: the door's fields) with ``parser``
           reading its output, and the run's session (if any) is connected to it; ``parser`` None:
           the container runs already (a pool's slot), and its ``image_id`` is given;
        5. a run with a session gets its watchdog (the deadline and idle timeout end it);
        6. the ``run.started`` log line (``log_extra``: the door's own fields).

        Returns the container's transport (None for an adopted run). On failure the door closes the run."""
        if parser is not None:
            self.start_clock()
        telemetry.run_began(self.run_id, self.options, pooled=parser is None)
        if closer is not None:
            with _LIVE_LOCK:
                _LIVE[self] = closer
        if self.options.audit is not None:
            later = parser is None
            self.audit_started(image_id if parser is None else self.backend.image_id(), later=later, **audit_extra)
            self.audited, self._audit_later = True, later
        transport = None
        if parser is not None:
            transport = self.launch(parser, self.deadline_from_now(), **(spec_extra or {}))
        if self.session is not None:
            # idle time counts from here: neither a door's work before it (writable='s read of the image's trees,
            # minutes for a big one) nor a pooled slot's wait before its adoption is idling
            self.session.last_activity = time.monotonic()
            self.watchdog = self.watch(self.session)
        started = self.options.started_fields()
        self.log.info("run.started", container_id=self.backend.container_id, **started, **(log_extra or {}))
        return transport

    def launch(self, parser: StreamParser, deadline: float, **spec_extra: Any) -> Transport:
        """The run's container, started by its backend from its spec (``deadline``: epoch seconds;
        ``spec_extra``: the door's fields), with ``parser`` reading its output; the run's session (if
        any) is connected to it. :meth:`begin` does it for a run; a pool, for a slot waiting for one."""
        with telemetry.starting(self.run_id):
            transport = self.backend.start(self.spec(deadline, **spec_extra), parser)
        if self.session is not None:
            self.session.connect(transport)
        return transport

    def finish(self, status: str, calls: int, usage: Mapping[str, Any] | None = None) -> RunSummary:
        """Finish the run's records, the same for every door (once its container is removed or its removal
        scheduled): it leaves the live set; its summary (``usage``: the last CPU time and peak memory read);
        the ``run.finished`` log line; and, when its ``run.started`` was, the ``run.finished`` audit record
        after the refused egress counted since the last flush (queued like its ``run.started``)."""
        with _LIVE_LOCK:
            _LIVE.pop(self, None)
        usage = usage or {}
        summary = RunSummary(
            run_id=self.run_id,
            name=self.name,
            status=status,
            wall_ms=round((time.monotonic() - self.started) * 1000, 3) if self.started else 0.0,
            cpu_ms=usage.get("cpu_ms"),
            peak_memory_bytes=usage.get("peak_memory_bytes"),
            calls=calls,
        )
        self.log.info("run.finished", **summary.to_dict())
        telemetry.run_finished(summary)
        if self.options.audit is not None and self.audited:
            records.flush_refusals(self.run_id)
            self.audit_finished(
                status, self.backend.container_id, summary.wall_ms, calls,
                cpu_ms=summary.cpu_ms, peak_memory_bytes=summary.peak_memory_bytes, later=self._audit_later,
            )  # fmt: skip
        return summary

    def start_clock(self) -> None:
        """The run starts now: its deadline is run_s from here (a pooled run: from adoption)."""
        self.started = time.monotonic()
        self.deadline = self.started + self.options.policy.timeouts.run_s

    @property
    def max_line(self) -> int:
        """The longest line its session takes from the worker: 16 times the output cap (a result is
        escaped JSON) plus 1 MiB for the rest of the answer."""
        return 16 * self.options.policy.limits.output_cap + (1 << 20)

    def make_backend(self, redact: Callable[[Any], Any] | None = None, *, late_egress: bool = False) -> Backend:
        """The backend of the run's kind, made once from the run's options, name and log (``redact``: the
        run's secrets out of its egress proxy's records); it becomes the run's backend. ``late_egress``: its
        start does not wait for the egress proxy, and a proxy that fails later ends this run
        (``BackendOptions.on_late_failure``)."""
        opts = self.options
        options = BackendOptions(
            name=self.name,
            log=self.log,
            redact=redact,
            on_late_failure=self.end if late_egress else None,
            **opts.backend_options(),
        )
        self.backend = make_backend(opts.kind, opts.policy, options)
        return self.backend

    def spec(self, deadline: float, started_at: str | None = None, **extra: Any) -> RunSpec:
        """The run's container spec, complete: the run's fields, the door's (``extra``: a pool's id and
        environment, ``mcp wrap``'s entrypoint) and what its backend decides (runtime, engine flavour, host
        paths, egress volume), before anything is created (``deadline``: epoch seconds; ``started_at``:
        default now). The backend starts it as it is."""
        opts = self.options
        host_pid, owner_started = ownership.owner()
        spec = RunSpec(
            run_id=self.run_id,
            tool=opts.tool,
            image=opts.image,
            policy_name=opts.policy.name,
            started_at=started_at or now_iso(),
            deadline=deadline,
            owner=host_pid,
            owner_started=owner_started,
            workspace=None if opts.workspace_copy else opts.workspace,
            workspace_copy=opts.workspace_copy,
            writable=opts.writable,
            keep=opts.keep,
            tool_mounts=tuple((str(src.path), src.target) for src in opts.tool_sources),
            **extra,
        )
        return self.backend.complete(spec)

    def deadline_from_now(self) -> float:
        """The run's wall-clock deadline if it starts now (epoch seconds)."""
        return time.time() + self.options.policy.timeouts.run_s

    def audit_started(self, image_id: str | None, *, later: bool = False, **extra: Any) -> None:
        """``run.started``, the same fields for every door (``extra``: the door's own). ``later``: queued
        (a pooled run: its slot's record was on disk before the container existed), else on disk now,
        before the container exists: a runner killed right after creating it still leaves a trace."""
        audit, opts = self.options.audit, self.options
        if audit is None:
            return
        record = audit.event_later if later else audit.event
        record(
            "run.started",
            run_id=self.run_id,
            name=self.name,
            tool=opts.tool,
            image=opts.image,
            image_id=image_id,
            owner=ownership.owner()[0],
            network=opts.policy.network.mode,
            **opts.started_fields(),
            **extra,
        )

    def audit_finished(
        self,
        status: str,
        container_id: str | None,
        duration_ms: float,
        calls: int,
        *,
        cpu_ms: float | None = None,
        peak_memory_bytes: int | None = None,
        later: bool = False,
    ) -> None:
        """``run.finished``, the same fields for every door."""
        audit = self.options.audit
        if audit is None:
            return
        record = audit.event_later if later else audit.event
        record(
            "run.finished",
            run_id=self.run_id,
            name=self.name,
            container_id=container_id,
            status=status,
            duration_ms=duration_ms,
            cpu_ms=cpu_ms,
            peak_memory_bytes=peak_memory_bytes,
            oom_killed=status == "oom_killed",  # the run itself; a call's child OOM is that call's status
            calls=calls,
        )

    def watch(self, session: Session) -> Watchdog:
        """The run's watchdog, started: its deadline and its idle timeout end it (``on_expire``)."""
        t = self.options.policy.timeouts
        return Watchdog(self.deadline, t.idle_s, session.busy, lambda: session.last_activity, self.on_expire).start()

    # the ways a run ends early -----------------------------------------------------------
    def on_protocol_violation(self, reason: str) -> None:
        """The stream broke (reader thread): kill the sandbox now, even if no call is waiting."""
        self.log.warning("run.protocol_violation", reason=reason)
        self.end(ProtocolError(f"protocol error: {reason}; the sandbox was killed"))

    def on_expire(self, which: Expiry) -> None:
        """The run deadline or the idle timeout passed (watchdog thread): kill the sandbox now."""
        t = self.options.policy.timeouts
        self.log.warning(f"run.{'deadline' if which == 'run' else 'idle'}", run_s=t.run_s, idle_s=t.idle_s)
        self.end(self.expiry_error(which))

    def expiry_error(self, which: Expiry) -> SandboxTimeout:
        t = self.options.policy.timeouts
        if which == "run":
            return SandboxTimeout(f"run exceeded its deadline of {t.run_s:g}s (timeouts.run_s); the sandbox was killed")
        return SandboxTimeout(
            f"the sandbox was idle for {t.idle_s:g}s (timeouts.idle_s); the sandbox was killed", reason_detail="idle"
        )

    def interrupt(self) -> SandboxError:
        """Stop the run now (SIGINT, SIGTERM): kill the sandbox, record ``interrupted``; never waits on
        the worker. Returns why the run ended (an earlier reason, such as the deadline, wins)."""
        self.end(interrupted_error(self.run_id))
        assert self.dead is not None
        return self.dead

    def end(self, exc: SandboxError) -> None:
        """The first reason the run ended wins; the sandbox is killed at once from whichever thread saw it."""
        self.fail(exc)
        self.backend.kill()

    def fail(self, exc: SandboxError) -> SandboxError:
        exc.details.setdefault("run_id", self.run_id)
        if self.dead is None:
            self.dead = exc
        return self.dead

    def explain_end(self, end: Ended) -> SandboxError:
        """Why no answer came, as the error the caller gets (the sandbox is dead by then)."""
        if self.dead is not None:
            self.backend.kill()
            return self.dead
        if end.how == "broken":
            self.end(ProtocolError(f"protocol error: {end.reason}; the sandbox was killed"))
        elif end.how == "timeout":
            if time.monotonic() >= self.deadline:
                self.on_expire("run")
            else:
                self.end(
                    SandboxTimeout(
                        "the worker did not answer within the call timeout; the sandbox was killed",
                        reason_detail="call",
                    )
                )
        else:
            self.fail(self.explain_exit() or WorkerCrashed("the worker exited while a call was pending"))
        assert self.dead is not None
        return self.dead

    def explain_exit(self, clean_ok: bool = False) -> SandboxError | None:
        """The worker's stream ended: find out why (deadline, OOM, crash); None if it ended cleanly."""
        if self.dead is not None:
            return self.dead
        status = self.backend.exit_status(EXIT_WAIT_S)
        if self.dead is not None:  # the watchdog or the parser saw it first
            return self.dead
        if status.removed:
            from toolcage.lifecycle.reaper import removed_message

            path = getattr(self.options.audit, "path", None)
            msg, details = removed_message(path, self.backend.container_id or "")
            return WorkerCrashed(msg, exit_code=status.exit_code, **details)
        if clean_ok and status.exit_code == 0:
            return None  # a child's OOM kill along the way was that call's status, not the run's
        if status.oom_killed:
            return SandboxOOM(
                f"the worker was killed by the memory limit ({self.options.policy.limits.memory} bytes)",
                exit_code=status.exit_code,
            )
        tail = self.session.parser.stderr_tail() if self.session else ""
        why = f": {status.why}" if status.why else ""
        return WorkerCrashed(
            f"the worker exited unexpectedly (exit code {status.exit_code}){why}",
            exit_code=status.exit_code,
            stderr_tail=tail[-2000:],
        )


class NotAdopted:
    """A ``Sandbox(pool=...)`` before ``start()``: nothing exists yet."""

    sandbox_user = True
    container_id: str | None = None

    def image_id(self) -> str | None:
        return None

    def complete(self, run: RunSpec) -> RunSpec:
        return run

    def start(self, run: RunSpec, parser: Any) -> Any:
        raise UsageError("a pooled sandbox is started by its pool")

    def kill(self) -> None:
        return None

    def exit_status(self, timeout: float) -> ExitStatus:
        return ExitStatus(None)

    def remove(self, keep: bool) -> None:
        return None


__all__ = ["NotAdopted", "Run", "interrupted_error"]
