"""Named attack cases, each run from inside a live sandbox on the real engine.

Every case asserts what was observed from inside (the attack failed) and why (the
kernel's error), so a weakened configuration turns a case red instead of passing by luck.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from toolcage import Sandbox
from toolcage.ops.probes import CODE_CASES, check, expected_for, run_code_probe

pytestmark = pytest.mark.usefixtures("no_leaks")


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    ws = tmp_path_factory.mktemp("ws")
    # world-writable on the host: only the read-only bind mount stops writes from inside
    ws.chmod(0o777)
    (ws / "keep.txt").write_text("original\n")
    (ws / "keep.txt").chmod(0o666)
    return ws


@pytest.fixture(scope="module")
def sandbox(engine: Any, workspace: Path) -> Iterator[Sandbox]:
    with Sandbox(workspace=workspace, tool="security") as sb:
        yield sb


CASES = [(name, code, expected) for name, _what, code, expected in CODE_CASES] + [
    # this module's workspace is world-writable on the host: only the read-only mount stops these
    (
        "write_workspace_file",
        "print(json.dumps({'r': attempt(lambda: open('/workspace/keep.txt', 'a'))}))",
        {"r": "EROFS"},
    ),
    (
        "memory_limit_visible",
        "v = None\nfor p in ('/sys/fs/cgroup/memory.max', '/sys/fs/cgroup/memory/memory.limit_in_bytes'):\n"
        "    if os.path.exists(p):\n        v = int(open(p).read())\n        break\nprint(json.dumps({'limit': v}))",
        {"limit": 512 * 1024 * 1024},
    ),
]


@pytest.mark.parametrize(("name", "code", "expected"), CASES, ids=[c[0] for c in CASES])
def test_attack_case(sandbox: Sandbox, name: str, code: str, expected: dict[str, Any]) -> None:
    """Each named attack fails inside the sandbox, for the stated kernel reason."""
    observed = run_code_probe(sandbox, code)
    want, _why = expected_for(name, expected, sandbox.kind)  # gVisor: the same wall, another errno
    assert check(observed, want), observed


def test_workspace_unchanged_on_host(sandbox: Sandbox, workspace: Path) -> None:
    """After every attack the host's workspace is exactly as it was."""
    sandbox.call("run_shell", {"command": "echo x >> /workspace/keep.txt; rm -f /workspace/keep.txt; true"})
    assert sorted(p.name for p in workspace.iterdir()) == ["keep.txt"]
    assert (workspace / "keep.txt").read_text() == "original\n"


def test_scratch_writable_and_capped(sandbox: Sandbox) -> None:
    """Scratch is writable, and filling it past its size fails with ENOSPC."""
    r = sandbox.call(
        "run_shell",
        {
            "command": "echo ok > /scratch/small && cat /scratch/small && "
            "dd if=/dev/zero of=/scratch/fill bs=1M count=100 2>&1; "
            "du -m /scratch/fill | cut -f1; rm -f /scratch/fill"
        },
    )
    out = r.result["stdout"]
    assert out.startswith("ok\n")
    assert "No space left on device" in out
    assert int(out.strip().splitlines()[-1]) <= 64


def test_inspect_matches_policy(sandbox: Sandbox, engine: Any) -> None:
    """docker inspect of the live container shows every CIS §5 knob the policy asks for."""
    info = engine.inspect(sandbox.container_id)
    hc = info["HostConfig"]
    assert hc["Privileged"] is False
    assert hc["ReadonlyRootfs"] is True
    from toolcage.ops.views import DEFAULT_CAPS, inspect_findings

    assert inspect_findings(info) == []  # doctor's own check of a live container against its policy
    if engine.flavor().name == "podman":  # Podman lists every default capability it dropped
        assert set(hc["CapDrop"]) >= DEFAULT_CAPS and not hc.get("CapAdd")
    else:
        assert hc["CapDrop"] == ["ALL"] and not hc.get("CapAdd")
    assert "no-new-privileges" in hc["SecurityOpt"]
    memory = 512 * 1024**2
    if sandbox.kind == "gvisor":  # the process limit is RLIMIT_NPROC in gVisor's kernel; the cgroup's a backstop
        assert {"Name": "nproc", "Soft": 64, "Hard": 64} in hc["Ulimits"] and hc["PidsLimit"] > 64
        assert hc["Runtime"] == "runsc"
        memory += (128 + 2 * 64) * 1024**2  # a headroom for gVisor's kernel; the policy's memory is kept inside
    else:
        assert hc["PidsLimit"] == 64
    assert hc["Memory"] == hc["MemorySwap"] == memory
    assert hc["NanoCpus"] == 1_000_000_000
    assert not hc.get("Init")  # the worker is PID 1 (docker-init held a reachable copy of the protocol stream)
    from toolcage.engine import seccomp

    assert seccomp.is_ours(hc["SecurityOpt"], gvisor=sandbox.kind == "gvisor")
    assert not hc.get("PortBindings")
    # Podman answers "shareable" for the private IPC namespace it made (only the engine's user could join it)
    ipc = ("private", "shareable") if engine.flavor().name == "podman" else ("private",)
    assert hc["PidMode"] in ("", "private") and hc["IpcMode"] in ipc and hc["UTSMode"] in ("", "private")
    assert info["Config"]["User"] == "65532:65532"
    assert info["Config"].get("NetworkDisabled") is True or hc["NetworkMode"] == "none"  # Podman: the latter
    assert all("docker.sock" not in m["Source"] for m in info["Mounts"])
    # beside the workspace, only the run's own overlays of the image's shared files (toolcage.engine.sharedfiles)
    from toolcage.engine import sharedfiles

    image_id = (engine.image(info["Config"]["Image"]) or {})["Id"]
    shared = {t: v for v, t in sharedfiles.run_volumes(sandbox.run_id)} if sharedfiles.layers(engine, image_id) else {}
    assert sorted((m["Destination"], m["RW"]) for m in info["Mounts"]) == sorted(
        [("/workspace", False)] + [(t, False) for t in shared]
    )
    for m in info["Mounts"]:
        if m["Destination"] in shared:
            assert m["Type"] == "volume" and m["Name"] == shared[m["Destination"]], m


@pytest.mark.parametrize("policy", ["default", "connector-http"])
def test_limit_probes(engine: Any, policy: str) -> None:
    """The memory and pids limits fire and egress to the metadata address is refused (doctor --probe's checks);
    under a proxy policy the egress proxy also refuses a smuggling-shaped request."""
    from toolcage.ops.probes import run_all

    with Sandbox(policy, tool="probe") as sb:
        results = {r.name: r for r in run_all(sb)}
    names = ["memory_limit_fires", "pids_limit_fires", "egress_refuses_metadata"]
    if policy == "connector-http":
        names.append("egress_refuses_smuggling")
    for name in names:
        assert results[name].passed, (name, results[name].observed)
    assert all(r.passed for r in results.values()), [r for r in results.values() if not r.passed]
