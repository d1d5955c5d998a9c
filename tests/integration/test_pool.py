"""The warm pool on the real engine: one run per slot, refill bounded by size, idle removal, secrets and
the run deadline given at adoption, audit, and nothing left after close() or a SIGKILLed owner.

The proxy-policy upstream is a container of this test on an ``internal`` network (alias
api.allowed.test): nothing here reaches beyond the machine.
"""

from __future__ import annotations

import json
import secrets
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import run_cli, start_upstream
from toolcage import DEFAULT_IMAGE, Sandbox, SandboxTimeout, UsageError
from toolcage.engine import sharedfiles
from toolcage.lifecycle.audit import read
from toolcage.pool import Pool

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.usefixtures("no_leaks")
# under gVisor too: test_a_slot_serves_exactly_one_run and the proxy slot with its secret
POOL_HOST_SIDE = (
    "the pool's bookkeeping (refill, idle removal, adoption, audit, close, a killed owner) is the runner's,"
    " alike under either runtime"
)


def pool_objects(engine: Any, pool_id: str) -> list[str]:
    """Every container, network and volume a pool made (they all carry its label)."""
    label = f"toolcage.pool={pool_id}"
    return (
        [f"container {c['Names'][0]} {c['State']}" for c in engine.containers(label)]
        + [f"network {n['Name']}" for n in engine.networks(label)]
        + [f"volume {v['Name']}" for v in engine.volumes(label)]
    )


def eventually(check: Callable[[], bool], timeout: float = 15.0) -> bool:
    until = time.monotonic() + timeout
    while time.monotonic() < until:
        if check():
            return True
        time.sleep(0.1)
    return check()


def test_a_slot_serves_exactly_one_run(engine: Any) -> None:
    """Two runs from one pool: different containers and run ids, the first run's scratch file is absent
    in the second, and the first container is gone once its run closed."""
    with Pool(size=2, audit=False) as pool:
        assert pool.wait_ready(timeout=60)
        with pool.sandbox() as a:
            assert a.call("write_file", {"path": "left.txt", "content": "from run a"}).ok
            assert a.call("read_file", {"path": "left.txt"}).result["content"] == "from run a"
            first = a.container_id
            # its runs take no secrets nor connectors: the slot loaded nothing for them while it waited
            assert _pooled_env(engine, first) == "bare"
        with pool.sandbox() as b:
            r = b.call("read_file", {"path": "left.txt"})
            assert r.status == "error" and "no such file" in r.error["message"]
            second = b.container_id
            listing = b.call("list_files", {"path": "/scratch"}).result["entries"]
        assert listing == []
        assert first != second and a.run_id != b.run_id
        assert eventually(lambda: engine.inspect(first) is None), "the used container is still there"
        assert eventually(lambda: engine.inspect(second) is None)


def _pooled_env(engine: Any, cid: str) -> str | None:
    """The container's TOOLCAGE_POOLED, as the runner set it (None: not set)."""
    env = engine.inspect(cid)["Config"]["Env"] or []
    return next((e.split("=", 1)[1] for e in env if e.startswith("TOOLCAGE_POOLED=")), None)


@pytest.mark.runc_only(POOL_HOST_SIDE)
def test_refills_up_to_size_never_beyond(engine: Any) -> None:
    """After runs take slots the pool refills to its size, and never holds more waiting slots than that."""
    with Pool(size=2, audit=False) as pool:
        assert pool.wait_ready(timeout=60)
        label = f"toolcage.pool={pool.id}"
        for _ in range(3):
            with pool.sandbox() as sb:
                assert sb.call("ping").ok
        seen: list[int] = []
        until = time.monotonic() + 4
        while time.monotonic() < until:  # while it refills: never more than size waiting or starting
            with pool._cond:
                seen.append(len(pool._ready) + pool._starting)
            time.sleep(0.05)
        assert max(seen) <= 2
        assert pool.wait_ready(timeout=60) and pool.ready() == 2
        assert eventually(lambda: len(engine.containers(label)) == 2), pool_objects(engine, pool.id)
        time.sleep(1.0)
        assert len(engine.containers(label)) == 2 and pool.ready() == 2


