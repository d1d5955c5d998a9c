"""What an OCI runtime (runc, gVisor's runsc) and an engine flavour (Docker, Podman) change in a container's
settings, as frozen values.

They are decided once, where the engine is known (``backends``: the kind picks the runtime, the engine
says its flavour), carried on the ``RunSpec``, and applied once by ``hostconfig`` after it has built the
hardened base: no dict is patched twice, and no other module needs to know what gVisor or Podman
want. A new runtime or flavour is one more value here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

READONLY_TMPFS = "ro,nosuid,nodev,noexec,size=4k"  # an empty, read-only dir over one a runtime would add


@dataclass(frozen=True)
class RuntimeKnobs:
    """An OCI runtime's needs. ``name``: HostConfig.Runtime (None: the engine's default, runc)."""

    name: str | None = None
    seccomp_gvisor: bool = False  # the seccomp profile's variant for gVisor's sentry (toolcage.engine.seccomp)
    # the cgroup's pids limit: base + per_process * the policy's pids (0, 0: the policy's pids as they are)
    host_pids_base: int = 0
    host_pids_per_process: int = 0
    memory_headroom: bool = False  # the cgroup's memory gets gvisor_memory_headroom(pids) over the policy's
    nproc_is_pids: bool = False  # RLIMIT_NPROC = the policy's pids (enforced per user by the runtime's kernel)
    readonly_tmp: tuple[str, ...] = ()  # empty read-only tmpfs where the runtime would put a writable one
    tool_namespaces: bool = False  # the worker starts tool code in namespaces of its own (worker.children)
    # how long a removal waits for the container to end by itself once the run closed the worker's input (the
    # worker exits at EOF) before the engine kills it; 0: killed at once
    exit_wait_s: float = 0.0

    def apply(self, host_config: dict[str, Any], pids: int) -> None:
        """Change ``host_config`` (built for ``pids`` processes) as this runtime needs; runc: nothing."""
        if self.name is None:
            return
        from toolcage.engine import seccomp

        host_config["Runtime"] = self.name
        if self.seccomp_gvisor:
            host_config["SecurityOpt"] = ["no-new-privileges", seccomp.security_opt(gvisor=True)]
        if self.host_pids_per_process or self.host_pids_base:
            host_config["PidsLimit"] = self.host_pids_base + self.host_pids_per_process * pids
        if self.memory_headroom:
            host_config["Memory"] = host_config["MemorySwap"] = host_config["Memory"] + gvisor_memory_headroom(pids)
        if self.nproc_is_pids:
            host_config["Ulimits"] = [*host_config["Ulimits"], {"Name": "nproc", "Soft": pids, "Hard": pids}]
        if self.readonly_tmp:
            host_config["Tmpfs"] = {
                **(host_config.get("Tmpfs") or {}),
                # a path the run made writable itself (writable=: a capped tmpfs) keeps its own
                **dict.fromkeys(
                    (p for p in self.readonly_tmp if p not in (host_config.get("Tmpfs") or {})), READONLY_TMPFS
                ),
            }


RUNC = RuntimeKnobs()

# gVisor's sentry, its gofer and (with the ptrace platform) a stub process per address space all run
# in the container's cgroup: on this machine kind 20 processes in the sandbox needed more than 64
# host pids and 100 more than 512. The cgroup's limit is then only a backstop for the sentry; the
# sandbox's own process limit is RLIMIT_NPROC, which gVisor's kernel enforces per user inside the
# sandbox (with runc it would count every process of that uid on the host). A fork bomb at a limit of
# 64 took up to 1,369 host pids in 28 runs (its stubs and the sentry's threads); past the cgroup's limit
# the sentry cannot start a thread and dies (exit code 2: the whole sandbox), as 16 per process (1,280)
# let happen in about one bomb in five. 32 per process: 2,304 for 64.
GVISOR_HOST_PIDS_PER_PROCESS = 32
GVISOR_HOST_PIDS_BASE = 256
# The sentry, its gofer and stubs take host memory beside the sandbox's own pages (~20 MiB, and ~0.5 MiB
# more per process in the sandbox, measured here), all charged to the container's cgroup, whose limit
# kills the sentry: the whole sandbox. So that cgroup gets this headroom over the policy's memory, and
# the policy's memory is kept inside, per call, by the worker's memory guard (worker.children.memguard).
# The base is twice the sentry's own: a guard starved of CPU by the call's own allocators (four processes
# allocating at once on a loaded 2-core machine) found 64 MiB too little about one time in ten.
# 2 MiB per process: with the ptrace platform the sentry's threads and page tables grow with how many
# processes ran at once and are not given back (+13-15 MiB of host memory outside gVisor's own count after
# each fork bomb of 57 processes), and a bomb of forked Pythons at 256 MiB and 64 processes peaked at 324-378
# of 448 MiB on an idle host, five bombs in one sandbox: a loaded test pass, its guard late, met 448
# (test_handler_abuse_ends_its_call_and_nothing_else[fork_bomb]). Counted up to 512 processes, the bound is as
# before: at most 128 MiB + 1 GiB more than the policy's memory.
GVISOR_MEMORY_HEADROOM_BASE = 128 * 1024**2
GVISOR_MEMORY_HEADROOM_PER_PROCESS = 2 * 1024**2
GVISOR_MEMORY_HEADROOM_PROCESSES = 512  # past this many, the headroom grows no more


def gvisor_memory_headroom(pids: int) -> int:
    """What a gVisor container's host memory limit adds to the policy's memory, for gVisor's own kernel."""
    processes = min(pids, GVISOR_MEMORY_HEADROOM_PROCESSES)
    return GVISOR_MEMORY_HEADROOM_BASE + GVISOR_MEMORY_HEADROOM_PER_PROCESS * processes


