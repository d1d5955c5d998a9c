"""``--sandbox container``: one hardened container per run under the engine's default runtime (runc),
plus, for ``network.mode: proxy``, its egress proxy (``toolcage.backends.egress``)."""

from __future__ import annotations

import contextlib
import dataclasses
import time
from typing import Any, ClassVar

from toolcage import telemetry
from toolcage.backends.base import BackendOptions, Background, ExitStatus
from toolcage.engine import hostpaths, imageconfig
from toolcage.engine.api import EngineAPI
from toolcage.engine.attach import DockerAttachTransport
from toolcage.engine.hostconfig import PROXY_SOCKET, container_config
from toolcage.engine.imageconfig import ImageConfig
from toolcage.engine.knobs import RUNC, RuntimeKnobs
from toolcage.engine.labels import RunSpec
from toolcage.errors import SandboxError, ToolcageError, UsageError
from toolcage.lifecycle import removal
from toolcage.policies import Policy, contract
from toolcage.rpc.transport import StreamParser, Transport

# A SIGKILLed worker with no OOM flag yet is looked at again for the engine's flag, which comes from an event of
# its own, on a loaded host after the exit (a loaded gVisor pass saw it come later than 0.3 s): this long when the
# engine says nobody asked it to kill the container (the kernel did: its OOM killer); not at all when someone did
# (docker kill, rm -f: a crash, reported at once, tests/integration/test_lifecycle.py::test_external_kill_mid_call);
# OOM_EVENT_WAIT_S when the engine cannot say.
# the worker could not lay a cached workspace copy (worker.copyfs; its reason is in its stderr log)
NO_COPY = (
    "the worker could not lay the cached workspace copy (workspace_cache): the engine answered its probe once and "
    "refuses now; run without workspace_cache, or remove the engine's answer with `docker volume rm` of the "
    "toolcage-copy-able-* volumes so that it is asked again"
)
OOM_EVENT_WAIT_S = 0.3
OOM_EVENT_LATE_S = 3.0
KILL_EVENTS_SINCE_S = 86400.0  # how far back the engine's events are asked (it keeps a bounded number of them)


