"""Helpers the integration and security tests share: the CLI as a user runs it, and upstream
servers on a test network (hardened like the sandbox, reached by network alias)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def run_cli(
    *args: str, env: dict[str, str] | None = None, stdin: str | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """``toolcage ARGS`` from this checkout, in the repository root, with ``env`` over the environment."""
    return subprocess.run(
        [sys.executable, "-m", "toolcage.cli", *args],
        input=stdin,
        capture_output=True,
        text=True,
        cwd=ROOT,
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
    except BaseException:
        engine.remove(cid)
        raise
    return cid
