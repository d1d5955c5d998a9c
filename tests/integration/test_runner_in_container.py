"""The runner inside a container, driving this machine's engine through the mounted socket (issue 12).

The runner's container gets toolcage's sources and the test venv's packages read-only, the engine
socket, and a host directory at /data/ws. Bind-mount sources are resolved by the engine on its
host, so toolcage maps the workspace from the runner's view (/data/ws) to the host's, detected
from the runner container's own mounts; a path with no mapping is refused with the fix.
"""

from __future__ import annotations

import secrets
import shutil
import site
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from toolcage import DEFAULT_IMAGE

pytestmark = pytest.mark.runc_only("the runner in a container (its image, hostname and mounts): host-side")

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def runner_layout(tmp_path: Path) -> Path:
    """toolcage's package as the wheel lays it out (runner/ is toolcage, worker/ toolcage.worker, ...)."""
    pkg = tmp_path / "pkg" / "toolcage"
    shutil.copytree(ROOT / "runner", pkg)
    for sub in ("worker", "policies", "image"):
        shutil.copytree(ROOT / sub, pkg / sub)
    return tmp_path / "pkg"


def _runner(
    engine: Any,
    layout: Path,
    host_ws: Path,
    hostname: str,
    script: str,
    *,
    name: str | None = None,
    binds: tuple[tuple[str, str], ...] | None = None,
) -> subprocess.CompletedProcess[str]:
    """``script`` in a runner container (named ``name``, ``hostname`` as its hostname) with the engine
    socket, toolcage and the venv, and ``binds`` (host path, path inside) read-only: by default
    ``host_ws`` at /data/ws."""
    volumes = [a for src, dst in (binds or ((str(host_ws), "/data/ws"),)) for a in ("-v", f"{src}:{dst}:ro")]
    return subprocess.run(
        [
            "docker", "run", "--rm", "--name", name or hostname, "--hostname", hostname, "--user", "0",
            "--read-only", "--tmpfs", "/tmp", "--network", "none", "-e", "HOME=/tmp",
            "-e", "PYTHONPATH=/pkg:/venv", "-e", "TOOLCAGE_AUDIT_LOG=/tmp/audit.jsonl",
            "-v", "/var/run/docker.sock:/var/run/docker.sock",
            "-v", f"{layout}:/pkg:ro", "-v", f"{site.getsitepackages()[0]}:/venv:ro", *volumes,
            "--label", "toolcage.test=runner-in-container",
            "--entrypoint", "sh", DEFAULT_IMAGE, "-c", script,
        ],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def _left(engine: Any, hostname: str) -> list[str]:
    return [
        c["Names"][0]
        for c in engine.containers("toolcage.run_id")
        if c["Labels"].get("toolcage.owner", "").startswith(hostname + ":")
    ]


def test_a_runner_in_a_container_mounts_the_workspace_from_the_hosts_path(
    engine: Any, runner_layout: Path, tmp_path: Path
) -> None:
    """`toolcage run` inside a container: --workspace /data/ws (the runner's view) reaches the sandbox
    as the host's directory; a workspace the runner's container has not from its host is refused
    (exit 2, the fix named) before anything starts; nothing is left behind."""
    host_ws = tmp_path / "ws"
    host_ws.mkdir()
    (host_ws / "note.txt").write_text("from the host\n")
    host_ws.chmod(0o755)
    (host_ws / "note.txt").chmod(0o644)
    tmp_path.chmod(0o755)
    hostname = f"toolcage-test-runner-{secrets.token_hex(3)}"
    script = (
        'python3 -m toolcage.cli run read_file --workspace /data/ws --params \'{"path": "/workspace/note.txt"}\'; '
        'echo "exit $?"; mkdir /tmp/elsewhere; '
        "python3 -m toolcage.cli run list_files --workspace /tmp/elsewhere; "
        'echo "exit $?"'
    )
    out = _runner(engine, runner_layout, host_ws, hostname, script)
    assert '"content": "from the host\\n"' in out.stdout, (out.stdout[-2000:], out.stderr[-2000:])
    assert out.stdout.count("exit 0") == 1 and "exit 2" in out.stdout, out.stdout[-2000:]
    assert "/tmp/elsewhere is not in any directory this runner's container has from its host" in out.stderr
    assert "TOOLCAGE_HOST_PATHS" in out.stderr and "Traceback" not in out.stderr
    deadline = time.monotonic() + 30
    while _left(engine, hostname) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert _left(engine, hostname) == []


def _wait_gone(engine: Any, hostname: str) -> None:
    deadline = time.monotonic() + 30
    while _left(engine, hostname) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert _left(engine, hostname) == []


def test_the_refusals_apply_to_the_host_path_the_engine_mounts(engine: Any, runner_layout: Path) -> None:
    """The host's /etc bound into the runner's container at /data/hostetc is refused as /etc, as it is on the host.

    Before: the runner checked its own view (/data/hostetc, nothing wrong with it), mapped it to /etc,
    and the sandbox read the host's /etc/hostname."""
    hostname = f"toolcage-test-runner-{secrets.token_hex(3)}"
    script = (
        'python3 -m toolcage.cli run read_file --workspace /data/hostetc --params \'{"path": "/workspace/hostname"}\'; '
        'echo "exit $?"'
    )
    out = _runner(engine, runner_layout, Path("/etc"), hostname, script, binds=(("/etc", "/data/hostetc"),))
    assert "exit 2" in out.stdout and '"content"' not in out.stdout, (out.stdout[-2000:], out.stderr[-2000:])
    refused = "refusing to mount the workspace '/data/hostetc' (on the engine's host: '/etc'): it is inside /etc"
    assert refused in out.stderr, out.stderr[-2000:]
    assert "Traceback" not in out.stderr
    _wait_gone(engine, hostname)


def test_a_runner_whose_hostname_is_not_its_id_finds_its_own_mounts(
    engine: Any, runner_layout: Path, tmp_path: Path
) -> None:
    """A runner container started with --hostname maps its workspace from its own mounts, not the same-named host dir.

    Before: it looked itself up by hostname, found nothing, and passed its path on as it was: the
    sandbox listed the host's directory of that name (decoy.txt) instead of the runner's (real.txt)."""
    tmp_path.chmod(0o755)
    decoy, real = tmp_path / "decoy", tmp_path / "real"
    for d, f in ((decoy, "decoy.txt"), (real, "real.txt")):
        d.mkdir()
        d.chmod(0o755)
        (d / f).write_text(f)
        (d / f).chmod(0o644)
    hostname = f"agent-{secrets.token_hex(3)}"  # the runner's hostname: no container has it as name or id
    name = f"toolcage-test-runner-{secrets.token_hex(3)}"
    script = f'python3 -m toolcage.cli run list_files --workspace {decoy}; echo "exit $?"'
    out = _runner(engine, runner_layout, real, hostname, script, name=name, binds=((str(real), str(decoy)),))
    assert "exit 0" in out.stdout, (out.stdout[-2000:], out.stderr[-2000:])
    assert "real.txt" in out.stdout and "decoy.txt" not in out.stdout, out.stdout[-2000:]
    _wait_gone(engine, hostname)


def test_a_runner_on_the_engines_own_machine_maps_nothing(engine: Any) -> None:
    """This test process, beside the engine: its paths go as they are, and the runner is sure of it."""
    from toolcage.engine import hostpaths

    view = hostpaths.detect(engine)
    assert view.sure and view.mapping is None, view
