"""container_config(): every hardening knob is set, from the policy, with no way to override."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit._helpers import run_spec
from toolcage.engine import seccomp
from toolcage.engine.hostconfig import container_config
from toolcage.engine.labels import container_name
from toolcage.policies import load_policy

FIX = Path(__file__).resolve().parent.parent / "fixtures" / "policies"


def test_hardening_knobs() -> None:
    """Read-only root, no caps, no-new-privs, init, no network, non-root, no ports."""
    cfg = container_config(load_policy("default"), run_spec())
    hc = cfg["HostConfig"]
    assert hc["ReadonlyRootfs"] is True
    assert hc["CapDrop"] == ["ALL"]
    assert "CapAdd" not in hc
    assert hc["SecurityOpt"] == ["no-new-privileges", seccomp.security_opt()]
    assert hc["Privileged"] is False
    assert hc["Init"] is False  # the worker is PID 1: docker-init kept a reachable copy of the protocol stream
    assert hc["NetworkMode"] == "none"
    assert cfg["NetworkDisabled"] is True
    assert hc["PortBindings"] == {} and hc["PublishAllPorts"] is False
    assert cfg["User"] == "65532:65532"
    assert hc["AutoRemove"] is False
    assert cfg["StdinOnce"] is True and cfg["OpenStdin"] is True and cfg["Tty"] is False


def test_limits_come_from_policy() -> None:
    """Memory (swap equal), pids, cpus, nofile and scratch size follow the policy."""
    p = load_policy(FIX / "good-small.yaml")
    hc = container_config(p, run_spec())["HostConfig"]
    assert hc["Memory"] == 128 * 1024**2 == hc["MemorySwap"]
    assert hc["PidsLimit"] == 32
    assert hc["NanoCpus"] == 1_000_000_000
    assert hc["Ulimits"] == [{"Name": "nofile", "Soft": 256, "Hard": 256}]
    tmpfs = hc["Tmpfs"]["/scratch"]
    for opt in ("nosuid", "nodev", f"size={8 * 1024**2}", "uid=65532", "gid=65532"):
        assert opt in tmpfs.split(",")


def test_workspace_is_read_only_bind() -> None:
    """The workspace is bound read-only at /workspace; without one nothing is mounted."""
    hc = container_config(load_policy("default"), run_spec(workspace=Path("/srv/proj")))["HostConfig"]
    assert hc["Mounts"] == [
        {
            "Type": "bind",
            "Source": "/srv/proj",
            "Target": "/workspace",
            "ReadOnly": True,
            "BindOptions": {"Propagation": "rprivate"},
        }
    ]
    assert container_config(load_policy("default"), run_spec())["HostConfig"]["Mounts"] == []


def test_labels_and_name() -> None:
    """Name and labels identify the run, its tool, policy (and hash) and owner."""
    p = load_policy("default")
    cfg = container_config(p, run_spec())
    assert container_name("run_python", "abcd1234") == "toolcage-run_python-abcd1234"
    assert container_name("../weird name!", "x") == "toolcage-weird-name-x"
    lab = cfg["Labels"]
    assert lab["toolcage.run_id"] == "abcd1234"
    assert lab["toolcage.tool"] == "run_python"
    assert lab["toolcage.policy"] == "default"
    assert lab["toolcage.policy_sha256"] == p.sha256()
    assert lab["toolcage.owner"] == "host:1"
    for key in ("toolcage.started_at", "toolcage.deadline", "toolcage.owner_started"):
        assert key in lab


def test_policy_travels_to_worker() -> None:
    """The worker receives the canonical policy JSON in its environment."""
    p = load_policy("default")
    env = container_config(p, run_spec())["Env"]
    assert f"TOOLCAGE_POLICY={p.canonical_json()}" in env


HOSTILE_ENV = [
    {"TOOLCAGE_POLICY": '{"limits": {"memory": 999999999999}}'},
    {"TOOLCAGE_DEADLINE": "9999999999", "TOOLCAGE_WATCH_RUNNER": "0", "TOOLCAGE_IN_CONTAINER": "0"},
    {"HostConfig": "x", "Privileged": "true", "CapAdd": "ALL", "User": "0:0"},
]


@pytest.mark.parametrize("extra_env", HOSTILE_ENV)
def test_caller_supplied_env_cannot_weaken_the_hardening(extra_env: dict[str, str]) -> None:
    """No dict a caller can pass (RunSpec.extra_env, the only one) changes HostConfig, user, network,
    labels or the policy, deadline and runner watch the worker is given."""
    p = load_policy("default")
    base = container_config(p, run_spec())
    cfg = container_config(p, run_spec(extra_env=extra_env))
    assert cfg["HostConfig"] == base["HostConfig"]
    for key in ("User", "Labels", "NetworkDisabled", "Image", "WorkingDir"):
        assert cfg[key] == base[key]
    assert set(base["Env"]) <= set(cfg["Env"])  # every reserved variable keeps the policy's value
    assert len([e for e in cfg["Env"] if e.startswith("TOOLCAGE_POLICY=")]) == 1


def test_no_container_log_but_for_a_kept_run() -> None:
    """dockerd would copy the whole protocol stream (answers, every file a download sends) into a json-file on
    the host: a sandbox has no log driver; a --keep run has a 1 MiB one, for `docker logs`."""
    p = load_policy("default")
    assert container_config(p, run_spec())["HostConfig"]["LogConfig"] == {"Type": "none"}
    kept = container_config(p, run_spec(keep=True))["HostConfig"]["LogConfig"]
    assert kept["Type"] == "json-file" and kept["Config"]["max-size"] == "1m"


def test_a_cached_copy_mounts_its_tree_read_only_under_the_copys_tmpfs() -> None:
    """workspace_cache: the kept tree read-only at COPY_LOWER (never copied into), the run's own tmpfs at /workspace
    (the overlay's upper layer), the worker told where, and the profile's cached-copy variant; the run that fills
    the cache has the volume itself at /workspace instead of the tmpfs, and the plain profile."""
    from toolcage.policies import contract

    pol = load_policy("default")
    cfg = container_config(pol, run_spec(workspace_copy=True, copy_lower="toolcage-copy-data-x"))
    hc = cfg["HostConfig"]
    lower = [m for m in hc["Mounts"] if m["Target"] == contract.COPY_LOWER]
    assert lower == [
        {"Type": "volume", "Source": "toolcage-copy-data-x", "Target": contract.COPY_LOWER, "ReadOnly": True,
         "VolumeOptions": {"NoCopy": True}}
    ]  # fmt: skip
    assert "/workspace" in hc["Tmpfs"] and "size=" in hc["Tmpfs"]["/workspace"]
    assert f"{contract.ENV_COPY_LOWER}={contract.COPY_LOWER}" in cfg["Env"]
    assert hc["SecurityOpt"] == ["no-new-privileges", seccomp.security_opt(copy=True)]
    filler = container_config(pol, run_spec(workspace_copy=True, copy_target="toolcage-copy-data-x"))
    fhc = filler["HostConfig"]
    assert "/workspace" not in fhc["Tmpfs"]
    assert [m["Source"] for m in fhc["Mounts"] if m["Target"] == "/workspace"] == ["toolcage-copy-data-x"]
    assert fhc["SecurityOpt"] == ["no-new-privileges", seccomp.security_opt()]
    assert not any(e.startswith(contract.ENV_COPY_LOWER) for e in filler["Env"])
    plain = container_config(pol, run_spec(workspace_copy=True))
    assert plain["HostConfig"]["SecurityOpt"] == ["no-new-privileges", seccomp.security_opt()]