@pytest.mark.runc_only(POOL_HOST_SIDE)
def test_idle_timeout_removes_idle_slots(engine: Any, tmp_path: Path) -> None:
    """Slots nobody takes for idle_s are removed (and audited as such); an unused pool is not refilled."""
    audit = tmp_path / "audit.jsonl"

    def idle_removed() -> int:
        records = read(audit) if audit.exists() else []
        return sum(r["event"] == "pool.slot_removed" and r.get("reason") == "idle" for r in records)

    with Pool(size=2, idle_s=2, audit=audit) as pool:
        # not wait_ready() for both: on a loaded host the first slot may idle out before the second is up
        assert eventually(lambda: idle_removed() >= 2, timeout=90), list(read(audit)) if audit.exists() else []
        assert eventually(lambda: pool_objects(engine, pool.id) == [], timeout=20), pool_objects(engine, pool.id)
        assert pool.ready() == 0
        time.sleep(1.0)
        assert pool_objects(engine, pool.id) == []  # nobody asked: nothing refilled
        with pool.sandbox() as sb:  # the next run waits for a fresh slot
            assert sb.call("ping").ok
    removed = [r for r in read(audit) if r["event"] == "pool.slot_removed"]
    assert len(removed) >= 2 and {r["reason"] for r in removed} >= {"idle"}


@pytest.mark.runc_only("a pooled run's idle clock is the runner's, alike under either runtime (10 s)")
def test_a_runs_idle_time_counts_from_adoption(engine: Any, tmp_path: Path) -> None:
    """A slot that waited longer than the run's idle_s (the pool's own idle_s is longer) gives its run the whole
    idle_s, counted from adoption: a call after a pause shorter than idle_s is answered."""
    pol = tmp_path / "idle.yaml"
    pol.write_text("timeouts:\n  run_s: 60\n  idle_s: 3\n  call_s: 30\n")
    with Pool(pol, size=1, idle_s=60, audit=False) as pool:
        assert pool.wait_ready(timeout=60)
        time.sleep(4)  # longer than the run's idle_s: an idle clock started with the slot would have run out
        with pool.sandbox() as sb:
            time.sleep(1)
            assert sb.call("ping").ok


@pytest.mark.runc_only("a pooled run's deadline is the runner's clock, alike under either runtime (18 s)")
def test_deadline_is_set_at_adoption_and_enforced(engine: Any, tmp_path: Path) -> None:
    """A slot that waited longer than run_s still gives its run the whole run_s, counted from adoption: a child
    asked to run past it is cut to the time left (status timeout), and the deadline then kills the sandbox."""
    pol = tmp_path / "short.yaml"
    # run_s 8, not 3: the cut child ends at its share of the time left, and its end is answered, before the
    # deadline, with seconds to spare for a call's start under gVisor on a loaded host
    pol.write_text("timeouts:\n  run_s: 8\n  call_s: 30\n")
    with Pool(pol, size=1, idle_s=60, audit=False) as pool:
        assert pool.wait_ready(timeout=60)
        time.sleep(9)  # longer than run_s: a deadline fixed when the slot was made would have passed
        with pool.sandbox() as sb:
            adopted = time.monotonic()  # the deadline was set at adoption, before this
            assert sb.call("run_shell", {"command": "echo alive"}).result["stdout"] == "alive\n"
            cut = sb.call("run_shell", {"command": "sleep 30", "timeout_s": 30})
            assert cut.status == "timeout" and 1.0 <= time.monotonic() - adopted <= 8, cut
            with pytest.raises(SandboxTimeout):
                time.sleep(max(0.0, adopted + 8.2 - time.monotonic()))
                sb.call("run_shell", {"command": "echo late"})
            took = time.monotonic() - adopted
        assert 8 <= took <= 20, took  # the deadline ended it, not the call's own 30 s
        assert sb.summary is not None and sb.summary.status == "timeout"


