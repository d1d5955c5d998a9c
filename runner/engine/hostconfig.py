"""``container_config(policy, run)``: the one pure function that turns a policy into Docker settings.

It returns Engine API JSON (``Config`` plus ``HostConfig``) and is unit-tested without
Docker. Callers cannot merge extra settings over the hardening: there is no parameter
for it. The security knobs are listed here, once, with the threat each one stops.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from toolcage.engine import seccomp
from toolcage.engine.knobs import RuntimeKnobs
from toolcage.engine.labels import LABEL_ROLE, RunSpec, labels
from toolcage.policies import Policy, contract

SANDBOX_UID = contract.SANDBOX_UID
PROXY_DIR = contract.PROXY_DIR
PROXY_SOCKET = contract.PROXY_SOCKET
PROXY_PORT = contract.PROXY_PORT  # the worker's relay inside the sandbox: 127.0.0.1:PROXY_PORT -> PROXY_SOCKET
WORKSPACE = contract.WORKSPACE
SCRATCH = contract.SCRATCH


def container_config(policy: Policy, run: RunSpec) -> dict[str, Any]:
    """The full create-container body for one run (Engine API field names)."""
    lim = policy.limits
    config = _hardened(policy, run, run.runtime, _Resources(lim.pids, lim.memory, int(lim.cpus * 1e9), lim.nofile))
    if run.proxy_volume is not None:
        # network.mode proxy: still no network interface but lo. The egress proxy's Unix socket
        # is the only way out; the worker relays 127.0.0.1:3128 to it. (A Docker "internal"
        # network was tried first: its bridge still routes to the host's own addresses.)
        config["HostConfig"]["Mounts"].append(_proxy_volume_mount(run.proxy_volume, read_only=True))
    run.runtime.apply(config["HostConfig"], lim.pids)
    run.flavor.apply(config["HostConfig"])
    return config


@dataclass(frozen=True)
class _Resources:
    pids: int
    memory: int
    nano_cpus: int
    nofile: int


def _hardened(policy: Policy, run: RunSpec, runtime: RuntimeKnobs, res: _Resources) -> dict[str, Any]:
    """The hardened body every container of a run starts from, before its runtime's and engine's knobs."""
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
    for volume, target in run.shared_files:
        # Threat: a sandbox changing what later sandboxes of the image run. Read-only (no capability to
        # remount), filled by the engine from the image before any sandbox mounts it; NoCopy: never copied into
        mounts.append(
            {"Type": "volume", "Source": volume, "Target": target, "ReadOnly": True, "VolumeOptions": {"NoCopy": True}}
        )
    for volume, target in run.runtime_mounts:
        # A user's own image: the worker's runtime (toolcage.engine.runtime), read-only, never copied into
        mounts.append(
            {"Type": "volume", "Source": volume, "Target": target, "ReadOnly": True, "VolumeOptions": {"NoCopy": True}}
        )
    reserved = {
        contract.ENV_POLICY: policy.canonical_json(),
        contract.ENV_RUN_ID: run.run_id,
        contract.ENV_DEADLINE: f"{run.deadline:.3f}",
        contract.ENV_IN_CONTAINER: "1",
        contract.ENV_WATCH_RUNNER: "1",
    }
    if run.workspace_copy:
        reserved[contract.ENV_WORKSPACE_COPY] = "1"
    if run.copy_lower:
        # Threat: a run changing the cached tree later runs start from. Read-only, filled by a run of toolcage's
        # own that ran no code; the worker covers it at boot, tool code only sees the overlay (worker.copyfs)
        mounts.append(
            {
                "Type": "volume", "Source": run.copy_lower, "Target": contract.COPY_LOWER, "ReadOnly": True,
                "VolumeOptions": {"NoCopy": True},
            }
        )  # fmt: skip
        reserved[contract.ENV_COPY_LOWER] = contract.COPY_LOWER
    if run.copy_target:  # the run that fills the cache: the volume itself is /workspace (it runs no code)
        mounts.append(
            {"Type": "volume", "Source": run.copy_target, "Target": WORKSPACE, "VolumeOptions": {"NoCopy": True}}
        )
    if run.writable:
        reserved[contract.ENV_WRITABLE] = ":".join(path for path, _ in run.writable)
    if runtime.tool_namespaces:
        # tool code starts in namespaces of its own, where gVisor's procfs and signals would let it
        # reach the worker (toolcage.worker.children.namespaces)
        reserved[contract.ENV_TOOL_NAMESPACES] = "1"
    # Threat: extra_env carrying a looser policy (or no deadline) to the worker while the
    # labels and HostConfig say otherwise. The policy's own values always win.
    # Threat (a user's own image): its ENV running code in the worker (LD_PRELOAD, PYTHONSTARTUP, ...). Every
    # variable of the image is blanked and the worker's own set over it (ImageConfig.blanked_env)
    own = run.foreign.blanked_env() if run.foreign is not None else {}
    env = {**own, **run.extra_env, **reserved}
    tmpfs = {SCRATCH: f"rw,nosuid,nodev,size={lim.scratch},uid={SANDBOX_UID},gid={SANDBOX_UID},mode=0700"}
    if run.workspace_copy and not run.copy_target:
        # Threat: the tool changing the caller's files. Nothing of the host is mounted: a tmpfs the runner
        # fills over the protocol, size-capped by the kernel; exec (a repository's scripts run in place),
        # never setuid or device nodes.
        tmpfs[WORKSPACE] = (
            f"rw,nosuid,nodev,exec,size={lim.workspace_copy},uid={SANDBOX_UID},gid={SANDBOX_UID},mode=0755"
        )
    for path, size in run.writable:
        # Threat: a run filling the host's disk, or leaving files for the next run of the image. A writable
        # path of the image (writable=) is a tmpfs of its own: every write capped by the kernel (ENOSPC, the
        # sandbox lives on), charged to the run's memory, gone with the container; the image's content is
        # put there by the runner over the protocol (toolcage.files.imagepaths: the engine cannot write into
        # a gVisor sentry's tmpfs), owned by the sandbox user, never setuid or device nodes.
        tmpfs[path] = f"rw,nosuid,nodev,exec,size={size},uid={SANDBOX_UID},gid={SANDBOX_UID},mode=0755"
    host_config: dict[str, Any] = {
        "ReadonlyRootfs": True,  # tool code cannot alter the image (or plant files for later calls)
        "Mounts": mounts,
        # The writable places: size-capped, no device nodes, no setuid, owned by the sandbox user.
        "Tmpfs": tmpfs,
        "CapDrop": ["ALL"],  # no capabilities: no raw sockets, no chown, no ptrace, no mount
        # setuid binaries and file caps cannot raise privileges; toolcage's seccomp profile (Docker's
        # default minus ptrace, process_vm_*, io_uring, userfaultfd, bpf, keyrings, ...: toolcage.engine.seccomp)
        "SecurityOpt": ["no-new-privileges", seccomp.security_opt(copy=bool(run.copy_lower))],
        "Privileged": False,
        "PidsLimit": res.pids,  # fork bombs hit the cgroup pids limit, not the host
        "Memory": res.memory,
        "MemorySwap": res.memory,  # swap equal to memory: no swap, so the limit bites
        "NanoCpus": res.nano_cpus,
        "Ulimits": [{"Name": "nofile", "Soft": res.nofile, "Hard": res.nofile}],
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
        # No container log: dockerd would JSON-encode every byte of the protocol stream (each answer, each file
        # a download sends, unredacted) into a file on the host, a copy of the run at rest and a cost on every
        # call (binary data frames most: 4x slower downloads). A --keep run keeps a small one for `docker logs`.
        "LogConfig": (
            {"Type": "json-file", "Config": {"max-size": "1m", "max-file": "1"}} if run.keep else {"Type": "none"}
        ),
    }
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
    if run.foreign is not None:
        # the image's ENTRYPOINT and CMD never run: the worker starts from the runtime, by absolute path
        from toolcage.engine.runtime import ENTRYPOINT

        entry = list(run.entrypoint or ENTRYPOINT)
        if entry[0] == "python3":  # mcp wrap's launcher: the runtime's interpreter, never the image's python3
            entry[0] = ENTRYPOINT[0]
        config["Entrypoint"] = entry
        config["Cmd"] = []
    elif run.entrypoint:
        config["Entrypoint"] = list(run.entrypoint)
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


# the egress proxy's own limits: one process serving one sandbox's connections
PROXY_RESOURCES = _Resources(pids=32, memory=128 * 1024**2, nano_cpus=500_000_000, nofile=1024)


def proxy_container_config(policy: Policy, run: RunSpec, egress_network: str, upstream: str | None) -> dict[str, Any]:
    """The egress proxy's container: as hardened as the sandbox; its one network is the egress
    network, and it serves the sandbox on a Unix socket in the run's proxy volume."""
    assert run.proxy_volume is not None
    bare = dataclasses.replace(
        run, workspace=None, proxy_volume=None, tool_mounts=(), entrypoint=(), foreign=None, runtime_mounts=()
    )
    cfg = _hardened(policy, bare, run.proxy_runtime, PROXY_RESOURCES)
    hc = cfg["HostConfig"]
    hc["NetworkMode"] = egress_network
    hc["Mounts"] = [*hc["Mounts"], _proxy_volume_mount(run.proxy_volume, read_only=False)]  # (shared files)
    run.proxy_runtime.apply(hc, PROXY_RESOURCES.pids)
    run.flavor.apply(hc)
    env = [e for e in cfg["Env"] if not e.startswith(f"{contract.ENV_IN_CONTAINER}=")]
    env.append(f"{contract.ENV_PROXY_LISTEN}=unix:{PROXY_SOCKET}")
    if upstream:
        env.append(f"{contract.ENV_EGRESS_PROXY}={upstream}")
    cfg.update(
        Env=env,
        Entrypoint=["python3", "-S", "-m", "toolcage.worker.egress.proxy"],
        # stdin: the runner's control lines (a live policy change, Egress.update), held by the runner alone
        AttachStdin=True,
        OpenStdin=True,
        StdinOnce=False,
        NetworkDisabled=False,
    )
    cfg["Labels"] = {**cfg["Labels"], LABEL_ROLE: "egress-proxy"}
    return cfg
