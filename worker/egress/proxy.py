"""The egress proxy: the only route out of a sandbox whose policy says ``network.mode: proxy``.

A small asyncio forward proxy (CONNECT and absolute-form plain HTTP) that calls the same
``policies.decide`` as SafeFetch, resolves names itself, checks every address, connects
only to a checked address, and refuses everything else with the reason. It runs from
the worker image (``python3 -S -m toolcage.worker.egress.proxy``) in its own hardened container.

Threat: request smuggling. HTTP is parsed with h11 after strict checks on the raw head
(``worker.egress.headcheck``); the request is re-framed towards the upstream (h11 client role,
decoded body re-encoded), never piped raw; one request per connection. A CONNECT
tunnel opens only after its TLS ClientHello names the CONNECT host (``worker.egress.clienthello``).
Decisions go to stdout as JSON lines (``worker.egress.decisionlog``) that the runner reads live.

Why not Squid, tinyproxy or smokescreen: none installs into this offline-built image
without a second toolchain, and each would need the policy translated into its own ACL
language, where the two decision functions could drift.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import signal
import sys
import time
from typing import Any
from urllib.parse import urlsplit

import h11

from toolcage.policies import Policy, contract, policy_from_json
from toolcage.policies.decide import Decision, Request, decide, parse_target, system_resolver
from toolcage.worker.egress import clienthello, headcheck
from toolcage.worker.egress.decisionlog import DecisionLog

MAX_HEAD = 64 * 1024
CONTROL_MAX = 1 << 20  # one control line (a whole policy: a long allowlist passes 64 KiB)
IDLE_TIMEOUT_S = 60.0
HELLO_TIMEOUT_S = 10.0
MAX_CLIENTS = 64
CHUNK = 65536
# Hop-by-hop (RFC 9110 §7.6.1) plus what the proxy sets itself: never forwarded as sent.
# Upgrade is dropped, so no protocol switch can turn a checked request into a raw pipe.
_HOP = {
    b"connection",
    b"proxy-connection",
    b"keep-alive",
    b"proxy-authorization",
    b"proxy-authenticate",
    b"te",
    b"trailer",
    b"upgrade",
    b"expect",
    b"host",
}


class Refused(Exception):
    def __init__(self, status: int, reason: str, head: bytes = b"") -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason
        self.head = head  # what was read, so the record can name the request line


def _text(raw: bytes | str, limit: int = 300) -> str:
    """Printable ASCII only: attacker bytes never reach a header line of ours unescaped."""
    s = raw.decode("latin-1") if isinstance(raw, bytes) else raw
    return "".join(c if " " <= c <= "~" else "?" for c in s)[:limit]


def _hop_headers(headers: list[tuple[bytes, bytes]]) -> set[bytes]:
    named = {t.strip().lower() for k, v in headers if k == b"connection" for t in v.split(b",")}
    return _HOP | named


async def _read(r: asyncio.StreamReader, timeout: float = IDLE_TIMEOUT_S) -> bytes:
    return await asyncio.wait_for(r.read(CHUNK), timeout)


@dataclasses.dataclass(eq=False)
class Live:
    """One connection the proxy relays now: what was decided for it, and its two ends (cut at a policy change
    that no longer allows it)."""

    url: str  # scheme://host:port/ of its target
    method: str | None
    addresses: tuple[str, ...]
    ends: tuple[asyncio.StreamWriter, ...]

    def resolve(self, _host: str) -> tuple[str, ...]:
        """The addresses it was connected to: a change is judged on them, never on a new lookup."""
        return self.addresses


class Proxy:
    def __init__(self, policy: Policy, log: DecisionLog, upstream: tuple[str, int] | None = None) -> None:
        self.policy = policy
        self.log = log
        self.upstream = upstream
        self.slots = asyncio.Semaphore(MAX_CLIENTS)
        self.live: set[Live] = set()

    async def _decide(self, url: str, method: str | None) -> Decision:
        return await asyncio.to_thread(decide, Request(url, method), self.policy, system_resolver)

    def _record(self, event: str, rec: dict[str, Any], d: Decision, **more: Any) -> None:
        """An allowed decision's record (audit-only: with what the allowlist would have refused)."""
        extra = {"would_deny": d.would_deny} if d.would_deny is not None else {}
        self.log.emit(event, **rec, **more, **extra, reason=d.reason)

    def apply(self, line: bytes) -> None:
        """One control line from the runner (the proxy's stdin, which only the runner holds: the sandbox reaches
        the proxy through its socket alone): ``{"seq": n, "policy": {...}}``, the run's whole new policy. It
        replaces the one in force at once (every later decision uses it); each relayed connection the new policy
        would refuse (its host, port and method, at the addresses it was connected to) is cut. Answered with
        ``policy.applied`` (seq, sha256, cut) or ``policy.refused`` (seq, reason), never dropped."""
        seq: Any = None
        try:
            msg = json.loads(line)
            seq = msg.get("seq") if isinstance(msg, dict) else None
            if not isinstance(seq, int) or not isinstance(msg.get("policy"), dict):
                raise ValueError('a control line is {"seq": n, "policy": {...}}')
            policy = policy_from_json(json.dumps(msg["policy"]))
        except Exception as exc:  # a bad line changes nothing
            self.log.emit_surely("policy.refused", seq=seq, reason=f"{type(exc).__name__}: {exc}"[:300])
            return
        self.policy = policy
        cut = 0
        for conn in list(self.live):
            d = decide(Request(conn.url, conn.method), policy, conn.resolve)
            if not d.allowed:
                cut += 1
                self.live.discard(conn)
                for end in conn.ends:
                    end.transport.abort()
                self.log.emit("egress.cut", target=conn.url, method=conn.method, reason=d.reason)
        self.log.emit_surely(
            "policy.applied", seq=seq, sha256=policy.sha256(), cut=cut, audit_only=policy.network.unsafe_audit_only
        )

    async def _deny(self, w: asyncio.StreamWriter, reason: str, status: int = 403) -> None:
        text = _text(reason)
        body = json.dumps({"allowed": False, "reason": text}).encode()
        w.write(
            f"HTTP/1.1 {status} denied: {text}\r\nX-Toolcage-Denied: {text}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
            + body
        )
        with contextlib.suppress(OSError):
            await w.drain()

    async def _open(self, d: Decision) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """Connect to a checked address (through the upstream proxy, pinned to that address, if set)."""
        t = d.target
        assert t is not None
        last: Exception | None = None
        for addr in d.addresses:
            try:
                if self.upstream is None:
                    return await asyncio.wait_for(asyncio.open_connection(addr, t.port), 10)
                r, w = await asyncio.wait_for(asyncio.open_connection(*self.upstream), 10)
                host = f"[{addr}]" if ":" in addr else addr
                w.write(f"CONNECT {host}:{t.port} HTTP/1.1\r\nHost: {host}:{t.port}\r\n\r\n".encode())
                await w.drain()
                head = await asyncio.wait_for(r.readuntil(b"\r\n\r\n"), 10)
                if head.split(b" ", 2)[1:2] != [b"200"]:
                    w.close()
                    raise OSError(f"upstream proxy refused: {_text(head.splitlines()[0])}")
                return r, w
            except (TimeoutError, OSError, asyncio.IncompleteReadError) as exc:
                last = exc
        raise OSError(f"cannot connect to {t.host}:{t.port}: {last}")

    async def handle(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        async with self.slots:
            try:
                await self._serve(r, w)
            except (TimeoutError, ConnectionError, asyncio.IncompleteReadError):
                pass
            except Exception as exc:  # one bad client must not take the proxy down
                self.log.emit("egress.error", error=type(exc).__name__, detail=str(exc)[:200])
            finally:
                w.close()

    async def _read_head(self, r: asyncio.StreamReader) -> tuple[bytes, bytes]:
        """The head up to CRLF CRLF and the bytes after it; bare LF/CR refused as soon as seen."""
        buf = bytearray()
        scanned = 0  # bytes already judged: each byte is scanned about once, whatever the read sizes
        while True:
            end = buf.find(b"\r\n\r\n", max(scanned - 3, 0))
            limit = len(buf) if end < 0 else end + 4
            problem = headcheck.bad_line_end(buf, scanned - 1, limit, complete=end >= 0)
            if problem:
                raise Refused(400, problem, bytes(buf[:4096]))
            if end >= 0:
                return bytes(buf[:limit]), bytes(buf[limit:])
            scanned = len(buf)
            if len(buf) > MAX_HEAD:
                raise Refused(431, "request head larger than 64 KiB", bytes(buf[:4096]))
            data = await _read(r)
            if not data:
                raise ConnectionError("client closed before the end of the head")
            buf += data

    async def _serve(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        try:
            head, rest = await self._read_head(r)
            problem = headcheck.check_head(head)
            if problem:
                raise Refused(400, problem, head)
            conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD)
            conn.receive_data(head + rest)
            try:
                req = conn.next_event()
            except h11.RemoteProtocolError as exc:
                raise Refused(400, f"malformed request: {exc}", head) from None
            assert isinstance(req, h11.Request)  # check_head accepted a complete head
        except Refused as exc:
            first = exc.head.split(b"\n", 1)[0].split(b"\r", 1)[0]
            method, _, target = _text(first, 4096).partition(" ")
            self.log.emit("egress.denied", method=method, target=target.rsplit(" ", 1)[0], reason=exc.reason)
            await self._deny(w, exc.reason, exc.status)
            return
        if req.method == b"CONNECT":
            await self._connect(req, conn, r, w)
        else:
            await self._plain(req, conn, r, w)

    def _host_matches(self, req: h11.Request, scheme: str, d: Decision) -> str | None:
        """Threat: domain fronting, an allowed target carrying another Host."""
        raw = next((v for k, v in req.headers if k == b"host"), None)
        if raw is None:
            return None  # HTTP/1.0 without Host (headcheck allows it only there): the target names the host
        host = raw.decode("latin-1")
        t = d.target
        assert t is not None
        try:
            h = parse_target(f"{scheme}://{host}/")
        except ValueError:
            return f"Host header {_text(host)!r} is not a valid host"
        port_given = host.rsplit("]", 1)[-1].count(":") == 1
        # CONNECT's Host may omit the port (RFC 9110 §9.3.6 names the authority; clients vary)
        if h.host != t.host or (h.port != t.port and (scheme == "http" or port_given)):
            return f"Host header {_text(host)!r} differs from the target's host"
        return None

    async def _connect(self, req: h11.Request, conn: h11.Connection, r: Any, w: asyncio.StreamWriter) -> None:
        target = req.target.decode("ascii")
        d = await self._decide(f"https://{target}", None)
        rec: dict[str, Any] = {"method": "CONNECT", "target": target, "rule": d.rule, "addresses": list(d.addresses)}
        mismatch = self._host_matches(req, "https", d) if d.allowed else None
        if not d.allowed or mismatch:
            self.log.emit("egress.denied", **rec, reason=mismatch or d.reason)
            await self._deny(w, mismatch or d.reason)
            return
        while conn.next_event() is not h11.PAUSED:  # EndOfMessage (a CONNECT has no body)
            pass
        w.write(conn.send(h11.Response(status_code=200, headers=[], reason=b"Connection established")))
        await w.drain()
        hello, _closed = conn.trailing_data  # bytes the client sent after the head, before our 200
        try:
            while len(hello) < clienthello.needed(hello):
                data = await _read(r, HELLO_TIMEOUT_S)
                if not data:
                    raise clienthello.NotClientHello("not a TLS ClientHello (the tunnel closed first)")
                hello += data
            sni = clienthello.server_name(hello)
        except (clienthello.NotClientHello, TimeoutError) as exc:
            reason = str(exc) if isinstance(exc, clienthello.NotClientHello) else "no TLS ClientHello in time"
            self.log.emit("egress.denied", **rec, reason=f"tunnel closed: {reason}")
            return
        assert d.target is not None
        want = d.target.host.lower().rstrip(".")
        # Threat: a tunnel to an allowed name whose TLS asks a shared front end for another site.
        if sni is None and not d.target.literal:
            self.log.emit("egress.denied", **rec, reason="tunnel closed: no SNI in the ClientHello for a named host")
            return
        if sni is not None and sni.rstrip(".") != want:
            why = f"tunnel closed: SNI {sni} differs from the CONNECT host {want}"
            self.log.emit("egress.denied", **rec, sni=sni, reason=why)
            return
        self._record("egress.allowed", rec, d, sni=sni)
        try:
            ur, uw = await self._open(d)
        except OSError as exc:
            self.log.emit("egress.error", target=target, error="connect", detail=str(exc))
            return
        live = Live(f"https://{target}/", None, d.addresses, (w, uw))
        if not decide(Request(live.url, None), self.policy, lambda _h: d.addresses).allowed:
            uw.close()  # the policy changed while this one connected: never relayed
            self.log.emit("egress.cut", target=live.url, method=None, reason="the policy changed while it connected")
            return
        self.live.add(live)
        try:
            uw.write(hello)
            await uw.drain()
            await asyncio.gather(_pipe(r, uw), _pipe(ur, w))
        finally:
            self.live.discard(live)

    async def _plain(self, req: h11.Request, conn: h11.Connection, r: Any, w: asyncio.StreamWriter) -> None:
        target = req.target.decode("ascii")
        method = req.method.decode("ascii")
        rec: dict[str, Any] = {"method": method, "target": target}
        if not target.lower().startswith("http://"):
            reason = (
                "https must use CONNECT"
                if target.lower().startswith("https://")
                else "this is a forward proxy: use an absolute http:// URL or CONNECT"
            )
            self.log.emit("egress.denied", **rec, reason=reason)
            await self._deny(w, reason, 400)
            return
        d = await self._decide(target, method)
        rec.update(rule=d.rule, addresses=list(d.addresses))
        mismatch = self._host_matches(req, "http", d) if d.allowed else None
        if not d.allowed or mismatch:
            self.log.emit("egress.denied", **rec, reason=mismatch or d.reason)
            await self._deny(w, mismatch or d.reason)
            return
        self._record("egress.allowed", rec, d)
        try:
            ur, uw = await self._open(d)
        except OSError as exc:
            self.log.emit("egress.error", target=target, error="connect", detail=str(exc))
            await self._deny(w, str(exc), 502)
            return
        assert d.target is not None
        live = Live(f"http://{_authority(d.target.host, d.target.port)}/", method, d.addresses, (w, uw))
        self.live.add(live)
        try:
            if not decide(Request(live.url, method), self.policy, lambda _h: d.addresses).allowed:
                raise OSError("the policy changed while it connected")
            await self._relay(req, conn, d, r, w, ur, uw)
        except (h11.ProtocolError, TimeoutError, OSError) as exc:
            self.log.emit("egress.error", target=target, error=type(exc).__name__, detail=str(exc))
            if conn.our_state in (h11.IDLE, h11.SEND_RESPONSE):
                await self._deny(w, f"bad exchange with the upstream: {exc}", 502)
        finally:
            self.live.discard(live)
            uw.close()

    async def _relay(
        self, req: h11.Request, conn: h11.Connection, d: Decision, r: Any, w: Any, ur: Any, uw: Any
    ) -> None:
        """One request re-framed to the upstream, one response re-framed back; then the connection ends
        (a pipelined second request is never read, so it never reaches the upstream)."""
        t = d.target
        assert t is not None
        parts = urlsplit(req.target.decode("ascii"))
        path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        hop = _hop_headers(list(req.headers))
        host = t.host if t.port == 80 else f"{t.host}:{t.port}"
        headers = [(k, v) for k, v in req.headers if k not in hop]
        headers += [(b"host", host.encode()), (b"connection", b"close")]
        up = h11.Connection(h11.CLIENT, max_incomplete_event_size=MAX_HEAD)
        uw.write(up.send(h11.Request(method=req.method, target=path.encode(), headers=headers)))
        if conn.they_are_waiting_for_100_continue:  # Expect is not forwarded: the proxy answers it
            w.write(conn.send(h11.InformationalResponse(status_code=100, headers=[])))
            await w.drain()
        while True:
            ev = conn.next_event()
            if ev is h11.NEED_DATA:
                conn.receive_data(await _read(r))
            elif isinstance(ev, h11.Data):
                uw.write(up.send(h11.Data(data=ev.data)))
                await uw.drain()
            elif isinstance(ev, h11.EndOfMessage):
                uw.write(up.send(h11.EndOfMessage()))  # trailers are not forwarded
                await uw.drain()
                break
            else:
                raise h11.RemoteProtocolError(f"unexpected {type(ev).__name__} from the client")
        while True:
            ev = up.next_event()
            if ev is h11.NEED_DATA:
                up.receive_data(await _read(ur))
            elif isinstance(ev, h11.InformationalResponse):
                continue  # 1xx: not relayed (Upgrade is never forwarded, Expect is answered here)
            elif isinstance(ev, h11.Response):
                keep = [(k, v) for k, v in ev.headers if k not in _hop_headers(list(ev.headers))]
                keep.append((b"connection", b"close"))
                w.write(conn.send(h11.Response(status_code=ev.status_code, headers=keep, reason=ev.reason)))
            elif isinstance(ev, h11.Data):
                w.write(conn.send(h11.Data(data=ev.data)))
                await w.drain()
            elif isinstance(ev, h11.EndOfMessage):
                w.write(conn.send(h11.EndOfMessage()))
                await w.drain()
                return
            else:
                raise h11.RemoteProtocolError(f"unexpected {type(ev).__name__} from the upstream")


def _authority(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


async def _control(proxy: Proxy) -> None:
    """The runner's control lines on stdin, applied in order (bounded: a line past CONTROL_MAX is refused)."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=CONTROL_MAX)
    try:
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    except (OSError, ValueError):  # no stdin (an older runner): the policy is fixed for the run
        return
    while True:
        try:
            line = await reader.readline()
        except ValueError:  # longer than the limit: refused, and the rest of it skipped
            proxy.log.emit_surely("policy.refused", seq=None, reason="control line too long")
            continue
        if not line:
            return
        if line.strip():
            proxy.apply(line)


async def _pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
    try:
        while True:
            data = await _read(src)
            if not data:
                break
            dst.write(data)
            await dst.drain()
    except (TimeoutError, OSError):
        pass
    finally:
        with contextlib.suppress(OSError):
            if dst.can_write_eof():
                dst.write_eof()


def _upstream() -> tuple[str, int] | None:
    raw = os.environ.get(contract.ENV_EGRESS_PROXY, "").strip()
    if not raw:
        return None
    parts = urlsplit(raw if "://" in raw else f"http://{raw}")
    if parts.scheme != "http" or not parts.hostname:
        raise SystemExit(f"TOOLCAGE_EGRESS_PROXY must be http://host:port, not {raw!r}")
    return parts.hostname, parts.port or 3128


async def main() -> None:
    raw = os.environ.get(contract.ENV_POLICY)
    policy = policy_from_json(raw) if raw else Policy()
    listen = os.environ.get(contract.ENV_PROXY_LISTEN, "0.0.0.0:3128")
    log = DecisionLog(sys.stdout, os.environ.get(contract.ENV_RUN_ID, "local"))
    proxy = Proxy(policy, log, _upstream())
    if listen.startswith("unix:"):
        path = listen[len("unix:") :]
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        server = await asyncio.start_unix_server(proxy.handle, path, limit=MAX_HEAD)
    else:
        host, _, port = listen.rpartition(":")
        server = await asyncio.start_server(proxy.handle, host, int(port), limit=MAX_HEAD)
    deadline = os.environ.get(contract.ENV_DEADLINE)
    # the runner ends the proxy with SIGTERM when its run ends: the decisions still queued are written before
    # it exits (a SIGKILL lost the last ones, so a refusal went unaccounted in the audit log under load)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    control = asyncio.create_task(_control(proxy))
    log.emit("proxy.listening", listen=listen, policy=policy.name, upstream=bool(proxy.upstream))
    try:
        async with server:
            wait = max(float(deadline) + 2 - time.time(), 0) if deadline else None
            try:
                await asyncio.wait_for(stop.wait(), wait)
            except TimeoutError:
                log.emit("proxy.deadline")
    finally:
        control.cancel()
        log.close()


if __name__ == "__main__":
    asyncio.run(main())
