"""Small builders shared by unit tests."""

from __future__ import annotations

import subprocess
from typing import Any

from toolcage.engine.labels import RunSpec


def run_spec(**overrides: Any) -> RunSpec:
    """A RunSpec with harmless values, for tests of container_config and what reads its output."""
    base: dict[str, Any] = dict(
        run_id="abcd1234",
        tool="run_python",
        image="toolcage-worker:test",
        policy_name="default",
        started_at="2026-01-01T00:00:00Z",
        deadline=1e9,
        owner="host:1",
        owner_started="42",
    )
    base.update(overrides)
    return RunSpec(**base)


def finish_with_stdin_open(proc: subprocess.Popen[bytes], timeout: float = 20) -> tuple[bytes, bytes]:
    """Wait for the process with its stdin still open (communicate() would close it), then read its output."""
    assert proc.stdout is not None and proc.stderr is not None and proc.stdin is not None
    try:
        proc.wait(timeout)
    finally:
        proc.kill()
        proc.wait()
    out, err = proc.stdout.read(), proc.stderr.read()
    for f in (proc.stdin, proc.stdout, proc.stderr):
        f.close()
    return out, err
