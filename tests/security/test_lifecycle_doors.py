"""Doors in a run's lifecycle, on the real engine: a second ``start()``, a slot adopted late, and the audit
record that must be on disk before a container exists (issue 21, point 5)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from toolcage import Sandbox, UsageError
from toolcage import pool as pool_mod
from toolcage.lifecycle.audit import read
from toolcage.pool import Pool

pytestmark = pytest.mark.usefixtures("no_leaks")
ROOT = Path(__file__).resolve().parents[2]


def test_second_start_on_a_pooled_sandbox_is_refused(engine: Any) -> None:
    """A second start() of a pooled Sandbox is refused: it adopted another slot and orphaned the first."""
    with Pool(size=2, audit=False) as pool:
        assert pool.wait_ready(timeout=60)
        sb = pool.sandbox()
        sb.start()
        try:
            first = sb.container_id
            with pytest.raises(UsageError, match="already started"):
                sb.start()
            assert pool.adopted == 1, "a second slot was adopted"
            assert sb.container_id == first
            assert sb.call("ping").ok
        finally:
            sb.close()


def test_second_start_on_a_sandbox_is_refused(engine: Any) -> None:
    """A Sandbox is one run: start() after start() (or after close()) is refused, and the run goes on."""
    sb = Sandbox(audit=False)
    sb.start()
    try:
        with pytest.raises(UsageError, match="already started"):
            sb.start()
        assert sb.call("ping").ok
    finally:
        sb.close()
    with pytest.raises(UsageError, match="already started"):
        sb.start()


@pytest.mark.runc_only("a pooled run's deadline is the runner's clock, alike under either runtime (15 s)")
def test_a_slot_adopted_late_gets_the_whole_run(engine: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A slot that waited past its idle time (its filler busy, so nothing expired it) is not handed out with
    less life left than run_s: the run gets the whole run_s, as a fresh sandbox would."""
    pol = tmp_path / "run10.yaml"
    pol.write_text("timeouts:\n  run_s: 10\n  call_s: 30\n")
    monkeypatch.setattr(pool_mod, "SLOT_GRACE_S", 3.0)
    monkeypatch.setattr(Pool, "_expire_idle", lambda self: None)  # a filler that never gets round to it
    with Pool(pol, size=1, idle_s=1, audit=False) as pool:
        assert pool.wait_ready(timeout=60)
        time.sleep(8)  # the slot's life was idle_s + run_s + grace = 14 s from its creation; about 5 s are left
        with pool.sandbox() as sb:
            # 6 s: past the ~5 s the stale slot had left, inside what the run may give a child (toolcage.timing)
            r = sb.call("run_shell", {"command": "sleep 6; echo done", "timeout_s": 20})
            assert r.ok and r.result["stdout"] == "done\n", r


_STARTERS = {
    "sandbox": ("run.started", "from toolcage import Sandbox; Sandbox(audit=log, tool='auditfirst').start()"),
    "pool": ("pool.slot_created", "from toolcage.pool import Pool; Pool(size=1, audit=log, tool='auditfirst')"),
    "wrap": ("run.started", ""),  # toolcage mcp wrap -- sleep 60
}


@pytest.mark.usefixtures("wrap_lock")  # its wrap door makes an `mcp wrap` run (tests/conftest.py)
@pytest.mark.parametrize("door", sorted(_STARTERS))
def test_audit_record_is_on_disk_before_the_container_exists(engine: Any, tmp_path: Path, door: str) -> None:
    """A runner SIGKILLed as soon as its container appears has already written its record: for every
    container it created, the audit log names the run (the container's run id)."""
    event, start = _STARTERS[door]
    log = tmp_path / "audit.jsonl"
    script = f"import sys, time\nlog = sys.argv[1]\n{start}\ntime.sleep(60)\n"
    env = {**os.environ, "TOOLCAGE_LOG_LEVEL": "error"}
    if door == "wrap":
        cli = str(Path(sys.executable).parent / "toolcage")
        argv = [cli, "mcp", "wrap", "--audit-log", str(log), "--", "sleep", "60"]
    else:
        argv = [sys.executable, "-c", script, str(log)]
    proc = subprocess.Popen(argv, env=env, cwd=ROOT, stdin=subprocess.PIPE, stderr=subprocess.DEVNULL)
    label = "toolcage.tool=mcp-wrap" if door == "wrap" else "toolcage.tool=auditfirst"

    def its_own() -> list[dict[str, Any]]:
        return [c for c in engine.containers(label) if str(proc.pid) in c["Labels"].get("toolcage.owner", "")]

    created: dict[str, Any] | None = None
    try:
        until = time.monotonic() + 60
        while created is None and time.monotonic() < until:
            mine = its_own()
            created = mine[0] if mine else None
            time.sleep(0.005)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        assert proc.stdin is not None
        proc.stdin.close()
    assert created is not None, "the runner never created its container"
    try:
        run_id = created["Labels"]["toolcage.run_id"]
        records = [r for r in read(log) if r["event"] == event] if log.exists() else []
        assert any(r["run_id"] == run_id for r in records), json.dumps(records)
    finally:
        for c in its_own():
            engine.remove(c["Id"])
