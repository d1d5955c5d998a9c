"""What every object of a run is named and labelled with, and the run's spec (everything about one run that
is not the policy): ``RunSpec``, ``container_name``, the label keys and ``labels()``.

The labels are the engine's only record of a run: the reaper, ``ps``, ``doctor`` and ``gc`` read them, so
their keys are spelled here once. The owner fields name a process in its namespace (toolcage.engine.ownership).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from toolcage.engine import ownership
from toolcage.engine.imageconfig import ImageConfig
from toolcage.engine.knobs import DOCKER, RUNC, FlavorKnobs, RuntimeKnobs
from toolcage.policies import Policy

NAME_PREFIX = "toolcage"
LABEL_PREFIX = "toolcage."

# Label keys, spelled once: every object of a run carries them (reaper, ps, doctor, gc read them).
LABEL_RUN_ID = f"{LABEL_PREFIX}run_id"
LABEL_TOOL = f"{LABEL_PREFIX}tool"
LABEL_POLICY = f"{LABEL_PREFIX}policy"
LABEL_POLICY_SHA256 = f"{LABEL_PREFIX}policy_sha256"
LABEL_STARTED_AT = f"{LABEL_PREFIX}started_at"
LABEL_DEADLINE = f"{LABEL_PREFIX}deadline"
LABEL_OWNER = f"{LABEL_PREFIX}owner"
LABEL_OWNER_STARTED = f"{LABEL_PREFIX}owner_started"
# where the owner's pid and start time mean one process (boot, PID and time namespaces: toolcage.engine.ownership)
LABEL_OWNER_NS = f"{LABEL_PREFIX}owner_ns"
LABEL_ROLE = f"{LABEL_PREFIX}role"
# "1" on every object of a run started with keep=True (`--keep`): the user's until they remove it.
# Labels cannot change after create, so this is decided at creation; the reaper never touches
# such objects and `gc` removes them only with `--kept`.
LABEL_KEEP = f"{LABEL_PREFIX}keep"
# the pool a pre-started sandbox was made by (toolcage.pool): its run_id is the id of the one run that adopts it
LABEL_POOL = f"{LABEL_PREFIX}pool"
# a cluster's engine agent (toolcage.ray): the cluster's name and the Ray node id of the agent that owns the run
LABEL_CLUSTER = f"{LABEL_PREFIX}cluster"
LABEL_NODE = f"{LABEL_PREFIX}node"
_OWN_LABELS = frozenset(
    {LABEL_RUN_ID, LABEL_TOOL, LABEL_POLICY, LABEL_POLICY_SHA256, LABEL_STARTED_AT, LABEL_DEADLINE, LABEL_OWNER,
     LABEL_OWNER_STARTED, LABEL_OWNER_NS, LABEL_ROLE, LABEL_KEEP, LABEL_POOL}
)  # fmt: skip


@dataclass(frozen=True)
class RunSpec:
    """Everything about one run that is not the policy."""

    run_id: str
    tool: str
    image: str
    policy_name: str
    started_at: str  # ISO 8601, UTC
    deadline: float  # epoch seconds
    owner: str  # host:pid of the runner
    owner_started: str  # the runner process's start time, so a reused pid is not the owner
    workspace: Path | None = None
    # workspace_mode copy: /workspace is a tmpfs of limits.workspace_copy, filled by the runner over the
    # protocol (nothing of the host is mounted; ``workspace`` is None then)
    workspace_copy: bool = False
    # workspace_cache (toolcage.engine.copycache): the volume holding the cached copy's tree, mounted read-only at
    # contract.COPY_LOWER under the run's tmpfs at /workspace (the worker lays the overlay: worker.copyfs); or, in
    # the run that makes that cache, the volume mounted read-write at /workspace in place of the tmpfs
    copy_lower: str | None = None
    copy_target: str | None = None
    extra_env: dict[str, str] = field(default_factory=dict)
    proxy_volume: str | None = None  # network.mode proxy: the volume holding the egress proxy's socket
    keep: bool = False  # --keep: the container stays after the run, and gc/the reaper leave it alone
    tool_mounts: tuple[tuple[str, str], ...] = ()  # (host path, sandbox path) of connector sources
    # what the container runs instead of the image's entrypoint (the worker); `mcp wrap` runs its launcher.
    # Only the command changes: every setting below is the same for it.
    entrypoint: tuple[str, ...] = ()
    # a warm pool's slot (toolcage.pool): made before its run exists, its deadline is the slot's
    # longest life (idle, then one run); the run's own deadline comes over the protocol at adoption
    pool: str | None = None
    # the engine's OCI runtime for the sandbox and its egress proxy, as values (toolcage.engine.knobs):
    # RUNC is the engine's default; GVISOR puts gVisor's user-space kernel between the code and the host's
    runtime: RuntimeKnobs = RUNC
    # the egress proxy's: the same as runtime, but for a runsc registered without a network stack of
    # its own (--network=none), where the proxy runs under the engine's default (backends.gvisor)
    proxy_runtime: RuntimeKnobs = RUNC
    # what the engine's API takes differently (PODMAN for Podman's Docker-compatible service)
    flavor: FlavorKnobs = DOCKER
    # (volume, path) pairs holding the image's program files, shared by its containers, mounted read-only
    # over the image's own (toolcage.engine.sharedfiles); () reads the image's files through its own root
    shared_files: tuple[tuple[str, str], ...] = ()
    # a user's own image (not a toolcage worker image): its config, for the worker's tools; the worker then
    # runs from the runtime's volumes (toolcage.engine.runtime), mounted read-only as (volume, path) pairs
    foreign: ImageConfig | None = None
    runtime_mounts: tuple[tuple[str, str], ...] = ()
    # writable=: (path of the image, size cap in bytes) pairs, each a tmpfs of its own the runner fills with
    # the image's content there over the protocol (toolcage.files.imagepaths); () keeps the root read-only
    writable: tuple[tuple[str, int], ...] = ()
    # the namespace the owner's pid means a process in (ownership.namespace_key), of the process that made the spec
    owner_ns: str = field(default_factory=ownership.namespace_key)


def container_name(tool: str, run_id: str) -> str:
    safe = re.sub(r"[^a-zA-Z0-9_.-]", "-", tool)[:40].strip("-.") or "run"
    return f"{NAME_PREFIX}-{safe}-{run_id}"


# labels this process adds to every object it makes: a cluster's engine agent names its cluster and node
# (toolcage.ray), so `docker ps` on a node shows which cluster runs what. Set once, at the agent's start.
_PROCESS_LABELS: dict[str, str] = {}


def add_process_labels(extra: dict[str, str]) -> None:
    """Label every object this process makes from now on with ``extra`` (keys under the toolcage. prefix)."""
    for key in extra:
        if not key.startswith(LABEL_PREFIX) or key in _OWN_LABELS:
            raise ValueError(f"a process label must be under {LABEL_PREFIX} and not one of a run's own: {key}")
    _PROCESS_LABELS.update(extra)


def labels(policy: Policy, run: RunSpec) -> dict[str, str]:
    """Labels on every object of a run, so `docker ps --filter label=toolcage.run_id` finds it."""
    out = {
        **_PROCESS_LABELS,
        LABEL_RUN_ID: run.run_id,
        LABEL_TOOL: run.tool,
        LABEL_POLICY: run.policy_name,
        LABEL_POLICY_SHA256: policy.sha256(),
        LABEL_STARTED_AT: run.started_at,
        LABEL_DEADLINE: f"{run.deadline:.3f}",
        LABEL_OWNER: run.owner,
        LABEL_OWNER_STARTED: run.owner_started,
        LABEL_OWNER_NS: run.owner_ns,
        LABEL_ROLE: "sandbox",
    }
    # always set: a label an image carries is merged into its containers' (a hostile image's toolcage.keep=1
    # would have every run of it kept, never collected by gc or the reaper); ours wins over the image's
    out[LABEL_KEEP] = "1" if run.keep else "0"
    if run.pool is not None:
        out[LABEL_POOL] = run.pool
    return out


# on top of idle_s + run_s in a pooled slot's deadline label: the pool's own checks come first (toolcage.pool)
SLOT_GRACE_S = 10.0
