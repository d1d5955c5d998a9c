"""``container_config(policy, run)``: the one pure function that turns a policy into Docker settings.

It returns Engine API JSON (``Config`` plus ``HostConfig``) and is unit-tested without
Docker. Callers cannot merge extra settings over the hardening: there is no parameter
for it. The security knobs are listed here, once, with the threat each one stops.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from toolcage.engine import seccomp
from toolcage.lifecycle import ownership
from toolcage.policies import Policy, contract

SANDBOX_UID = contract.SANDBOX_UID
PROXY_DIR = contract.PROXY_DIR
PROXY_SOCKET = contract.PROXY_SOCKET
PROXY_PORT = contract.PROXY_PORT  # the worker's relay inside the sandbox: 127.0.0.1:PROXY_PORT -> PROXY_SOCKET
WORKSPACE = contract.WORKSPACE
SCRATCH = contract.SCRATCH
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
# where the owner's pid and start time mean one process (boot, PID and time namespaces: toolcage.lifecycle.ownership)
LABEL_OWNER_NS = f"{LABEL_PREFIX}owner_ns"
LABEL_ROLE = f"{LABEL_PREFIX}role"
# "1" on every object of a run started with keep=True (`--keep`): the user's until they remove it.
# Labels cannot change after create, so this is decided at creation; the reaper never touches
# such objects and `gc` removes them only with `--kept`.
LABEL_KEEP = f"{LABEL_PREFIX}keep"
# the pool a pre-started sandbox was made by (toolcage.pool): its run_id is the id of the one run that adopts it
LABEL_POOL = f"{LABEL_PREFIX}pool"


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
    # the engine's OCI runtime for the sandbox and its egress proxy: None is the engine's default
    # (runc); GVISOR ("runsc") puts gVisor's user-space kernel between the code and the host's
    runtime: str | None = None
    # the egress proxy's: the same as runtime, but for a runsc registered without a network stack of
    # its own (--network=none), where the proxy runs under the engine's default (ContainerBackend)
    proxy_runtime: str | None = None
    # "podman" when the engine is Podman's Docker-compatible service (see _apply_podman)
    engine_flavor: str = "docker"
    # the namespace the owner's pid means a process in (ownership.namespace_key), of the process that made the spec
    owner_ns: str = field(default_factory=ownership.namespace_key)


def worker_image() -> str:
    """The worker image this installation runs by default (``$TOOLCAGE_IMAGE`` overrides); the egress
    proxy always runs from it."""
    from toolcage.options import worker_image as image

    return image()


def container_name(tool: str, run_id: str) -> str:
    safe = re.sub(r"[^a-zA-Z0-9_.-]", "-", tool)[:40].strip("-.") or "run"
    return f"{NAME_PREFIX}-{safe}-{run_id}"


def labels(policy: Policy, run: RunSpec) -> dict[str, str]:
    """Labels on every object of a run, so `docker ps --filter label=toolcage.run_id` finds it."""
    out = {
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
    if run.keep:
        out[LABEL_KEEP] = "1"
    if run.pool is not None:
        out[LABEL_POOL] = run.pool
    return out


def container_config(policy: Policy, run: RunSpec) -> dict[str, Any]:
    """The full create-container body for one run (Engine API field names)."""
    lim = policy.limits
    mounts = []
    if run.workspace is not None:
        # Threat: the tool changing the caller's files. Read-only, and no propagation back.
        mounts.append(
            {
                "Type": "bind",
                "Source": str(run.workspace),
                "Target": WORKSPACE,
                "ReadOnly": True,
                "BindOptions": {"Propagation": "rprivate"},
            }
        )
    for source, target in run.tool_mounts:
        # Threat: a handler rewriting its own code or the user's. Read-only, like the workspace.
        mounts.append(
            {
                "Type": "bind",
                "Source": source,
                "Target": target,
                "ReadOnly": True,
                "BindOptions": {"Propagation": "rprivate"},
            }
        )
    reserved = {
        contract.ENV_POLICY: policy.canonical_json(),
        contract.ENV_RUN_ID: run.run_id,
        contract.ENV_DEADLINE: f"{run.deadline:.3f}",
        contract.ENV_IN_CONTAINER: "1",
        contract.ENV_WATCH_RUNNER: "1",
    }
    if run.runtime == GVISOR:
        # tool code starts in namespaces of its own, where gVisor's procfs and signals would let it
        # reach the worker (toolcage.worker.children.namespaces)
        reserved[contract.ENV_TOOL_NAMESPACES] = "1"
    # Threat: extra_env carrying a looser policy (or no deadline) to the worker while the
    # labels and HostConfig say otherwise. The policy's own values always win.
    env = {**run.extra_env, **reserved}
    host_config: dict[str, Any] = {
        "ReadonlyRootfs": True,  # tool code cannot alter the image (or plant files for later calls)
        "Mounts": mounts,
        # The only writable place: size-capped, no device nodes, no setuid, owned by the sandbox user.
        "Tmpfs": {SCRATCH: f"rw,nosuid,nodev,size={lim.scratch},uid={SANDBOX_UID},gid={SANDBOX_UID},mode=0700"},
        "CapDrop": ["ALL"],  # no capabilities: no raw sockets, no chown, no ptrace, no mount
        # setuid binaries and file caps cannot raise privileges; toolcage's seccomp profile (Docker's
        # default minus ptrace, process_vm_*, io_uring, userfaultfd, bpf, keyrings, ...: toolcage.engine.seccomp)
        "SecurityOpt": ["no-new-privileges", seccomp.security_opt()],
        "Privileged": False,
        "PidsLimit": lim.pids,  # fork bombs hit the cgroup pids limit, not the host
        "Memory": lim.memory,
        "MemorySwap": lim.memory,  # swap equal to memory: no swap, so the limit bites
        "NanoCpus": int(lim.cpus * 1e9),
        "Ulimits": [{"Name": "nofile", "Soft": lim.nofile, "Hard": lim.nofile}],
        # No docker-init: the worker itself is PID 1. docker-init kept a copy of the container's
        # stdio (the protocol stream) in a dumpable process of the sandbox uid, so tool code could
        # open /proc/1/fd/0 and /proc/1/fd/1. The worker, non-dumpable before anything else runs,
        # holds the only copies, reaps orphans, and kills every other process when a call ends.
        "Init": False,
        "NetworkMode": "none",
        "IpcMode": "private",
        "PortBindings": {},
        "PublishAllPorts": False,
        "AutoRemove": False,  # the runner removes it after reading State.OOMKilled
        "LogConfig": {"Type": "json-file", "Config": {"max-size": "1m", "max-file": "1"}},
    }
    _apply_runtime(host_config, run.runtime, lim.pids)
    if run.engine_flavor == "podman":
        _apply_podman(host_config)
    config: dict[str, Any] = {
        "Image": run.image,
        "User": f"{SANDBOX_UID}:{SANDBOX_UID}",
        "WorkingDir": SCRATCH,
        "Env": [f"{k}={v}" for k, v in env.items()],
        "Labels": labels(policy, run),
        "Hostname": "toolcage",
        "AttachStdin": True,
        "AttachStdout": True,
        "AttachStderr": True,
        "OpenStdin": True,
        "StdinOnce": True,  # the runner going away closes stdin: the worker sees EOF and exits
        "Tty": False,
        # No network stack beyond a private loopback. Faster to start than NetworkMode "none"
        # alone (no libnetwork sandbox); tests assert only `lo` exists and connects fail.
        "NetworkDisabled": True,
        "HostConfig": host_config,
    }
    if run.entrypoint:
        config["Entrypoint"] = list(run.entrypoint)
    if run.proxy_volume is not None:
        # network.mode proxy: still no network interface but lo. The egress proxy's Unix socket
        # is the only way out; the worker relays 127.0.0.1:3128 to it. (A Docker "internal"
        # network was tried first: its bridge still routes to the host's own addresses.)
        mounts.append(_proxy_volume_mount(run.proxy_volume, read_only=True))
    return config


def _proxy_volume_mount(volume: str, read_only: bool) -> dict[str, Any]:
    """The run's proxy socket volume. NoCopy: Docker would otherwise copy the image's directory at the
    mount point (root's, 0755) onto the empty volume at its first mount, and the proxy (the sandbox
    user) could not make its socket there: the tmpfs keeps the owner and mode it was made with, so
    the sandbox and its proxy can start in either order, or at once."""
    return {
        "Type": "volume",
        "Source": volume,
        "Target": PROXY_DIR,
        "ReadOnly": read_only,
        "VolumeOptions": {"NoCopy": True},
    }


GVISOR = "runsc"
# gVisor's sentry, its gofer and (with the ptrace platform) a stub process per address space all run
# in the container's cgroup: on this machine kind 20 processes in the sandbox needed more than 64
# host pids and 100 more than 512. The cgroup's limit is then only a backstop for the sentry; the
# sandbox's own process limit is RLIMIT_NPROC, which gVisor's kernel enforces per user inside the
# sandbox (with runc it would count every process of that uid on the host).
GVISOR_HOST_PIDS_PER_PROCESS = 16
GVISOR_HOST_PIDS_BASE = 256
# The sentry, its gofer and stubs take host memory beside the sandbox's own pages (~20 MiB, and ~0.5 MiB
# more per process in the sandbox, measured here), all charged to the container's cgroup, whose limit
# kills the sentry: the whole sandbox. So that cgroup gets this headroom over the policy's memory, and
# the policy's memory is kept inside, per call, by the worker's memory guard (toolcage.worker.children.memguard).
# Bounded: at most 64 MiB + 1 GiB more than the policy's memory.
GVISOR_MEMORY_HEADROOM_BASE = 64 * 1024**2
GVISOR_MEMORY_HEADROOM_PER_PROCESS = 1024**2
GVISOR_MEMORY_HEADROOM_PROCESSES = 1024  # past this many, the headroom grows no more
READONLY_TMPFS = "ro,nosuid,nodev,noexec,size=4k"  # an empty, read-only dir over one a runtime would add


def gvisor_memory_headroom(pids: int) -> int:
    """What a gVisor container's host memory limit adds to the policy's memory, for gVisor's own kernel."""
    processes = min(pids, GVISOR_MEMORY_HEADROOM_PROCESSES)
    return GVISOR_MEMORY_HEADROOM_BASE + GVISOR_MEMORY_HEADROOM_PER_PROCESS * processes


