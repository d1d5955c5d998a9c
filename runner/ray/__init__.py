"""toolcage on a Ray cluster: one engine agent per node, placement and admission, typed node failure.

    import ray, toolcage.ray as tcr
    ray.init(address="auto")
    cluster = tcr.Cluster("default", per_node={"warm": 4, "max_running": 32, "max_starting": 2})
    cluster.wait_ready()                                      # every node has the image (else: all on the first)
    r = cluster.run("run_python", {"code": "print(1)"})      # one fresh sandbox somewhere, then gone
    with cluster.sandbox() as sb:                             # a session pinned to one node
        sb.write_files({"a.py": "print(2)"}); sb.call("run_python", {"path": "/scratch/a.py"})

``Pool`` across machines (:mod:`.cluster`): an :class:`~toolcage.ray.agent.EngineAgent` per node with the
``toolcage_engine`` resource, placement by each node's load (:mod:`.placement`), sessions on one node
(:mod:`.session`), every node's runs and audit (:mod:`.views`). A lost node is ``NodeLost``, a dead engine
``EngineUnavailable``, no room in ``wait_s`` ``NoCapacity``: typed, never retried. Without Ray, importing this
raises ``MissingExtra`` (an ``ImportError``): ``pip install 'toolcage[ray]'``.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import TYPE_CHECKING, Any

from toolcage.errors import MissingExtra

if importlib.util.find_spec("ray") is None:
    raise MissingExtra("toolcage.ray needs Ray: pip install 'toolcage[ray]'", extra="ray", module="ray")

if TYPE_CHECKING:
    from toolcage.ray.agent import EngineAgent
    from toolcage.ray.cluster import NODE_RESOURCE, Cluster
    from toolcage.ray.session import AsyncClusterSandbox, ClusterSandbox
    from toolcage.ray.views import cluster_audit, cluster_ps

_WHERE = {
    "NODE_RESOURCE": "cluster", "Cluster": "cluster", "ClusterSandbox": "session",
    "AsyncClusterSandbox": "session", "EngineAgent": "agent", "cluster_audit": "views", "cluster_ps": "views",
}  # fmt: skip


def __getattr__(name: str) -> Any:  # PEP 562: Ray loads with the first name used, not with the package
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)


__all__ = [
    "NODE_RESOURCE",
    "AsyncClusterSandbox",
    "Cluster",
    "ClusterSandbox",
    "EngineAgent",
    "cluster_audit",
    "cluster_ps",
]
