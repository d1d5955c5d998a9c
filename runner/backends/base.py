"""The backend seam: what ``Run`` needs of whatever runs a worker, and the options every backend takes.

A backend completes a run's container spec with what only it knows (its runtime, the engine's flavour,
host paths), starts the worker and hands back a transport to its stdio, kills it, says how it ended and
removes what it made. Nothing above the seam asks which backend it has: a new one is a module with a
class like ``ContainerBackend`` and an entry in ``toolcage.backends.BACKENDS``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from toolcage.engine.api import EngineAPI
from toolcage.engine.labels import RunSpec
from toolcage.policies import Policy
from toolcage.rpc.transport import StreamParser, Transport


@dataclass(frozen=True)
class ExitStatus:
    """How the worker ended. ``oom_killed``: the worker itself was killed by the memory limit;
    ``removed``: its container is gone, removed by someone other than its run; ``why``: what the backend
    knows of such an end, said after the exit code."""

    exit_code: int | None
    oom_killed: bool = False
    removed: bool = False
    why: str = ""  # what the backend knows of such an end (said after the exit code)


@dataclass(frozen=True)
class BackendOptions:
    """Everything a backend may use, typed (``RunOptions.backend_options`` plus the run's own name, log
    and redaction); each backend reads the fields it needs."""

    name: str  # the container's name (the run's)
    log: Any  # the run's bound logger
    image: str
    # the egress proxy's image: the worker image of this installation (``$TOOLCAGE_IMAGE`` or the default),
    # never the run's own, whose added packages could shadow the proxy's code (RunOptions.backend_options)
    proxy_image: str
    engine: EngineAPI | None = None  # None: the default engine, asked for when first needed
    audit: Any = None  # the run's audit log (the egress proxy's decisions are written to it)
    workspace: str | None = None
    egress_network: str | None = None
    egress_proxy: str | None = None  # an upstream proxy for the egress proxy
    ca_pem: str | None = None
    # the run's secrets out of the proxy's records (a pooled slot's: its adopting run's, late)
    redact: Callable[[Any], Any] | None = None
    # set by a Sandbox's own run: ``start`` returns once the worker is started, not also its egress proxy,
    # which comes up beside it (the worker's relay holds a connection until it listens); a proxy that then
    # fails to come up ends the run through this, from the thread that saw it. None (a pool's slot, mcp
    # wrap): ``start`` waits for the proxy too, and raises what stopped it.
    on_late_failure: Callable[[Any], None] | None = None


class Backend(Protocol):
    """One run's backend (what its kind is: ``BackendClass``, the registry's entry)."""

    container_id: str | None
    sandbox_user: bool  # the worker runs as uid 65532 (the workspace must be readable by it)

    def image_id(self) -> str | None:
        """The image the worker will run, for ``run.started`` (before anything is created)."""
        ...

    def complete(self, run: RunSpec) -> RunSpec:
        """``run`` with what this backend decides (runtime, engine flavour, host paths, the egress volume),
        before anything is created; ``start`` takes the completed spec as it is."""
        ...

    def start(self, run: RunSpec, parser: StreamParser) -> Transport: ...

    def kill(self) -> None:
        """Stop the worker now; safe from any thread, at any time, more than once."""
        ...

    def exit_status(self, timeout: float) -> ExitStatus: ...

    def remove(self, keep: bool) -> None:
        """Free everything the run made (unless ``keep``: leave it for inspection)."""
        ...


class BackendClass(Protocol):
    """A registry entry: the class itself, with its kind's facts (how strong a wall, whether the worker
    runs in a container: mounts, a sandbox user; whether ``auto`` may pick it), and how to make one."""

    strength: int
    in_container: bool
    auto: bool
    how_to_use: str  # how to get a run of this kind (a policy's isolation minimum names it)

    def __call__(self, policy: Policy, options: BackendOptions) -> Backend: ...

    def unavailable(self, engine: EngineAPI | None) -> str | None:
        """Why this engine cannot serve the kind (with the fix), or None."""
        ...


class Background:
    """A function run on a thread of its own; ``join`` waits for it and raises what it raised."""

    def __init__(self, fn: Callable[[], Any], name: str) -> None:
        self._fn: Callable[[], Any] = fn
        self._error: BaseException | None = None
        self._done = threading.Event()
        threading.Thread(target=self._run, name=name, daemon=True).start()

    def _run(self) -> None:
        try:
            self._fn()
        except BaseException as exc:
            self._error = exc
        finally:
            self._done.set()

    def join(self) -> None:
        self._done.wait()
        if self._error is not None:
            raise self._error


__all__ = ["Backend", "BackendClass", "BackendOptions", "Background", "ExitStatus"]
