"""The driver of a Ray cluster's toolcage nodes: :class:`Cluster` keeps a view of every node's agent (its load,
its engine, whether it has the image), sends the image where it is missing, and places each run or session on
the best node that admits it. Sessions are :mod:`toolcage.ray.session`'s; the operators' views of every node
are :mod:`toolcage.ray.views`'. Nothing here schedules containers: each node's agent does, as toolcage does on
one machine.

Failure is typed, never retried (a call may have had effects): a run whose node or agent dies ends in
:class:`~toolcage.errors.NodeLost`; one whose engine stops answering in
:class:`~toolcage.errors.EngineUnavailable`; a run no node admits before ``wait_s`` in
:class:`~toolcage.errors.NoCapacity`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from secrets import token_hex
from typing import TYPE_CHECKING, Any

import ray

from toolcage.errors import ImageMissing, NoCapacity, NodeLost, SandboxInterrupted, ToolcageError, UsageError
from toolcage.policies import contract
from toolcage.ray import direct, placement
from toolcage.ray.agent import NAMESPACE, AgentConfig, EngineAgent, Outcome, agent_name
from toolcage.ray.handle import NodeAgent, actor_lost
from toolcage.ray.session import AsyncClusterSandbox, ClusterSandbox
from toolcage.ray.views import cluster_audit, cluster_ps

if TYPE_CHECKING:
    from toolcage.policies import PolicySource
    from toolcage.results import CallResult

NODE_RESOURCE = "toolcage_engine"  # a node with this Ray resource runs an agent (`ray start --resources`)
DEFAULT_PER_NODE = {"warm": 2, "max_running": 16, "max_starting": 2}
REFRESH_S = 1.0  # how often the driver refreshes its view of the nodes and their agents
DEFAULT_WAIT_S = 60.0  # how long a run waits for a node to admit it, by default
BROKEN_CHECK_S = 5.0  # how long a call whose connection broke waits for Ray to say whether its agent lives
DIRECT_RETRY_S = 30.0  # an agent whose direct channel could not be opened is asked through Ray this long
WAIT_SLICE_S = (0.25, 2.0)  # a run that finds every node full waits on one this long (doubling), then asks all again


def _per_node(per_node: Mapping[str, int] | None) -> dict[str, int]:
    out = dict(DEFAULT_PER_NODE)
    for key, value in (per_node or {}).items():
        if key not in out:
            raise UsageError(f"per_node takes {', '.join(out)}, not {key!r}")
        if isinstance(value, bool) or not isinstance(value, int) or value < (0 if key == "warm" else 1):
            raise UsageError(f"per_node[{key!r}] must be an integer of at least {0 if key == 'warm' else 1}")
        out[key] = value
    return out


class Cluster:
    """Runs and sessions across every node of a Ray cluster that has a toolcage engine.

    ``policy``: as for ``Sandbox`` (a bundled name, a file, a mapping, a Policy): the same on every node.
    ``image``: the worker image every node must have, by id (``image_id``; default: this driver's engine's
    build of ``image``, or the first node's); a node that lacks it, or has another build, is sent it
    (``docker save`` from this driver's engine, else from a node that has it; never a pull) and takes no
    runs until it has it. ``per_node``: ``warm`` (the never-reused pool on each node), ``max_running`` and
    ``max_starting`` (the caps each node's agent enforces). ``placement``: ``best_of_k`` (default, K=2)
    or ``least_loaded``. ``name``: the agents' name; another Cluster of the same name shares them (and
    must have the same configuration). ``linger_s``: how long an agent waits for a client after the last
    one left before it removes its pool and exits. ``ready_timeout``: how long the constructor waits for
    the first node to take runs. ``direct`` (default on; ``TOOLCAGE_RAY_DIRECT=off`` turns the default off): a
    run and a session's call go to the node's agent on its direct channel (:mod:`toolcage.ray.direct`: signed
    TCP connections, kept open, that the agent's Ray ``hello`` hands out) instead of one Ray actor call each;
    Ray still finds and watches the agents, and under Ray's TLS every call stays on Ray. Call ``ray.init``
    first; call :meth:`wait_ready` before a burst (the constructor returns once one node is ready, not all)."""

    def __init__(
        self,
        policy: PolicySource = "default",
        *,
        image: str | None = None,
        image_id: str | None = None,
        per_node: Mapping[str, int] | None = None,
        placement_strategy: str = placement.BEST_OF_K,
        k: int = 2,
        name: str = "default",
        node_resource: str = NODE_RESOURCE,
        linger_s: float = 30.0,
        wait_s: float = DEFAULT_WAIT_S,
        ready_timeout: float = 120.0,
        snapshot_key: bytes | None = None,
        direct: bool | None = None,
    ) -> None:
        from toolcage.files import snapshot
        from toolcage.options import resolve_policy, worker_image

        if not ray.is_initialized():
            raise UsageError("call ray.init(...) before toolcage.ray.Cluster(...)")
        if placement_strategy not in placement.PLACEMENTS:
            raise UsageError(f"placement_strategy must be one of {', '.join(placement.PLACEMENTS)}")
        self.policy = resolve_policy(policy)
        self.image = worker_image(image)
        self.name = name
        self.node_resource = node_resource
        # runs and session calls on each agent's direct channel (toolcage.ray.direct), Ray finding and watching
        # the agents; off: every call is a Ray actor call (TOOLCAGE_RAY_DIRECT=off sets the default)
        self.direct = direct if direct is not None else os.environ.get(contract.ENV_RAY_DIRECT, "on") != "off"
        self.placement, self.k, self.wait_s = placement_strategy, k, wait_s
        limits = _per_node(per_node)
        self._local_engine: Any = None
        self.image_id = image_id or self._local_image_id()
        self.config = AgentConfig(
            cluster=name, policy=json.loads(self.policy.canonical_json()), image=self.image, image_id=self.image_id,
            warm=limits["warm"], max_running=limits["max_running"], max_starting=limits["max_starting"],
            linger_s=linger_s,
        )  # fmt: skip
        # this driver's key: it signs its sessions' snapshots and verifies a resume before any node is asked
        # (the agents hold none, so another driver's key can never stand in for it)
        self.snapshot_key = snapshot_key or snapshot.host_key(create=True)
        # this client, as the agents know it: its Ray job (a driver, or a task of its job) and a token of its own
        self.job = f"{ray.get_runtime_context().get_job_id()}:{token_hex(4)}"
        self._agents: dict[str, NodeAgent] = {}
        self._lock = threading.Lock()
        self._closed = False
        self._image_ref: Any = None  # the image's bytes in Ray's object store, put once
        self._loading: dict[str, threading.Thread] = {}
        self.events: list[dict[str, Any]] = []  # what the view saw: nodes joining, lost, images sent
        # runs' own images (cluster.sandbox(image=...)), by content id: the nodes known to have each (asked
        # once, then kept up to date by what this driver sends and what the nodes refuse), and one lock per
        # (node, image) so concurrent runs send an image to a node once
        self._holders: dict[str, set[str]] = {}
        self._sending: dict[tuple[str, str], threading.Lock] = {}
        self._refresh()
        self._thread = threading.Thread(target=self._refresh_loop, name="toolcage-ray-view", daemon=True)
        self._thread.start()
        self.wait_ready(timeout=ready_timeout, count=1)

    # the view ---------------------------------------------------------------------------------
    def _local_image_id(self) -> str | None:
        from toolcage.engine.docker_adapter import Engine

        try:
            self._local_engine = Engine.default()
            info = self._local_engine.image(self.image)
        except ToolcageError:
            self._local_engine = None
            return None
        return str(info["Id"]) if info else None

    def _nodes(self) -> list[str]:
        return sorted(
            n["NodeID"]
            for n in ray.nodes()  # type: ignore[no-untyped-call]
            if n.get("Alive") and n.get("Resources", {}).get(self.node_resource, 0) > 0
        )

    def _agent_for(self, node_id: str) -> NodeAgent:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        handle = (
            ray.remote(EngineAgent)
            .options(
                name=agent_name(self.name, node_id), namespace=NAMESPACE, lifetime="detached", get_if_exists=True,
                num_cpus=0, max_restarts=0, max_concurrency=1000,
                scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
            )
            .remote(self.config)
        )  # fmt: skip
        view = placement.NodeView(node_id, self.config.max_running, healthy=False, why_not="starting its agent")
        return NodeAgent(node_id, handle, view)

    def _refresh(self) -> None:
        alive = set(self._nodes())
        with self._lock:
            for node_id in list(self._agents):
                if node_id not in alive:
                    self._drop(node_id, "the node left the cluster")
            new = [n for n in alive if n not in self._agents]
        for node_id in new:
            agent = self._agent_for(node_id)
            with self._lock:
                self._agents[node_id] = agent
            self.events.append({"event": "node_joined", "node": node_id, "t": time.time()})
        agents = [a for a in self._agents.values() if not a.lost]
        if not agents:
            return
        refs = {a.handle.hello.remote(self.job, self.config.digest(), self.image_id): a for a in agents}
        ready, _ = ray.wait(list(refs), num_returns=len(refs), timeout=30 if new else 5)
        for ref in ready:
            agent = refs[ref]
            try:
                load = ray.get(ref)
                if self.image_id is None and load.get("config_image_id"):  # the build the cluster already runs
                    self.image_id = load["config_image_id"]
                    self.config = dataclasses.replace(self.config, image_id=self.image_id)
                self._update(agent, load)
            except UsageError:
                raise
            except Exception as exc:
                if actor_lost(exc):
                    self._drop(agent.node_id, f"its agent died: {type(exc).__name__}")
                else:
                    agent.view.healthy, agent.view.why_not = False, str(exc)[:300]
        for agent in agents:
            if not agent.lost and not agent.view.image_ready and agent.view.healthy:
                self._send_image(agent)

    def _refresh_loop(self) -> None:
        while not self._closed:
            time.sleep(REFRESH_S)
            if self._closed or not ray.is_initialized():  # never start a Ray of our own after ray.shutdown()
                return
            try:
                self._refresh()
            except Exception as exc:  # the view goes stale, runs still carry their own load answers
                self.events.append({"event": "refresh_failed", "error": str(exc)[:300], "t": time.time()})

    def _drop(self, node_id: str, why: str) -> None:
        agent = self._agents.pop(node_id, None)
        if agent is not None:
            agent.lost = True
            if agent.direct is not None:  # a call waiting on it ends now, as a Ray call to a lost actor does
                agent.direct.close()
            self.events.append({"event": "node_lost", "node": node_id, "why": why, "t": time.time()})

    def _update(self, agent: NodeAgent, load: dict[str, Any]) -> None:
        if not load:  # an answer that carries no view (the direct channel's own error answer)
            return
        if self.direct and "direct" in load and not agent.lost and time.monotonic() >= agent.direct_retry_at:
            offer = load["direct"]
            if agent.direct is None or not agent.direct.same(offer):
                old, agent.direct = agent.direct, direct.Channel.of(offer)
                if old is not None:
                    old.retire()
        v = agent.view
        v.running = int(load.get("running", v.running))
        v.healthy = bool(load.get("healthy"))
        v.image_ready = bool(load.get("image_ready"))
        v.why_not = str(load.get("why_not") or "")

    def _job_hex(self) -> str:
        return self.job

    # images -----------------------------------------------------------------------------------
    def _send_image(self, agent: NodeAgent) -> None:
        """Send the image to a node that lacks it (one thread per node, once at a time)."""
        t = self._loading.get(agent.node_id)
        if t is not None and t.is_alive():
            return
        if "loading" in agent.view.why_not:
            return
        t = threading.Thread(target=self._load_on, args=(agent,), name="toolcage-ray-image", daemon=True)
        self._loading[agent.node_id] = t
        t.start()

    def _image_source(self) -> Any:
        """An ObjectRef of the image's ``docker save`` bytes: from this driver's engine, else a node with it."""
        if self._image_ref is not None:
            return self._image_ref
        if self._local_engine is not None and self._local_image_id() == self.image_id and self.image_id:
            data = b"".join(self._local_engine.save_image(self.image))
            self._image_ref = ray.put(data)
            return self._image_ref
        for peer in list(self._agents.values()):
            if peer.view.image_ready and not peer.lost:
                return peer.handle.export_image.remote()  # node to node: the bytes need not pass through here
        raise ImageMissing(f"no engine in reach has {self.image} ({self.image_id}) to send: build or load it on one")

    def _load_on(self, agent: NodeAgent) -> None:
        t0 = time.time()
        try:
            src = self._image_source()
            out = ray.get(agent.handle.load_image.remote(src))
            self._update(agent, out)
            self.events.append({"event": "image_sent", "node": agent.node_id, "s": round(time.time() - t0, 2)})
        except Exception as exc:
            msg = exc.message if isinstance(exc, ToolcageError) else str(exc)[:300]
            agent.view.why_not = f"image not sent: {msg}"
            self.events.append({"event": "image_failed", "node": agent.node_id, "error": msg})

    def wait_ready(self, count: int | None = None, timeout: float = 120.0) -> int:
        """Wait until ``count`` nodes (default: all) take runs (agent up, engine up, the image there); return
        how many do. Raises ``NoCapacity`` if none does by ``timeout``.

        Call it before a burst: ``Cluster(...)`` returns as soon as one node takes runs, while the image is
        still on its way to the others (``docker save`` bytes, node to node), so runs sent right away all land
        on that first node until the others have it.

            cluster = Cluster("default")
            cluster.wait_ready()             # every node that has the toolcage_engine resource
            results = cluster.map(calls)     # spread across them"""
        until = time.monotonic() + timeout
        while True:
            with self._lock:
                ready = sum(1 for a in self._agents.values() if a.view.eligible)
                total = len(self._agents)
            want = total if count is None else count
            if ready >= max(want, 1):
                return ready
            if time.monotonic() >= until:
                if ready:
                    return ready
                whys = "; ".join(f"{a.node_id[:12]}: {a.view.why_not}" for a in self._agents.values())
                raise NoCapacity(
                    f"no node of the cluster can take runs after {timeout:.0f}s"
                    + (f" ({whys})" if whys else f": no alive node has the {self.node_resource!r} resource")
                )
            time.sleep(0.2)

    def nodes(self) -> list[dict[str, Any]]:
        """Each node's view: id, whether it takes runs and why not, its running runs as last reported."""
        with self._lock:
            return [
                {"node_id": a.node_id, "eligible": a.view.eligible, "why_not": a.view.why_not,
                 "running": a.view.running, "inflight": a.view.inflight}
                for a in self._agents.values()
            ]  # fmt: skip

    # placement --------------------------------------------------------------------------------
    def _order(self, node: str | None, image: tuple[str, str] | None = None) -> list[NodeAgent]:
        prefer = self._holders_of(image[1]) if image is not None else set()
        with self._lock:
            if node is not None:
                agent = self._agents.get(node)
                if agent is None:
                    raise NodeLost(f"node {node[:12]} is not in the cluster (left, or lost)", node=node)
                return [agent]
            views = [a.view for a in self._agents.values()]
            decision = placement.decide(views, self.placement, self.k, prefer=prefer)
            return [self._agents[n] for n in decision.order if n in self._agents]

    # runs' own images ---------------------------------------------------------------------------
    def resolve_image(self, ref: str) -> tuple[str, str] | None:
        """``(ref, content id)`` of a run's image, or None for the cluster's own. The id is this driver's
        engine's for ``ref``, else the first node's that has it (ImageMissing when none has)."""
        if not isinstance(ref, str) or not ref:
            raise UsageError("image must be an image reference (name[:tag] or an image id)")
        if ref == self.image:
            return None
        image_id: str | None = None
        if self._local_engine is not None:
            with contextlib.suppress(ToolcageError):
                info = self._local_engine.image(ref)
                image_id = str(info["Id"]) if info else None
        if image_id is None:
            agents = [a for a in list(self._agents.values()) if not a.lost]
            refs = [a.handle.image_id_of.remote(ref) for a in agents]
            for got in ray.get(refs, timeout=30) if refs else []:
                if got:
                    image_id = str(got)
                    break
        if image_id is None:
            raise ImageMissing(f"no engine in reach has the image {ref} (this driver's nor a node's): build or load it")
        if image_id == self.image_id:
            return None
        return ref, image_id

    def _holders_of(self, image_id: str) -> set[str]:
        """The nodes known to have ``image_id`` (asked of every node the first time)."""
        with self._lock:
            known = self._holders.get(image_id)
            if known is not None:
                return set(known)
            agents = [a for a in self._agents.values() if not a.lost and a.view.eligible]
        found: set[str] = set()
        refs = {a.handle.has_images.remote([image_id]): a for a in agents}
        ready, _ = ray.wait(list(refs), num_returns=len(refs), timeout=10) if refs else ([], [])
        for ref in ready:
            with contextlib.suppress(Exception):
                if ray.get(ref):
                    found.add(refs[ref].node_id)
        with self._lock:
            self._holders.setdefault(image_id, set()).update(found)
            return set(self._holders[image_id])

    def _has(self, agent: NodeAgent, image_id: str, has: bool) -> None:
        with self._lock:
            held = self._holders.setdefault(image_id, set())
            if has:
                held.add(agent.node_id)
            else:
                held.discard(agent.node_id)

    def _send_run_image(self, agent: NodeAgent, ref: str, image_id: str) -> None:
        """Send a run's image to a node that lacks it, with no registry: ``docker save`` of it from this
        driver's engine (or from a node that has it, node to node through Ray's object store), ``docker
        load`` there, its content id checked after the load. Once per (node, image) at a time."""
        with self._lock:
            lock = self._sending.setdefault((agent.node_id, image_id), threading.Lock())
        with lock:
            with self._lock:
                if agent.node_id in self._holders.get(image_id, set()):
                    return  # another run sent it meanwhile
            t0 = time.time()
            src: Any = None
            if self._local_engine is not None:
                with contextlib.suppress(ToolcageError):
                    info = self._local_engine.image(ref)
                    if info and info.get("Id") == image_id:
                        src = ray.put(b"".join(self._local_engine.save_image(ref)))
            if src is None:
                peers = [a for a in list(self._agents.values()) if a.node_id in self._holders_of(image_id)]
                if not peers:
                    raise ImageMissing(f"no engine in reach has {ref} ({image_id}) to send to {agent.node_id[:12]}")
                src = peers[0].handle.export_image_of.remote(ref, image_id)
            try:
                out = ray.get(agent.handle.load_image_of.remote(src, ref, image_id))
            except Exception as exc:
                if actor_lost(exc):
                    raise self._lost(agent, exc) from None
                if isinstance(exc, ray.exceptions.RayTaskError) and isinstance(exc.cause, ToolcageError):
                    raise exc.cause from None
                raise
            self._update(agent, out)
            self._has(agent, image_id, True)
            self.events.append({
                "event": "run_image_sent", "node": agent.node_id, "image": ref, "image_id": image_id,
                "s": round(time.time() - t0, 2), "load_s": out.get("load_s"),
            })  # fmt: skip

    def _lost(self, agent: NodeAgent, exc: BaseException) -> NodeLost:
        alive = agent.node_id in set(self._nodes())
        why = "the agent died (its node is alive)" if alive else "its node died"
        self._drop(agent.node_id, why)
        return NodeLost(
            f"node {agent.node_id[:12]} was lost mid-run: {why}; the run is not retried (it may have had "
            "effects) and its sandbox is removed by that node's reaper",
            node=agent.node_id, cause=type(exc).__name__,
        )  # fmt: skip

    def _ask(
        self, agent: NodeAgent, method: str, args: tuple[Any, ...], hold: Callable[[Any], bool] | None = None
    ) -> Any:
        """``method(*args)`` on the agent: on its direct channel when it has one (:mod:`.direct`), else a Ray
        actor call. ``direct.ChannelError`` only once the request may have reached the agent; a channel that
        cannot be opened is set aside for this agent for DIRECT_RETRY_S, and the call goes through Ray."""
        ch = agent.direct
        if ch is not None and method in direct.METHODS:
            try:
                return ch.call(method, args, hold)
            except direct.ChannelError as exc:
                if exc.sent or agent.lost:
                    raise
                if not ch.closed:  # new calls go through Ray for a while; the calls in flight on it finish there
                    agent.direct, agent.direct_retry_at = None, time.monotonic() + DIRECT_RETRY_S
                    ch.retire()
                    self.events.append({"event": "direct_unavailable", "node": agent.node_id, "error": str(exc)})
        return ray.get(getattr(agent.handle, method).remote(*args))

    def _broken(self, agent: NodeAgent, exc: direct.ChannelError) -> ToolcageError:
        """What a call whose connection broke after its request went out ends in: ``NodeLost`` when the agent is
        gone (or does not answer Ray within BROKEN_CHECK_S); else the agent saw the connection close and cancelled
        the call there, and the node stays in the view (``SandboxInterrupted``)."""
        if agent.lost:
            return self._lost(agent, exc)
        try:
            ray.get(agent.handle.status.remote(), timeout=BROKEN_CHECK_S)
        except Exception as why:
            return self._lost(agent, why)
        return SandboxInterrupted(
            f"the connection to the agent of node {agent.node_id[:12]} broke mid-call ({exc}); the agent lives, and "
            "cancelled the call there if it was still running", node=agent.node_id,
        )  # fmt: skip

    def _settle(self, agent: NodeAgent, outcome: Outcome) -> Any:
        kind, value, load = outcome
        self._update(agent, load)
        if kind == "error":
            raise value
        return value

    def _admitted(
        self,
        method: str,
        args: tuple[Any, ...],
        wait_s: float | None,
        node: str | None,
        image: tuple[str, str] | None = None,
    ) -> tuple[NodeAgent, Any]:
        """Ask the nodes in placement order until one admits the call (none waits: a full node says so at
        once); when all are full, wait on the best one for what is left of ``wait_s``. Nothing has run on a
        node that refused, so trying the next one is not a retry. ``image``: the run's own (ref, content
        id): the nodes that have it are asked first; one that lacks it is sent it before it is asked."""
        wait = self.wait_s if wait_s is None else wait_s
        until = time.monotonic() + wait
        refused: list[str] = []
        slice_s = WAIT_SLICE_S[0]
        while True:
            order = self._order(node, image)
            for i, agent in enumerate(order):
                last = i == len(order) - 1
                # the last node asked waits a slice for room, then every node is asked again: room may come
                # anywhere first; the slices grow, so many waiting runs do not flood the agents
                left = max(min(until - time.monotonic(), slice_s), 0) if last else 0
                if image is not None and agent.node_id not in self._holders_of(image[1]):
                    if agent.view.load >= 1.0 and not last:
                        continue  # full: no use sending it there now
                    try:
                        self._send_run_image(agent, *image)
                    except NodeLost:
                        continue
                    except ToolcageError as exc:
                        refused.append(f"{agent.node_id[:12]}: {exc.message}")
                        continue
                agent.view.inflight += 1
                try:
                    outcome = self._ask(agent, method, (*args, left))
                except direct.ChannelError as exc:
                    if exc.sent:  # it went out: the run may have had effects, never retried
                        raise self._broken(agent, exc) from None
                    self._lost(agent, exc)  # lost before it was asked: nothing ran there
                    continue
                except Exception as exc:
                    if actor_lost(exc):
                        self._lost(agent, exc)
                        continue
                    raise
                finally:
                    agent.view.inflight -= 1
                kind, value, load = outcome
                self._update(agent, load)
                refusal = kind == "error" and isinstance(value, ToolcageError) and value.details.get("refused")
                if refusal and image is not None and value.details.get("image_missing"):
                    self._has(agent, image[1], False)  # removed there since: sent again on the next round
                if refusal:  # nothing ran there: ask another, or wait, or say why none took it
                    refused.append(f"{agent.node_id[:12]}: {value.message}")
                    if last and time.monotonic() >= until:
                        raise NoCapacity(f"no node admitted the run within {wait:.1f}s ({'; '.join(refused[-3:])})")
                    continue
                return agent, outcome
            if time.monotonic() >= until:
                why = "; ".join(refused[-3:]) or "no node can take runs"
                raise NoCapacity(f"no node admitted the run within {wait:.1f}s ({why})")
            if not order:  # no node can take runs now (images loading, engines down): look again soon
                time.sleep(min(0.2, max(until - time.monotonic(), 0)))
            slice_s = min(slice_s * 2, WAIT_SLICE_S[1])
            refused.clear()

    # one-off runs -----------------------------------------------------------------------------
    def run(
        self,
        tool: str,
        params: dict[str, Any] | None = None,
        *,
        secrets: Mapping[str, str] | None = None,
        timeout: float | None = None,
        wait_s: float | None = None,
        node: str | None = None,
        image: str | None = None,
    ) -> CallResult:
        """One call in one fresh sandbox on the best node, then the sandbox is gone (as ``Sandbox``, once).
        ``wait_s``: how long to wait for a node with room (then ``NoCapacity``); ``node``: that node only;
        ``image``: any image (default: the cluster's), placed on a node that has it, else sent to one."""
        self._check_open()
        own = self.resolve_image(image) if image is not None else None
        args = (self._job_hex(), tool, params, dict(secrets) if secrets else None, timeout, own[1] if own else None)
        agent, outcome = self._admitted("run", args, wait_s, node, own)
        result: CallResult = self._settle(agent, outcome)
        return result

    def map(
        self, calls: Iterable[tuple[str, dict[str, Any] | None]], **kwargs: Any
    ) -> list[CallResult | ToolcageError]:
        """Many one-off runs at once (threads, within each node's caps): each result, or the error it ended with."""
        from concurrent.futures import ThreadPoolExecutor

        calls = list(calls)

        def one(c: tuple[str, dict[str, Any] | None]) -> CallResult | ToolcageError:
            try:
                return self.run(c[0], c[1], **kwargs)
            except ToolcageError as exc:
                return exc

        cap = max(1, sum(1 for _ in self._agents) * self.config.max_running)
        with ThreadPoolExecutor(max_workers=min(len(calls) or 1, cap, 256)) as ex:
            return list(ex.map(one, calls))

    async def arun(self, tool: str, params: dict[str, Any] | None = None, **kwargs: Any) -> CallResult:
        """:meth:`run` for an event loop (the waits happen on a thread)."""
        return await asyncio.to_thread(lambda: self.run(tool, params, **kwargs))

    # sessions ---------------------------------------------------------------------------------
    def sandbox(self, **options: Any) -> ClusterSandbox:
        """A session pinned to one node (``with cluster.sandbox() as sb:``): ``Sandbox``'s calls, files and
        snapshots. Options: ``workspace`` (a directory the node can see; a diff reads it as this driver sees
        it), ``workspace_mode``, ``workspace_gitignore``, ``resume`` (a snapshot: a path or bytes here,
        verified here with the driver's key, then sent to the node), ``secrets``, ``node``, ``wait_s``,
        ``image`` (any image, unchanged, as ``Sandbox(image=...)``: placed on a node that has it, by content
        id, else sent to the least loaded one with no registry; on the node, a slot of that image from its
        warm pool, started on demand)."""
        return ClusterSandbox(self, options)

    def async_sandbox(self, **options: Any) -> AsyncClusterSandbox:
        """The async twin of :meth:`sandbox` (``async with cluster.async_sandbox() as sb:``)."""
        return AsyncClusterSandbox(ClusterSandbox(self, options))

    # operators --------------------------------------------------------------------------------
    def ps(self) -> list[dict[str, Any]]:
        """Live runs on every node (``toolcage ps`` there), each row with its node."""
        return cluster_ps()

    def audit(self, run_id: str | None = None, limit: int = 200, verify: bool = True) -> list[dict[str, Any]]:
        """Each node's audit records and whether its chain verifies (``toolcage audit`` there)."""
        return cluster_audit(run_id=run_id, limit=limit, verify=verify)

    def reap(self) -> list[dict[str, Any]]:
        """Ask every node's agent to remove what dead owners left there."""
        refs = [a.handle.reap.remote() for a in self._agents.values()]
        return [o for got in ray.get(refs) for o in got]

    def _check_open(self) -> None:
        if self._closed:
            raise UsageError("this Cluster is closed")

    def close(self, *, stop_agents: bool = False) -> None:
        """Leave every agent (this driver's sessions there close); ``stop_agents``: also stop them now (their
        warm pools go; other drivers' runs on them end). Otherwise an agent exits ``linger_s`` after its last
        client left."""
        if self._closed:
            return
        self._closed = True
        agents = list(self._agents.values())
        refs = [a.handle.leave.remote(self._job_hex()) for a in agents]
        if stop_agents:
            refs += [a.handle.shutdown.remote("stopped by its cluster") for a in agents]
        with contextlib.suppress(Exception):
            ray.wait(refs, num_returns=len(refs), timeout=60)
        for agent in agents:  # after the agents closed this driver's sessions, whose calls then end as closed
            if agent.direct is not None:
                agent.direct.close()

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = ["DEFAULT_PER_NODE", "DEFAULT_WAIT_S", "NODE_RESOURCE", "Cluster"]
