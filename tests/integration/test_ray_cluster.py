"""toolcage on a real Ray cluster whose worker nodes each have their own Docker engine.

One head and three worker raylets (`ray start`), each worker with a dockerd of its own
(examples/ray_cluster/local_cluster.py): a container of node A is invisible to node B's engine, as on
separate machines. Node 2 starts without the worker image, so the cluster has to send it. Every check
asks the engines themselves (their `docker ps`/`events`/`image inspect`), not toolcage's own view.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import ray_harness

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [
    pytest.mark.ray_cluster,
    pytest.mark.runc_only("the Ray cluster (placement and node failure): its nodes' engines have no runsc"),
]


@pytest.fixture(scope="module")
def lc() -> Iterator[Any]:
    if os.geteuid() != 0:
        pytest.fail("the multi-engine cluster tests start dockerd and need root")
    cluster = ray_harness().LocalCluster()
    cluster.up(nodes=3, image_on={0, 1})
    try:
        yield cluster
    finally:
        cluster.down()


@pytest.fixture(scope="module")
def ray_driver(lc: Any) -> Iterator[Any]:
    import ray

    ray.init(address=lc.address, log_to_driver=False)
    try:
        yield ray
    finally:
        ray.shutdown()


def engine_ids(lc: Any, k: int, *filters: str) -> list[str]:
    args = ["ps", "-aq", "--no-trunc"]
    for f in filters:
        args += ["--filter", f]
    out = lc.nodes[k].docker(*args)
    text = out if isinstance(out, str) else out.stdout
    return [line for line in text.split() if line]


def wait_until(pred: Any, timeout: float, step: float = 0.5) -> bool:
    until = time.monotonic() + timeout
    while time.monotonic() < until:
        if pred():
            return True
        time.sleep(step)
    return bool(pred())


def sleeping_call(session: Any, seconds: int) -> tuple[threading.Thread, list[Any]]:
    """A call that sleeps ``seconds`` in ``session``, on a thread; the list gets its result or its error."""
    got: list[Any] = []

    def call() -> None:
        try:
            got.append(session.call("run_python", {"code": f"import time; time.sleep({seconds}); print('done')"}))
        except Exception as exc:
            got.append(exc)

    th = threading.Thread(target=call)
    th.start()
    return th, got


def node_index(lc: Any, node_id: str) -> int:
    return next(n.index for n in lc.nodes if n.node_id == node_id)


def _left_of(lc: Any, cluster_name: str) -> dict[int, list[str]]:
    return {n.index: engine_ids(lc, n.index, f"label=toolcage.cluster={cluster_name}") for n in lc.nodes}


# --- images reach the nodes -------------------------------------------------------------------------


def test_a_node_without_the_image_takes_no_runs_until_it_is_sent_the_same_build(lc: Any, ray_driver: Any) -> None:
    import toolcage.ray as tcr
    from toolcage.engine.docker_adapter import Engine
    from toolcage.errors import NoCapacity
    from toolcage.options import DEFAULT_IMAGE

    want = Engine.default().image(DEFAULT_IMAGE)
    assert want is not None
    node2 = lc.nodes[2].node_id
    assert not lc.nodes[2].docker("image", "ls", "-q", "toolcage-worker").stdout.strip(), "node 2 must start without it"
    c = tcr.Cluster("default", name="img", per_node={"warm": 0, "max_running": 4, "max_starting": 1}, linger_s=2)
    try:
        with pytest.raises(NoCapacity, match="image"):  # refused at once, never pulled, never run
            c.run("run_python", {"code": "print(1)"}, node=node2, wait_s=0)
        assert c.wait_ready(count=3, timeout=180) == 3, c.nodes()
        got = json.loads(lc.nodes[2].docker("image", "inspect", "toolcage-worker:0.1.0").stdout)[0]
        assert got["Id"] == want["Id"]  # the same build, by id (docker save/load keeps it)
        assert any(e["event"] == "image_sent" and e["node"] == node2 for e in c.events)
        r = c.run("run_python", {"code": "print(6*7)"}, node=node2)
        assert r.ok and r.result["stdout"].strip() == "42"
    finally:
        c.close(stop_agents=True)


# --- placement spreads, admission caps, nothing left ------------------------------------------------


def test_placement_spreads_runs_across_engines_and_leaves_nothing(lc: Any, ray_driver: Any) -> None:
    import toolcage.ray as tcr

    c = tcr.Cluster("default", name="spread", per_node={"warm": 1, "max_running": 4, "max_starting": 2}, linger_s=1)
    try:
        c.wait_ready(count=3, timeout=180)
        since = str(int(time.time()) - 1)
        results = c.map([("run_python", {"code": "print(1)"})] * 24)
        assert all(getattr(r, "ok", False) for r in results), results
        started = {
            n.index: len(
                [
                    line
                    for line in n.docker(
                        "events", "--since", since, "--until", str(int(time.time()) + 1),
                        "--filter", "label=toolcage.cluster=spread", "--filter", "event=start", "--format", "x",
                    ).stdout.split()
                    if line
                ]
            )
            for n in lc.nodes
        }  # fmt: skip
        total = sum(started.values())
        assert total >= 24, started
        for k, count in started.items():
            assert count >= total / 4 / 1.5, f"node {k} started {count} of {total}: {started}"
    finally:
        c.close(stop_agents=True)
    assert wait_until(lambda: not any(_left_of(lc, "spread").values()), 30), _left_of(lc, "spread")


def test_admission_caps_hold_under_a_burst(lc: Any, ray_driver: Any) -> None:
    import toolcage.ray as tcr

    caps = {"warm": 0, "max_running": 2, "max_starting": 1}
    c = tcr.Cluster("default", name="caps", per_node=caps, linger_s=1)
    seen: dict[int, int] = {0: 0, 1: 0, 2: 0}
    done = threading.Event()

    def watch() -> None:  # the engines' own count of running sandboxes, sampled through the burst
        while not done.is_set():
            for n in lc.nodes:
                now = engine_ids(lc, n.index, "label=toolcage.cluster=caps", "status=running")
                seen[n.index] = max(seen[n.index], len(now))
            time.sleep(0.1)

    try:
        c.wait_ready(count=3, timeout=180)
        since = time.time()
        t = threading.Thread(target=watch, daemon=True)
        t.start()
        results = c.map([("run_python", {"code": "import time; time.sleep(0.3)"})] * 30, wait_s=300)
        done.set()
        t.join()
        assert all(getattr(r, "ok", False) for r in results), [r for r in results if not getattr(r, "ok", False)][:3]
        for k, most in seen.items():
            assert most <= caps["max_running"], f"node {k} ran {most} sandboxes at once"
        for n in lc.nodes:  # concurrent starts, from the engine's create/start events
            lines = n.docker(
                "events", "--since", f"{since - 1:.3f}", "--until", f"{time.time() + 1:.0f}", "--filter",
                "label=toolcage.cluster=caps", "--filter", "event=create", "--filter", "event=start",
                "--format", "{{.Action}} {{.Actor.ID}} {{.TimeNano}}",
            ).stdout.split("\n")  # fmt: skip
            open_starts, most = set(), 0
            for line in sorted((ln.split() for ln in lines if ln.strip()), key=lambda p: int(p[2])):
                (open_starts.add if line[0] == "create" else open_starts.discard)(line[1])
                most = max(most, len(open_starts))
            assert most <= caps["max_starting"], f"node {n.index}: {most} containers starting at once"
    finally:
        done.set()
        c.close(stop_agents=True)


def test_a_full_cluster_makes_a_run_wait_then_say_no_capacity(lc: Any, ray_driver: Any) -> None:
    import toolcage.ray as tcr
    from toolcage.errors import NoCapacity

    c = tcr.Cluster("default", name="full", per_node={"warm": 0, "max_running": 1, "max_starting": 1}, linger_s=1)
    try:
        c.wait_ready(count=3, timeout=180)
        held = [c.sandbox().start() for _ in range(3)]
        assert sorted(s.node or "" for s in held) == sorted(n.node_id for n in lc.nodes)  # one per node
        t0 = time.monotonic()
        with pytest.raises(NoCapacity, match="no node admitted"):
            c.run("run_python", {"code": "print(1)"}, wait_s=1.5)
        assert 1.4 <= time.monotonic() - t0 < 10
        waiter: list[Any] = []
        th = threading.Thread(target=lambda: waiter.append(c.run("run_python", {"code": "print(2)"}, wait_s=60)))
        th.start()
        time.sleep(1.0)
        held[0].close()  # room on one node: the waiting run goes there
        th.join(60)
        assert waiter and waiter[0].ok
        for s in held[1:]:
            s.close()
    finally:
        c.close(stop_agents=True)


NO_ROUTE = "import socket\ntry:\n socket.create_connection(('10.255.255.1', 80), 2)\n print('open')\nexcept OSError as e:\n print('closed', e)"  # noqa: E501


# --- the same hardened container on every node, cluster-wide views ----------------------------------


def test_every_node_runs_the_same_hardened_container_and_views_span_the_cluster(lc: Any, ray_driver: Any) -> None:
    import toolcage.ray as tcr

    c = tcr.Cluster("default", name="same", per_node={"warm": 0, "max_running": 2, "max_starting": 1}, linger_s=1)
    try:
        c.wait_ready(count=3, timeout=180)
        sessions = [c.sandbox(node=n.node_id).start() for n in lc.nodes]
        hardening = []
        for s, n in zip(sessions, lc.nodes, strict=True):
            assert s.node == n.node_id
            (cid,) = engine_ids(lc, n.index, f"label=toolcage.run_id={s.run_id}", "label=toolcage.role=sandbox")
            hc = json.loads(n.docker("inspect", cid).stdout)[0]
            h = hc["HostConfig"]
            hardening.append(
                (h["CapDrop"], h["ReadonlyRootfs"], sorted(h["SecurityOpt"] or []), h["NetworkMode"], h["PidsLimit"],
                 h["Memory"], h["NanoCpus"], hc["Config"]["User"])
            )  # fmt: skip
            assert hc["Config"]["Labels"]["toolcage.node"] == n.node_id
            # no route out from any node's sandbox (the policy has no network)
            r = s.call("run_python", {"code": NO_ROUTE})
            assert r.result["stdout"].startswith("closed"), r.result
        assert hardening[0] == hardening[1] == hardening[2]
        assert hardening[0][0] == ["ALL"] and hardening[0][1] is True and hardening[0][3] == "none"
        rows = c.ps()
        assert {r["node"] for r in rows if r["run_id"] in {s.run_id for s in sessions}} == {n.node_id for n in lc.nodes}
        for s in sessions:
            s.close()
        logs = c.audit(limit=50)
        assert not [log for log in logs if "error" in log], logs  # an agent that did not answer, and why
        assert {log["node"] for log in logs} >= {n.node_id for n in lc.nodes}
        for log in logs:
            assert log["problems"] == [], log  # each node's chain verifies
        # and from the command line, as an operator types it
        out = subprocess.run(
            [sys.executable, "-m", "toolcage.cli", "audit", "--ray", lc.address, "--verify", "--json"],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert out.returncode == 0, out.stderr
        assert len({json.loads(line)["node"] for line in out.stdout.splitlines() if line.strip()}) >= 3
    finally:
        c.close(stop_agents=True)


# --- node loss, engine loss --------------------------------------------------------------------------


def test_killing_a_raylet_mid_run_ends_exactly_its_runs_as_node_lost_and_its_reaper_cleans_on_return(
    lc: Any, ray_driver: Any
) -> None:
    import toolcage.ray as tcr
    from toolcage.errors import NodeLost

    c = tcr.Cluster("default", name="loss", per_node={"warm": 0, "max_running": 4, "max_starting": 2}, linger_s=60)
    victim = 1
    try:
        c.wait_ready(count=3, timeout=180)
        sessions = [c.sandbox(node=n.node_id).start() for n in lc.nodes for _ in range(2)]
        victim_id = lc.nodes[victim].node_id
        outcomes: dict[int, Any] = {}

        def long_call(i: int) -> None:
            try:
                outcomes[i] = sessions[i].call("run_python", {"code": "import time; time.sleep(25); print('done')"})
            except Exception as exc:
                outcomes[i] = (exc, time.monotonic())

        threads = [threading.Thread(target=long_call, args=(i,)) for i in range(len(sessions))]
        for t in threads:
            t.start()
        time.sleep(3)
        left_behind = engine_ids(lc, victim, "label=toolcage.cluster=loss", "status=running")
        assert len(left_behind) == 2
        killed = time.monotonic()
        lc.kill_raylet(victim)
        # new runs go elsewhere while it is gone
        assert wait_until(lambda: victim_id not in {n["node_id"] for n in c.nodes()}, 30)
        for _ in range(3):
            assert c.run("run_python", {"code": "print(3)"}).ok
        for t in threads:
            t.join(60)
        for i, s in enumerate(sessions):
            if s.node == victim_id:
                exc, when = outcomes[i]
                assert isinstance(exc, NodeLost), outcomes[i]
                assert exc.status == "node_lost" and when - killed < 20, when - killed  # the stated bound
            else:
                assert getattr(outcomes[i], "ok", False), outcomes[i]
                s.close()
        # the dead agent's sandboxes are still on the node's engine, until the node comes back
        assert engine_ids(lc, victim, "label=toolcage.cluster=loss")
        lc.restart_node(victim)
        assert wait_until(lambda: lc.nodes[victim].node_id in {n["node_id"] for n in c.nodes() if n["eligible"]}, 60)
        assert wait_until(lambda: not engine_ids(lc, victim, "label=toolcage.cluster=loss"), 30)
        recs = [r for log in c.audit(limit=400) if log["node"] == lc.nodes[victim].node_id for r in log["records"]]
        assert any(r.get("event") == "cluster.agent_started" and r.get("reaped", 0) >= 2 for r in recs), recs[-5:]
    finally:
        c.close(stop_agents=True)


def test_stopping_an_engine_mid_run_says_engine_unavailable_and_placement_avoids_it(lc: Any, ray_driver: Any) -> None:
    import toolcage.ray as tcr
    from toolcage.errors import EngineUnavailable

    c = tcr.Cluster("default", name="eng", per_node={"warm": 0, "max_running": 4, "max_starting": 2}, linger_s=1)
    k = 2
    try:
        c.wait_ready(count=3, timeout=180)
        s = c.sandbox(node=lc.nodes[k].node_id).start()
        th, got = sleeping_call(s, 30)
        time.sleep(2)
        lc.stop_engine(k)
        th.join(60)
        assert got and isinstance(got[0], EngineUnavailable), got
        assert wait_until(lambda: not next(n for n in c.nodes() if n["node_id"] == lc.nodes[k].node_id)["eligible"], 10)
        for _ in range(3):
            assert c.run("run_python", {"code": "print(1)"}).ok  # elsewhere
        lc.start_engine(k)
        assert wait_until(lambda: next(n for n in c.nodes() if n["node_id"] == lc.nodes[k].node_id)["eligible"], 60)
        assert c.run("run_python", {"code": "print(1)"}, node=lc.nodes[k].node_id).ok
    finally:
        c.close(stop_agents=True)


# --- nothing leaks: driver SIGKILL, bystanders untouched ----------------------------------------------

DRIVER = textwrap.dedent(
    """
    import sys, threading, time, ray, toolcage.ray as tcr
    ray.init(address=sys.argv[1], log_to_driver=False)
    c = tcr.Cluster("default", name="drv", per_node={"warm": 1, "max_running": 4, "max_starting": 2}, linger_s=3)
    c.wait_ready(count=3, timeout=180)
    held = [c.sandbox().start() for _ in range(3)]
    long = ("run_python", {"code": "import time; time.sleep(60)"})
    for _ in range(3):
        threading.Thread(target=c.run, args=long, daemon=True).start()
    time.sleep(2)
    print("ready", flush=True)
    time.sleep(600)
    """
)


def test_sigkill_of_the_driver_leaks_nothing_and_touches_no_one_elses(lc: Any, ray_driver: Any, tmp_path: Path) -> None:
    # a bystander: a toolcage-labelled container whose owner (this test process) lives
    bystander = lc.nodes[0].docker(
        "create", "--label", "toolcage.run_id=bystander", "--label", f"toolcage.owner=x:{os.getpid()}",
        "--label", "toolcage.cluster=drv", "toolcage-worker:0.1.0", "true",
    ).stdout.strip()  # fmt: skip
    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    proc = subprocess.Popen(
        [sys.executable, str(script), lc.address], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.strip() == "ready", line
        assert wait_until(lambda: sum(len(v) for v in _left_of(lc, "drv").values()) >= 7, 30)
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)

        def only_bystander() -> bool:
            left = _left_of(lc, "drv")
            return left[0] == [bystander] and not left[1] and not left[2]

        assert wait_until(only_bystander, 40), _left_of(lc, "drv")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        if proc.stdout is not None:
            proc.stdout.close()
        lc.nodes[0].docker("rm", "-f", bystander)


def test_the_readmes_ray_example_runs_against_the_multi_engine_cluster(lc: Any, ray_driver: Any) -> None:
    readme = ROOT / "tests" / "integration" / "test_docs.py"
    spec = importlib.util.spec_from_file_location("readme_blocks", readme)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.RAY_BLOCKS, "the README and docs/ray.md lost their Ray examples"
    for index in mod.RAY_BLOCKS:
        env = {**os.environ, "RAY_ADDRESS": lc.address}
        proc = subprocess.run(
            [sys.executable, "-c", mod.BLOCKS[index][1]], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert "ok 42" in proc.stdout, proc.stdout


def test_a_killed_agent_ends_its_sessions_as_node_lost_and_its_successor_reaps(lc: Any, ray_driver: Any) -> None:
    import ray

    import toolcage.ray as tcr
    from toolcage.errors import NodeLost
    from toolcage.ray.agent import NAMESPACE, agent_name

    c = tcr.Cluster("default", name="akill", per_node={"warm": 0, "max_running": 4, "max_starting": 2}, linger_s=2)
    node0 = lc.nodes[0].node_id
    try:
        c.wait_ready(count=3, timeout=180)
        s = c.sandbox(node=node0).start()
        th, got = sleeping_call(s, 30)
        time.sleep(2)
        ray.kill(ray.get_actor(agent_name("akill", node0), namespace=NAMESPACE), no_restart=True)
        th.join(30)
        assert got and isinstance(got[0], NodeLost) and "agent died" in got[0].message, got
        # the view makes a new agent on the node (alive), whose reaper removes what the dead one left
        assert wait_until(lambda: not engine_ids(lc, 0, "label=toolcage.cluster=akill"), 30)
        assert c.run("run_python", {"code": "print(1)"}, node=node0).ok
    finally:
        c.close(stop_agents=True)


def test_a_node_that_joins_gets_an_agent_and_takes_runs(lc: Any, ray_driver: Any) -> None:
    import toolcage.ray as tcr

    c = tcr.Cluster("default", name="join", per_node={"warm": 0, "max_running": 2, "max_starting": 1}, linger_s=1)
    try:
        c.wait_ready(count=3, timeout=180)
        new = lc.add_node(image=True)
        assert wait_until(lambda: any(n["node_id"] == new.node_id and n["eligible"] for n in c.nodes()), 60)
        r = c.run("run_python", {"code": "print(5)"}, node=new.node_id)
        assert r.ok and r.result["stdout"].strip() == "5"
    finally:
        c.close(stop_agents=True)


def test_a_ray_task_anywhere_in_the_cluster_uses_the_same_agents(lc: Any, ray_driver: Any) -> None:
    import ray

    import toolcage.ray as tcr

    c = tcr.Cluster("default", name="task", per_node={"warm": 0, "max_running": 2, "max_starting": 1}, linger_s=2)
    try:
        c.wait_ready(count=3, timeout=180)

        @ray.remote(num_cpus=0.1)
        def inside() -> tuple[str, str]:
            import toolcage.ray as tcr

            mine = tcr.Cluster("default", name="task", per_node={"warm": 0, "max_running": 2, "max_starting": 1})
            r = mine.run("run_python", {"code": "print(7)"})
            mine.close()
            return str(r.status), r.result["stdout"].strip()

        assert ray.get([inside.remote() for _ in range(3)], timeout=180) == [("ok", "7")] * 3
    finally:
        c.close(stop_agents=True)


def test_many_async_calls_gathered_on_one_cluster_session_run_at_once(lc: Any, ray_driver: Any) -> None:
    """On the direct channel an async call waits on a thread of its own pool, not the loop's default executor
    (cores + 4 threads here): 12 two-second calls gathered on one session (the policy lets 12 run at once) take
    about two seconds, not four (two waves of the default executor's 6 threads). Two, not one: the calls' own
    starts on 2 loaded cores took up to 0.9 s, which one-second calls against a 1.9 s bound did not leave room for."""
    import asyncio

    import toolcage.ray as tcr

    policy = {"extends": "default", "limits": {"concurrency": 12}}
    c = tcr.Cluster(policy, name="gather", per_node={"warm": 0, "max_running": 4, "max_starting": 2}, linger_s=2)

    async def go() -> tuple[float, list[Any]]:
        async with c.async_sandbox(node=lc.nodes[0].node_id) as s:
            t0 = time.monotonic()
            calls = [s.call("run_python", {"code": "import time; time.sleep(2); print('up')"}) for _ in range(12)]
            got = await asyncio.gather(*calls)
            return time.monotonic() - t0, got

    try:
        c.wait_ready(count=3, timeout=180)
        took, got = asyncio.run(go())
        assert all(r.ok and r.result["stdout"] == "up\n" for r in got), got
        assert took < 3.6, took  # two waves: at least 4 s
    finally:
        c.close(stop_agents=True)


def test_files_travel_both_ways_and_a_snapshot_resumes_on_another_node(
    lc: Any, ray_driver: Any, tmp_path: Path
) -> None:
    import toolcage.ray as tcr

    c = tcr.Cluster("default", name="files", per_node={"warm": 0, "max_running": 2, "max_starting": 1}, linger_s=1)
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "a.txt").write_text("alpha")
    (src / "sub" / "b.bin").write_bytes(bytes(range(256)))
    try:
        c.wait_ready(count=3, timeout=180)
        with c.sandbox(node=lc.nodes[0].node_id) as s:
            up = s.upload(src, "/scratch/in")
            assert (up.files, up.bytes) == (2, 5 + 256)
            r = s.call("exec", {"command": "cat /scratch/in/a.txt; wc -c < /scratch/in/sub/b.bin"})  # its contents
            assert r.result["stdout"] == "alpha256\n", r.result
            s.call("exec", {"command": "mkdir -p /scratch/out && echo result > /scratch/out/r.txt"})
            got = s.download("/scratch/out", tmp_path / "back")
            assert got.files == 1 and (tmp_path / "back" / "r.txt").read_text() == "result\n"
            assert not [p for p in (tmp_path / "back").iterdir() if p.name.startswith(".toolcage-dl-")]
            info = s.snapshot(tmp_path / "s.tar")
            assert info.sha256
        # the cluster signs with the driver's key: it resumes on another node, whose own key differs
        with c.sandbox(node=lc.nodes[1].node_id, resume=tmp_path / "s.tar") as s2:
            r = s2.call("exec", {"command": "cat /scratch/out/r.txt /scratch/in/a.txt"})
            assert r.ok and r.result["stdout"] == "result\nalpha", r.result
        tampered = bytearray((tmp_path / "s.tar").read_bytes())
        tampered[len(tampered) // 2] ^= 1
        from toolcage.errors import ToolcageError

        with pytest.raises(ToolcageError), c.sandbox(node=lc.nodes[2].node_id, resume=bytes(tampered)):
            pass
    finally:
        c.close(stop_agents=True)


def test_after_ray_is_gone_toolcage_gc_on_each_node_removes_every_thing_the_cluster_made(
    lc: Any, ray_driver: Any
) -> None:
    """The last test of the module: it takes every raylet down (as `ray stop` or a power cut would)."""
    import toolcage.ray as tcr

    c = tcr.Cluster("default", name="gone", per_node={"warm": 1, "max_running": 4, "max_starting": 2}, linger_s=600)
    c.wait_ready(count=len(lc.nodes), timeout=180)
    held = [c.sandbox(node=n.node_id).start() for n in lc.nodes]
    assert len(held) == len(lc.nodes)
    assert all(_left_of(lc, "gone").values())
    for n in lc.nodes:
        lc.kill_raylet(n.index)
    for n in lc.nodes:
        assert wait_until(lambda n=n: not lc.node_alive(n.index), 30)
    time.sleep(2)  # the agents' processes exit with their raylets
    assert any(_left_of(lc, "gone").values())  # left behind: nobody removed them yet
    for n in lc.nodes:
        env = {**os.environ, "DOCKER_HOST": n.docker_host, "TOOLCAGE_AUDIT_LOG": n.audit_log}
        out = subprocess.run(
            [sys.executable, "-m", "toolcage.cli", "gc", "--json"], env=env, capture_output=True, text=True, timeout=120
        )
        assert out.returncode == 0, out.stderr
    assert not any(_left_of(lc, "gone").values()), _left_of(lc, "gone")
    for n in lc.nodes:  # networks and volumes too
        nets = n.docker("network", "ls", "-q", "--filter", "label=toolcage.cluster=gone").stdout.split()
        vols = n.docker("volume", "ls", "-q", "--filter", "label=toolcage.cluster=gone").stdout.split()
        assert not nets and not vols, (nets, vols)
