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

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def runner_layout(tmp_path: Path) -> Path:
    """toolcage's package as the wheel lays it out (runner/ is toolcage, worker/ toolcage.worker, ...)."""
    pkg = tmp_path / "pkg" / "toolcage"
    shutil.copytree(ROOT / "runner", pkg)
    for sub in ("worker", "policies", "image"):
        shutil.copytree(ROOT / sub, pkg / sub)
    return tmp_path / "pkg"


def _runner(engine: Any, layout: Path, host_ws: Path, hostname: str, script: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            "docker", "run", "--rm", "--name", hostname, "--hostname", hostname, "--user", "0",
            "--read-only", "--tmpfs", "/tmp", "--network", "none", "-e", "HOME=/tmp",
            "-e", "PYTHONPATH=/pkg:/venv", "-e", "TOOLCAGE_AUDIT_LOG=/tmp/audit.jsonl",
            "-v", "/var/run/docker.sock:/var/run/docker.sock",
            "-v", f"{layout}:/pkg:ro", "-v", f"{site.getsitepackages()[0]}:/venv:ro", "-v", f"{host_ws}:/data/ws:ro",
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