@pytest.mark.runc_only(POOL_HOST_SIDE)
def test_pooled_run_is_audited_and_labelled(engine: Any, tmp_path: Path) -> None:
    """The slot's labels name the run that adopts it; the audit log has its pool.slot_created, then the
    run's run.started (pool, container), run.call and run.finished under that same run id."""
    audit = tmp_path / "audit.jsonl"
    with Pool(size=1, tool="pool-audit", audit=audit) as pool:
        assert pool.wait_ready(timeout=60)
        with pool.sandbox() as sb:
            assert sb.call("run_python", {"code": "print(1)"}).ok
            labels = engine.inspect(sb.container_id)["Config"]["Labels"]
            ps = json.loads(run_cli("ps", "--json").stdout)
        assert labels["toolcage.run_id"] == sb.run_id and labels["toolcage.pool"] == pool.id
        assert labels["toolcage.tool"] == "pool-audit" and sb.name == f"toolcage-pool-audit-{sb.run_id}"
        assert any(r["run_id"] == sb.run_id for r in ps)
    mine = [r for r in read(audit) if r.get("run_id") == sb.run_id]
    events = [r["event"] for r in mine]
    assert events[:2] == ["pool.slot_created", "run.started"] and events[-1] == "run.finished", events
    assert "run.call" in events
    started = mine[1]
    assert started["pool"] == pool.id and started["container_id"] == sb.container_id and started["slot_age_ms"] >= 0
    assert mine[-1]["status"] == "ok" and mine[-1]["calls"] == 1


UPSTREAM = r"""
import http.server, json
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = json.dumps(dict(self.headers)).encode()  # echoes every header back, the secret too
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
http.server.ThreadingHTTPServer(("0.0.0.0", 8080), H).serve_forever()
"""
CONNECTOR = """
from toolcage.sdk import Context, tool


@tool
def headers(ctx: Context) -> dict:
    \"\"\"The upstream's echo of the request headers.\"\"\"
    return ctx.fetch("http://api.allowed.test:8080/h", auth="TOK").json()
"""
TOKEN = "tcpool_" + secrets.token_hex(8)


@pytest.fixture(scope="module")
def upstream(engine: Any) -> Iterator[dict[str, Any]]:
    """An internal network with an HTTP server (api.allowed.test) that echoes the request headers."""
    tag = secrets.token_hex(3)
    net, labels = f"toolcage-test-pool-{tag}", {"toolcage.test": tag}
    engine.create_network(net, internal=True, labels=labels)
    cid = None
    try:
        cid = start_upstream(engine, f"toolcage-test-pool-up-{tag}", net, UPSTREAM, ["api.allowed.test"], labels, {})
        subnet = engine.network(net)["IPAM"]["Config"][0]["Subnet"]
        time.sleep(0.5)
        yield {"network": net, "subnet": subnet}
    finally:
        if cid is not None:
            engine.remove(cid)
        engine.remove_network(net)


def proxy_policy(tmp_path: Path, subnet: str, run_s: int = 60) -> Path:
    pol = tmp_path / "proxy.yaml"
    pol.write_text(
        textwrap.dedent(f"""
        network:
          mode: proxy
          allow: [{{host: api.allowed.test, schemes: [http], ports: [8080], methods: [GET]}}]
          allow_private_cidrs: ["{subnet}"]
        secrets:
          TOK: {{send_to: {{host: api.allowed.test, scheme: http, port: 8080, header: X-Api-Key, format: "{{value}}"}}}}
        timeouts: {{run_s: {run_s}, call_s: 20}}
        """)
    )
    return pol