class ContainerBackend:
    """One hardened container per run (plus, for ``network.mode: proxy``, its egress proxy)."""

    strength: ClassVar[int] = 1
    in_container: ClassVar[bool] = True
    auto: ClassVar[bool] = True
    how_to_use: ClassVar[str] = "use --sandbox container"
    runtime: ClassVar[RuntimeKnobs] = RUNC  # the sandbox's OCI runtime, as knob values (engine.knobs)
    sandbox_user = True

    def __init__(self, policy: Policy, options: BackendOptions) -> None:
        self.policy, self.options = policy, options
        self.name, self.log = options.name, options.log
        self._engine = options.engine
        self.container_id: str | None = None
        self._egress: Any = None
        self._launch: Background | None = None  # the egress proxy's launch, when start did not wait for it
        self._image_info: dict[str, Any] | None = None
        self._layers: Any = None  # where the image's shared files lie (engine.sharedfiles), or None
        self._files: list[str] = []  # this run's overlay volumes over them, made at start
        self._runtime: Any = None  # a user's own image: the worker image's runtime (engine.runtime)
        self._proxy_ref: str | None = None  # the worker image, where $TOOLCAGE_IMAGE names a user's own
        self._foreign_decided = False  # _foreign() asked: its answer is _foreign_config
        self._foreign_config: ImageConfig | None = None

    @classmethod
    def unavailable(cls, engine: EngineAPI | None) -> str | None:
        return None  # an engine that answers runs runc; a missing one is reported at start, with the fix

    @property
    def engine(self) -> EngineAPI:
        if self._engine is None:
            from toolcage.engine.docker_adapter import Engine

            self._engine = Engine.default()
        return self._engine

    def image_id(self) -> str | None:
        try:
            return (self._image() or {}).get("Id")
        except ToolcageError:
            return None  # start() reports the engine or the image as missing, with the fix

    def _image(self) -> dict[str, Any] | None:
        """The image's inspect data, asked once (None: not here; start reports it missing, with the fix)."""
        if self._image_info is None:
            self._image_info = self.engine.image(self.options.image) or {}
        return self._image_info or None

    def _foreign(self) -> ImageConfig | None:
        """A user's own image (not built FROM the worker image): its config, as values; None for a worker
        image, or a missing one (start reports that, with the fix). Decided once per run."""
        if self._foreign_decided:
            return self._foreign_config
        from toolcage.image.build import check_worker_image, runs_own_worker

        info = self._image()
        found = check_worker_image(info)
        config = None
        # the worker image itself (the common run) is its own worker without asking the engine again
        own = found == "worker" and (
            self.options.image == self.options.proxy_image
            or runs_own_worker(info, self.engine.image(self.options.proxy_image))
        )
        if found != "missing" and not own:
            if found == "worker":  # the label, but not an image of this installation: anyone can write a label
                self.log.warning(
                    "image.not_built_here", image=self.options.image, detail="runs with toolcage's runtime"
                )
            assert info is not None
            try:
                config = imageconfig.from_inspect(self.options.image, info)
            except imageconfig.BadImageConfig as exc:
                raise UsageError(str(exc)) from None
        self._foreign_decided, self._foreign_config = True, config
        return config

    def check_writable(self, writable: tuple[tuple[str, int], ...]) -> None:
        """writable=: in an image that runs its own worker (toolcage's, or one built here FROM it) the worker
        runs from the image's own /usr: UsageError for those paths (toolcage.engine.writable.WORKER_OWN), asked
        before the image's trees are read. A user's own image runs the worker from the runtime: all may be."""
        if writable and self._image() is not None and self._foreign() is None:
            from toolcage.engine.writable import check_worker_image

            check_worker_image(writable)

    def _worker_image_id(self) -> str:
        """The worker image whose runtime a user's image runs with (the egress proxy's image too): this
        installation's (``$TOOLCAGE_IMAGE`` or the default), or the default where ``$TOOLCAGE_IMAGE`` names a
        user's own image (every run is then of that image; the runtime and the proxy still need toolcage's)."""
        from toolcage import __version__
        from toolcage.image.build import check_worker_image

        ref = self.options.proxy_image
        info = self.engine.image(ref)
        if check_worker_image(info) == "foreign":
            ref = self._proxy_ref = f"toolcage-worker:{__version__}"  # the default (toolcage.options)
            info = self.engine.image(ref)
        if info is None or not info.get("Id"):
            raise UsageError(
                f"image {self.options.image} is not a toolcage worker image, so it runs with the worker image's "
                f"runtime, and the worker image {ref} is missing: run `toolcage image build`"
            )
        return str(info["Id"])

    def proxy_runtime(self) -> RuntimeKnobs:
        """The egress proxy's runtime: the sandbox's (a subclass may say otherwise)."""
        return self.runtime

    def complete(self, run: RunSpec) -> RunSpec:
        from toolcage.engine import runtime, sharedfiles

        foreign = self._foreign()
        if foreign is not None:
            # a user's own image, unchanged: the worker comes from the worker image's runtime, mounted read-only
            self._runtime = runtime.find(self.engine, self._worker_image_id())
            run = dataclasses.replace(
                run, foreign=foreign, runtime_mounts=runtime.run_mounts(run.run_id, self._runtime)
            )
        else:
            self.check_writable(run.writable)  # (decided above: no second look at the image)
            self._layers = sharedfiles.layers(self.engine, self.image_id())
        run = dataclasses.replace(
            run,
            runtime=self.runtime,
            flavor=self.engine.flavor(),
            shared_files=sharedfiles.run_volumes(run.run_id) if self._layers is not None else (),
        )
        if self.policy.network.mode == "proxy":
            from toolcage.backends.egress import sandbox_env, volume_name

            env = {**sandbox_env(), contract.ENV_PROXY_SOCKET: PROXY_SOCKET}
            if self.options.ca_pem:
                env[contract.ENV_CA_PEM] = self.options.ca_pem
            run = dataclasses.replace(
                run,
                proxy_runtime=self.proxy_runtime(),
                proxy_volume=volume_name(run.run_id),
                extra_env={**run.extra_env, **env},  # (a pooled slot's own too)
            )
        mapped: RunSpec = hostpaths.map_run(run, self.engine)  # a runner in a container: sources as the host names them
        return mapped

    def start(self, run: RunSpec, parser: StreamParser) -> Transport:
        from toolcage.lifecycle.reaper import reap_in_background

        reap_in_background(self.engine, self.log, self.options.audit)
        if run.shared_files:
            from toolcage.engine import sharedfiles
            from toolcage.engine.labels import LABEL_ROLE, labels

            # before either container: the sandbox and its proxy (same image) mount them
            self._files = sharedfiles.make_run_volumes(
                self.engine, self._layers, run.shared_files, {**labels(self.policy, run), LABEL_ROLE: "files"}
            )
        if run.runtime_mounts and self._runtime is not None:
            from toolcage.engine import runtime
            from toolcage.engine.labels import LABEL_ROLE, labels

            self._files += runtime.make_run_volumes(
                self.engine, self._runtime, run.runtime_mounts, {**labels(self.policy, run), LABEL_ROLE: "runtime"}
            )
        if run.proxy_volume is None:
            return self._start_sandbox(run, parser)
        from toolcage.backends.egress import Egress, audit_decisions

        opts = self.options
        self._egress = Egress(
            self.engine, self.policy, run, opts.egress_network, opts.egress_proxy, self.log,
            # written as they happen, not at close; counted for OpenTelemetry when the application set a provider
            on_decision=telemetry.egress_decisions(run.run_id, audit_decisions(opts.audit, run.run_id)),
            proxy_image=self._proxy_ref or opts.proxy_image, redact=opts.redact,
        )  # fmt: skip
        self._egress.prepare()
        # the proxy and the sandbox start at the same time: each start is mostly the engine's waiting
        # (the proxy's, on its bridge network, the longer); the worker connects to the proxy's socket
        # only when tool code opens a connection, and waits for it then (worker.egress.relay)
        late = self.options.on_late_failure
        proxy = Background(self._launch_late if late is not None else self._egress.launch, "toolcage-egress-launch")
        try:
            transport = self._start_sandbox(run, parser)
        except BaseException:
            with contextlib.suppress(BaseException):
                proxy.join()  # its container is known before the caller's clean-up removes everything
            raise
        if late is not None:
            # the first answer does not wait for the proxy (2.4x a run without network when it did): a
            # connection made before it listens is held by the worker's relay, and a proxy that does not
            # come up ends the run (_launch_late); close waits for the launch before it removes anything
            self._launch = proxy
            return transport
        try:
            proxy.join()  # ready, or why not (the caller's clean-up removes both)
        except BaseException:
            transport.close()
            raise
        return transport

    def _launch_late(self) -> None:
        """The egress proxy's launch when ``start`` did not wait for it: a failure ends the run (the sandbox is
        killed, and its next call, or the one waiting, raises why), from this thread."""
        try:
            self._egress.launch()
        except BaseException as exc:
            err = exc if isinstance(exc, SandboxError) else SandboxError(f"the egress proxy did not start: {exc}")
            self.log.warning("egress.failed", error=err.message)
            assert self.options.on_late_failure is not None
            self.options.on_late_failure(err)
            raise

    def _launched(self) -> None:
        """Wait for a launch ``start`` did not wait for (its outcome was reported already): the proxy's
        container is known, or never made, before anything is stopped or removed."""
        launch, self._launch = self._launch, None
        if launch is not None:
            with contextlib.suppress(BaseException):
                launch.join()

    def check_network_changeable(self) -> None:
        """UsageError unless the run has an egress proxy whose policy can change."""
        if self._egress is None:
            raise UsageError(
                "this sandbox started without the egress proxy (network.mode: none), and a running sandbox gets no "
                "route it did not start with: start it with network.mode: proxy (an empty allow list refuses "
                "everything) to change its network while it runs"
            )

    def update_network(self, policy: Any) -> dict[str, Any]:
        """A live policy change at the run's egress proxy (Egress.update), once the proxy is up."""
        self.check_network_changeable()
        launch = self._launch
        if launch is not None:
            launch.join()  # a late launch: the proxy listens (or the run already ended, and said why)
        return dict(self._egress.update(policy))

    def _start_sandbox(self, run: RunSpec, parser: StreamParser) -> Transport:
        self.container_id = self.engine.create(container_config(self.policy, run), self.name)
        sock, closer = self.engine.attach(self.container_id)
        transport = DockerAttachTransport(sock, parser, closer)
        transport.start()  # attached and reading before the worker's first byte
        try:
            self.engine.start(self.container_id)
        except BaseException:
            transport.close()  # the engine refused the start (a mount it cannot make): no socket left open
            raise
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
        # the engine sets OOMKilled from an event of its own, which on a loaded host can come after the exit
        # (a loaded gVisor test pass read exit 137 with OOMKilled false): a SIGKILLed worker that nobody asked
        # the engine to kill is looked at again before its end is called a crash (OOM_EVENT_LATE_S)
        wait_s = OOM_EVENT_WAIT_S
        if code == 137 and not state.get("OOMKilled"):
            asked = self.engine.kill_requested(self.container_id, time.time() - KILL_EVENTS_SINCE_S)
            wait_s = 0.0 if asked else OOM_EVENT_LATE_S if asked is False else OOM_EVENT_WAIT_S
        waited_until = time.monotonic() + wait_s
        while code == 137 and not state.get("OOMKilled") and time.monotonic() < waited_until:
            time.sleep(0.1)
            again = self.engine.inspect(self.container_id)
            if again is None:
                break
            state = again.get("State", {})
        oom = bool(state.get("OOMKilled"))
        if code == 137 and not oom and wait_s == OOM_EVENT_LATE_S:
            # nobody asked the engine to kill it and the flag never came: the engine's own oom event decides (the
            # flag was seen lost at the exit under gVisor; the event stays in the engine's log)
            oom = bool(self.engine.oom_reported(self.container_id, time.time() - KILL_EVENTS_SINCE_S))
        # State.OOMKilled is set when *any* process of the container met the limit (a call's child
        # too, which the worker survives and reports per call): only a SIGKILLed worker is the victim
        why = NO_COPY if code == contract.EXIT_NO_COPY else ""
        return ExitStatus(code, oom_killed=oom and code == 137, why=why)

    def remove(self, keep: bool) -> None:
        self._launched()
        if keep:
            if self._egress is not None:  # kept stopped, like the sandbox: not a live proxy until the deadline
                with contextlib.suppress(ToolcageError):
                    self._egress.stop()
            if self.container_id is not None:
                self.log.warning("run.kept", container=self.name)
            return
        files, self._files = self._files, []
        wait = self.runtime.exit_wait_s  # gVisor: its worker's exit at EOF ends it, before a kill would
        if self._egress is None:
            if self.container_id is not None and removal.hand_off(self.container_id, files, wait):
                return
            if self.container_id is not None:
                removal.end(self.engine, self.container_id, wait)
            self._remove_files(files)
            return
        # the sandbox goes while the proxy is stopped and drained; the volume and network after both
        cid = self.container_id
        sandbox = Background(lambda: None if cid is None else removal.end(self.engine, cid, wait), "toolcage-remove")
        try:
            self._egress.down(before_volume=sandbox.join)
        except BaseException:
            with contextlib.suppress(ToolcageError):  # the proxy's error is the one to see (the reaper has the rest)
                self._remove_files(files)
            raise
        self._remove_files(files)  # after both containers that mounted them

    def _remove_files(self, names: list[str]) -> None:
        for name in names:
            self.engine.remove_volume(name)


__all__ = ["ContainerBackend"]
