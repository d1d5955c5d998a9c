"""``--sandbox gvisor``: the container backend under gVisor's runsc, a user-space kernel between tool code
and the host's. Everything gVisor changes in a container is one value (``toolcage.engine.knobs.GVISOR``);
what the engine must have registered for it is checked here, once, before a run starts."""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

from toolcage.backends.base import ExitStatus
from toolcage.backends.container import ContainerBackend
from toolcage.engine.api import EngineAPI
from toolcage.engine.knobs import GVISOR, RUNC, RuntimeKnobs

# runsc flags the gvisor kind's walls depend on: without --oci-seccomp toolcage's seccomp profile is not
# applied inside gVisor (ptrace, io_uring, raw sockets open there); without --overlay2=none runsc
# lays a writable memory overlay on the read-only root. Podman, for one, lists a runsc it found on
# the PATH with none of them (and kata and krun that are not installed).
GVISOR_REQUIRED_ARGS = ("--oci-seccomp", "--overlay2=none")

# exit code 2 is runsc's sentry ending on a fatal error. What ends it in a sandbox is the host cgroup's
# backstop (engine.knobs): its pids limit, which the sentry's own threads meet (with the ptrace platform
# they grow with how many processes ran at once: ~200 more after each fork bomb at a limit of 64, so about
# the tenth ends the run), or its memory limit.
SENTRY_ENDED = (
    "gVisor's kernel ended, most likely at the host's backstop limit on its own threads or memory after many "
    "processes ran at once (docs/operating.md, gVisor)"
)


def runsc_args(info: dict[str, Any]) -> list[str] | None:
    """runsc's runtimeArgs as the engine has it registered (``docker info``'s Runtimes); None: not at all."""
    runtimes = info.get("Runtimes") or {}
    return list((runtimes.get("runsc") or {}).get("runtimeArgs") or []) if "runsc" in runtimes else None


def gvisor_problem(info: dict[str, Any]) -> str | None:
    """Why the engine's runsc cannot serve the gvisor kind, or None."""
    args = runsc_args(info)
    if args is None:
        return "the engine has no runsc runtime registered"
    missing = [a for a in GVISOR_REQUIRED_ARGS if a not in args]
    if missing:
        return (
            f"the engine's runsc runtime is registered without {' and '.join(missing)} (its runtimeArgs: "
            f"{' '.join(args) or 'none'}): toolcage's seccomp profile and read-only root would not hold there"
        )
    return None


def gvisor_registered(info: dict[str, Any]) -> bool:
    """Whether the engine has gVisor's runsc registered as a runtime, with the flags the kind needs."""
    return gvisor_problem(info) is None


def gvisor_networked(info: dict[str, Any]) -> bool:
    """Whether runsc is registered with a network stack of its own, so a container with a network (the
    egress proxy) can run under it. Registered with ``--network=none`` it cannot: the egress proxy
    of a gVisor sandbox then runs under the engine's default runtime."""
    args = runsc_args(info)
    return args is not None and "--network=none" not in args


class GVisorBackend(ContainerBackend):
    """One hardened container per run, under runsc."""

    strength: ClassVar[int] = 2
    how_to_use: ClassVar[str] = (
        "register gVisor's runsc with the engine (README: gVisor) and use --sandbox gvisor or auto"
    )
    runtime: ClassVar[RuntimeKnobs] = GVISOR

    @classmethod
    def unavailable(cls, engine: EngineAPI | None) -> str | None:
        if engine is None:
            from toolcage.engine.docker_adapter import Engine

            engine = Engine.default()
        problem = gvisor_problem(engine.info())
        if problem is None:
            return None
        return (
            f"--sandbox gvisor: {problem}. Register runsc as the README's gVisor section shows "
            "(`.ci/register-runsc` does it), or use --sandbox container"
        )

    def exit_status(self, timeout: float) -> ExitStatus:
        status = super().exit_status(timeout)
        if status.exit_code == 2 and not status.removed and not status.oom_killed:
            return dataclasses.replace(status, why=SENTRY_ENDED)
        return status

    def proxy_runtime(self) -> RuntimeKnobs:
        """runsc for the egress proxy too, unless runsc has no network stack to give it (then runc)."""
        return GVISOR if gvisor_networked(self.engine.info()) else RUNC


__all__ = [
    "GVISOR_REQUIRED_ARGS",
    "GVisorBackend",
    "gvisor_networked",
    "gvisor_problem",
    "gvisor_registered",
    "runsc_args",
]
