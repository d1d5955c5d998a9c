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

from toolcage.backends.gvisor import gvisor_networked, gvisor_problem, gvisor_registered, runsc_args
from toolcage.engine.api import is_podman, limits_problem, rootless

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
    if problem and runsc_args(info) is not None:
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
    podman = is_podman(version)
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