def _apply_runtime(host_config: dict[str, Any], runtime: str | None, pids: int) -> None:
    if runtime is None:
        return
    host_config["Runtime"] = runtime
    if runtime == GVISOR:
        host_config["SecurityOpt"] = ["no-new-privileges", seccomp.security_opt(gvisor=True)]
        host_config["PidsLimit"] = GVISOR_HOST_PIDS_BASE + GVISOR_HOST_PIDS_PER_PROCESS * pids
        host_config["Memory"] = host_config["MemorySwap"] = host_config["Memory"] + gvisor_memory_headroom(pids)
        host_config["Ulimits"] = [*host_config["Ulimits"], {"Name": "nproc", "Soft": pids, "Hard": pids}]
        # runsc puts a writable tmpfs of its own at /tmp unless the spec mounts something there: an
        # empty read-only one keeps /tmp as read-only as it is under runc
        host_config["Tmpfs"] = {**(host_config.get("Tmpfs") or {}), "/tmp": READONLY_TMPFS}


# The knobs Podman's Docker-compatible API (4.3) takes differently; each stopped a sandbox there.
PODMAN_NPROC = 4096  # its own default nproc is one runc cannot set with every capability dropped


def _apply_podman(host_config: dict[str, Any]) -> None:
    """Idempotent (the proxy's config is the sandbox's, changed, then applied again):
    - ``seccomp=<json>`` is read as a *path* on the service's host: the profile shipped with this
    installation instead (the same bytes, ``runner/engine/seccomp.json``; a local service only);
    - tmpfs ``uid=``/``gid=`` are refused: ``U`` gives the tmpfs to the container's user instead;
    - a read-only root gets writable tmpfs at /tmp and /var/tmp: read-only ones are mounted there;
    - an explicit ``nproc`` (per host uid, a backstop: the pids cgroup is each sandbox's limit)."""
    from toolcage.engine.seccomp import SHIPPED

    host_config["SecurityOpt"] = [
        f"seccomp={SHIPPED}" if o.startswith("seccomp=") else o for o in host_config["SecurityOpt"]
    ]
    host_config["Tmpfs"] = {
        target: opts
        if opts == READONLY_TMPFS
        else ",".join([o for o in opts.split(",") if not o.startswith(("uid=", "gid=")) and o != "U"] + ["U"])
        for target, opts in (host_config.get("Tmpfs") or {}).items()
    }
    # with a read-only root Podman mounts writable tmpfs of its own at /tmp and /var/tmp (read-only-tmpfs,
    # mode 1777, no size): empty read-only ones keep them as read-only as under Docker
    host_config["Tmpfs"].update({"/tmp": READONLY_TMPFS, "/var/tmp": READONLY_TMPFS})
    if not any(u["Name"] == "nproc" for u in host_config["Ulimits"]):
        host_config["Ulimits"] = [
            *host_config["Ulimits"],
            {"Name": "nproc", "Soft": PODMAN_NPROC, "Hard": PODMAN_NPROC},
        ]


