"""Helpers the integration and security tests share: the CLI as a user runs it, and upstream
servers on a test network (hardened like the sandbox, reached by network alias)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def ray_harness() -> Any:
    """examples/ray_cluster/local_cluster.py as a module (its LocalCluster: a head and worker raylets, each
    with a dockerd of its own), for the cluster tests."""
    path = ROOT / "examples" / "ray_cluster" / "local_cluster.py"
    spec = importlib.util.spec_from_file_location("local_cluster", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["local_cluster"] = mod
    spec.loader.exec_module(mod)
    return mod


def secret_connector(tmp_path: Path, name: str, source: str, host: str) -> tuple[Path, Path]:
    """A connector module (``source``) that may read the secret TOKEN, and a policy file named ``name``
    that binds TOKEN to ``host`` (allowed through the egress proxy): (connector, policy)."""
    import yaml

    conn = tmp_path / "conn" / "stash.py"
    conn.parent.mkdir()
    conn.write_text(source)
    pol = tmp_path / "pol.yaml"
    pol.write_text(
        yaml.safe_dump(
            {
                "name": name,
                "network": {"mode": "proxy", "allow": [{"host": host}]},
                "timeouts": {"call_s": 120, "run_s": 600, "idle_s": 600},
                "secrets": {"TOKEN": {"send_to": {"host": host}, "unsafe_expose_to_handler": True}},
            }
        )
    )
    return conn, pol


def run_cli(
    *args: str,
    env: dict[str, str] | None = None,
    stdin: str | None = None,
    timeout: float = 120,
    cwd: str | os.PathLike[str] = ROOT,
) -> subprocess.CompletedProcess[str]:
    """``toolcage ARGS`` from this checkout, in ``cwd`` (the repository root), with ``env`` over the environment."""
    return subprocess.run(
        [sys.executable, "-m", "toolcage.cli", *args],
        input=stdin,
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


def start_upstream(
    engine: Any,
    name: str,
    net: str,
    script: str,
    aliases: list[str],
    labels: dict[str, str],
    env: dict[str, str],
    sysctls: dict[str, str] | None = None,
) -> str:
    """A Python server (``script``, run by the worker image's python3) on ``net`` as ``aliases``, started."""
    from toolcage import DEFAULT_IMAGE

    host_config: dict[str, Any] = {
        "NetworkMode": net,
        "ReadonlyRootfs": True,
        "CapDrop": ["ALL"],
        "Memory": 128 << 20,
        "PidsLimit": 32,
        "SecurityOpt": ["no-new-privileges"],
        "Tmpfs": {"/tmp": "size=1m"},
        # explicit: Podman's default nofile and nproc are ones runc cannot set with every capability dropped
        "Ulimits": [{"Name": "nofile", "Soft": 1024, "Hard": 1024}, {"Name": "nproc", "Soft": 4096, "Hard": 4096}],
    }
    if sysctls:
        host_config["Sysctls"] = sysctls
    cid = str(
        engine.create(
            {
                "Image": os.environ.get("TOOLCAGE_IMAGE", DEFAULT_IMAGE),
                "Entrypoint": ["python3", "-c", script],
                "User": "65532:65532",
                "Labels": labels,
                "Env": [f"{k}={v}" for k, v in env.items()],
                "HostConfig": host_config,
                "NetworkingConfig": {"EndpointsConfig": {net: {"Aliases": aliases}}},
            },
            name,
        )
    )
    try:
        engine.start(cid)
        wait_listening(engine, cid)
    except BaseException:
        engine.remove(cid)
        raise
    return cid


def wait_listening(engine: Any, cid: str, timeout: float = 60) -> None:
    """Until the container's process has a listening TCP socket (its network namespace's /proc/net/tcp*,
    read from the host): a sandbox answers, and its proxy connects, sooner than a cold server binds."""
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pid = ((engine.inspect(cid) or {}).get("State") or {}).get("Pid") or 0
        for table in ("tcp", "tcp6"):
            try:
                rows = Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:] if pid else []
            except OSError:
                rows = []
            if any(row.split()[3] == "0A" for row in rows):  # TCP_LISTEN
                return
        time.sleep(0.05)
    raise AssertionError(f"{cid[:12]} did not listen within {timeout} s: {engine.logs(cid)[-2000:]}")


