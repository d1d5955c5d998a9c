"""doctor's knob-by-knob comparison and the orphan rules, on plain data."""

from __future__ import annotations

import copy
import os
import socket
from typing import Any

from tests.unit._helpers import run_spec
from toolcage.engine.hostconfig import container_config
from toolcage.lifecycle.reaper import orphan_reason
from toolcage.ops.views import inspect_findings
from toolcage.policies import load_policy


def live_inspect() -> dict[str, Any]:
    """What docker inspect says of a container created from container_config (the fields doctor reads)."""
    p = load_policy("default")
    cfg = container_config(p, run_spec())
    hc = dict(cfg["HostConfig"])
    hc.update(PidMode="", UTSMode="", UsernsMode="")
    return {
        "Name": "/toolcage-t-r",
        "Config": {k: v for k, v in cfg.items() if k != "HostConfig"},
        "HostConfig": hc,
        "Mounts": [],
    }


def test_as_configured_has_no_findings() -> None:
    """A container exactly as toolcage creates it passes."""
    assert inspect_findings(live_inspect()) == []


def test_each_weakening_is_found() -> None:
    """Every weakened knob is reported by name."""
    cases = [
        (("HostConfig", "ReadonlyRootfs"), False, "read-only root fs"),
        (("HostConfig", "Privileged"), True, "privileged"),
        (("HostConfig", "CapDrop"), [], "cap_drop"),
        (("HostConfig", "CapAdd"), ["SYS_ADMIN"], "cap_add"),
        (("HostConfig", "SecurityOpt"), [], "no-new-privileges"),
        (("HostConfig", "SecurityOpt"), ["no-new-privileges"], "seccomp"),  # Docker's default profile
        (("HostConfig", "SecurityOpt"), ["no-new-privileges", "seccomp=unconfined"], "seccomp"),
        (("HostConfig", "Init"), True, "init"),  # docker-init would hold the protocol stream
        (("HostConfig", "PidsLimit"), 0, "pids limit"),
        (("HostConfig", "Memory"), 0, "memory"),
        (("HostConfig", "NanoCpus"), 4_000_000_000, "cpus"),
        (("HostConfig", "PidMode"), "host", "PidMode"),
        (("Config", "User"), "0:0", "user"),
        (("Config", "NetworkDisabled"), False, "network"),
    ]
    for (section, key), value, needle in cases:
        info = copy.deepcopy(live_inspect())
        info[section][key] = value
        if key == "NetworkDisabled":
            info["HostConfig"]["NetworkMode"] = "bridge"
        findings = inspect_findings(info)
        assert any(needle in f for f in findings), (key, findings)


def test_rw_mount_and_socket_found() -> None:
    """A writable mount or an engine socket in a sandbox is a finding."""
    info = live_inspect()
    info["Mounts"] = [{"Source": "/var/run/docker.sock", "Destination": "/x", "RW": True}]
    findings = inspect_findings(info)
    assert any("engine socket" in f for f in findings) and any("read-write" in f for f in findings)


def test_orphan_rules() -> None:
    """Dead owner and reused pid make an orphan in the reaper's own namespace; a live owner never does,
    past its deadline too; an owner in another namespace is judged by the deadline alone."""
    from toolcage.engine.ownership import namespace_key, process_start_ticks

    here = namespace_key()
    me = {
        "toolcage.owner": f"{socket.gethostname()}:{os.getpid()}",
        "toolcage.owner_started": process_start_ticks(os.getpid()),
        "toolcage.owner_ns": here,
        "toolcage.deadline": "9999999999",
    }
    assert orphan_reason(me, 0, here) is None
    dead = {**me, "toolcage.owner": f"{socket.gethostname()}:999999"}
    assert "gone" in (orphan_reason(dead, 0, here) or "")
    reused = {**me, "toolcage.owner_started": "1"}
    assert "another process" in (orphan_reason(reused, 0, here) or "")
    late = {**me, "toolcage.deadline": "100"}
    assert orphan_reason(late, 200, here) is None  # its owner lives
    elsewhere = {**dead, "toolcage.owner_ns": "other-boot/1/-"}
    assert orphan_reason(elsewhere, 0, here) is None
    assert "deadline" in (orphan_reason({**elsewhere, "toolcage.deadline": "100"}, 200, here) or "")
