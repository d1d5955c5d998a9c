"""One run's identity and records, in one place for every door (Sandbox, a pool's slot, ``mcp wrap``).

A run has an id, a container name and a logger bound to both; its container spec (``RunSpec``) is
built here and nowhere else; its ``run.started`` and ``run.finished`` audit records carry one field
set whichever door made the run (a door adds only what is its own: the pool a slot came from, the
wrapped command). Also here: what an adopting run sees of a pool's slot (``AdoptedBackend``) and a
pooled Sandbox before it adopts one (``NotAdopted``), so ``sandbox`` and ``pool`` need not import
each other.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime
from secrets import token_hex
from typing import TYPE_CHECKING, Any

from toolcage import logs
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
from toolcage.lifecycle.watchdog import Watchdog
from toolcage.rpc.session import Ended, Session

if TYPE_CHECKING:
    from toolcage.lifecycle.watchdog import Expiry
    from toolcage.options import RunOptions

EXIT_WAIT_S = 5.0  # how long to wait for a worker whose stream ended to report its exit


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


def interrupted_error(run_id: str) -> SandboxError:
    """The run was stopped by its runner (SIGINT, SIGTERM, KeyboardInterrupt) mid-way."""
    return SandboxInterrupted("the run was interrupted; the sandbox was killed", run_id=run_id)


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

    def adopted(self, options: RunOptions) -> Run:
        """A pool's prestarted run taken over by the run that adopts its slot (with that run's options:
        the pool's, or its own audit log); its id, name, log and session stay, its clock starts later."""
        self.options = options
        return self

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
        return WorkerCrashed(
            f"the worker exited unexpectedly (exit code {status.exit_code})",
            exit_code=status.exit_code,
            stderr_tail=tail[-2000:],
        )


class AdoptedBackend:
    """The adopting run's view of a pool's slot: kill at once, removal in the pool's background."""

    sandbox_user = True

    def __init__(self, slot: Any) -> None:
        self._slot = slot
        self.container_id = slot.backend.container_id  # started before adoption: known, and never changes

    def image_id(self) -> str | None:
        return self._slot.image_id  # type: ignore[no-any-return]  # read when the slot was made: no engine trip

    def complete(self, run: RunSpec) -> RunSpec:
        return run  # its spec was completed when the slot started

    def start(self, run: RunSpec, parser: Any) -> Any:
        raise UsageError("a pooled sandbox is started by its pool")

    def kill(self) -> None:
        self._slot.backend.kill()

    def exit_status(self, timeout: float) -> ExitStatus:
        return self._slot.backend.exit_status(timeout)  # type: ignore[no-any-return]

    def remove(self, keep: bool) -> None:
        self._slot.pool._retire(self._slot, "used")  # off the caller's path: the pool's remover does it


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


__all__ = ["AdoptedBackend", "NotAdopted", "Run", "interrupted_error"]
