"""The Harbor environment's rules, without Harbor (it needs Python 3.12+): capabilities, users, network, sizes.

Harbor itself runs them in tests/integration/test_harbor.py (a trixie runner image, a real ``harbor run``).
"""

from __future__ import annotations

import importlib.util

import pytest

from toolcage import load_policy
from toolcage.errors import MissingExtra
from toolcage.integrations import harbor_rules as rules

MIB = 1 << 20


def test_capabilities_claim_only_what_toolcage_enforces() -> None:
    """No network and a hostname allowlist (wildcards, public IPv4) are claimed; ranges, mounts, GPUs are not."""
    caps = rules.CAPABILITIES
    assert caps["disable_internet"] and caps["network_allowlist"]
    assert caps["network_allowlist_hostnames"] and caps["network_allowlist_wildcard_hostnames"]
    assert caps["network_allowlist_ipv4_addresses"]
    for never in ("network_allowlist_ipv4_cidrs", "network_allowlist_ipv6_cidrs", "mounted", "gpus", "tpus"):
        assert caps[never] is False, never
    assert "dynamic_network_policy" not in caps  # decided by the live toolcage (AsyncSandbox.update_network)
    assert rules.RESOURCE_CAPABILITIES["memory_limit"] and not rules.RESOURCE_CAPABILITIES["memory_request"]


@pytest.mark.parametrize("user", [None, "root", 0, "0", 65532, "65532"])
def test_root_and_the_sandbox_user_run_as_the_sandbox_user(user: str | int | None) -> None:
    """Harbor's user="root" (its bookkeeping, the verifier) runs, as uid 65532: never with more rights."""
    rules.check_user(user)


@pytest.mark.parametrize("user", ["agent", 1000, "nobody", "1000"])
def test_another_user_is_refused_saying_why(user: str | int) -> None:
    """A user other than root or 65532 asks for less than the sandbox user may: refused, naming the user."""
    with pytest.raises(rules.UserRefused, match=r"uid 65532.*cannot run as") as err:
        rules.check_user(user)
    assert repr(user) in str(err.value)


def test_network_modes_map_onto_toolcage_policies() -> None:
    """no-network is mode none (proxy with nothing allowed when a phase will change it); an allowlist is proxy."""
    assert rules.network("no-network", [], changeable=False) == {"mode": "none"}
    assert rules.network("no-network", [], changeable=True) == {"mode": "proxy", "allow": []}
    net = rules.network("allowlist", ["pypi.org", "*.example.com", "8.8.8.8"], changeable=False)
    assert [r["host"] for r in net["allow"]] == ["pypi.org", "*.example.com", "8.8.8.8"]
    policy = load_policy(rules.policy(net, memory=1024 * MIB, cpus=0.5, run_s=600))  # valid as a policy
    assert policy.network.mode == "proxy" and policy.limits.cpus == 0.5 and policy.timeouts.idle_s == 600


def test_public_is_refused_unless_the_operator_says_no_network() -> None:
    """toolcage never gives unrestricted network: public is an error saying so, or no network if asked."""
    with pytest.raises(ValueError, match="never gives a sandbox unrestricted network"):
        rules.network("public", [], changeable=False)
    assert rules.network("public", [], changeable=False, public="no-network") == {"mode": "none"}


@pytest.mark.parametrize("host", ["127.0.0.1", "10.1.2.3", "169.254.169.254", "192.168.0.1", "localhost"])
def test_an_allowlist_entry_the_floor_refuses_is_refused_before_start(host: str) -> None:
    """A private, loopback or metadata address, or localhost, in allowed_hosts is an error at once (the floor's
    rule for a live change), so Harbor refuses the task before a sandbox starts rather than at a phase."""
    with pytest.raises(ValueError, match=f"allow rule {host}: .*egress floor always refuses"):
        rules.network("allowlist", ["pypi.org", host], changeable=False)


def test_writable_paths_and_sizes() -> None:
    """Harbor's paths, the workdir and extras, nested ones folded; sizes share the memory /scratch leaves."""
    assert rules.writable_paths("/app", ["/tmp/x", "/logs/agent", "/"]) == (
        "/app",
        "/logs",
        "/solution",
        "/tests",
        "/tmp",
    )
    assert rules.writable_paths(None) == ("/logs", "/solution", "/tests", "/tmp")
    memory, size = rules.sizes(512, None, 5)
    assert memory == 512 * MIB and 5 * size + 64 * MIB <= memory
    assert rules.sizes(None, 100, 5) == (rules.DEFAULT_MEMORY_MB * MIB, 100 * MIB)


def test_exit_codes_as_a_shell_gives_them() -> None:
    """A process killed by signal N exits 128 + N, as under Harbor's Docker environment."""
    assert rules.exit_code({"exit_code": 3}) == 3
    assert rules.exit_code({"exit_code": -9, "signal": "SIGKILL"}) == 137


def test_the_environment_module_needs_harbor() -> None:
    """Without Harbor installed, importing the environment says which extra to install (MissingExtra)."""
    if importlib.util.find_spec("harbor") is not None:  # pragma: no cover - only where Harbor is installed
        pytest.fail("this test pins the module's behaviour where Harbor is absent: run it in the main venv")
    with pytest.raises(MissingExtra, match="harbor"):
        importlib.import_module("toolcage.integrations.harbor")
