"""Issue 40 (placement on a cluster): the direct channel from a driver to a node's agent (toolcage.ray.direct).

The agent's real server runs here on 127.0.0.1, on an event loop of its own, serving handlers that record what
they were asked. Threats: a peer that does not hold the agent's key (anything on the node's network: another
user's process, a sandbox given a route to the node) getting a run started or an answer read; a frame changed,
replayed or sent back the other way on a connection that did prove the key; a request that makes the agent's
unpickler run code; a size that makes the agent allocate without bound; an address that is not the agent
feeding the driver a forged answer; a call whose driver is gone running on.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import pickle
import secrets
import socket
import struct
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.helpers import held_connections
from toolcage.ray import direct

KEY = b"k" * 32


class _Agent:
    """The server on a loop in a thread, and what its handlers saw."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.calls: list[tuple[str, tuple[Any, ...]]] = []
        self.socks: list[socket.socket] = []
        self.cancelled: list[str] = []
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

        async def run(*args: Any) -> Any:
            self.calls.append(("run", args))
            if args and args[0] == "busy":  # holds its connection a while: a burst needs one each
                await asyncio.sleep(0.5)
            if args and args[0] == "slow":
                try:
                    await asyncio.sleep(30)
                except asyncio.CancelledError:
                    self.cancelled.append("run")
                    raise
            return ("ok", {"echo": args}, {"load": 1})

        async def call(*args: Any) -> Any:
            self.calls.append(("call", args))
            if args and args[0] == "unpicklable":
                return ("ok", lambda: None, {})
            return ("ok", len(args), {})

        def on_error(exc: Exception, stage: str) -> Any:
            return ("error", f"{type(exc).__name__}: {exc}", {})

        self.server = direct.Server(KEY, {"run": run, "call": call}, lambda v: pickle.dumps(v), on_error)
        self.host, self.port = asyncio.run_coroutine_threadsafe(self.server.start("127.0.0.1"), self.loop).result(5)

    def close(self) -> None:
        for s in self.socks:
            s.close()

        async def down() -> None:
            self.server.close()
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            await asyncio.gather(*tasks, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(down(), self.loop).result(5)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        self.loop.close()


@pytest.fixture
def agent() -> Iterator[_Agent]:
    a = _Agent()
    try:
        yield a
    finally:
        a.close()


def _raw(agent: _Agent) -> tuple[socket.socket, bytes]:
    s = socket.create_connection((agent.host, agent.port), timeout=5)
    agent.socks.append(s)
    hello = b""
    while len(hello) < 36:
        hello += s.recv(36 - len(hello))
    assert hello[:4] == direct.MAGIC
    return s, hello[4:]


def _closed(s: socket.socket) -> bool:
    s.settimeout(5)
    try:
        return s.recv(1) == b""
    except ConnectionResetError:
        return True


def _proved(agent: _Agent) -> tuple[socket.socket, bytes]:
    """A connection that proved the key the way a driver does; returns it and the frame key."""
    s, nonce_s = _raw(agent)
    nonce_c = secrets.token_bytes(32)
    mine, theirs, key = direct._keys(KEY, nonce_s, nonce_c)
    s.sendall(nonce_c + mine)
    got = b""
    while len(got) < 32:
        got += s.recv(32 - len(got))
    assert got == theirs
    return s, key


def _frame(key: bytes, direction: bytes, seq: int, payload: bytes) -> bytes:
    mac = hmac.new(key, direction + seq.to_bytes(8, "big") + payload, hashlib.sha256).digest()
    return struct.pack(">I", len(payload)) + mac + payload


def _wait(pred: Any, timeout: float = 5.0) -> bool:
    until = time.monotonic() + timeout
    while time.monotonic() < until:
        if pred():
            return True
        time.sleep(0.02)
    return bool(pred())


def test_a_driver_with_the_key_is_answered_on_kept_connections(agent: _Agent) -> None:
    ch = direct.Channel(agent.host, agent.port, KEY)
    try:
        for i in range(20):
            assert ch.call("run", ("job", "ping", {"i": i})) == ("ok", {"echo": ("job", "ping", {"i": i})}, {"load": 1})
        assert ch.call("call", ("sid", "t", None, None)) == ("ok", 4, {})
        assert len(ch._open) == 1  # one connection, kept between calls
    finally:
        ch.close()


def test_a_peer_without_the_key_is_refused_and_nothing_runs(agent: _Agent) -> None:
    s, nonce_s = _raw(agent)
    nonce_c = secrets.token_bytes(32)
    wrong, _, key = direct._keys(b"w" * 32, nonce_s, nonce_c)
    s.sendall(nonce_c + wrong + _frame(key, b"q", 0, pickle.dumps(("run", ("x",)))))
    assert _closed(s)
    # a driver given the wrong key is refused too, before any request goes out
    with pytest.raises(direct.ChannelError) as err:
        direct.Channel(agent.host, agent.port, b"w" * 32).call("run", ("y",))
    assert err.value.sent is False
    assert agent.calls == [] and agent.server.refused == 2


def test_a_proof_replayed_from_another_connection_is_refused(agent: _Agent) -> None:
    """The proof covers the agent's fresh nonce: what a listener saw on one connection opens no other."""
    s1, nonce_s1 = _raw(agent)
    nonce_c = secrets.token_bytes(32)
    mine, _, _ = direct._keys(KEY, nonce_s1, nonce_c)
    s1.sendall(nonce_c + mine)
    s2, _ = _raw(agent)
    s2.sendall(nonce_c + mine)
    assert _closed(s2)
    assert agent.server.refused == 1


@pytest.mark.parametrize("tamper", ["flipped", "replayed", "reflected", "unsigned"])
def test_a_frame_not_signed_for_its_place_closes_the_connection(agent: _Agent, tamper: str) -> None:
    s, key = _proved(agent)
    good = pickle.dumps(("call", ("sid", "t", None, None)))
    s.sendall(_frame(key, b"q", 0, good))
    head = b""
    while len(head) < 36:
        head += s.recv(36 - len(head))
    (size,) = struct.unpack(">I", head[:4])
    body = b""
    while len(body) < size:
        body += s.recv(size - len(body))
    assert len(agent.calls) == 1
    bad = {
        "flipped": _frame(key, b"q", 1, good).replace(b"sid", b"sie"),  # still a valid request, not its MAC
        "replayed": _frame(key, b"q", 0, good),  # the first frame again
        "reflected": _frame(key, b"a", 1, good),  # signed as an answer
        "unsigned": struct.pack(">I", len(good)) + b"\0" * 32 + good,
    }[tamper]
    s.sendall(bad)
    assert _closed(s)
    assert len(agent.calls) == 1 and agent.server.refused == 1


def test_a_request_that_names_a_class_is_refused_even_with_the_key(agent: _Agent) -> None:
    class Boom:
        def __reduce__(self) -> Any:
            return (exec, ("open('/tmp/toolcage-direct-pwned', 'w').write('1')",))

    s, key = _proved(agent)
    s.sendall(_frame(key, b"q", 0, pickle.dumps(("run", (Boom(),)))))
    assert _closed(s)
    assert agent.calls == [] and agent.server.refused == 1
    import os

    assert not os.path.exists("/tmp/toolcage-direct-pwned")
    with pytest.raises(pickle.UnpicklingError):
        direct.loads_request(pickle.dumps(("shutdown", ())))  # only run and call


def test_a_size_over_the_bound_closes_before_anything_is_read(agent: _Agent) -> None:
    s, _ = _proved(agent)
    s.sendall(struct.pack(">I", direct.MAX_REQUEST + 1) + b"\0" * 32)
    assert _closed(s)
    assert agent.server.refused == 1


def test_a_challenge_never_answered_is_dropped(agent: _Agent, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(direct, "HANDSHAKE_S", 0.3)
    s, _ = _raw(agent)
    assert _closed(s)


def test_a_flood_of_connections_that_never_prove_the_key_is_capped_and_cannot_shut_a_driver_out(
    agent: _Agent,
) -> None:
    """Each open challenge holds a descriptor for up to HANDSHAKE_S: at most MAX_CHALLENGES wait at once, the
    next pushes the oldest out, and a driver with the key is served while the flood holds every place."""
    flood = [_raw(agent)[0] for _ in range(direct.MAX_CHALLENGES)]
    assert _wait(lambda: len(agent.server.challenging) == direct.MAX_CHALLENGES)
    extra, _ = _raw(agent)  # still answered: the oldest of the flood goes instead
    assert _closed(flood[0]) and agent.server.evicted >= 1
    assert len(agent.server.challenging) == direct.MAX_CHALLENGES
    ch = direct.Channel(agent.host, agent.port, KEY)
    for _ in range(3):
        assert ch.call("call", ("sid",))[0] == "ok"
    ch.close()
    for s in [*flood, extra]:
        s.close()
    assert _wait(lambda: not agent.server.challenging)


def test_the_driver_takes_nothing_from_an_address_that_cannot_prove_the_key() -> None:
    """A listener that is not the agent (a port taken over after the agent died): its 'proof' is refused,
    and nothing it sends is unpickled."""
    lsock = socket.socket()
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(1)
    port = lsock.getsockname()[1]

    def fake() -> None:
        c, _ = lsock.accept()
        c.sendall(direct.MAGIC + b"n" * 32)
        c.recv(64)
        c.sendall(b"p" * 32)
        c.close()

    t = threading.Thread(target=fake, daemon=True)
    t.start()
    with pytest.raises(direct.ChannelError) as err:
        direct.Channel("127.0.0.1", port, KEY).call("run", ())
    assert err.value.sent is False and "prove" in str(err.value)
    t.join(5)
    lsock.close()


def test_a_driver_that_leaves_mid_call_has_its_call_cancelled(agent: _Agent) -> None:
    ch = direct.Channel(agent.host, agent.port, KEY)
    held, hold = held_connections()

    out: list[Any] = []
    t = threading.Thread(target=lambda: out.append(_try(lambda: ch.call("run", ("slow",), hold))), daemon=True)
    t.start()
    assert _wait(lambda: agent.calls)
    held[0].abort()
    t.join(5)
    assert isinstance(out[0], direct.ChannelError) and out[0].sent is True
    assert _wait(lambda: agent.cancelled == ["run"])
    ch.close()


def test_closing_the_channel_ends_a_waiting_call(agent: _Agent) -> None:
    """What the driver does when Ray says the node or the agent is gone: the call waiting ends at once."""
    ch = direct.Channel(agent.host, agent.port, KEY)
    out: list[Any] = []
    t = threading.Thread(target=lambda: out.append(_try(lambda: ch.call("run", ("slow",)))), daemon=True)
    t.start()
    assert _wait(lambda: agent.calls)
    t0 = time.monotonic()
    ch.close()
    t.join(5)
    assert time.monotonic() - t0 < 2
    assert isinstance(out[0], direct.ChannelError) and out[0].sent is True
    with pytest.raises(direct.ChannelError) as err:
        ch.call("run", ())
    assert err.value.sent is False


def test_a_request_the_agent_fails_is_answered_as_an_error_on_a_connection_that_stays_up(agent: _Agent) -> None:
    """Wrong arguments (the handler raises) or an answer that will not pickle: the driver gets the agent's error
    answer, not a broken connection (which it would have to take for a lost node)."""
    ch = direct.Channel(agent.host, agent.port, KEY)
    try:
        kind, why, _ = ch.call("call", ("unpicklable",))
        assert kind == "error" and "pickle" in why.lower(), why

        async def strict(sid: str) -> Any:
            return ("ok", sid, {})

        agent.server.handlers["call"] = strict
        kind, why, _ = ch.call("call", ("sid", "extra", "args"))
        assert kind == "error" and why.startswith("TypeError"), why
        assert ch.call("call", ("sid",)) == ("ok", "sid", {})
        assert len(ch._open) == 1  # the same connection all along
    finally:
        ch.close()


def test_a_burst_of_one_drivers_calls_never_pushes_its_own_connections_out(agent: _Agent) -> None:
    """200 calls at once from one driver: its handshakes in flight stay under the agent's challenge list
    (direct.HANDSHAKES), so none is pushed out by another of its own and every call is answered on the channel."""
    from concurrent.futures import ThreadPoolExecutor

    ch = direct.Channel(agent.host, agent.port, KEY)
    try:
        with ThreadPoolExecutor(200) as ex:
            got = list(ex.map(lambda i: _try(lambda: ch.call("run", ("busy",))), range(200)))
        assert all(isinstance(g, tuple) and g[0] == "ok" for g in got), [g for g in got if not isinstance(g, tuple)][:3]
        assert agent.server.refused == 0 and agent.server.evicted == 0 and len(ch._open) <= 200
        assert agent.server.peak <= direct.HANDSHAKES, agent.server.peak
    finally:
        ch.close()


def test_an_error_answer_that_cannot_be_made_still_answers(agent: _Agent) -> None:
    """on_error itself failing (an exception whose message raises) still answers, as a plain error."""

    class Nasty(Exception):
        def __str__(self) -> str:
            raise RuntimeError("no message")

    async def boom(*args: Any) -> Any:
        raise Nasty()

    def strict_on_error(exc: Exception, stage: str) -> Any:
        return ("error", f"{exc}", {})  # str() raises for Nasty

    agent.server.handlers["call"] = boom
    agent.server.on_error = strict_on_error
    ch = direct.Channel(agent.host, agent.port, KEY)
    try:
        kind, err, load = ch.call("call", ("x",))
        assert kind == "error" and "Nasty" in err.message and load == {}, err
        assert ch.call("run", ("y",))[0] == "ok"  # the same connection, still up
    finally:
        ch.close()


def test_no_channel_is_offered_or_taken_under_rays_tls(monkeypatch: pytest.MonkeyPatch) -> None:
    offer = {"host": "127.0.0.1", "port": 1, "key": KEY.hex()}
    assert direct.Channel.of(offer) is not None
    monkeypatch.setenv("RAY_USE_TLS", "1")
    assert direct.tls_on() and direct.Channel.of(offer) is None


def _try(fn: Any) -> Any:
    try:
        return fn()
    except Exception as exc:
        return exc
