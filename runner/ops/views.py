"""What operators run: live runs (ps), the hardening audit of live containers (doctor), engine facts.

``inspect_findings`` is the runtime twin of tests/unit/test_config.py: it compares a live
container's fresh ``docker inspect`` with what its own policy demands, knob by knob.
"""

from __future__ import annotations

import time
from datetime import datetime
from typing import Any

from toolcage.engine import seccomp
from toolcage.engine.api import EngineAPI
from toolcage.engine.hostconfig import SANDBOX_UID
from toolcage.engine.knobs import GVISOR, gvisor_memory_headroom
from toolcage.engine.labels import (
    LABEL_OWNER,
    LABEL_POLICY,
    LABEL_POLICY_SHA256,
    LABEL_ROLE,
    LABEL_RUN_ID,
    LABEL_STARTED_AT,
    LABEL_TOOL,
)
from toolcage.policies import PolicyError, contract, policy_from_json


def _env(info: dict[str, Any]) -> dict[str, str]:
    return dict(e.split("=", 1) for e in (info.get("Config", {}).get("Env") or []) if "=" in e)


# the capabilities an engine grants a container by default (Docker's and Podman's): a CapDrop that
# names them all (Podman's inspect lists them instead of ALL) leaves none
DEFAULT_CAPS = frozenset(
    [
        "AUDIT_WRITE",
        "CHOWN",
        "DAC_OVERRIDE",
        "FOWNER",
        "FSETID",
        "KILL",
        "MKNOD",
        "NET_BIND_SERVICE",
        "NET_RAW",
        "SETFCAP",
        "SETGID",
        "SETPCAP",
        "SETUID",
        "SYS_CHROOT",
    ]
)


def _ulimit_name(u: dict[str, Any]) -> str:
    """``nofile`` (Docker) and ``RLIMIT_NOFILE`` (Podman's inspect) alike."""
    return str(u.get("Name", "")).lower().removeprefix("rlimit_")


def inspect_findings(info: dict[str, Any]) -> list[str]:
    """Every knob of a live toolcage container that is weaker than its policy says (empty: as locked down)."""
    hc = info.get("HostConfig", {})
    cfg = info.get("Config", {})
    labels = cfg.get("Labels") or {}
    role = labels.get(LABEL_ROLE, "sandbox")
    findings: list[str] = []

    def weak(knob: str, have: Any, want: Any) -> None:
        findings.append(f"{knob}: is {have!r}, policy wants {want!r}")

    try:
        policy = policy_from_json(_env(info)[contract.ENV_POLICY])
    except (KeyError, PolicyError) as exc:
        return [f"policy: cannot read the container's policy ({exc})"]
    if labels.get(LABEL_POLICY_SHA256) != policy.sha256():
        findings.append("policy: the label's sha256 does not match the policy in the environment")
    if hc.get("Privileged"):
        weak("privileged", True, False)
    if not hc.get("ReadonlyRootfs"):
        weak("read-only root fs", hc.get("ReadonlyRootfs"), True)
    dropped = {c.upper().removeprefix("CAP_") for c in hc.get("CapDrop") or []}
    if "ALL" not in dropped and not dropped >= DEFAULT_CAPS:  # Podman lists every default it dropped
        weak("cap_drop", hc.get("CapDrop"), ["ALL"])
    if hc.get("CapAdd"):
        weak("cap_add", hc.get("CapAdd"), None)
    sec = hc.get("SecurityOpt") or []
    if not any(o.startswith("no-new-privileges") and not o.endswith("false") for o in sec):
        weak("no-new-privileges", sec, ["no-new-privileges"])
    if any(
        o in ("seccomp=unconfined", "seccomp:unconfined", "apparmor=unconfined", "apparmor:unconfined") for o in sec
    ):
        weak("security profiles", sec, "confined")
    if cfg.get("User") != f"{SANDBOX_UID}:{SANDBOX_UID}":
        weak("user", cfg.get("User"), f"{SANDBOX_UID}:{SANDBOX_UID}")
    copy = any(str(e).startswith(f"{contract.ENV_COPY_LOWER}=") for e in cfg.get("Env") or [])
    if not seccomp.is_ours(sec, gvisor=hc.get("Runtime") == GVISOR.name, copy=copy):
        weak("seccomp", "Docker's default or another profile", "toolcage's profile (toolcage.engine.seccomp)")
    if hc.get("Init"):
        weak("init", "docker-init (it holds the protocol stream in a dumpable process)", "the worker as PID 1")
    for mode in ("PidMode", "IpcMode", "UTSMode", "UsernsMode"):
        if hc.get(mode) == "host":
            weak(mode, "host", "private")
    for m in info.get("Mounts") or []:
        if "docker.sock" in str(m.get("Source", "")) or "containerd.sock" in str(m.get("Source", "")):
            weak("mounts", m.get("Source"), "no engine socket")
        if role == "sandbox" and m.get("RW"):
            weak(f"mount {m.get('Destination')}", "read-write", "read-only")
    if role == "sandbox":
        lim = policy.limits
        pids = hc.get("PidsLimit")
        if hc.get("Runtime") == GVISOR.name:  # the process limit: RLIMIT_NPROC in gVisor (knobs.GVISOR)
            nproc = [u for u in hc.get("Ulimits") or [] if _ulimit_name(u) == "nproc"]
            if not nproc or nproc[0].get("Hard", 0) > lim.pids:
                weak("nproc (gVisor's process limit)", nproc, lim.pids)
            if not pids or pids <= 0 or pids > GVISOR.host_pids_base + GVISOR.host_pids_per_process * lim.pids:
                weak("pids limit (gVisor's host backstop)", pids, "a limit")
        elif not pids or pids <= 0 or pids > lim.pids:
            weak("pids limit", pids, lim.pids)
        # under gVisor the host's limit adds a headroom for gVisor's kernel (engine.knobs.gvisor_memory_headroom)
        memory = lim.memory + (gvisor_memory_headroom(lim.pids) if hc.get("Runtime") == GVISOR.name else 0)
        if not hc.get("Memory") or hc["Memory"] > memory:
            weak("memory", hc.get("Memory"), memory)
        if hc.get("MemorySwap") not in (hc.get("Memory"),):
            weak("memory+swap", hc.get("MemorySwap"), hc.get("Memory"))
        if not hc.get("NanoCpus") or hc["NanoCpus"] > int(lim.cpus * 1e9):
            weak("cpus", (hc.get("NanoCpus") or 0) / 1e9, lim.cpus)
        nofile = [u for u in hc.get("Ulimits") or [] if _ulimit_name(u) == "nofile"]
        if not nofile or nofile[0].get("Hard", 0) > lim.nofile:
            weak("nofile", nofile, lim.nofile)
        if not (cfg.get("NetworkDisabled") or hc.get("NetworkMode") == "none"):
            weak("network", hc.get("NetworkMode"), "none (only lo)")
        if hc.get("PortBindings") or hc.get("PublishAllPorts"):
            weak("published ports", hc.get("PortBindings"), None)
    return findings


