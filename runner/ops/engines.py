"""What the engine can run a sandbox with, and how current its runtimes are (``toolcage doctor``).

The kinds: ``container`` (the engine's default runtime, runc: the host's kernel is the wall) and
``gvisor`` (runsc registered with the engine: gVisor's user-space kernel in between). ``auto``
picks the strongest available (``toolcage.backends.available_kinds``).

Known escapes through runc, with the release that fixed each (a runtime older than that gets a
warning): CVE-2024-21626 (a leaked fd to the host's cgroup filesystem, "Leaky Vessels"), fixed in
1.1.12; CVE-2025-31133, CVE-2025-52565 and CVE-2025-52881 (races on masked paths and /dev/console
that let a container write host procfs files), fixed in 1.2.8 (and 1.3.3).
"""

from __future__ import annotations

import re
from typing import Any

# (fixed in, advisory): a runc older than the first is open to the second
RUNC_FIXES: tuple[tuple[tuple[int, int, int], str], ...] = (
    ((1, 1, 12), "CVE-2024-21626 (fd leak to the host's cgroupfs; fixed in runc 1.1.12)"),
    (
        (1, 2, 8),
        "CVE-2025-31133, CVE-2025-52565, CVE-2025-52881 (masked-path and /dev/console races; fixed in runc 1.2.8)",
    ),
)


def parse_version(text: str | None) -> tuple[int, int, int] | None:
    """``1.1.5+ds1`` -> (1, 1, 5); None when there is no version in it."""
    m = re.search(r"(\d+)\.(\d+)\.(\d+)", text or "")
    return (int(m.group(1)), int(m.group(2)), int(m.group(3))) if m else None


def runc_warnings(version: str | None) -> list[str]:
    """Each known escape the engine's runc has no fix for, naming the fix."""
    have = parse_version(version)
    if have is None:
        return []
    shown = ".".join(map(str, have))
    return [f"runc {shown} is open to {what}" for fixed, what in RUNC_FIXES if have < fixed]


def component_version(engine_version: dict[str, Any], name: str) -> str | None:
    for c in engine_version.get("Components") or []:
        if str(c.get("Name", "")).lower() == name:
            return str(c.get("Version"))
    return None


# runsc flags the gvisor kind's walls depend on: without --oci-seccomp toolcage's seccomp profile is not
# applied inside gVisor (ptrace, io_uring, raw sockets open there); without --overlay2=none runsc
# lays a writable memory overlay on the read-only root. Podman, for one, lists a runsc it found on
# the PATH with none of them (and kata and krun that are not installed).
GVISOR_REQUIRED_ARGS = ("--oci-seccomp", "--overlay2=none")


def _runsc_args(info: dict[str, Any]) -> list[str] | None:
    """runsc's runtimeArgs as the engine has it registered (``docker info``'s Runtimes); None: not at all."""
    runtimes = info.get("Runtimes") or {}
    return list((runtimes.get("runsc") or {}).get("runtimeArgs") or []) if "runsc" in runtimes else None


def gvisor_problem(info: dict[str, Any]) -> str | None:
    """Why the engine's runsc cannot serve the gvisor kind, or None."""
    args = _runsc_args(info)
    if args is None:
        return "the engine has no runsc runtime registered"
    missing = [a for a in GVISOR_REQUIRED_ARGS if a not in args]
    if missing:
        return (
            f"the engine's runsc runtime is registered without {' and '.join(missing)} (its runtimeArgs: "
            f"{' '.join(args) or 'none'}): toolcage's seccomp profile and read-only root would not hold there"
        )
    return None


def gvisor_registered(info: dict[str, Any]) -> bool:
    """Whether the engine has gVisor's runsc registered as a runtime, with the flags the kind needs."""
    return gvisor_problem(info) is None


def gvisor_networked(info: dict[str, Any]) -> bool:
    """Whether runsc is registered with a network stack of its own, so a container with a network (the
    egress proxy) can run under it. Registered with ``--network=none`` it cannot: the egress proxy
    of a gVisor sandbox then runs under the engine's default runtime."""
    args = _runsc_args(info)
    return args is not None and "--network=none" not in args


def backends_report(engine_version: dict[str, Any], info: dict[str, Any]) -> dict[str, Any]:
    """Each sandbox kind: whether the engine has it, its runtime and version; which ``auto`` picks."""
    runtimes = info.get("Runtimes") or {}
    runc = component_version(engine_version, "runc")
    kinds = {
        "gvisor": {
            "available": gvisor_registered(info),
            "runtime": "runsc",
            "path": (runtimes.get("runsc") or {}).get("path"),
            "egress_proxy_runtime": "runsc" if gvisor_networked(info) else (info.get("DefaultRuntime") or "runc"),
        },
        "container": {"available": True, "runtime": info.get("DefaultRuntime") or "runc", "version": runc},
        "none": {"available": True, "runtime": None, "note": "no isolation: never picked by auto"},
    }
    problem = gvisor_problem(info)
    if problem and _runsc_args(info) is not None:
        kinds["gvisor"]["note"] = f"not usable: {problem}"
    auto = "gvisor" if kinds["gvisor"]["available"] else "container"
    return {"kinds": kinds, "auto": auto, "warnings": runc_warnings(runc)}


def engine_sockets(environ: dict[str, str], uid: int) -> list[str]:
    """The engine endpoints ``doctor`` looks at: DOCKER_HOST's (the one in use) first, then the
    well-known sockets of rootful and rootless Docker and Podman."""
    runtime_dir = environ.get("XDG_RUNTIME_DIR") or f"/run/user/{uid}"
    found = [environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"]
    for path in (
        "/var/run/docker.sock",
        "/run/podman/podman.sock",
        f"{runtime_dir}/docker.sock",
        f"{runtime_dir}/podman/podman.sock",
    ):
        url = f"unix://{path}"
        if url not in found:
            found.append(url)
    return found


def engine_summary(version: dict[str, Any], info: dict[str, Any]) -> dict[str, Any]:
    """One engine as doctor lists it: which it is, whether it runs rootless or remaps users, and the
    sandbox kinds it can serve (gvisor only with runsc registered as the kind needs)."""
    podman = any("podman" in str(c.get("Name", "")).lower() for c in version.get("Components") or [])
    problem, limits = gvisor_problem(info), limits_problem(info)
    return {
        "flavor": "podman" if podman else "docker",
        "version": version.get("Version"),
        "rootless": rootless(info),
        "userns": "name=userns" in " ".join(info.get("SecurityOptions") or []),
        "kinds": [] if limits else (["gvisor"] if problem is None else []) + ["container"],
        "gvisor_problem": problem,
        "limits_problem": limits,
    }


def rootless(info: dict[str, Any]) -> bool:
    """Docker says so in SecurityOptions (name=rootless); Podman's compatible service in ``Rootless``."""
    return info.get("Rootless") is True or "name=rootless" in " ".join(info.get("SecurityOptions") or [])


def limits_problem(info: dict[str, Any]) -> str | None:
    """Why the engine cannot enforce a sandbox's memory and pids limits, or None. Rootless on cgroup v1
    there is no cgroup the engine may delegate: rootless Podman (seen on this machine kind, 4.3.1)
    creates the container and silently drops --memory and --pids-limit."""
    if rootless(info) and str(info.get("CgroupVersion")) == "1":
        return (
            "the engine runs rootless on cgroup v1, where it cannot enforce the memory and pids limits (it "
            "ignores them): use a rootful engine, or a host with cgroup v2 delegating the memory and pids "
            "controllers to the user"
        )
    return None
