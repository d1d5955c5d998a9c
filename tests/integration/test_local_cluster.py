"""examples/ray_cluster/local_cluster.py: a real Ray cluster on this machine, a head and two worker nodes, each
worker node with a Docker engine of its own; the worker image only on node 0.

Checks what toolcage.ray relies on: the engines are separate (a container made on node 0's engine is not on
node 1's, nor on the main engine), node 1 lacks the image, both nodes are alive with the toolcage_engine
resource, a task pinned to node k sees node k's DOCKER_HOST (and audit log and state dir) and reaches that
engine, a SIGKILLed raylet is marked dead within local_cluster.DEATH_BOUND_S, restart_node brings the node back
under a new Ray node id, stop_engine/start_engine, and that down() leaves no process, namespace, veth,
iptables rule, mount or directory of the cluster behind. Runs as root (the harness starts dockerd); 35-60 s
on a 2-core machine.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import ray

pytestmark = pytest.mark.runc_only("the Ray cluster (placement and node failure): its nodes' engines have no runsc")

ROOT = Path(__file__).resolve().parents[2]
HARNESS = ROOT / "examples" / "ray_cluster" / "local_cluster.py"
LABEL = "toolcage.test=harness"


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("local_cluster", HARNESS)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


lc = _load()


@pytest.fixture(scope="module")
def cluster(engine: Any) -> Iterator[Any]:
    c = lc.LocalCluster(image=os.environ.get("TOOLCAGE_IMAGE", lc.DEFAULT_IMAGE))
    c.up(nodes=2, image_on={0})
    try:
        yield c
    finally:
        if ray.is_initialized():
            ray.shutdown()
        c.down()


@pytest.fixture(scope="module")
def driver(cluster: Any) -> Any:
    ray.init(address=cluster.address, logging_level=logging.ERROR, log_to_driver=False)
    return ray


def _env_on(node_id: str) -> dict[str, Any]:
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    @ray.remote(num_cpus=0, max_retries=0)
    def probe() -> dict[str, Any]:
        import socket

        host = os.environ.get("DOCKER_HOST", "")
        with socket.socket(socket.AF_UNIX) as s:
            s.settimeout(5)
            s.connect(host.removeprefix("unix://"))
            s.sendall(b"GET /_ping HTTP/1.0\r\n\r\n")
            ping = s.recv(64).split(b"\r\n")[0].decode()
        keys = ("DOCKER_HOST", "TOOLCAGE_AUDIT_LOG", "XDG_STATE_HOME")
        return {
            "env": {k: os.environ.get(k) for k in keys},
            "ping": ping,
            "node": ray.get_runtime_context().get_node_id(),
        }

    strategy = NodeAffinitySchedulingStrategy(node_id, soft=False)
    return ray.get(probe.options(scheduling_strategy=strategy).remote(), timeout=60)


def test_engines_are_separate(cluster: Any) -> None:
    n0, n1 = cluster.nodes
    assert n0.socket != n1.socket and n0.dir != n1.dir
    cid = n0.docker(
        "create", "--label", LABEL, "--name", f"tc-harness-{cluster.id}", cluster.image, "true"
    ).stdout.strip()
    try:
        assert n0.docker("ps", "-aq", "--no-trunc", "--filter", f"label={LABEL}").stdout.split() == [cid]
        assert n1.docker("ps", "-aq", "--no-trunc", "--filter", f"label={LABEL}").stdout.split() == []
        main = subprocess.run(["docker", "ps", "-aq", "--no-trunc"], capture_output=True, text=True, check=True)
        assert cid not in main.stdout.split()
    finally:
        n0.docker("rm", "-f", cid)
    assert n0.docker("ps", "-aq", "--filter", f"label={LABEL}").stdout.split() == []


def test_only_node0_has_the_image(cluster: Any) -> None:
    n0, n1 = cluster.nodes
    assert n0.has_image and not n1.has_image
    got = n0.docker("image", "inspect", "--format", "{{.Id}}", cluster.image).stdout.strip()
    assert got == cluster.image_id
    missing = n1.docker("image", "inspect", cluster.image, check=False)
    assert missing.returncode != 0 and "No such image" in missing.stderr


def test_nodes_alive_with_the_engine_resource(cluster: Any, driver: Any) -> None:
    alive = {n["NodeID"]: n for n in driver.nodes() if n["Alive"]}
    for node in cluster.nodes:
        assert node.node_id in alive, node.name
        assert alive[node.node_id]["NodeName"] == node.name
        assert alive[node.node_id]["Resources"].get(lc.ENGINE_RESOURCE) == 1
    head = [n for n in alive.values() if n["NodeName"] == "toolcage-head"]
    assert len(head) == 1 and lc.ENGINE_RESOURCE not in head[0]["Resources"]
    # the driver sits on the head's raylet: killing a worker's raylet never takes it down
    assert driver.get_runtime_context().get_node_id() == head[0]["NodeID"]


def test_a_task_on_node_k_sees_node_ks_engine(cluster: Any, driver: Any) -> None:
    for node in cluster.nodes:
        got = _env_on(node.node_id)
        assert got["node"] == node.node_id
        assert got["env"] == {
            "DOCKER_HOST": node.docker_host,
            "TOOLCAGE_AUDIT_LOG": node.audit_log,
            "XDG_STATE_HOME": node.state_home,
        }
        assert got["ping"] == "HTTP/1.0 200 OK"


def test_killed_raylet_is_dead_within_the_bound_and_restart_gives_a_new_id(cluster: Any, driver: Any) -> None:
    node = cluster.nodes[1]
    old = node.node_id
    t = cluster.kill_raylet(1)
    while True:
        state = {n["NodeID"]: n["Alive"] for n in driver.nodes()}
        if not state[old]:
            took = time.monotonic() - t
            break
        assert time.monotonic() - t < lc.DEATH_BOUND_S, f"still alive {lc.DEATH_BOUND_S}s after its raylet was killed"
        time.sleep(0.05)
    print(f"node dead {took:.2f}s after SIGKILL of its raylet")
    new = cluster.restart_node(1)
    assert new != old and node.node_id == new
    alive = {n["NodeID"]: n for n in driver.nodes() if n["Alive"]}
    assert alive[new]["NodeName"] == node.name and alive[new]["Resources"].get(lc.ENGINE_RESOURCE) == 1
    assert old not in alive
    assert _env_on(new)["env"]["DOCKER_HOST"] == node.docker_host


def test_stop_and_start_engine(cluster: Any) -> None:
    node = cluster.nodes[1]
    cluster.stop_engine(1)
    assert not node.ping()
    assert node.docker("version", check=False, timeout=30).returncode != 0
    cluster.start_engine(1)
    assert node.ping()
    assert node.docker("ps", "-q").stdout.strip() == ""


def test_down_leaves_nothing(cluster: Any) -> None:
    if ray.is_initialized():
        ray.shutdown()
    pids = [p.pid for n in cluster.nodes for p in (n.ray, n.dockerd) if p] + [cluster.head.pid]
    dirs = [cluster.root, cluster.run_dir, cluster.ray_dir]
    slots = [n.slot for n in cluster.nodes]
    cluster.down()
    assert lc.marked(cluster.id) == []
    assert [p for p in pids if Path(f"/proc/{p}").exists() and "Z" not in _state(p)] == []
    assert not [d for d in dirs if os.path.exists(d)]
    assert not [s for s in slots if Path(f"/run/netns/tclc{s}").exists() or Path(f"/sys/class/net/tcv{s}").exists()]
    rules = subprocess.run(["iptables-save"], capture_output=True, text=True, check=True).stdout
    assert cluster.tag not in rules
    mounts = Path("/proc/self/mountinfo").read_text()
    assert not [d for d in dirs if f" {d}/" in mounts or f" {d} " in mounts]


def _state(pid: int) -> str:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return "Z"
    return raw[raw.rindex(")") + 2 :].split()[0]
