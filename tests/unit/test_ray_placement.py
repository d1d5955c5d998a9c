"""Placement decisions (toolcage.ray.placement), the cluster's per-node options and what the driver packs for an
upload: pure, no Ray started."""

from __future__ import annotations

import dataclasses
import os
import random
from collections import Counter
from pathlib import Path
from typing import Any, cast

import pytest

from toolcage.ray import placement
from toolcage.ray.placement import BEST_OF_K, LEAST_LOADED, NodeView, decide


def nodes(*loads: int, cap: int = 10) -> list[NodeView]:
    return [NodeView(f"n{i}", cap, running=load, image_ready=True) for i, load in enumerate(loads)]


def test_least_loaded_orders_every_node_by_its_share_of_its_cap() -> None:
    views = nodes(5, 1, 3)
    views[2].max_running = 100  # 3 of 100 is less loaded than 1 of 10
    assert decide(views, LEAST_LOADED).order == ("n2", "n1", "n0")


def test_runs_in_flight_from_this_driver_count_before_the_agent_reports_them() -> None:
    views = nodes(0, 0)
    views[0].inflight = 3
    assert decide(views, LEAST_LOADED).order[0] == "n1"


def test_nodes_that_cannot_take_runs_are_left_out_with_why() -> None:
    views = nodes(0, 0, 0)
    views[0].healthy, views[0].why_not = False, "engine unavailable: refused"
    views[1].image_ready, views[1].why_not = False, "loading the image"
    d = decide(views, BEST_OF_K)
    assert d.order == ("n2",)
    assert d.skipped == {"n0": "engine unavailable: refused", "n1": "loading the image"}
    empty = decide(views[:2])
    assert empty.order == () and "no node" in empty.reason


def test_best_of_k_never_puts_the_more_loaded_of_its_sample_first() -> None:
    rng = random.Random(7)
    views = nodes(9, 0, 5, 2, 7)
    firsts = Counter(decide(views, BEST_OF_K, k=2, rng=rng).order[0] for _ in range(2000))
    assert "n0" not in firsts  # the most loaded node is never the better of two
    assert firsts["n1"] > firsts["n3"] > firsts["n2"] > firsts["n4"]  # lighter nodes win more often
    for _ in range(50):
        d = decide(views, BEST_OF_K, k=2, rng=rng)
        assert sorted(d.order) == sorted(v.node_id for v in views)  # every node stays a fallback


def test_a_burst_spreads_over_nodes_when_each_run_counts_at_once() -> None:
    views = nodes(0, 0, 0, cap=32)
    rng = random.Random(1)
    for _ in range(90):
        first = decide(views, BEST_OF_K, rng=rng).order[0]
        next(v for v in views if v.node_id == first).inflight += 1
    counts = [v.inflight for v in views]
    assert max(counts) - min(counts) <= 3, counts  # best of two keeps a burst nearly even


def test_an_unknown_strategy_is_refused() -> None:
    with pytest.raises(ValueError, match="placement must be one of"):
        decide(nodes(0), "random")
    assert set(placement.PLACEMENTS) == {BEST_OF_K, LEAST_LOADED}


def test_per_node_options_are_checked_before_anything_starts() -> None:
    from toolcage.errors import UsageError
    from toolcage.ray.cluster import DEFAULT_PER_NODE, _per_node

    assert _per_node(None) == DEFAULT_PER_NODE
    assert _per_node({"warm": 0, "max_running": 3})["max_running"] == 3
    for bad in ({"wram": 1}, {"max_running": 0}, {"max_starting": True}, {"warm": -1}, {"max_running": "2"}):
        with pytest.raises(UsageError):
            _per_node(bad)


def test_cluster_statuses_have_their_exit_codes_and_errors() -> None:
    from toolcage.errors import EngineUnavailable, NoCapacity, NodeLost, SandboxError
    from toolcage.results import Status

    for err, status in (
        (NodeLost, "node_lost"),
        (EngineUnavailable, "engine_unavailable"),
        (NoCapacity, "no_capacity"),
    ):
        assert issubclass(err, SandboxError) and err.status == status
        assert Status(status).exit_code == 3


def test_the_agent_config_digest_tells_two_configurations_apart() -> None:
    from toolcage.ray.agent import AgentConfig, agent_name

    base = AgentConfig("c", {"name": "default"}, "img:1", "sha256:a", 2, 16, 2, 30.0)
    same = AgentConfig("c", {"name": "default"}, "img:1", "sha256:a", 2, 16, 2, 5.0)
    other = AgentConfig("c", {"name": "default", "limits": {"memory": 1}}, "img:1", "sha256:a", 2, 16, 2, 30.0)
    assert base.digest() == same.digest()  # linger is not the containers' configuration
    # nor the image id: a client that knows none takes the agents' (hello checks one that is given)
    assert dataclasses.replace(base, image_id=None).digest() == base.digest()
    assert base.digest() != other.digest()
    # no snapshot key at all: each driver signs and verifies with its own, so none can be silently unused
    assert not any(f.name == "snapshot_key" for f in dataclasses.fields(AgentConfig))
    assert agent_name("c", "abc") == "toolcage:c:abc"


@pytest.mark.parametrize("command", [["audit", "--verify"], ["ps"]])
def test_a_ray_address_nobody_answers_is_refused_at_once_with_exit_2(command: list[str]) -> None:
    import socket
    import time

    from click.testing import CliRunner

    from toolcage.cli.main import cli

    with socket.socket() as s:  # a port that was free a moment ago: nothing listens there
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    t0 = time.monotonic()
    out = CliRunner().invoke(cli, [*command, "--ray", f"127.0.0.1:{port}"])
    assert out.exit_code == 2, out.output
    assert "cannot reach the Ray cluster" in out.output and "Traceback" not in out.output
    assert time.monotonic() - t0 < 30  # not Ray's minutes of retries


@pytest.mark.parametrize("extra", [["--since", "10m"], ["--audit-log", "/tmp/x.jsonl"]])
def test_audit_ray_refuses_the_options_it_would_not_honour(extra: list[str]) -> None:
    from click.testing import CliRunner

    from toolcage.cli.main import cli

    out = CliRunner().invoke(cli, ["audit", "--ray", "127.0.0.1:1", *extra])
    assert out.exit_code == 2, out.output
    assert "not --since or --audit-log" in out.output and "Traceback" not in out.output


def test_a_cluster_upload_is_checked_on_the_driver_as_a_local_upload_is(tmp_path: Path) -> None:
    """A session's upload runs on the driver (toolcage.files.upload, through the agent's call relay): the caller's
    mistakes are UploadUsage with Sandbox.upload's words, before anything is sent to a node."""
    from toolcage.files.upload import UploadUsage
    from toolcage.ray import ClusterSandbox

    sent: list[Any] = []
    s = ClusterSandbox(cast(Any, None), {})
    s.call = lambda tool, params=None, **kw: sent.append((tool, params))  # type: ignore[method-assign,assignment,misc,return-value]
    tree = tmp_path / "tree"
    (tree / "sub").mkdir(parents=True)
    (tree / "link").symlink_to("sub")
    os.mkfifo(tree / "sub" / "pipe")
    with pytest.raises(UploadUsage, match=r"pipe' is a FIFO; an upload takes files, directories and symlinks"):
        s.upload(tree, "/scratch/in")
    with pytest.raises(UploadUsage, match=r"is a symlink; upload what it points to"):
        s.upload(tree / "link", "/scratch/in")
    with pytest.raises(UploadUsage, match=r"cannot read '.*missing': No such file"):
        s.upload(tmp_path / "missing", "/scratch/in")
    assert sent == []
