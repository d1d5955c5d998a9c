"""What ``toolcage.integrations.harbor`` decides without Harbor imported: the capabilities it declares, which
``user`` a command may ask for, a Harbor network policy as a toolcage ``network:`` section, and the sizes of
the writable paths. Harbor needs Python 3.12 or newer, so these rules are kept apart and tested where it is
absent.

Users: every process of a toolcage sandbox runs as uid 65532, never as root. Harbor asks for ``root`` for its
own bookkeeping (``mkdir``/``chmod`` of /logs, ``chmod +x`` of a script, packing a transfer) and for the
verifier by default: those run as the sandbox user, who owns every writable path, and whatever really needs
root (``apt-get install``, ``chown``) fails there as it would for any non-root user, never silently with
more rights. A task that names another user (``[agent] user = "agent"``) asks for *less* than the sandbox
user may (an agent kept from the tests): that cannot be given, so it is refused, saying why.
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterable, Mapping
from typing import Any

from toolcage.policies.contract import SANDBOX_UID

MIB = 1 << 20
# where Harbor reads and writes inside an environment (harbor.models.trial.paths.EnvironmentPaths, and /tmp for
# its transfer archives): each a writable path of the image (a tmpfs, filled with the image's content there)
HARBOR_PATHS = ("/logs", "/tests", "/solution", "/tmp")
DEFAULT_MEMORY_MB = 2048  # a task that names no memory_mb: the default policy's 512 MiB is small for agents
DEFAULT_RUN_S = 6 * 3600.0  # the sandbox's own deadline, a backstop: Harbor's timeouts end a trial first
SCRATCH = 64 * MIB
_MIN_PATH = 16 * MIB
_MAX_PATH = 1024 * MIB

# EnvironmentCapabilities' fields, as toolcage can back each one (docs/harbor.md says why)
CAPABILITIES: dict[str, bool] = {
    "disable_internet": True,  # network.mode none: no interface but lo
    "network_allowlist": True,  # network.mode proxy: only through the egress proxy, only to the allowlist
    "network_allowlist_hostnames": True,
    "network_allowlist_wildcard_hostnames": True,  # "*.example.com": its subdomains, not the apex
    "network_allowlist_ipv4_addresses": True,  # public addresses only: the SSRF floor refuses the rest
    "network_allowlist_ipv6_addresses": False,  # not tested here (no IPv6 route): not claimed
    "network_allowlist_ipv4_cidrs": False,  # the allowlist names hosts, never ranges
    "network_allowlist_ipv6_cidrs": False,
    "mounted": False,  # nothing of the host is mounted into a sandbox
    "gpus": False,
    "tpus": False,
    "stream": False,  # no SSH server in the sandbox
    "windows": False,
    "docker_compose": False,  # one container per environment, the task's image
}
RESOURCE_CAPABILITIES: dict[str, bool] = {
    "cpu_limit": True,  # limits.cpus
    "memory_limit": True,  # limits.memory
    "fractional_cpus": True,
    "cpu_request": False,
    "memory_request": False,
}
_ROOT = ("root", "0", 0)
_SANDBOX = (str(SANDBOX_UID), SANDBOX_UID)


class UserRefused(ValueError):
    """A command asked for a user the sandbox cannot be (any but root, 0 and 65532)."""


def check_user(user: str | int | None) -> None:
    """Whether a command may run for ``user`` (already resolved against the default user): None, root and the
    sandbox user run as uid 65532; any other user is :class:`UserRefused` (module docstring)."""
    if user is None or user in _ROOT or user in _SANDBOX:
        return
    raise UserRefused(
        f"toolcage runs every command as the sandbox user (uid {SANDBOX_UID}), so it cannot run as {user!r}: "
        "a separate user would keep the agent from files the sandbox user can read. Leave the task's "
        "[agent]/[verifier] user unset (or root, which runs as the sandbox user), or use another environment"
    )


def allow_rules(hosts: Iterable[str]) -> list[dict[str, Any]]:
    """Harbor's ``allowed_hosts`` as toolcage allow rules (HTTP and HTTPS on their default ports, through the
    proxy); ValueError, when asked, for an entry the egress floor refuses (a private, loopback or metadata
    address, ``localhost``): the floor's own rule (``policies.decide.change_problem``), as for a live change."""
    from toolcage.policies import load_policy
    from toolcage.policies.decide import change_problem

    rules = [{"host": host, "schemes": ["http", "https"]} for host in hosts]
    checked = load_policy({"network": {"mode": "proxy", "allow": rules}})
    problem = change_problem(load_policy("default"), checked.network)
    if problem is not None:
        raise ValueError(f"allowed_hosts: {problem}")
    return rules