def proxy_container_config(policy: Policy, run: RunSpec, egress_network: str, upstream: str | None) -> dict[str, Any]:
    """The egress proxy's container: as hardened as the sandbox; its one network is the egress
    network, and it serves the sandbox on a Unix socket in the run's proxy volume."""
    assert run.proxy_volume is not None
    cfg = container_config(
        policy,
        dataclasses.replace(
            run, runtime=run.proxy_runtime, workspace=None, proxy_volume=None, tool_mounts=(), entrypoint=()
        ),
    )
    hc = cfg["HostConfig"]
    hc["NetworkMode"] = egress_network
    hc["Mounts"] = [_proxy_volume_mount(run.proxy_volume, read_only=False)]
    hc["Memory"] = hc["MemorySwap"] = 128 * 1024**2
    hc["PidsLimit"] = 32
    hc["NanoCpus"] = 500_000_000
    hc["Ulimits"] = [{"Name": "nofile", "Soft": 1024, "Hard": 1024}]
    _apply_runtime(hc, run.proxy_runtime, 32)
    if run.engine_flavor == "podman":
        _apply_podman(hc)
    env = [e for e in cfg["Env"] if not e.startswith(f"{contract.ENV_IN_CONTAINER}=")]
    env.append(f"{contract.ENV_PROXY_LISTEN}=unix:{PROXY_SOCKET}")
    if upstream:
        env.append(f"{contract.ENV_EGRESS_PROXY}={upstream}")
    cfg.update(
        Env=env,
        Entrypoint=["python3", "-S", "-m", "toolcage.worker.egress.proxy"],
        AttachStdin=False,
        OpenStdin=False,
        StdinOnce=False,
        NetworkDisabled=False,
    )
    cfg["Labels"] = {**cfg["Labels"], LABEL_ROLE: "egress-proxy"}
    return cfg
