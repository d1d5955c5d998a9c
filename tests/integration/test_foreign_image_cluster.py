"""Any image on the Ray cluster (issue 36, point 5): ``cluster.sandbox(image=...)`` runs a run's own image
unchanged on a node; placement asks the nodes that have the image (by content id) first; a node that lacks
it is sent it with no registry (``docker save`` here, ``docker load`` there through its engine's API), its
content id checked after the load, and the worker image's runtime volumes are made there at its first run.

A real Ray cluster on this machine: two worker nodes, each with a dockerd of its own
(examples/ray_cluster/local_cluster.py), both with the worker image; the run images are tiny ``docker
import``s (bench.images.burst_image), put on node 0 only, or on no node at all (only this driver's engine).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from typing import Any

import pytest

from bench.images import burst_image
from tests.helpers import ray_harness
from toolcage.ray import placement

pytestmark = [
    pytest.mark.ray_cluster,
    pytest.mark.runc_only("the Ray cluster: its nodes' engines have no runsc"),
]


def view(node_id: str, running: int = 0) -> placement.NodeView:
    return placement.NodeView(node_id, max_running=4, running=running, image_ready=True)


def test_placement_asks_the_nodes_with_the_image_first() -> None:
    nodes = [view("a"), view("b", running=3), view("c", running=1)]
    got = placement.decide(nodes, placement.LEAST_LOADED, prefer={"b"})
    assert got.order == ("b", "a", "c")  # the busier node has the image: it is asked first
    assert "image" in got.reason
    got = placement.decide(nodes, placement.BEST_OF_K, prefer={"b", "c"})
    assert set(got.order[:2]) == {"b", "c"} and got.order[2] == "a"
    assert placement.decide(nodes, placement.LEAST_LOADED, prefer=set()).order == ("a", "c", "b")
    assert placement.decide(nodes, placement.LEAST_LOADED, prefer={"a", "b", "c"}).order == ("a", "c", "b")


@pytest.fixture(scope="module")
def lc(engine: Any) -> Iterator[Any]:
    if os.geteuid() != 0:
        pytest.fail("the multi-engine cluster tests start dockerd and need root")
    cluster = ray_harness().LocalCluster()
    cluster.up(nodes=2, image_on={0, 1})
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


def node_engine(node: Any) -> Any:
    from toolcage.engine.docker_adapter import Engine

    return Engine(base_url=node.docker_host)


def put_on(node: Any, ref: str, engine: Any) -> None:
    """The image on that node's engine, as a user's own build there (docker save | docker load)."""
    node_engine(node).load_image(engine.save_image(ref))


def image_id_on(node: Any, ref: str) -> str | None:
    info = node_engine(node).image(ref)
    return str(info["Id"]) if info else None


def ran(node: Any, run_id: str | None) -> dict[str, Any]:
    """The container of that run on the node's engine (it is removed at close: looked up while open)."""
    from toolcage.engine.labels import LABEL_RUN_ID

    rows = [c for c in node_engine(node).containers(f"{LABEL_RUN_ID}={run_id}") if c]
    assert rows, f"run {run_id} has no container on {node.name}"
    info = node_engine(node).inspect(rows[0]["Id"])
    assert info is not None
    return info


def test_a_run_image_goes_to_the_node_that_has_it(lc: Any, ray_driver: Any, engine: Any) -> None:
    import toolcage.ray as tcr

    n0, n1 = lc.nodes
    ref = burst_image(13, engine)
    want = engine.image(ref)["Id"]
    put_on(n0, ref, engine)
    assert image_id_on(n0, ref) == want and image_id_on(n1, ref) is None
    c = tcr.Cluster("default", name="fimg", per_node={"warm": 1, "max_running": 4, "max_starting": 2}, linger_s=2)
    try:
        assert c.wait_ready(count=2, timeout=180) == 2, c.nodes()
        for _ in range(3):  # the node with the image, each time (both are idle: load alone would split them)
            with c.sandbox(image=ref) as sb:
                assert sb.node == n0.node_id
                assert sb.call("write_file", {"path": "a.txt", "content": "x"}).ok
                assert ran(n0, sb.run_id)["Image"] == want
        assert image_id_on(n1, ref) is None  # nothing sent where it was not needed
        assert not [e for e in c.events if e["event"] == "run_image_sent"]
    finally:
        c.close(stop_agents=True)


