"""Where a cluster run goes: decisions as values, from a view of the nodes the driver keeps.

Pure (no Ray, no engine): the driver's view of each node is refreshed from the agents' own answers
(each answer carries the agent's load), and a run in flight from this driver is counted at once, so a
burst spreads before any agent has answered. The agent enforces its caps itself (``max_running``,
``max_starting``); the view only orders the nodes to ask. E2B places by best of K sampled nodes for
the same reason (research: scale-and-frameworks.md §1.1): it needs no global lock and no fresh view.

A run in an image other than the cluster's (``cluster.sandbox(image=...)``) prefers the nodes that already
have that image (by content id): they are asked first, by the same strategy; the others after, least
loaded first, each sent the image before it is asked (``docker save``/``load``, no registry).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

LEAST_LOADED = "least_loaded"
BEST_OF_K = "best_of_k"
PLACEMENTS = (LEAST_LOADED, BEST_OF_K)


@dataclass
class NodeView:
    """What the driver believes of one node's agent."""

    node_id: str
    max_running: int
    running: int = 0  # as the agent last said (its own count, all drivers' runs)
    inflight: int = 0  # this driver's runs sent to it and not yet answered
    healthy: bool = True  # the agent answers and its engine answers
    image_ready: bool = False  # the cluster's image, by id, is on the node's engine
    why_not: str = ""  # why it takes no runs, when it does not

    @property
    def eligible(self) -> bool:
        return self.healthy and self.image_ready

    @property
    def load(self) -> float:
        """The share of its cap in use, counting this driver's runs it has not reported yet."""
        return (max(self.running, 0) + self.inflight) / max(self.max_running, 1)


@dataclass(frozen=True)
class Decision:
    """The nodes to ask, in order (the first that admits the run takes it), and why."""

    order: tuple[str, ...]
    reason: str
    skipped: dict[str, str] = field(default_factory=dict)  # node -> why it was not asked


def decide(
    nodes: list[NodeView],
    strategy: str = BEST_OF_K,
    k: int = 2,
    rng: random.Random | None = None,
    prefer: frozenset[str] | set[str] = frozenset(),
) -> Decision:
    """The nodes a run should be offered to, best first. ``best_of_k``: K nodes sampled, the least loaded
    of them first, then the rest by load; ``least_loaded``: all nodes by load. Nodes that cannot take runs
    (engine down, image not there yet) are left out, with why. ``prefer``: the nodes that have the run's
    image: those first (by the strategy), then the others by load."""
    if strategy not in PLACEMENTS:
        raise ValueError(f"placement must be one of {', '.join(PLACEMENTS)}, not {strategy!r}")
    skipped = {n.node_id: n.why_not or "not ready" for n in nodes if not n.eligible}
    ready = [n for n in nodes if n.eligible]
    if not ready:
        return Decision((), "no node can take runs", skipped)
    rng = rng or random.Random()  # noqa: S311 - spreading load, not a secret
    have = [n for n in ready if n.node_id in prefer]
    if have and len(have) < len(ready):
        with_it = decide(have, strategy, k, rng)
        lack = sorted((n for n in ready if n.node_id not in prefer), key=lambda n: (n.load, rng.random()))
        why = f"nodes with the image first ({with_it.reason}), then the others (sent it)"
        return Decision((*with_it.order, *(n.node_id for n in lack)), why, skipped)
    by_load = sorted(ready, key=lambda n: (n.load, rng.random()))
    if strategy == LEAST_LOADED or len(ready) <= k:
        return Decision(tuple(n.node_id for n in by_load), "least loaded first", skipped)
    sample = rng.sample(ready, k)
    first = min(sample, key=lambda n: (n.load, rng.random()))
    rest = [n.node_id for n in by_load if n is not first]
    return Decision((first.node_id, *rest), f"best of {k} sampled", skipped)
