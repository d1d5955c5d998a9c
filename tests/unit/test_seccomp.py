"""toolcage's seccomp profile: generated, shipped, and without the calls tool code never needs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.unit._helpers import run_spec
from toolcage.engine import seccomp
from toolcage.engine.hostconfig import container_config, proxy_container_config

SHIPPED = Path(seccomp.__file__).with_suffix(".json")


def _allowed(profile: dict) -> set[str]:
    return {n for rule in profile["syscalls"] if rule["action"] == "SCMP_ACT_ALLOW" for n in rule["names"]}


def test_shipped_file_is_the_generated_profile() -> None:
    """runner/engine/seccomp.json is exactly `python -m toolcage.engine.seccomp` (regenerate it after a change)."""
    assert SHIPPED.read_text() == seccomp.profile_json()


def test_denied_calls_are_never_allowed() -> None:
    """No call the issue names (ptrace, process_vm_*, io_uring, userfaultfd, bpf, keyrings, ...) is allowed."""
    allowed = _allowed(seccomp.profile())
    must_deny = {
        "ptrace", "process_vm_readv", "process_vm_writev", "userfaultfd", "perf_event_open", "bpf", "keyctl",
        "add_key", "request_key", "io_uring_setup", "io_uring_enter", "io_uring_register", "pidfd_getfd", "kcmp",
        "unshare", "setns", "mount",
    }  # fmt: skip
    assert not must_deny & allowed
    assert must_deny <= set(seccomp.DENIED)
    explicit = {n for r in seccomp.profile()["syscalls"] if r["action"] == "SCMP_ACT_ERRNO" for n in r["names"]}
    assert must_deny <= explicit


def test_default_is_deny_and_native_arches_only() -> None:
    """Anything not listed fails with EPERM; no 32-bit compat entry point is accepted."""
    p = seccomp.profile()
    assert (p["defaultAction"], p["defaultErrnoRet"]) == ("SCMP_ACT_ERRNO", 1)
    assert p["architectures"] == ["SCMP_ARCH_X86_64", "SCMP_ARCH_AARCH64"]


def test_conditional_rules() -> None:
    """personality only for the default persona (and the query), socket only for unix/inet/inet6/netlink
    (and no raw inet socket),
    clone never with namespace flags, clone3 answers ENOSYS so libc falls back to clone."""
    rules = seccomp.profile()["syscalls"]

    def values(name: str) -> list[int]:
        return sorted(r["args"][0]["value"] for r in rules if r["names"] == [name] and r.get("args"))

    assert values("personality") == [0, 0xFFFFFFFF]
    assert values("socket") == [1, 2, 2, 10, 10, 16]
    two = [r["args"] for r in rules if r["names"] == ["socket"] and len(r["args"]) == 2]
    ip_types = sorted((a[0]["value"], a[1]["valueTwo"]) for a in two)
    assert ip_types == [(2, 1), (2, 2), (10, 1), (10, 2)]  # inet and inet6: streams and datagrams, never SOCK_RAW (3)
    assert {a[1]["value"] for a in two} == {0xF}
    (clone,) = [r for r in rules if r["names"] == ["clone"]]
    assert clone["args"][0] == {"index": 0, "value": 0x7E020000, "valueTwo": 0, "op": "SCMP_CMP_MASKED_EQ"}
    (clone3,) = [r for r in rules if r["names"] == ["clone3"]]
    assert clone3 == {"names": ["clone3"], "action": "SCMP_ACT_ERRNO", "errnoRet": 38}


def test_applied_to_sandbox_and_proxy() -> None:
    """Both the sandbox and the egress proxy carry the profile, and is_ours recognises it."""
    from toolcage.policies import load_policy

    policy = load_policy("connector-http")
    spec = run_spec(proxy_volume="toolcage-sock-x")
    for cfg in (container_config(policy, spec), proxy_container_config(policy, spec, "net", None)):
        opts = cfg["HostConfig"]["SecurityOpt"]
        assert seccomp.is_ours(opts)
        assert json.loads(opts[1][len("seccomp=") :]) == seccomp.profile()
    assert not seccomp.is_ours(["no-new-privileges"])
    assert not seccomp.is_ours(["seccomp=unconfined"])


def test_process_controls_only_on_the_caller() -> None:
    """prlimit64 only on pid 0 or read-only; setpriority/ioprio_set only who 0 and never the user-wide
    form; sched_set* only pid 0: no unconditional entry lets them reach the worker."""
    rules = seccomp.profile()["syscalls"]
    unconditional = {n for r in rules if r["action"] == "SCMP_ACT_ALLOW" and not r.get("args") for n in r["names"]}

    def entries(name: str) -> list[list[tuple[int, int]]]:
        found = [r for r in rules if name in r["names"]]
        assert all(r["action"] == "SCMP_ACT_ALLOW" and r["names"] == [name] for r in found)
        assert all(a["op"] == "SCMP_CMP_EQ" for r in found for a in r["args"])
        return sorted(sorted((a["index"], a["value"]) for a in r["args"]) for r in found)

    assert not set(seccomp.SELF_ONLY) & unconditional
    assert entries("prlimit64") == [[(0, 0)], [(2, 0)]]
    assert entries("setpriority") == [[(0, 0), (1, 0)], [(0, 1), (1, 0)]]
    assert entries("ioprio_set") == [[(0, 1), (1, 0)], [(0, 2), (1, 0)]]
    for name in ("sched_setaffinity", "sched_setattr", "sched_setparam", "sched_setscheduler"):
        assert entries(name) == [[(0, 0)]]


def test_the_gvisor_variant_differs_only_in_clone3_ipc_and_the_launchers_namespaces() -> None:
    """runsc's seccomp answers EPERM whatever errnoRet says, so its variant allows clone3 (glibc would not
    fall back to clone and no thread could start); System V IPC and POSIX queues, which gVisor gives no
    way to list (so no way to sweep), are refused there; mount and unshare are allowed there for the
    worker's nsinit launcher (which takes them away from tool code again); every other rule is the same."""

    def names(p: dict, action: str) -> set[str]:
        return {n for r in p["syscalls"] if r["action"] == action and "args" not in r for n in r["names"]}

    plain, gvisor = seccomp.profile(), seccomp.profile(gvisor=True)
    ipc = set(seccomp.GVISOR_UNLISTABLE_IPC)
    ns = set(seccomp.GVISOR_NAMESPACES)
    assert ns == {"mount", "unshare"}
    assert names(plain, "SCMP_ACT_ALLOW") - names(gvisor, "SCMP_ACT_ALLOW") == ipc
    assert names(gvisor, "SCMP_ACT_ALLOW") - names(plain, "SCMP_ACT_ALLOW") == {"clone3"} | ns
    assert names(gvisor, "SCMP_ACT_ERRNO") - names(plain, "SCMP_ACT_ERRNO") == ipc
    assert names(plain, "SCMP_ACT_ERRNO") - names(gvisor, "SCMP_ACT_ERRNO") == {"clone3"} | ns
    assert [r for r in plain["syscalls"] if "args" in r] == [r for r in gvisor["syscalls"] if "args" in r]
    assert [r for r in gvisor["syscalls"] if r["names"] == ["clone3"]] == [
        {"names": ["clone3"], "action": "SCMP_ACT_ALLOW"}
    ]
    assert seccomp.is_ours([seccomp.security_opt(gvisor=True)], gvisor=True)
    assert not seccomp.is_ours([seccomp.security_opt(gvisor=True)])