GVISOR = RuntimeKnobs(
    name="runsc",
    seccomp_gvisor=True,
    host_pids_base=GVISOR_HOST_PIDS_BASE,
    host_pids_per_process=GVISOR_HOST_PIDS_PER_PROCESS,
    memory_headroom=True,
    nproc_is_pids=True,
    # runsc puts a writable tmpfs of its own at /tmp unless the spec mounts something there: an empty
    # read-only one keeps /tmp as read-only as it is under runc
    readonly_tmp=("/tmp",),
    # tool code starts in namespaces of its own, where gVisor's procfs and signals would let it reach the worker
    tool_namespaces=True,
    # killed, a gVisor sandbox sometimes stays "running" in the engine's eyes for 10 to 28 s after runsc's sandbox
    # process is gone (dockerd waits 10 s for an exit it is not told of, then kills again): 2 in ~20 removals after
    # a fork bomb on a loaded host. A worker that exits at EOF ends it in ~0.2 s (25 of 25 under the same load)
    exit_wait_s=1.0,
)


@dataclass(frozen=True)
class FlavorKnobs:
    """What an engine's API takes differently from Docker's. ``name``: ``docker`` or ``podman``."""

    name: str = "docker"
    seccomp_by_path: bool = False  # ``seccomp=<json>`` is read as a path on the service's host
    tmpfs_owner_flag: bool = False  # tmpfs ``uid=``/``gid=`` refused: ``U`` gives it to the container's user
    readonly_tmp: tuple[str, ...] = ()  # writable tmpfs the engine adds under a read-only root: read-only ones
    nproc: int | None = None  # an explicit RLIMIT_NPROC when the runtime sets none
    volume_size: bool = True  # a tmpfs volume may have a size= (Podman reads it as a project quota)
    # the image's program files may come from volumes shared by its containers (toolcage.engine.sharedfiles)
    shared_files: bool = True

    def apply(self, host_config: dict[str, Any]) -> None:
        """Change ``host_config`` as this engine needs; Docker: nothing."""
        if self.seccomp_by_path:
            from toolcage.engine.seccomp import SHIPPED

            host_config["SecurityOpt"] = [
                f"seccomp={SHIPPED}" if o.startswith("seccomp=") else o for o in host_config["SecurityOpt"]
            ]
        if self.tmpfs_owner_flag:
            host_config["Tmpfs"] = {
                target: opts
                if opts == READONLY_TMPFS
                else ",".join([o for o in opts.split(",") if not o.startswith(("uid=", "gid="))] + ["U"])
                for target, opts in (host_config.get("Tmpfs") or {}).items()
            }
        if self.readonly_tmp:
            host_config["Tmpfs"] = {
                **(host_config.get("Tmpfs") or {}),
                # a path the run made writable itself (writable=: a capped tmpfs) keeps its own
                **dict.fromkeys(
                    (p for p in self.readonly_tmp if p not in (host_config.get("Tmpfs") or {})), READONLY_TMPFS
                ),
            }
        if self.nproc is not None and not any(u["Name"] == "nproc" for u in host_config["Ulimits"]):
            host_config["Ulimits"] = [
                *host_config["Ulimits"],
                {"Name": "nproc", "Soft": self.nproc, "Hard": self.nproc},
            ]


DOCKER = FlavorKnobs()
# The knobs Podman's Docker-compatible API (4.3) takes differently; each stopped a sandbox there:
# - ``seccomp=<json>`` is read as a *path*: the profile shipped with this installation instead (the same
#   bytes, ``runner/engine/seccomp.json``; a local service only);
# - with a read-only root it mounts writable tmpfs of its own at /tmp and /var/tmp (mode 1777, no size);
# - its own default nproc is one runc cannot set with every capability dropped (a backstop per host uid:
#   the pids cgroup is each sandbox's limit).
PODMAN_NPROC = 4096
PODMAN = FlavorKnobs(
    name="podman",
    seccomp_by_path=True,
    tmpfs_owner_flag=True,
    readonly_tmp=("/tmp", "/var/tmp"),
    nproc=PODMAN_NPROC,
    volume_size=False,
    shared_files=False,  # left out: its storage and volume copy-up differ, and its tests run without
)
FLAVORS = {f.name: f for f in (DOCKER, PODMAN)}

__all__ = [
    "DOCKER",
    "FLAVORS",
    "GVISOR",
    "PODMAN",
    "READONLY_TMPFS",
    "RUNC",
    "FlavorKnobs",
    "RuntimeKnobs",
    "gvisor_memory_headroom",
]
