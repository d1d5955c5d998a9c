"""The engine agent: one Ray actor per node, the one owner of that node's container engine.

It is toolcage on one machine, reached through Ray: the never-reused warm pool (``AsyncPool``), the
image check, the egress proxies (each run's backend starts its own, as locally), the reaper and the
node's audit log, all unchanged. The stdio channel to a sandbox never leaves the node: Ray carries
only a call's parameters and its ``CallResult`` (a run's and a session call's on the direct channel Ray hands
out, :mod:`toolcage.ray.direct`).

What the agent adds is what a shared node needs:
- admission: at most ``max_running`` runs at once on the node (a run waits up to the caller's
  ``wait_s``, then ``NoCapacity``), and at most ``max_starting`` containers starting at once, pool
  refills and cold starts together (one semaphore: start storms are what break engines);
- a health view: the engine is pinged every second; a node whose engine does not answer, or that lacks
  the cluster's image (checked by id), takes no runs;
- clients: each ``Cluster`` that uses the agent is one (``<job id>:<token>``: a driver, or a Ray task of its
  job, each its own); a client that closes has its sessions closed, a job that ends (its driver exited or was
  SIGKILLed) has every run of its clients cancelled and their sandboxes removed within ``JOB_CHECK_S``, and
  when no client is left for ``linger_s`` the agent removes its warm pool and exits.

What the agent never does: hold a client's files or compute for it. Downloads, uploads, diffs and
snapshots run on the client (toolcage.ray.ClusterSandbox) through ``call``, one bounded chunk of the
worker's at a time, so their memory and CPU are the caller's, and a hostile sandbox's large file or
pathological diff cannot take down the agent that serves every client of the node. The agent holds no
snapshot key: each driver signs and verifies with its own.

Found by name (``toolcage:<cluster>:<node id>`` in namespace ``toolcage``), so any driver, task or actor
of the cluster reaches the same agent. The agent's process owns every container it starts (their owner
labels name it): if the agent dies, or its node, the node's reaper (the next agent's start, or
``toolcage gc`` there) removes them.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from secrets import token_hex
from typing import Any, TypeVar

from toolcage.errors import (
    DockerUnavailable,
    EngineUnavailable,
    ImageMissing,
    NoCapacity,
    SandboxError,
    SandboxInterrupted,
    ToolcageError,
    UsageError,
    WorkerCrashed,
)

NAMESPACE = "toolcage"  # the Ray namespace of every agent
NAME_PREFIX = "toolcage:"
ENGINE_CHECK_S = 1.0  # how often the agent pings its engine
JOB_CHECK_S = 2.0  # how often it asks Ray which client jobs still live
T = TypeVar("T")


def job_of(client: str) -> str:
    """The Ray job a client id (``<job id>:<token>``) belongs to."""
    return client.partition(":")[0]


def agent_name(cluster: str, node_id: str) -> str:
    return f"{NAME_PREFIX}{cluster}:{node_id}"


@dataclass(frozen=True)
class AgentConfig:
    """What every agent of one cluster is made from; a cluster's agents must all agree on it."""

    cluster: str
    policy: dict[str, Any]  # the Policy, as its model dump (the same hardened container on every node)
    image: str
    image_id: str | None  # the build every node must have (None: whatever the node has under that name)
    warm: int
    max_running: int
    max_starting: int
    linger_s: float
    # no snapshot key: the agent never signs nor verifies; each driver does, with its own key, so no
    # driver's key can be silently replaced by another's (issue 34, point 5)

    def digest(self) -> str:
        """What must match between a driver's config and an agent it finds running."""
        import hashlib
        import json

        policy = hashlib.sha256(json.dumps(self.policy, sort_keys=True).encode()).hexdigest()[:16]
        return f"{policy}|{self.image}|{self.warm}|{self.max_running}|{self.max_starting}"


Outcome = tuple[str, Any, dict[str, Any]]  # ("ok", value, load) or ("error", ToolcageError, load)