def test_proxy_slot_with_connector_and_secret(engine: Any, upstream: dict[str, Any], tmp_path: Path) -> None:
    """A proxy-policy slot brings its egress proxy pre-started; the secret given at adoption reaches the
    worker (it adds the header upstream and redacts the echo) and is in no container's settings."""
    (tmp_path / "tools").mkdir()
    (tmp_path / "tools" / "echo_headers.py").write_text(CONNECTOR)
    pol = proxy_policy(tmp_path, upstream["subnet"])
    audit = tmp_path / "audit.jsonl"
    with Pool(pol, size=1, tools=[tmp_path / "tools"], egress_network=upstream["network"], audit=audit) as pool:
        assert pool.wait_ready(timeout=90)
        slot_objects = pool_objects(engine, pool.id)
        assert any("toolcage-proxy-" in o for o in slot_objects), slot_objects
        with pool.sandbox(secrets={"TOK": TOKEN}) as sb:
            r = sb.call("headers")
            assert r.ok, r
            assert r.result.get("x-api-key") == "[secret TOK]", r.result  # sent by the worker, redacted on the way back
            fetched = sb.call("http_fetch", {"url": "http://api.allowed.test:8080/plain"})
            assert fetched.ok and fetched.result["status"] == 200
            inspected = [engine.inspect(c["Id"]) for c in engine.containers(f"toolcage.run_id={sb.run_id}")]
        assert len(inspected) == 2  # the sandbox and its proxy
        # its runs may take secrets and connectors: the slot loaded their modules while it waited
        assert {_pooled_env(engine, i["Id"]) for i in inspected} == {"1"}
        for info in inspected:
            assert TOKEN not in json.dumps(info), "a secret reached a container's settings"
    configured = [r for r in read(audit) if r["event"] == "run.configured" and r["run_id"] == sb.run_id]
    assert configured and configured[0]["secrets"] == ["TOK"] and configured[0]["tools"] == ["headers"]
    decisions = [r for r in read(audit) if r["event"] == "egress.decision" and r["run_id"] == sb.run_id]
    assert any(d["source"] == "proxy" and d["allowed"] for d in decisions), decisions
    assert TOKEN not in audit.read_text()
    assert eventually(lambda: pool_objects(engine, pool.id) == []), pool_objects(engine, pool.id)


@pytest.mark.runc_only(POOL_HOST_SIDE)
def test_close_removes_every_slot_with_its_proxy(engine: Any, upstream: dict[str, Any], tmp_path: Path) -> None:
    """pool.close() removes every waiting slot: containers, proxies, networks and volumes."""
    pol = proxy_policy(tmp_path, upstream["subnet"])
    pool = Pool(pol, size=2, audit=False)
    try:
        assert pool.wait_ready(timeout=90)
        made = pool_objects(engine, pool.id)
        shared = 2 if sharedfiles.layers(engine, engine.image(DEFAULT_IMAGE)["Id"]) else 0  # a slot's file overlays
        assert sum(o.startswith("network ") for o in made) == 2
        assert sum(o.startswith("volume ") for o in made) == 2 * (1 + shared), made
        pool.close()
        with pytest.raises(UsageError, match="the pool is closed"):
            Sandbox(pool=pool, secrets={"TOK": TOKEN}).start()
    finally:
        pool.close()
    assert pool_objects(engine, pool.id) == []


OWNER = """
import sys
from toolcage.pool import Pool
pool = Pool(sys.argv[1], size=2, audit=False)
assert pool.wait_ready(timeout=90)
sb = pool.sandbox(secrets={"TOK": "tcpool_owner_token"})
sb.start()
print(pool.id, flush=True)
sb.call("run_shell", {"command": "sleep 300", "timeout_s": 300}, timeout=600)
"""