def test_an_image_no_node_has_is_sent_by_content_id_and_runs(lc: Any, ray_driver: Any, engine: Any) -> None:
    import toolcage.ray as tcr

    n0, n1 = lc.nodes
    ref = burst_image(14, engine, fresh=True)  # a new build: no node has it
    want = engine.image(ref)["Id"]
    assert image_id_on(n0, ref) is None and image_id_on(n1, ref) is None
    c = tcr.Cluster("default", name="fsend", per_node={"warm": 0, "max_running": 4, "max_starting": 2}, linger_s=2)
    try:
        assert c.wait_ready(count=2, timeout=180) == 2, c.nodes()
        with c.sandbox(image=ref, node=n1.node_id) as sb:
            assert sb.node == n1.node_id
            assert sb.call("write_file", {"path": "a.txt", "content": "x"}).ok
            assert ran(n1, sb.run_id)["Image"] == want
        assert image_id_on(n1, ref) == want  # the same content id after the load
        sent = [e for e in c.events if e["event"] == "run_image_sent"]
        assert [(e["node"], e["image_id"]) for e in sent] == [(n1.node_id, want)]
        # the worker image's runtime volumes were made on that node's engine
        vols = [v["Name"] for v in node_engine(n1).volumes("toolcage.rt")]
        assert vols, "no runtime volume on node 1"
        # the next run of it prefers node 1 now (it has it), and nothing is sent again
        with c.sandbox(image=ref) as sb:
            assert sb.node == n1.node_id
        r = c.run("write_file", {"path": "b.txt", "content": "y"}, image=ref)
        assert r.ok
        assert len([e for e in c.events if e["event"] == "run_image_sent"]) == 1
    finally:
        c.close(stop_agents=True)


def test_an_image_missing_everywhere_is_a_clear_error(lc: Any, ray_driver: Any) -> None:
    import toolcage.ray as tcr
    from toolcage.errors import ImageMissing

    c = tcr.Cluster("default", name="fmiss", per_node={"warm": 0, "max_running": 2, "max_starting": 1}, linger_s=2)
    try:
        with pytest.raises(ImageMissing, match="toolcage-test-burst-nowhere"):
            c.sandbox(image="toolcage-test-burst-nowhere:never").start()
    finally:
        c.close(stop_agents=True)


def test_a_burst_over_many_images_sends_each_at_most_once_per_node_and_leaves_nothing(
    lc: Any, ray_driver: Any, engine: Any
) -> None:
    from concurrent.futures import ThreadPoolExecutor

    import toolcage.ray as tcr

    refs = [burst_image(n, engine) for n in range(15, 21)]
    c = tcr.Cluster("default", name="fburst", per_node={"warm": 1, "max_running": 4, "max_starting": 2}, linger_s=1)
    try:
        assert c.wait_ready(count=2, timeout=180) == 2, c.nodes()

        def one(ref: str) -> bool:
            return c.run("write_file", {"path": "a.txt", "content": ref}, image=ref).ok

        with ThreadPoolExecutor(6) as ex:
            assert all(ex.map(one, refs * 2))
        sent = [(e["node"], e["image_id"]) for e in c.events if e["event"] == "run_image_sent"]
        assert len(sent) == len(set(sent)), sent  # never the same image to the same node twice
        assert {i for _, i in sent} <= {engine.image(r)["Id"] for r in refs}
    finally:
        c.close(stop_agents=True)
    label = "toolcage.cluster=fburst"

    def left() -> list[Any]:
        return [x["Names"] for node in lc.nodes for x in node_engine(node).containers(label)]

    until = time.monotonic() + 30  # removal may end just after the agents answered their shutdown
    while left() and time.monotonic() < until:
        time.sleep(0.5)
    assert not left()