def _counted(sb: Any) -> Any:
    """A sandbox whose close returns once its container is removed: a run holds its place under max_running
    until then, so the engine never has more of the node's sandboxes than the cap (plus the warm pool)."""
    sb._sync.remove_in_background = False
    return sb


@dataclass
class _Held:
    """A session a client opened on this node."""

    client: str
    sandbox: Any  # AsyncSandbox
    task: asyncio.Task[Any] | None = None


class EngineAgent:
    """The Ray actor class (``ray.remote(EngineAgent)``): an async actor, so one agent serves many runs."""

    def __init__(self, config: AgentConfig) -> None:
        import ray

        from toolcage.engine import labels as hostlabels
        from toolcage.engine.docker_adapter import Engine
        from toolcage.logs import get_logger
        from toolcage.options import resolve_audit
        from toolcage.policies import load_policy

        self.config = config
        self.node_id: str = ray.get_runtime_context().get_node_id()
        hostlabels.add_process_labels({hostlabels.LABEL_CLUSTER: config.cluster, hostlabels.LABEL_NODE: self.node_id})
        self.log = get_logger(agent=self.node_id[:12], cluster=config.cluster)
        self.engine = Engine.default()
        self.audit = resolve_audit(None)
        self.policy = load_policy(config.policy)
        self.gate = threading.BoundedSemaphore(config.max_starting)
        self.running = 0
        self.starting = 0
        self.served = 0
        self.clients: dict[str, float] = {}  # client id (job id:token) -> when it last said hello
        self.held: dict[str, _Held] = {}  # session id -> session
        self.tasks: dict[asyncio.Task[Any], str] = {}  # one-off runs in flight -> client id
        self.apool: Any = None
        self.engine_ok = True
        self.engine_error = ""
        self.image_id: str | None = None
        self.reaped: list[dict[str, Any]] = []
        self.loading = False
        self._cond: asyncio.Condition | None = None
        self._loops: list[asyncio.Task[None]] = []
        self._idle_since = time.monotonic()
        self._stopping = False
        self._closers: set[asyncio.Future[None]] = set()  # one-off runs answered, their sandboxes being closed
        self._direct: tuple[Any, dict[str, Any]] | None = None  # the direct channel's server, and what hello offers
        self._direct_failed = False
        with contextlib.suppress(ToolcageError):
            self.reaped = self._reap("agent_start")  # what a dead agent of this node left
        self._check_engine()
        if self.audit is not None:
            self.audit.event(
                "cluster.agent_started", cluster=config.cluster, node=self.node_id, image=config.image,
                image_id=self.image_id, policy=self.policy.name, reaped=len(self.reaped), pid=os.getpid(),
            )  # fmt: skip

    # views -----------------------------------------------------------------------------------
    @property
    def image_ready(self) -> bool:
        want = self.config.image_id
        return self.image_id is not None and (want is None or self.image_id == want)

    def _why_not(self) -> str:
        if not self.engine_ok:
            return f"engine unavailable: {self.engine_error}"
        if self.loading:
            return "loading the image"
        if self.image_id is None:
            return f"image {self.config.image} missing"
        if not self.image_ready:
            return f"image {self.config.image} is another build ({self.image_id[:19]})"
        return ""

    def load(self) -> dict[str, Any]:
        """What placement needs, sent back with every answer."""
        return {
            "node_id": self.node_id,
            "running": self.running,
            "starting": self.starting,
            "max_running": self.config.max_running,
            "healthy": self.engine_ok,
            "image_ready": self.image_ready and not self.loading,
            "image_id": self.image_id,
            "why_not": self._why_not(),
            "warm_ready": self.apool.ready() if self.apool is not None else 0,
            "served": self.served,
            "sessions": len(self.held),
            "pid": os.getpid(),  # the agent's process, for an operator (and the tests) to watch its memory
        }

    # lifecycle -------------------------------------------------------------------------------
    async def hello(self, client: str, digest: str, image_id: str | None = None) -> dict[str, Any]:
        """A client (a Ray job) starts using this agent: checks it was made with the same config. A client
        that knows no image id (a Ray task on a node without the image) takes the agent's."""
        if digest != self.config.digest() or (image_id is not None and image_id != self.config.image_id):
            raise UsageError(
                f"cluster {self.config.cluster!r} already runs with another configuration on node "
                f"{self.node_id[:12]} ({self.config.digest()}, image {self.config.image_id}): give your Cluster "
                "another name="
            )
        self._ensure_loops()
        self.clients[client] = time.monotonic()
        self._ensure_pool()
        direct = await self._ensure_direct()
        return {
            **self.load(), "reaped": len(self.reaped), "pid": os.getpid(), "config_image_id": self.config.image_id,
            "direct": direct,
        }  # fmt: skip

    def _direct_failed_request(self, exc: Exception, stage: str) -> Outcome:
        """The answer to a direct request that failed in the agent (Ray would raise it as a RayTaskError):
        arguments it could not take are the caller's (UsageError), an answer that would not pickle the agent's."""
        kind = UsageError if stage == "request" and isinstance(exc, TypeError | ValueError) else SandboxError
        message = f"the agent of node {self.node_id[:12]} could not answer the request: {type(exc).__name__}: {exc}"
        return ("error", kind(message[:1000], node=self.node_id), self.load())

    async def _ensure_direct(self) -> dict[str, Any] | None:
        """The direct channel's address and key (:mod:`toolcage.ray.direct`), opened on the first hello; None
        under Ray's TLS, or where it cannot listen (the clients keep Ray's channel)."""
        import ray

        from toolcage.ray import direct

        if self._direct is None and not self._direct_failed and not direct.tls_on():
            key = os.urandom(32)
            server = direct.Server(
                key, {"run": self.run, "call": self.call}, ray.cloudpickle.dumps, self._direct_failed_request
            )
            try:
                host, port = await server.start(ray.util.get_node_ip_address())  # type: ignore[no-untyped-call]
            except OSError as exc:
                self._direct_failed = True
                self.log.warning("cluster.direct_unavailable", error=str(exc))
                return None
            self._direct = (server, {"host": host, "port": port, "key": key.hex()})
        return self._direct[1] if self._direct is not None else None

    async def leave(self, client: str) -> None:
        """A client is done: its sessions close; the agent lingers, then exits, once nobody is left."""
        self.clients.pop(client, None)
        await self._end(lambda c: c == client, "the client closed its cluster")

    def _ensure_loops(self) -> None:
        if not self._loops:
            self._loops = [asyncio.ensure_future(self._engine_loop()), asyncio.ensure_future(self._job_loop())]

    def _ensure_pool(self) -> None:
        if self.apool is not None or self.config.warm < 1 or not self.image_ready or not self.engine_ok:
            return
        from toolcage.aio import AsyncPool

        self.apool = AsyncPool(
            self.policy, size=self.config.warm, parallel=min(self.config.warm, self.config.max_starting),
            image=self.config.image, tool="ray", audit=self.audit if self.audit is not None else False,
            start_gate=self.gate,
        )  # fmt: skip

    def _check_engine(self) -> None:
        try:
            self.engine.ping()
            info = self.engine.image(self.config.image)
            self.image_id = str(info["Id"]) if info else None
            self.engine_ok, self.engine_error = True, ""
        except ToolcageError as exc:
            self.engine_ok, self.engine_error = False, exc.message

    async def _engine_loop(self) -> None:
        while not self._stopping:
            await asyncio.sleep(ENGINE_CHECK_S)
            was = self.engine_ok
            await asyncio.to_thread(self._check_engine)
            if was and not self.engine_ok:
                self.log.warning("cluster.engine_down", error=self.engine_error)
                if self.apool is not None:  # its slots went with the engine; a new pool when it is back
                    pool, self.apool = self.apool, None
                    with contextlib.suppress(Exception):
                        await pool.close()
            elif not was and self.engine_ok:
                self.log.info("cluster.engine_back")
                with contextlib.suppress(ToolcageError):
                    self.reaped += await asyncio.to_thread(self._reap, "engine_back")
            if self.engine_ok:
                self._ensure_pool()

    async def _job_loop(self) -> None:
        import ray

        gcs: Any = getattr(ray._private.worker.global_worker, "gcs_client")  # noqa: B009 - not in Ray's stubs
        while not self._stopping:
            await asyncio.sleep(JOB_CHECK_S)
            clients = {*self.clients, *(h.client for h in self.held.values()), *self.tasks.values()}
            jobs = {job_of(c) for c in clients}
            if jobs:
                try:
                    table = await asyncio.to_thread(
                        gcs.get_all_job_info, skip_submission_job_info_field=True,
                        skip_is_running_tasks_field=True, timeout=10,
                    )  # fmt: skip
                except Exception as exc:  # the GCS is away for a moment: ask again later
                    self.log.warning("cluster.job_check_failed", error=str(exc))
                    continue
                alive = {jid.hex() for jid, info in table.items() if not info.is_dead}
                dead = jobs - alive
                if dead:
                    for c in [c for c in self.clients if job_of(c) in dead]:
                        self.clients.pop(c, None)
                    gone = frozenset(dead)
                    await self._end(lambda c: job_of(c) in gone, "its driver (Ray job) is gone")  # noqa: B023
            busy = self.clients or self.held or self.tasks
            if busy:
                self._idle_since = time.monotonic()
            elif time.monotonic() - self._idle_since >= self.config.linger_s:
                ray.get_runtime_context().current_actor.shutdown.remote("no client left")
                return

    async def _end(self, whose: Callable[[str], bool], why: str) -> None:
        """Cancel the runs and close the sessions of the clients ``whose`` picks."""
        for task, owner in list(self.tasks.items()):
            if whose(owner):
                task.cancel()
        for sid, held in list(self.held.items()):
            if whose(held.client):
                self.log.info("cluster.session_ended", session=sid, reason=why)
                await self.close(sid)

    async def shutdown(self, why: str = "asked") -> None:
        """Close every session and the warm pool, then end this actor."""
        import ray

        self._stopping = True
        if self._direct is not None:
            self._direct[0].close()
        for task in list(self.tasks):
            task.cancel()
        for sid in list(self.held):
            await self.close(sid)
        if self._closers:
            await asyncio.wait(list(self._closers), timeout=60)
        if self.apool is not None:
            with contextlib.suppress(Exception):
                await self.apool.close()
        if self.audit is not None:
            self.audit.event("cluster.agent_stopped", cluster=self.config.cluster, node=self.node_id, reason=why)
        self.log.info("cluster.agent_stopped", reason=why)
        ray.actor.exit_actor()  # type: ignore[no-untyped-call]

    # admission ---------------------------------------------------------------------------------
    async def _admit(self, wait_s: float, image: str | None = None) -> None:
        if self._stopping:
            raise NoCapacity("the node's agent is shutting down", node=self.node_id, refused=True)
        why = self._why_not()
        if why:
            err = EngineUnavailable if not self.engine_ok else ImageMissing
            raise err(f"node {self.node_id[:12]} takes no runs: {why}", node=self.node_id, refused=True)
        if image is not None and not await asyncio.to_thread(self._has, image):  # the driver sends it, then asks again
            raise ImageMissing(
                f"node {self.node_id[:12]} does not have the image {image}", node=self.node_id, refused=True,
                image_missing=image,
            )  # fmt: skip
        if self._cond is None:
            self._cond = asyncio.Condition()
        async with self._cond:
            if self.running >= self.config.max_running:
                try:
                    await asyncio.wait_for(
                        self._cond.wait_for(lambda: self.running < self.config.max_running), max(wait_s, 0)
                    )
                except TimeoutError:
                    raise NoCapacity(
                        f"node {self.node_id[:12]} is at max_running={self.config.max_running}",
                        node=self.node_id,
                        refused=True,
                    ) from None
            self.running += 1

    async def _release(self) -> None:
        assert self._cond is not None
        async with self._cond:
            self.running -= 1
            self._cond.notify()

    def _gated(self, fn: Callable[[], T]) -> T:
        with self.gate:
            self.starting += 1
            try:
                return fn()
            finally:
                self.starting -= 1

    async def _translate(self, exc: ToolcageError) -> ToolcageError:
        """A failure the engine's going away caused is said as such. The engine unreachable is one; a worker
        that crashed is one when the engine stops answering within a second (a stopping dockerd kills its
        containers before it closes its API)."""
        if isinstance(exc, DockerUnavailable) and not isinstance(exc, EngineUnavailable):
            self.engine_ok, self.engine_error = False, exc.message
            return EngineUnavailable(
                f"the engine of node {self.node_id[:12]} stopped answering during the run: {exc.message}",
                node=self.node_id,
            )
        if isinstance(exc, WorkerCrashed):
            for _ in range(5):  # off the event loop: the node's other runs go on meanwhile
                await asyncio.to_thread(self._check_engine)
                if not self.engine_ok:
                    return EngineUnavailable(
                        f"the engine of node {self.node_id[:12]} stopped answering during the run: {self.engine_error}",
                        node=self.node_id,
                    )
                await asyncio.sleep(0.2)
        exc.details.setdefault("node", self.node_id)
        return exc

    # one-off runs -----------------------------------------------------------------------------
    async def run(
        self, client: str, tool: str, params: dict[str, Any] | None, secrets: dict[str, str] | None,
        timeout: float | None, image: str | None, wait_s: float,
    ) -> Outcome:  # fmt: skip
        """One fresh sandbox (a warm one when the pool has it), one call, then it is gone. ``image``: another
        image than the cluster's, by content id (the driver sent it here if the node lacked it)."""
        from toolcage.aio import AsyncSandbox

        task = asyncio.current_task()
        try:
            await self._admit(wait_s, image)
        except ToolcageError as exc:
            return ("error", exc, self.load())
        assert task is not None
        self.tasks[task] = client
        sb: Any = None
        handed_off = False  # to a closer, which releases the run's place when the sandbox is gone
        try:
            if self.apool is not None:
                sb = _counted(self.apool.sandbox(secrets=secrets, image=image))
                await sb.start()
            else:
                sb = _counted(
                    AsyncSandbox(
                        self.policy, image=image or self.config.image, tool="ray", secrets=secrets, audit=self.audit
                    )
                )
                await asyncio.to_thread(self._gated, sb._sync.start)
            result = await sb.call(tool, params, timeout=timeout)
            self.served += 1
            # the answer goes back now; the sandbox is closed and removed after it, and the run holds its
            # place under max_running until then
            closer = asyncio.ensure_future(self._close_then_release(sb))
            self._closers.add(closer)
            closer.add_done_callback(self._closers.discard)
            handed_off = True
            return ("ok", result, self.load())
        except ToolcageError as exc:
            return ("error", await self._translate(exc), self.load())
        except asyncio.CancelledError:
            return (
                "error",
                SandboxInterrupted("the run was cancelled: its client is gone", node=self.node_id),
                self.load(),
            )
        finally:
            self.tasks.pop(task, None)
            if not handed_off:  # it failed or was cancelled: closed before the answer goes
                if sb is not None:
                    with contextlib.suppress(ToolcageError):
                        await sb.close()
                await self._release()

    async def _close_then_release(self, sb: Any) -> None:
        try:
            await sb.close()
        except ToolcageError as exc:
            self.log.warning("cluster.close_failed", run_id=sb.run_id, error=exc.message)
        finally:
            await self._release()

    # sessions ---------------------------------------------------------------------------------
    async def open(self, client: str, options: dict[str, Any], wait_s: float) -> Outcome:
        """A session pinned to this node: a warm sandbox when it needs nothing the pool's lack (a
        workspace, a writable copy), else a cold one within the node's start cap. A resume is the driver's: it
        verifies the snapshot with its own key and fills the session through ``call``."""
        from toolcage.aio import AsyncSandbox

        image = options.get("image")  # another image than the cluster's, by content id
        try:
            await self._admit(wait_s, image)
        except ToolcageError as exc:
            return ("error", exc, self.load())
        try:
            secrets = options.get("secrets")
            mode = options.get("workspace_mode") or "ro"
            # a copy (filled from this node's workspace, or empty for the driver to fill from a snapshot it
            # verified) is something the pool's sandboxes lack
            cold = options.get("workspace") is not None or mode != "ro" or self.apool is None
            if not cold:  # (the pool's sub-pool of that image, filled on demand: toolcage.pool)
                sb = _counted(self.apool.sandbox(secrets=secrets, image=image))
                await sb.start()
            else:
                sb = _counted(AsyncSandbox(
                    self.policy, image=image or self.config.image, tool=options.get("tool") or "ray-session",
                    workspace=options.get("workspace"), workspace_mode=mode,
                    workspace_gitignore=bool(options.get("workspace_gitignore")), secrets=secrets, audit=self.audit,
                ))  # fmt: skip
                await asyncio.to_thread(self._gated, sb._sync.start)
        except ToolcageError as exc:
            await self._release()
            return ("error", await self._translate(exc), self.load())
        except BaseException:
            await self._release()
            raise
        sid = token_hex(8)
        self.held[sid] = _Held(client, sb)
        return ("ok", {"session": sid, "run_id": sb.run_id, "name": sb.name}, self.load())

    def _session(self, sid: str) -> Any:
        held = self.held.get(sid)
        if held is None:
            raise UsageError(f"no session {sid} on node {self.node_id[:12]} (closed, or its client is gone)")
        return held.sandbox

    async def _on(self, sid: str, fn: Callable[[Any], Any]) -> Outcome:
        try:
            value = await fn(self._session(sid))
            return ("ok", value, self.load())
        except ToolcageError as exc:
            return ("error", await self._translate(exc), self.load())

    async def call(self, sid: str, tool: str, params: dict[str, Any] | None, timeout: float | None) -> Outcome:
        return await self._on(sid, lambda sb: sb.call(tool, params, timeout=timeout))

    async def update_network(self, sid: str, network: Any, requested_by: str) -> Outcome:
        return await self._on(sid, lambda sb: sb.update_network(network, requested_by=requested_by))

    async def write_files(self, sid: str, files: dict[str, bytes | str], mode: int) -> Outcome:
        return await self._on(sid, lambda sb: sb.write_files(files, mode=mode))

    async def read_files(self, sid: str, paths: list[str], missing_ok: bool) -> Outcome:
        return await self._on(sid, lambda sb: sb.read_files(paths, missing_ok=missing_ok))

    async def close(self, sid: str) -> Outcome:
        held = self.held.pop(sid, None)
        if held is None:
            return ("ok", None, self.load())
        try:
            summary = await held.sandbox.close()
            self.served += 1
            return ("ok", summary, self.load())
        except ToolcageError as exc:
            return ("error", await self._translate(exc), self.load())
        finally:
            await self._release()

    # images -----------------------------------------------------------------------------------
    async def export_image(self) -> bytes:
        """The cluster's image as ``docker save`` writes it, for a peer that lacks it."""
        if not self.image_ready:
            raise ImageMissing(f"node {self.node_id[:12]} does not have the cluster's image to give")
        return await asyncio.to_thread(lambda: b"".join(self.engine.save_image(self.config.image)))

    async def load_image(self, data: bytes) -> dict[str, Any]:
        """``docker load`` of the image from the driver or a peer; the node takes runs once its id matches."""
        self.loading = True
        t0 = time.monotonic()
        try:
            await asyncio.to_thread(self.engine.load_image, data)
        finally:
            self.loading = False
        await asyncio.to_thread(self._check_engine)
        took = round(time.monotonic() - t0, 3)
        if self.audit is not None:
            self.audit.event(
                "cluster.image_loaded", cluster=self.config.cluster, node=self.node_id, image=self.config.image,
                image_id=self.image_id, bytes=len(data), seconds=took, ready=self.image_ready,
            )  # fmt: skip
        if not self.image_ready:
            raise ImageMissing(
                f"node {self.node_id[:12]} loaded {self.config.image} but its id is {self.image_id}, not "
                f"{self.config.image_id}"
            )
        self._ensure_pool()
        return {**self.load(), "load_s": took}

    # other images (a run's own: cluster.sandbox(image=...)), by content id ----------------------------
    def _has(self, image_id: str) -> bool:
        try:
            info = self.engine.image(image_id)
        except ToolcageError:
            return False
        return info is not None and info.get("Id") == image_id

    async def has_images(self, image_ids: list[str]) -> list[str]:
        """Which of these images (content ids) this node's engine has."""
        return [i for i in image_ids if await asyncio.to_thread(self._has, i)]

    async def image_id_of(self, ref: str) -> str | None:
        """The content id of ``ref`` on this node's engine, or None."""
        try:
            info = await asyncio.to_thread(self.engine.image, ref)
        except ToolcageError:
            return None
        return str(info["Id"]) if info else None

    async def export_image_of(self, ref: str, image_id: str) -> bytes:
        """``docker save`` of ``ref`` (checked to be ``image_id`` here), for a node that lacks it."""
        if await self.image_id_of(ref) != image_id:
            raise ImageMissing(f"node {self.node_id[:12]} does not have {ref} as {image_id}")
        return await asyncio.to_thread(lambda: b"".join(self.engine.save_image(ref)))

    async def load_image_of(self, data: bytes, ref: str, image_id: str) -> dict[str, Any]:
        """``docker load`` of a run's image sent by the driver (or a peer through it); the load is kept only
        if the engine then has that content id (the image's config digest: what was sent is what runs). The
        worker image's runtime volumes for it are made at its first run (toolcage.engine.runtime.find)."""
        t0 = time.monotonic()
        if not await asyncio.to_thread(self._has, image_id):
            # a load is as heavy on the engine as a start: within max_starting (a thread waits, not the loop)
            await asyncio.to_thread(self._gated, lambda: self.engine.load_image(data))
        took = round(time.monotonic() - t0, 3)
        ok = await asyncio.to_thread(self._has, image_id)
        if self.audit is not None:
            self.audit.event(
                "cluster.image_loaded", cluster=self.config.cluster, node=self.node_id, image=ref,
                image_id=image_id, bytes=len(data), seconds=took, ready=ok,
            )  # fmt: skip
        if not ok:
            raise ImageMissing(f"node {self.node_id[:12]} loaded {ref} but has no image {image_id} after it")
        return {**self.load(), "load_s": took}

    # operators --------------------------------------------------------------------------------
    def _reap(self, by: str) -> list[dict[str, Any]]:
        from toolcage.lifecycle.reaper import find_orphans, remove

        found = find_orphans(self.engine)
        if found:
            remove(self.engine, found, self.audit, by=f"cluster-{by}")
            self.log.info("cluster.reaped", count=len(found), by=by)
        return [{**o.__dict__, "node": self.node_id} for o in found]

    async def reap(self) -> list[dict[str, Any]]:
        """Remove what dead owners left on this node's engine (never what a live runner owns)."""
        return await asyncio.to_thread(self._reap, "asked")

    async def ps(self) -> list[dict[str, Any]]:
        from toolcage.ops.views import live_runs

        rows = await asyncio.to_thread(live_runs, self.engine, False)
        return [{**r, "node": self.node_id} for r in rows]

    async def audit_log(self, run_id: str | None, limit: int, verify: bool) -> dict[str, Any]:
        """This node's audit records (the last ``limit``, or one run's) and whether its chain verifies."""
        from collections import deque

        from toolcage.lifecycle import audit as audit_mod

        path = self.audit.path if self.audit is not None else audit_mod.default_path()

        def read() -> dict[str, Any]:
            out: dict[str, Any] = {"node": self.node_id, "path": str(path)}
            if verify:
                out["problems"] = audit_mod.verify(path)
            recs: deque[dict[str, Any]] = deque(maxlen=limit)
            if path.exists():
                for rec in audit_mod.read(path):
                    if run_id is None or rec.get("run_id") == run_id:
                        recs.append(rec)
            out["records"] = list(recs)
            return out

        return await asyncio.to_thread(read)

    async def status(self) -> dict[str, Any]:
        return self.load()
