"""The driver's handle of one node's agent, and how an agent that is gone is told from an error it raised.

Shared by the driver (``toolcage.ray.cluster``) and its sessions (``toolcage.ray.session``), so neither
imports the other for them.
"""

from __future__ import annotations

from typing import Any

import ray

from toolcage.ray import placement


def actor_lost(exc: BaseException) -> bool:
    """Whether ``exc`` says the agent (its actor, or its node) is gone, not that a call failed."""
    return isinstance(exc, ray.exceptions.RayActorError | ray.exceptions.ActorUnavailableError)


class NodeAgent:
    """The driver's handle and view of one node's agent."""

    def __init__(self, node_id: str, handle: Any, view: placement.NodeView) -> None:
        self.node_id = node_id
        self.handle = handle
        self.view = view
        self.lost = False
        self.direct: Any = None  # toolcage.ray.direct.Channel, once the agent's hello offered one
        self.direct_retry_at = 0.0  # the channel could not be opened: this agent's calls stay on Ray until then


__all__ = ["NodeAgent", "actor_lost"]
