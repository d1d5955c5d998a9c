"""Issue 40 (placement): how the driver routes a run between an agent's direct channel and Ray.

No Ray cluster here: a Cluster built without its constructor, fake agent handles whose Ray calls are recorded,
and the direct channel's real server on 127.0.0.1 or a port nobody listens on.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.helpers import held_connections
from toolcage.errors import NodeLost
from toolcage.ray import cluster as cluster_mod
from toolcage.ray import direct, placement
from toolcage.ray.handle import NodeAgent

UP = {"healthy": True, "image_ready": True}


class _Remote:
    def __init__(self, log: list[str], node: str, method: str) -> None:
        self.log, self.node, self.method = log, node, method

    def remote(self, *args: Any) -> Any:
        self.log.append(f"ray:{self.method}@{self.node}")
        return ("ok", f"{self.method} via ray", {"running": 0, "healthy": True, "image_ready": True})


class _Handle:
    def __init__(self, log: list[str], node: str) -> None:
        self.log, self.node = log, node

    def __getattr__(self, method: str) -> _Remote:
        return _Remote(self.log, self.node, method)


def _cluster(nodes: list[str], log: list[str], monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setattr(cluster_mod.ray, "get", lambda ref, **kw: ref)
    c = cluster_mod.Cluster.__new__(cluster_mod.Cluster)
    c._lock = threading.Lock()
    c.events = []
    c.placement, c.k, c.wait_s, c.direct = placement.LEAST_LOADED, 2, 1.0, True
    c._holders, c._sending = {}, {}
    c._agents = {
        n: NodeAgent(n, _Handle(log, n), placement.NodeView(n, 4, image_ready=True, healthy=True)) for n in nodes
    }
    c._nodes = lambda: list(nodes)  # type: ignore[method-assign]
    return c


@pytest.fixture
def server() -> Iterator[tuple[str, int, list[str]]]:
    """A real direct server whose run answers at once, or, for ``hang``, never (until its connection closes)."""
    loop = asyncio.new_event_loop()
    seen: list[str] = []
    t = threading.Thread(target=loop.run_forever, daemon=True)
    t.start()

    async def run(*args: Any) -> Any:
        seen.append(str(args[0]))
        if args[0] == "hang":
            await asyncio.sleep(60)
        if args[0] == "slow":
            await asyncio.sleep(1.0)
        return ("ok", "run via direct", {"running": 0, "healthy": True, "image_ready": True})

    srv = direct.Server(
        b"k" * 32, {"run": run, "call": run}, __import__("pickle").dumps, lambda e, stage: ("error", e, {})
    )
    host, port = asyncio.run_coroutine_threadsafe(srv.start("127.0.0.1"), loop).result(5)
    try:
        yield host, port, seen
    finally:

        async def down() -> None:
            srv.close()
            await asyncio.gather(
                *[x for x in asyncio.all_tasks() if x is not asyncio.current_task()], return_exceptions=True
            )

        asyncio.run_coroutine_threadsafe(down(), loop).result(5)
        loop.call_soon_threadsafe(loop.stop)
        t.join(5)
        loop.close()


def _free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = int(s.getsockname()[1])
    s.close()
    return port


def test_a_run_goes_on_the_direct_channel_when_the_agent_offered_one(
    server: tuple[str, int, list[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    host, port, seen = server
    log: list[str] = []
    c = _cluster(["n1"], log, monkeypatch)
    c._update(c._agents["n1"], {"direct": {"host": host, "port": port, "key": (b"k" * 32).hex()}, **UP})
    agent, outcome = c._admitted("run", ("job", "t", None, None, None, None), None, None)
    assert outcome[1] == "run via direct" and seen == ["job"] and log == []
    # a session's open (and anything not in direct.METHODS) stays on Ray
    assert c._ask(agent, "open", ("job", {}, 0.0))[1] == "open via ray"
    agent.direct.close()


def test_a_channel_that_cannot_be_opened_is_given_up_and_the_run_goes_through_ray(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    log: list[str] = []
    c = _cluster(["n1"], log, monkeypatch)
    agent = c._agents["n1"]
    c._update(agent, {"direct": {"host": "127.0.0.1", "port": _free_port(), "key": "00" * 32}, **UP})
    assert agent.direct is not None
    _, outcome = c._admitted("run", ("job", "t", None, None, None, None), None, None)
    assert outcome[1] == "run via ray" and log == ["ray:run@n1"]
    assert agent.direct is None and agent.direct_retry_at > time.monotonic() + cluster_mod.DIRECT_RETRY_S - 5
    assert [e["event"] for e in c.events] == ["direct_unavailable"]
    # the next hello's offer is not taken again for a while: this agent's calls stay on Ray, then it is tried again
    c._update(agent, {"direct": {"host": "127.0.0.1", "port": 1, "key": "00" * 32}, **UP})
    assert agent.direct is None
    agent.direct_retry_at = time.monotonic() - 1
    c._update(agent, {"direct": {"host": "127.0.0.1", "port": 1, "key": "00" * 32}, **UP})
    assert agent.direct is not None
    agent.direct.close()


def test_a_run_whose_connection_dies_after_it_went_out_is_node_lost_and_never_asked_of_another_node(
    server: tuple[str, int, list[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The run may have had effects on the first node: asking the second would run it twice."""
    host, port, seen = server
    log: list[str] = []
    c = _cluster(["n1", "n2"], log, monkeypatch)
    offer = {"host": host, "port": port, "key": (b"k" * 32).hex()}
    for a in c._agents.values():
        c._update(a, {"direct": offer, **UP})
    out: list[Any] = []
    th = threading.Thread(
        target=lambda: out.append(_try(lambda: c._admitted("run", ("hang", "t", None, None, None, None), None, None)))
    )
    th.start()
    until = time.monotonic() + 5
    while not seen and time.monotonic() < until:
        time.sleep(0.02)
    asked = [a for a in c._agents.values() if a.direct._open]
    assert len(asked) == 1
    c._drop(asked[0].node_id, "the node left the cluster")  # what the view does when Ray says the node is gone
    th.join(5)
    assert isinstance(out[0], NodeLost), out
    assert seen == ["hang"] and log == []  # asked once, of one node
    for a in [*c._agents.values(), *asked]:
        a.direct.close()


