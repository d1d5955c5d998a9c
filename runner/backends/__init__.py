"""Where a worker runs: the one seam between ``Sandbox`` and a container engine or a local process.

A backend starts the worker and hands back a transport to its stdio, kills it, says how it
ended and removes what it made. ``Sandbox`` never asks which backend it has; a new one
(gVisor, Podman) is a class with these five methods and an entry in ``BACKENDS``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from toolcage import logs
from toolcage.engine import hostpaths
from toolcage.engine.api import EngineAPI
from toolcage.engine.hostconfig import GVISOR, PROXY_SOCKET, RunSpec, container_config, worker_image
from toolcage.errors import SandboxError, ToolcageError, UsageError
from toolcage.lifecycle import removal
from toolcage.policies import Policy, contract
from toolcage.rpc.transport import DockerAttachTransport, ProcessTransport, StreamParser, Transport

NONE_WARNING = (
    "--sandbox none: the tool runs as a plain process on this host with your privileges. "
    "NOTHING IS ISOLATED (no container, no read-only workspace, no network block). Development only."
)
# how --sandbox none starts the worker (tests swap in misbehaving workers)
LOCAL_WORKER_ARGV = [sys.executable, "-m", "toolcage.worker"]


@dataclass(frozen=True)
class ExitStatus:
    """How the worker ended. ``oom_killed``: the worker itself was killed by the memory limit;
    ``removed``: its container is gone, removed by someone other than its run."""

    exit_code: int | None
    oom_killed: bool = False
    removed: bool = False


class Backend(Protocol):
    container_id: str | None
    sandbox_user: bool  # the worker runs as uid 65532 (the workspace must be readable by it)

    def image_id(self) -> str | None:
        """The image the worker will run, for ``run.started`` (before anything is created)."""
        ...

    def start(self, run: RunSpec, parser: StreamParser) -> Transport: ...

    def kill(self) -> None:
        """Stop the worker now; safe from any thread, at any time, more than once."""
        ...

    def exit_status(self, timeout: float) -> ExitStatus: ...

    def remove(self, keep: bool) -> None:
        """Free everything the run made (unless ``keep``: leave it for inspection)."""
        ...


class ContainerBackend:
    """One hardened container per run (plus, for ``network.mode: proxy``, its egress proxy)."""

    sandbox_user = True

    def __init__(
        self,
        policy: Policy,
        *,
        engine: EngineAPI | None,
        image: str,
        name: str,
        log: Any,
        audit: Any,
        egress_network: str | None,
        egress_proxy: str | None,
        ca_pem: str | None,
        runtime: str | None = None,
        redact: Any = None,  # the run's secrets out of the proxy's records (a pooled slot's: its owner's, late)
        **_unused: Any,
    ) -> None:
        self.policy, self.image, self.name, self.log, self.audit = policy, image, name, log, audit
        self.redact = redact
        self.runtime = runtime
        self._engine = engine
        self.egress_network, self.egress_proxy, self.ca_pem = egress_network, egress_proxy, ca_pem
        self.container_id: str | None = None
        self._egress: Any = None

    @property
    def engine(self) -> Any:
        if self._engine is None:
            from toolcage.engine.docker_adapter import Engine

            self._engine = Engine.default()
        return self._engine

    def image_id(self) -> str | None:
        try:
            return (self.engine.image(self.image) or {}).get("Id")
        except ToolcageError:
            return None  # start() reports the engine or the image as missing, with the fix

    def _proxy_runtime(self) -> str | None:
        """The egress proxy's runtime: the sandbox's, unless runsc has no network stack to give it."""
        if self.runtime != GVISOR or self.policy.network.mode != "proxy":
            return self.runtime
        from toolcage.ops.engines import gvisor_networked

        return GVISOR if gvisor_networked(self.engine.info()) else None

    def start(self, run: RunSpec, parser: StreamParser) -> Transport:
        from toolcage.lifecycle.reaper import reap_in_background

        reap_in_background(self.engine, self.log, self.audit)
        run = dataclasses.replace(
            run, runtime=self.runtime, proxy_runtime=self._proxy_runtime(), engine_flavor=engine_flavor(self.engine)
        )
        run = hostpaths.map_run(run, self.engine)  # a runner in a container: mount sources as the host names them
        if self.policy.network.mode == "proxy":
            from toolcage.backends.egress import Egress, audit_decisions

            self._egress = Egress(
                self.engine, self.policy, run, self.egress_network, self.egress_proxy, self.log,
                on_decision=audit_decisions(self.audit, run.run_id),  # written as they happen, not at close
                proxy_image=worker_image(), redact=self.redact,
            )  # fmt: skip
            volume, env = self._egress.prepare()
            env[contract.ENV_PROXY_SOCKET] = PROXY_SOCKET
            if self.ca_pem:
                env[contract.ENV_CA_PEM] = self.ca_pem
            run = dataclasses.replace(run, proxy_volume=volume, extra_env=env)
            # the proxy and the sandbox start at the same time: each start is mostly the engine's waiting
            # (the proxy's, on its bridge network, the longer); the worker connects to the proxy's socket
            # only when tool code opens a connection, and waits for it then (worker.relay)
            egress = self._egress
            proxy = _Background(egress.launch, "toolcage-egress-launch")
            try:
                transport = self._start_sandbox(run, parser)
            except BaseException:
                with contextlib.suppress(BaseException):
                    proxy.join()  # its container is known before the caller's clean-up removes everything
                raise
            try:
                proxy.join()  # ready, or why not (the caller's clean-up removes both)
            except BaseException:
                transport.close()
                raise
            return transport
        return self._start_sandbox(run, parser)

    def _start_sandbox(self, run: RunSpec, parser: StreamParser) -> Transport:
        self.container_id = self.engine.create(container_config(self.policy, run), self.name)
        sock, closer = self.engine.attach(self.container_id)
        transport = DockerAttachTransport(sock, parser, closer)
        transport.start()  # attached and reading before the worker's first byte
        self.engine.start(self.container_id)
        return transport

    def kill(self) -> None:
        if self.container_id is not None:
            with contextlib.suppress(ToolcageError):
                self.engine.kill(self.container_id)

    def exit_status(self, timeout: float) -> ExitStatus:
        if self.container_id is None:
            return ExitStatus(None)
        code = self.engine.wait(self.container_id, timeout=timeout)
        info = self.engine.inspect(self.container_id)
        if info is None:  # the run has not removed it yet: someone else did (toolcage.lifecycle.reaper.removed_by)
            return ExitStatus(code, removed=True)
        state = info.get("State", {})
        code = state.get("ExitCode", code)
        # State.OOMKilled is set when *any* process of the container met the limit (a call's child
        # too, which the worker survives and reports per call): only a SIGKILLed worker is the victim
        return ExitStatus(code, oom_killed=bool(state.get("OOMKilled")) and code == 137)

    def remove(self, keep: bool) -> None:
        if keep:
            if self.container_id is not None:
                self.log.warning("run.kept", container=self.name)
            return
        if self._egress is None:
            if self.container_id is not None and not removal.hand_off(self.container_id):
                self.engine.remove(self.container_id)
            return
        # the sandbox goes while the proxy is stopped and drained; the volume and network after both
        cid = self.container_id
        sandbox = _Background(lambda: self.engine.remove(cid) if cid is not None else None, "toolcage-remove")
        self._egress.down(before_volume=sandbox.join)


class _Background:
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


class ProcessBackend:
    """The same worker as a local subprocess (``--sandbox none``): development only, nothing isolated."""

    sandbox_user = False
    container_id: str | None = None

    def __init__(self, policy: Policy, *, workspace: str | None, ca_pem: str | None, **_unused: Any) -> None:
        self.policy, self.workspace, self.ca_pem = policy, workspace, ca_pem
        self.proc: subprocess.Popen[bytes] | None = None
        self._tmpdirs: list[str] = []

    def image_id(self) -> str | None:
        return None

    def start(self, run: RunSpec, parser: StreamParser) -> Transport:
        logs.get_logger(run_id=run.run_id).warning("sandbox.not_isolated", note=NONE_WARNING)
        scratch = tempfile.mkdtemp(prefix=f"toolcage-{run.run_id}-scratch-")
        self._tmpdirs.append(scratch)
        workspace = self.workspace or ""  # "": no workspace (the worker says so instead of listing nothing)
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "LANG": os.environ.get("LANG", "C.UTF-8"),
            contract.ENV_POLICY: self.policy.canonical_json(),
            contract.ENV_RUN_ID: run.run_id,
            contract.ENV_DEADLINE: f"{run.deadline:.3f}",
            contract.ENV_WORKSPACE: workspace,
            contract.ENV_SCRATCH: scratch,
            contract.ENV_WATCH_RUNNER: "1",
            **({contract.ENV_CA_PEM: self.ca_pem} if self.ca_pem else {}),
        }
        transport = ProcessTransport(list(LOCAL_WORKER_ARGV), env, scratch, parser)
        self.proc = transport.proc
        transport.start()
        return transport

    def kill(self) -> None:
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, 9)  # its own session: the children go too

    def exit_status(self, timeout: float) -> ExitStatus:
        if self.proc is None:
            return ExitStatus(None)
        try:
            return ExitStatus(self.proc.wait(timeout=timeout))
        except subprocess.TimeoutExpired:
            return ExitStatus(None)

    def remove(self, keep: bool) -> None:
        try:
            if self.proc is not None and self.exit_status(2).exit_code is None:
                self.kill()
                self.proc.wait(timeout=5)
        finally:
            for d in self._tmpdirs:
                shutil.rmtree(d, ignore_errors=True)


def engine_flavor(engine: Any) -> str:
    """``podman`` when the engine is Podman's Docker-compatible service, else ``docker`` (asked once per
    engine). Refuses (SandboxError, with the fix) an engine that cannot enforce the limits."""
    flavor = getattr(engine, "_toolcage_flavor", None)
    if flavor is None:
        try:
            components = engine.ping().get("Components") or []
        except Exception:
            components = []
        podman = any("podman" in str(c.get("Name", "")).lower() for c in components)
        flavor = "podman" if podman else "docker"
        if podman:  # (a rootless Docker says so itself: create's warnings, toolcage.engine.docker_adapter)
            from toolcage.ops.engines import limits_problem

            problem = limits_problem(engine.info())
            if problem:
                raise SandboxError(f"this engine cannot hold a sandbox: {problem}")
        with contextlib.suppress(AttributeError):
            engine._toolcage_flavor = flavor
    return str(flavor)


def _gvisor(policy: Policy, **options: Any) -> Backend:
    return ContainerBackend(policy, **{**options, "runtime": GVISOR})


# each takes the options it uses and ignores the rest
BACKENDS: dict[str, Callable[..., Backend]] = {"container": ContainerBackend, "gvisor": _gvisor, "none": ProcessBackend}
# how strong a wall each kind is (``isolation`` in a policy is a minimum; ``auto`` takes the strongest)
STRENGTH = {"none": 0, "container": 1, "gvisor": 2}


def in_container(kind: str) -> bool:
    """Does this kind run the worker in a container (mounts, a sandbox user), or as a local process?"""
    return kind != "none"


def available_kinds(engine: EngineAPI | None = None) -> list[str]:
    """The kinds ``auto`` may pick on this engine, strongest first (never ``none``): ``gvisor`` when the
    engine has the ``runsc`` runtime registered, then ``container``."""
    if engine is None:
        from toolcage.engine.docker_adapter import Engine

        engine = Engine.default()
    from toolcage.ops.engines import gvisor_registered

    return (["gvisor"] if gvisor_registered(engine.info()) else []) + ["container"]


def default_kind(kind: str | None) -> str:
    """``--sandbox`` when given, else ``$TOOLCAGE_SANDBOX``, else ``container``."""
    return kind or os.environ.get(contract.ENV_SANDBOX) or "container"


def resolve_kind(kind: str, policy: Policy, engine: EngineAPI | None = None) -> str:
    """``--sandbox`` as given (``auto``: the strongest available), checked against the policy's
    ``isolation`` minimum; UsageError with the fix otherwise."""
    if kind not in BACKENDS and kind != "auto":
        raise UsageError(f"unknown sandbox kind {kind!r}: use one of {', '.join(map(repr, [*BACKENDS, 'auto']))}")
    if kind == "auto":
        kind = available_kinds(engine)[0]
    elif kind == "gvisor":
        if engine is None:
            from toolcage.engine.docker_adapter import Engine

            engine = Engine.default()
        from toolcage.ops.engines import gvisor_problem

        problem = gvisor_problem(engine.info())
        if problem:
            raise UsageError(
                f"--sandbox gvisor: {problem}. Register runsc as the README's gVisor section shows "
                "(`.ci/register-runsc` does it), or use --sandbox container"
            )
    need = policy.isolation
    if need is not None and STRENGTH.get(kind, 1) < STRENGTH[need]:
        hint = (
            "register gVisor's runsc with the engine (README: gVisor) and use --sandbox gvisor or auto"
            if need == "gvisor"
            else "use --sandbox container"
        )
        raise UsageError(f"policy {policy.name!r} requires isolation {need!r}; this run would use {kind!r}: {hint}")
    return kind


def make_backend(kind: str, policy: Policy, **options: Any) -> Backend:
    """The backend named ``kind`` (``--sandbox``), given every option; each takes what it uses."""
    factory = BACKENDS.get(kind)
    if factory is None:
        raise UsageError(f"unknown sandbox kind {kind!r}: use one of {', '.join(map(repr, BACKENDS))}")
    return factory(policy, **options)