def test_the_cached_copy_variant_differs_only_in_the_boots_two_calls() -> None:
    """A run with a cached workspace copy (toolcage.worker.copyfs): mount and unshare allowed for the worker's boot,
    which takes them away again before anything of the run executes; every other rule is the plain profile's,
    and neither the plain profile nor the gVisor variant is taken for it (nor it for them)."""

    def names(p: dict, action: str) -> set[str]:
        return {n for r in p["syscalls"] if r["action"] == action and "args" not in r for n in r["names"]}

    plain, copy = seccomp.profile(), seccomp.profile(copy=True)
    assert set(seccomp.COPY_BOOT) == {"mount", "unshare"}
    assert names(copy, "SCMP_ACT_ALLOW") - names(plain, "SCMP_ACT_ALLOW") == {"mount", "unshare"}
    assert names(plain, "SCMP_ACT_ALLOW") - names(copy, "SCMP_ACT_ALLOW") == set()
    assert names(plain, "SCMP_ACT_ERRNO") - names(copy, "SCMP_ACT_ERRNO") == {"mount", "unshare"}
    assert [r for r in plain["syscalls"] if "args" in r] == [r for r in copy["syscalls"] if "args" in r]
    assert seccomp.is_ours([seccomp.security_opt(copy=True)], copy=True)
    assert not seccomp.is_ours([seccomp.security_opt(copy=True)])
    assert not seccomp.is_ours([seccomp.security_opt()], copy=True)
    with pytest.raises(AssertionError):
        seccomp.profile(gvisor=True, copy=True)
