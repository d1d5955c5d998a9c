"""The egress proxy: the only route out of a sandbox whose policy says ``network.mode: proxy``.

A small asyncio forward proxy (CONNECT and absolute-form plain HTTP) that calls the same
``policies.decide`` as SafeFetch, resolves names itself, checks every address, connects
only to a checked address, and refuses everything else with 403 and the reason. It runs
from the worker image (``python3 -S -m worker.proxy``) in its own hardened container,
attached to the run's internal network and to the egress network.

Why not a well-kept proxy configured from the policy (Squid, tinyproxy, smokescreen):
none is installable into this offline-built image without a second toolchain, and each
would need the policy translated into its own ACL language, where the two decision
functions could drift. Here the proxy and SafeFetch run the same ``decide()``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
import time
from typing import Any
from urllib.parse import urlsplit

from policies import Policy, policy_from_json
from policies.decide import Decision, Request, decide, system_resolver

MAX_HEAD = 64 * 1024
IDLE_TIMEOUT_S = 60.0
MAX_CLIENTS = 64
_HOP = {
    "connection",
    "proxy-connection",
    "keep-alive",
    "proxy-authorization",
    "proxy-authenticate",
    "te",
    "trailer",
    "upgrade",
}


def log(event: str, **kw: Any) -> None:
    """One JSON line on stdout per decision (the proxy has no protocol stream to protect)."""
    kw.update(event=event, run_id=RUN_ID, component="egress-proxy", timestamp=time.time())
    sys.stdout.write(json.dumps(kw) + "\n")
    sys.stdout.flush()


RUN_ID = os.environ.get("TOOLCAGE_RUN_ID", "local")


class Proxy:
    def __init__(self, policy: Policy, upstream: tuple[str, int] | None = None) -> None:
        self.policy = policy
        self.upstream = upstream
        self.slots = asyncio.Semaphore(MAX_CLIENTS)

    async def _decide(self, url: str, method: str | None) -> Decision:
        return await asyncio.to_thread(decide, Request(url, method), self.policy, system_resolver)

    async def _deny(self, w: asyncio.StreamWriter, reason: str, status: int = 403) -> None:
        text = reason.replace("\r", " ").replace("\n", " ")
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
                    raise OSError(f"upstream proxy refused: {head.splitlines()[0].decode(errors='replace')}")
                return r, w
            except (TimeoutError, OSError, asyncio.IncompleteReadError) as exc:
                last = exc
        raise OSError(f"cannot connect to {t.host}:{t.port}: {last}")

    async def handle(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        peer = w.get_extra_info("peername")
        async with self.slots:
            try:
                head = await asyncio.wait_for(r.readuntil(b"\r\n\r\n"), IDLE_TIMEOUT_S)
            except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, OSError):
                w.close()
                return
            try:
                await self._serve(head, r, w, peer)
            except Exception as exc:  # one bad client must not take the proxy down
                log("egress.error", error=type(exc).__name__, detail=str(exc)[:200])
            finally:
                w.close()

    async def _serve(self, head: bytes, r: asyncio.StreamReader, w: asyncio.StreamWriter, peer: Any) -> None:
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
            await self._deny(w, "malformed request line", 400)
            return
        method, target, _version = parts
        headers = [tuple(x.split(":", 1)) for x in lines[1:] if x]
        if any(len(h) != 2 for h in headers):
            await self._deny(w, "malformed header", 400)
            return
        if method == "CONNECT":
            url, req_method = f"https://{target}", None
        elif target.startswith(("http://", "https://")):
            url, req_method = target, method
            if target.startswith("https://"):
                await self._deny(w, "https must use CONNECT", 400)
                return
        else:
            await self._deny(w, "this is a forward proxy: use an absolute URL or CONNECT", 400)
            return
        d = await self._decide(url, req_method)
        log(
            "egress.allowed" if d.allowed else "egress.denied",
            method=method,
            target=target,
            reason=d.reason,
            rule=d.rule,
            addresses=list(d.addresses),
        )
        if not d.allowed:
            await self._deny(w, d.reason)
            return
        if method != "CONNECT":
            host_hdr = next((v.strip() for k, v in headers if k.strip().lower() == "host"), None)
            t = d.target
            assert t is not None
            expected = {t.host, f"{t.host}:{t.port}"}
            if host_hdr is not None and host_hdr.lower().rstrip(".") not in expected:
                # threat: domain fronting, an allowed URL carrying another Host
                log("egress.denied", method=method, target=target, reason="Host header differs from the URL")
                await self._deny(w, f"Host header {host_hdr!r} differs from the URL's host")
                return
        try:
            ur, uw = await self._open(d)
        except OSError as exc:
            await self._deny(w, str(exc), 502)
            return
        if method == "CONNECT":
            w.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
            await w.drain()
        else:
            t = d.target
            assert t is not None
            parts_url = urlsplit(target)
            path = (parts_url.path or "/") + (f"?{parts_url.query}" if parts_url.query else "")
            out = [f"{method} {path} HTTP/1.1"]
            out += [f"{k.strip()}:{v}" for k, v in headers if k.strip().lower() not in _HOP | {"host"}]
            default = 80
            out.append(f"Host: {t.host if t.port == default else f'{t.host}:{t.port}'}")
            out.append("Connection: close")
            uw.write(("\r\n".join(out) + "\r\n\r\n").encode("latin-1"))
            await uw.drain()
        await asyncio.gather(_pipe(r, uw), _pipe(ur, w))


async def _pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
    try:
        while True:
            data = await asyncio.wait_for(src.read(65536), IDLE_TIMEOUT_S)
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
    raw = os.environ.get("TOOLCAGE_EGRESS_PROXY", "").strip()
    if not raw:
        return None
    parts = urlsplit(raw if "://" in raw else f"http://{raw}")
    if parts.scheme != "http" or not parts.hostname:
        raise SystemExit(f"TOOLCAGE_EGRESS_PROXY must be http://host:port, not {raw!r}")
    return parts.hostname, parts.port or 3128


async def main() -> None:
    raw = os.environ.get("TOOLCAGE_POLICY")
    policy = policy_from_json(raw) if raw else Policy()
    listen = os.environ.get("TOOLCAGE_PROXY_LISTEN", "0.0.0.0:3128")
    proxy = Proxy(policy, _upstream())
    if listen.startswith("unix:"):
        path = listen[len("unix:") :]
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        server = await asyncio.start_unix_server(proxy.handle, path, limit=MAX_HEAD)
    else:
        host, _, port = listen.rpartition(":")
        server = await asyncio.start_server(proxy.handle, host, int(port), limit=MAX_HEAD)
    deadline = os.environ.get("TOOLCAGE_DEADLINE")
    log("proxy.listening", listen=listen, policy=policy.name, upstream=bool(proxy.upstream))
    async with server:
        if deadline:
            await asyncio.sleep(max(float(deadline) + 2 - time.time(), 0))
            log("proxy.deadline")
        else:
            await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main())
