"""The operators' views of every node of a Ray cluster: its live runs (``toolcage ps --ray``) and each node's
audit log (``toolcage audit --ray``), from every toolcage agent ``ray.init`` reaches, any cluster name.
Data, never printed here (``toolcage.cli.ops`` prints them)."""

from __future__ import annotations

import contextlib
from typing import Any

import ray

from toolcage.ray.agent import NAME_PREFIX, NAMESPACE


def _agents() -> list[Any]:
    """Every toolcage agent in the cluster ``ray.init`` connected to (any cluster name)."""
    handles = []
    for entry in ray.util.list_named_actors(all_namespaces=True):
        if entry.get("namespace") == NAMESPACE and str(entry.get("name", "")).startswith(NAME_PREFIX):
            with contextlib.suppress(Exception):
                handles.append(ray.get_actor(entry["name"], namespace=NAMESPACE))
    return handles


def _gather(refs: list[Any], timeout: float) -> list[Any]:
    out = []
    ready, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout)
    for ref in refs:
        if ref in ready:
            try:
                out.append(ray.get(ref))
            except Exception as exc:
                out.append(exc)
        else:
            out.append(TimeoutError("no answer"))
    return out


def cluster_ps(timeout: float = 10.0) -> list[dict[str, Any]]:
    """Live runs on every node that has an agent (``toolcage ps --ray``)."""
    rows: list[dict[str, Any]] = []
    for got in _gather([a.ps.remote() for a in _agents()], timeout):
        if isinstance(got, list):
            rows += got
    return rows


def cluster_audit(
    run_id: str | None = None, limit: int = 200, verify: bool = True, timeout: float = 30.0
) -> list[dict[str, Any]]:
    """Each node's audit log (``toolcage audit --ray``): node, path, problems (empty: the chain verifies), records."""
    out: list[dict[str, Any]] = []
    for got in _gather([a.audit_log.remote(run_id, limit, verify) for a in _agents()], timeout):
        out.append(got if isinstance(got, dict) else {"error": str(got)})
    return out


__all__ = ["cluster_audit", "cluster_ps"]
