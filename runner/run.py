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
from datetime import UTC, datetime
from secrets import token_hex
from typing import TYPE_CHECKING, Any

from toolcage import logs, ownership
from toolcage.backends import ExitStatus
from toolcage.config import RunSpec, container_name
from toolcage.errors import UsageError

if TYPE_CHECKING:
    from toolcage.options import RunOptions


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


class Run:
    """A run's id, name and log, its RunSpec and its audit records (``run.started``, ``run.finished``)."""

    def __init__(self, options: RunOptions, run_id: str | None = None, **log_context: Any) -> None:
        self.options = options
        self.run_id = run_id or token_hex(4)
        self.name = container_name(options.tool, self.run_id)
        self.log = logs.get_logger(run_id=self.run_id, name=self.name, **log_context)

    @property
    def max_line(self) -> int:
        """The longest line its session takes from the worker: 16 times the output cap (a result is
        escaped JSON) plus 1 MiB for the rest of the answer."""
        return 16 * self.options.policy.limits.output_cap + (1 << 20)

    def spec(self, deadline: float, started_at: str | None = None, **extra: Any) -> RunSpec:
        """The run's container spec (``deadline``: epoch seconds; ``started_at``: default now; ``extra``: a
        door's own fields, such as a pool's id and environment or ``mcp wrap``'s entrypoint)."""
        opts = self.options
        host_pid, owner_started = ownership.owner()
        return RunSpec(
            run_id=self.run_id,
            tool=opts.tool,
            image=opts.image,
            policy_name=opts.policy.name,
            started_at=started_at or now_iso(),
            deadline=deadline,
            owner=host_pid,
            owner_started=owner_started,
            workspace=opts.workspace,
            keep=opts.keep,
            tool_mounts=tuple((str(src.path), src.target) for src in opts.tool_sources),
            **extra,
        )

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


class AdoptedBackend:
    """The adopting run's view of a pool's slot: kill at once, removal in the pool's background."""

    sandbox_user = True

    def __init__(self, slot: Any) -> None:
        self._slot = slot
        self.container_id = slot.backend.container_id  # started before adoption: known, and never changes

    def image_id(self) -> str | None:
        return self._slot.image_id  # type: ignore[no-any-return]  # read when the slot was made: no engine trip

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

    def start(self, run: RunSpec, parser: Any) -> Any:
        raise UsageError("a pooled sandbox is started by its pool")

    def kill(self) -> None:
        return None

    def exit_status(self, timeout: float) -> ExitStatus:
        return ExitStatus(None)

    def remove(self, keep: bool) -> None:
        return None


__all__ = ["AdoptedBackend", "NotAdopted", "Run"]