def network(mode: str, hosts: Iterable[str], *, changeable: bool, public: str = "refuse") -> dict[str, Any]:
    """A Harbor policy (``network_mode``: no-network, allowlist or public) as a toolcage ``network:`` section.
    ``changeable``: the sandbox must take a live change later, so it runs behind the proxy even with nothing
    allowed. ``public``: toolcage never gives a sandbox unrestricted network; ``"refuse"`` (the default) says
    so, ``"no-network"`` runs such a task with none (the operator's choice, for tasks that need none)."""
    if mode == "public":
        if public != "no-network":
            raise ValueError(
                "network_mode 'public' is not offered: toolcage never gives a sandbox unrestricted network. Set "
                "the task's network_mode to 'allowlist' (with allowed_hosts) or 'no-network', or pass "
                "--ek public=no-network to run it with no network"
            )
        mode = "no-network"
    if mode == "no-network":
        return {"mode": "proxy", "allow": []} if changeable else {"mode": "none"}
    if mode == "allowlist":
        return {"mode": "proxy", "allow": allow_rules(hosts)}
    raise ValueError(f"unknown network_mode {mode!r}")


def writable_paths(workdir: str | None, extra: Iterable[str] = ()) -> tuple[str, ...]:
    """The image paths made writable: Harbor's, the task's workdir and ``extra``; a path under another is
    dropped (the outer one holds it), and ``/`` is never one."""
    wanted = [*HARBOR_PATHS, *([workdir] if workdir else []), *extra]
    norm = [posixpath.normpath(p) for p in wanted if p and p.startswith("/")]
    out: list[str] = []
    for path in sorted(set(norm), key=len):
        if path != "/" and not any(path == o or path.startswith(o + "/") for o in out):
            out.append(path)
    return tuple(sorted(out))


def sizes(memory_mb: int | None, storage_mb: int | None, paths: int) -> tuple[int, int]:
    """(memory, each writable path's size) in bytes: the task's memory_mb (else DEFAULT_MEMORY_MB); its
    storage_mb for each path, else an even share of the memory /scratch leaves (a tmpfs is memory, and
    toolcage refuses paths whose sizes could pass the run's memory)."""
    memory = (memory_mb or DEFAULT_MEMORY_MB) * MIB
    if storage_mb:
        return memory, storage_mb * MIB
    share = (memory - SCRATCH) // max(paths, 1)
    return memory, max(_MIN_PATH, min(_MAX_PATH, share // MIB * MIB))


def policy(
    net: Mapping[str, Any], *, memory: int, cpus: float | None, run_s: float, extends: str = "default"
) -> dict[str, Any]:
    """The sandbox's policy: ``extends`` with the network, memory, CPUs and a deadline for a Harbor trial (its
    idle and call timeouts as long: an agent thinks between commands, and ``exec`` passes its own timeout)."""
    limits: dict[str, Any] = {"memory": memory, "pids": 1024, "nofile": 4096, "output_cap": 16 * MIB}
    limits["scratch"] = SCRATCH
    if cpus:
        limits["cpus"] = float(cpus)
    return {
        "extends": extends,
        "name": "harbor",
        "network": dict(net),
        "limits": limits,
        "timeouts": {"run_s": run_s, "idle_s": run_s, "call_s": run_s},
    }


def exit_code(result: Mapping[str, Any]) -> int:
    """A process's exit code as a shell gives it: 128 + N for one killed by signal N (the worker says -N)."""
    code = int(result.get("exit_code") or 0)
    return 128 - code if code < 0 else code


__all__ = [
    "CAPABILITIES",
    "DEFAULT_MEMORY_MB",
    "DEFAULT_RUN_S",
    "HARBOR_PATHS",
    "RESOURCE_CAPABILITIES",
    "UserRefused",
    "allow_rules",
    "check_user",
    "exit_code",
    "network",
    "policy",
    "sizes",
    "writable_paths",
]