@pytest.mark.parametrize("agent_lives", [True, False])
def test_a_connection_that_breaks_while_the_agent_lives_is_an_interrupted_call_not_a_lost_node(
    server: tuple[str, int, list[str]], monkeypatch: pytest.MonkeyPatch, agent_lives: bool
) -> None:
    """Only Ray says whether the agent is gone: a broken connection alone does not drop the node (its sessions
    would be given up while it holds them); the call ends SandboxInterrupted, cancelled there."""
    from toolcage.errors import SandboxInterrupted

    host, port, seen = server
    log: list[str] = []
    c = _cluster(["n1"], log, monkeypatch)
    if not agent_lives:

        def dead(ref: Any, **kw: Any) -> Any:
            raise cluster_mod.ray.exceptions.RayActorError()

        monkeypatch.setattr(cluster_mod.ray, "get", dead)
    agent = c._agents["n1"]
    c._update(agent, {"direct": {"host": host, "port": port, "key": (b"k" * 32).hex()}, **UP})
    held, hold = held_connections()

    out: list[Any] = []
    th = threading.Thread(target=lambda: out.append(_try(lambda: c._ask(agent, "run", ("hang",), hold))))
    th.start()
    until = time.monotonic() + 5
    while not seen and time.monotonic() < until:
        time.sleep(0.02)
    held[0].abort()  # the connection breaks under the call
    th.join(5)
    assert isinstance(out[0], direct.ChannelError) and out[0].sent
    got = c._broken(agent, out[0])
    if agent_lives:
        assert isinstance(got, SandboxInterrupted) and "cancelled the call there" in got.message, got
        assert "n1" in c._agents and not agent.lost
        assert log == ["ray:status@n1"]
    else:
        assert isinstance(got, NodeLost), got
        assert "n1" not in c._agents and agent.lost
    agent.direct.close()


def test_a_handshake_that_fails_sets_the_channel_aside_without_breaking_the_calls_in_flight(
    server: tuple[str, int, list[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A new connection that cannot be opened (a flood, an agent slow to accept) sends the next calls through Ray;
    a call already on the channel finishes there (closing every connection interrupted it)."""
    host, port, seen = server
    log: list[str] = []
    c = _cluster(["n1"], log, monkeypatch)
    agent = c._agents["n1"]
    c._update(agent, {"direct": {"host": host, "port": port, "key": (b"k" * 32).hex()}, **UP})
    ch = agent.direct
    out: list[Any] = []
    th = threading.Thread(target=lambda: out.append(_try(lambda: c._ask(agent, "run", ("slow",)))))
    th.start()
    until = time.monotonic() + 5
    while not seen and time.monotonic() < until:
        time.sleep(0.02)

    def refused(*a: Any) -> Any:
        raise direct.ChannelError("the agent refused the key", sent=False)

    monkeypatch.setattr(direct, "_connect", refused)
    assert c._ask(agent, "run", ("next",))[1] == "run via ray" and log == ["ray:run@n1"]
    assert agent.direct is None and ch.closed
    th.join(5)
    assert out and out[0][1] == "run via direct", out  # finished on its connection, not interrupted
    assert not ch._open  # and that connection is closed after it


def _try(fn: Any) -> Any:
    try:
        return fn()
    except Exception as exc:
        return exc