def age_seconds(started_at: str, now: float | None = None) -> float | None:
    """Seconds since ``started_at`` (ISO 8601), or None when the label is unreadable."""
    try:
        started = datetime.fromisoformat(started_at.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None
    return round((time.time() if now is None else now) - started, 1)


def format_age(secs: float | None) -> str:
    """An age for people: 42s, 12m, 3.5h."""
    if secs is None:
        return "?"
    if secs < 120:
        return f"{secs:.0f}s"
    if secs < 7200:
        return f"{secs / 60:.0f}m"
    return f"{secs / 3600:.1f}h"


def live_runs(engine: EngineAPI, with_memory: bool = True) -> list[dict[str, Any]]:
    """Running sandboxes, from their Docker labels (what `docker ps --filter label=toolcage.run_id` shows)."""
    rows = []
    for c in engine.containers(LABEL_RUN_ID, all=False):
        labels = c.get("Labels") or {}
        if labels.get(LABEL_ROLE, "sandbox") != "sandbox":
            continue
        mem = None
        if with_memory:
            stats = engine.stats(c["Id"])
            mem = (stats.get("memory_stats") or {}).get("usage")
        rows.append(
            {
                "name": (c.get("Names") or ["?"])[0].lstrip("/"),
                "run_id": labels.get(LABEL_RUN_ID),
                "tool": labels.get(LABEL_TOOL),
                "policy": labels.get(LABEL_POLICY),
                "image": c.get("Image"),  # the ref it was started from (a user's own image too), as `docker ps` says
                "age_s": age_seconds(labels.get(LABEL_STARTED_AT, "")),  # a number: programs compare it
                "memory_bytes": mem,
                "owner": labels.get(LABEL_OWNER),
                "container_id": c["Id"][:12],
            }
        )
    return rows


def daemon_security(info: dict[str, Any]) -> dict[str, Any]:
    opts = " ".join(info.get("SecurityOptions") or [])
    return {
        "seccomp": "name=seccomp" in opts,
        "apparmor": "name=apparmor" in opts,
        "selinux": "name=selinux" in opts,
        "userns": "name=userns" in opts,
        "rootless": "name=rootless" in opts,
        "cgroup_version": info.get("CgroupVersion"),
        "storage_driver": info.get("Driver"),
    }