# `toolcage mcp wrap` tests: real MCP servers from PyPI (pinned, so the images are cached by content),
# a probe server of our own (run from the fetch image, which holds the mcp SDK), an official MCP client
MCP_TIME = "mcp-server-time==2026.10.19"
MCP_FETCH = "mcp-server-fetch==2026.10.24"
PROBE_DIR = ROOT / "tests" / "fixtures" / "mcp_wrap"  # mounted as the workspace: /workspace/probe_server.py
PROBE = ["python3", "/workspace/probe_server.py"]
WRAP_LABEL = "toolcage.tool=mcp-wrap"


def wrap_image(package: str, tag: str) -> str:
    """``toolcage image build --pip PACKAGE --tag TAG`` (a no-op when it is up to date)."""
    proc = run_cli("image", "build", "--pip", package, "--tag", tag, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return tag


def wrap_objects(engine: Any) -> set[str]:
    """Every container, network and volume of a `mcp wrap` run on this engine (by label)."""
    return (
        {f"container {c['Id'][:12]} {c['Names']}" for c in engine.containers(WRAP_LABEL)}
        | {f"network {n['Name']}" for n in engine.networks(WRAP_LABEL)}
        | {f"volume {v['Name']}" for v in engine.volumes(WRAP_LABEL)}
    )


class WrapRun:
    """What a `toolcage mcp wrap` session left: its stderr and its exit code."""

    def __init__(self, stderr: str, exit_code: int | None) -> None:
        self.stderr, self.exit_code = stderr, exit_code


def wrap_session(args: list[str], body: Any, env: dict[str, str] | None = None, timeout: float = 120) -> WrapRun:
    """Run ``await body(session)`` against `toolcage mcp wrap ARGS`, spawned and driven by the official MCP
    client over stdio (through `sh`, which records the exit code)."""
    import tempfile
    import time

    import anyio
    from mcp import ClientSession
    from mcp.client.stdio import StdioServerParameters, stdio_client

    keep = ("PATH", "HOME", "XDG_CACHE_HOME", "DOCKER_HOST", "PIP_INDEX_URL")
    base = {k: v for k, v in os.environ.items() if k.startswith("TOOLCAGE_") or k in keep}
    with tempfile.TemporaryDirectory(prefix="toolcage-wrap-test-") as tmp:
        code_file, err_file = Path(tmp) / "exit", Path(tmp) / "stderr"
        # In a session of its own (setsid -f): the client ends its server's process group 2 s after closing its
        # stdin (mcp.client.stdio), and `mcp wrap` removing its container on a loaded host takes longer. What it
        # ends with by itself is recorded once it has ended, and waited for below.
        part = f"{code_file}.part"
        script = f'{sys.executable} -m toolcage.cli mcp wrap "$@"; echo $? > {part}; mv {part} {code_file}'
        params = StdioServerParameters(
            command="setsid",
            args=["-f", "/bin/sh", "-c", script, "sh", *args],
            env={**base, **(env or {})},
            cwd=str(ROOT),
        )

        async def main() -> None:
            with anyio.fail_after(timeout):
                async with stdio_client(params, errlog=err) as (read, write), ClientSession(read, write) as session:
                    await body(session)

        with open(err_file, "w") as err:
            anyio.run(main)
        ends = time.monotonic() + timeout  # a failure's bound: it ends once its client has gone
        while not code_file.exists() and time.monotonic() < ends:
            time.sleep(0.05)
        code = code_file.read_text().strip() if code_file.exists() else ""
        return WrapRun(err_file.read_text(), int(code) if code else None)


# where Docker's runsc keeps its containers' state (`runsc --root RUNSC_ROOT ps <id>` lists a gVisor
# sandbox's processes, which live in gVisor's kernel, not the host's)
RUNSC_ROOT = "/var/run/docker/runtime-runc/moby"


def held_connections() -> tuple[list[Any], Any]:
    """A ``hold`` for ``toolcage.ray.direct.Channel.call`` that keeps each connection it is given (so a test can
    break the one a call waits on), and the list it keeps them in."""
    held: list[Any] = []

    def hold(conn: Any) -> bool:
        if conn is not None:
            held.append(conn)
        return True

    return held, hold