@pytest.mark.runc_only(POOL_HOST_SIDE)
def test_sigkilled_owner_leaves_nothing_gc_keeps(engine: Any, upstream: dict[str, Any], tmp_path: Path) -> None:
    """A process with a proxy pool and an adopted run, SIGKILLed: `toolcage gc` removes every slot, proxy,
    network and volume it left."""
    pol = proxy_policy(tmp_path, upstream["subnet"])
    proc = subprocess.Popen([sys.executable, "-c", OWNER, str(pol)], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    pool_id = proc.stdout.readline().strip()
    try:
        assert pool_id, "the owner did not start its pool"
        assert eventually(lambda: len(engine.containers(f"toolcage.pool={pool_id}")) >= 5)  # 3 slots, their proxies
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        proc.stdout.close()
    gc = run_cli("gc", "--json")
    assert gc.returncode == 0, gc.stderr
    assert eventually(lambda: pool_objects(engine, pool_id) == [], timeout=20), pool_objects(engine, pool_id)


@pytest.mark.runc_only(POOL_HOST_SIDE)
def test_serve_pool_runs_each_request_in_a_fresh_sandbox(engine: Any, tmp_path: Path) -> None:
    """`toolcage serve --pool 2`: each request in its own pooled sandbox (a file from one is absent in the
    next), answers matched by id, a batch refused; every run audited, nothing left at exit."""
    audit = tmp_path / "audit.jsonl"
    reqs = [
        {"jsonrpc": "2.0", "method": "write_file", "params": {"path": "a.txt", "content": "x"}, "id": 1},
        {"jsonrpc": "2.0", "method": "list_files", "params": {"path": "/scratch"}, "id": 2},
        [{"jsonrpc": "2.0", "method": "ping", "id": 3}],
    ]
    stdin = "".join(json.dumps(r) + "\n" for r in reqs)
    proc = run_cli("serve", "--pool", "2", "--tool-label", "servepool", "--audit-log", str(audit), stdin=stdin)
    assert proc.returncode == 0, proc.stderr
    answers = {json.dumps(a.get("id")): a for a in map(json.loads, proc.stdout.splitlines())}
    assert answers["1"]["result"]["bytes_written"] == 1
    assert answers["2"]["result"]["entries"] == []
    assert answers["null"]["error"]["code"] == -32600
    runs = {r["run_id"] for r in read(audit) if r["event"] == "run.finished"}
    assert len(runs) == 2
    assert engine.containers("toolcage.tool=servepool") == []


@pytest.mark.runc_only(POOL_HOST_SIDE)
def test_mcp_serve_pool_fresh_per_call(engine: Any) -> None:
    """`toolcage mcp serve --pool 2 --fresh-per-call`: every tools/call in a fresh pooled sandbox."""
    from mcp import ClientSession

    from tests.integration.test_mcp_serve import _session, scratch_not_kept

    async def body(s: ClientSession) -> None:
        await scratch_not_kept(s)
        res = await s.call_tool("run_shell", {"command": "ls /scratch | wc -l"})
        assert not res.is_error and res.structured_content["stdout"].strip() == "0"

    _session(["--pool", "2", "--fresh-per-call"], body)
    assert [c for c in engine.containers("toolcage.pool") if c["Labels"].get("toolcage.tool") == "mcp"] == []


@pytest.mark.runc_only(POOL_HOST_SIDE)
def test_async_pool_runs_start_without_the_default_executor(engine: Any) -> None:
    """AsyncPool: four runs gathered while the loop's one default-executor thread is busy each adopt a
    container of their own (fresh scratch), and everything the pool made is removed after."""
    import asyncio
    import threading
    from concurrent.futures import ThreadPoolExecutor

    from toolcage import AsyncPool

    async def body() -> tuple[str, list[tuple[str, str | None]]]:
        loop = asyncio.get_running_loop()
        loop.set_default_executor(ThreadPoolExecutor(1))
        release = threading.Event()
        busy = loop.run_in_executor(None, release.wait)
        try:
            async with AsyncPool(size=2, audit=False, max_concurrent_starts=2) as pool:
                assert await pool.wait_ready(timeout=60)

                async def one() -> tuple[str, str | None]:
                    async with pool.sandbox() as sb:
                        r = await sb.call("run_shell", {"command": "ls /scratch | wc -l"})
                        assert r.ok and r.result["stdout"].strip() == "0"
                        return sb.run_id, sb.container_id

                return pool.id, await asyncio.gather(*(one() for _ in range(4)))
        finally:
            release.set()
            await busy

    pool_id, runs = asyncio.run(asyncio.wait_for(body(), 120))
    assert len({r for r, _ in runs}) == 4 and len({c for _, c in runs}) == 4
    assert eventually(lambda: pool_objects(engine, pool_id) == [])
