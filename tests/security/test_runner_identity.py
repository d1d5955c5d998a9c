"""Runners that share a hostname must never reap each other's live sandboxes (issue 21, point 3).

Two runners in separate PID and UTS namespaces (``unshare``) that set the same hostname: compose
services with ``hostname:``, CI jobs in containers, every runner in a container. The victim starts
a sandbox and waits; the attacker, in another namespace, runs the reaper and ``toolcage gc``.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from toolcage import Sandbox
from toolcage.errors import SandboxError
from toolcage.lifecycle import audit, reaper

ROOT = Path(__file__).resolve().parents[2]

VICTIM = """
import json, sys
from toolcage import Sandbox
sb = Sandbox().start()
print(json.dumps({"run_id": sb.run_id, "cid": sb.container_id}), flush=True)
sys.stdin.readline()  # the attacker has run
try:
    r = sb.call("run_python", {"code": "print(6 * 7)"})
    print(json.dumps({"ok": r.ok, "stdout": r.result["stdout"]}), flush=True)
except Exception as exc:
    print(json.dumps({"ok": False, "error": str(exc)}), flush=True)
sb.close()
"""

# the background reaper's own pass (find_orphans, then remove as "reaper"), kept to the victim's run:
# the test never removes what it did not create
ATTACKER = """
import json, sys
from toolcage.lifecycle import audit, reaper
from toolcage.engine.docker_adapter import Engine
engine = Engine.default()
found = [o for o in reaper.find_orphans(engine) if o.run_id == sys.argv[1]]
reaper.remove(engine, found, audit.shared(), by="reaper")
print(json.dumps([o.reason for o in found]), flush=True)
"""


def _in_namespace(hostname: str, argv: list[str], **kw: Any) -> subprocess.Popen[str]:
    """``argv`` as PID 1 of new PID, UTS and mount namespaces whose hostname is ``hostname``."""
    cmd = ["unshare", "--pid", "--uts", "--mount", "--fork", "--mount-proc", "sh", "-c", 'hostname "$0" && exec "$@"']
    return subprocess.Popen(
        [*cmd, hostname, *argv], cwd=ROOT, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kw
    )


@pytest.fixture
def cleanup(engine: Any) -> Iterator[list[str]]:
    """Run ids this test made: whatever is left of them is removed at the end."""
    run_ids: list[str] = []
    yield run_ids
    for c in engine.containers("toolcage.run_id"):
        if c["Labels"].get("toolcage.run_id") in run_ids:
            engine.remove(c["Id"])


def test_a_runner_with_the_same_hostname_in_another_pid_namespace_leaves_a_live_sandbox(
    engine: Any, cleanup: list[str]
) -> None:
    """A second runner with the same hostname (other PID and UTS namespaces) neither reaps nor gc's a live sandbox.

    Before: both see the owner as ``<host>:1``; the attacker's pid 1 is itself, with another start
    time, so the reaper called the owner gone ("owner pid 1 now belongs to another process") and
    removed the container; the victim's next call failed ("the worker exited unexpectedly")."""
    host = f"toolcage-test-shared-{secrets.token_hex(3)}"
    victim = _in_namespace(host, [sys.executable, "-c", VICTIM], stdin=subprocess.PIPE)
    try:
        assert victim.stdout is not None and victim.stdin is not None
        line = victim.stdout.readline()
        assert line, victim.stderr.read() if victim.stderr else ""
        started = json.loads(line)
        cleanup.append(started["run_id"])
        gc = _in_namespace(host, [sys.executable, "-m", "toolcage.cli", "gc", "--dry-run", "--json"])
        gc_out, gc_err = gc.communicate(timeout=60)
        assert gc.returncode == 0, gc_err[-2000:]
        would = [o for o in json.loads(gc_out)["would_remove"] if o["run_id"] == started["run_id"]]
        attacker = _in_namespace(host, [sys.executable, "-c", ATTACKER, started["run_id"]])
        att_out, att_err = attacker.communicate(timeout=60)
        assert attacker.returncode == 0, att_err[-2000:]
        victim.stdin.write("go\n")
        victim.stdin.flush()
        out, err = victim.communicate(timeout=120)
    finally:
        if victim.poll() is None:
            victim.kill()
            victim.wait()
    assert would == [], f"gc would remove the live sandbox: {would}"
    assert json.loads(att_out) == [], f"the reaper removed the live sandbox: {att_out}"
    assert json.loads(out.splitlines()[-1]) == {"ok": True, "stdout": "42\n"}, (out, err[-2000:])


def test_a_container_removed_from_outside_says_so_and_by_whom(engine: Any, tmp_path: Path) -> None:
    """A run whose container `toolcage gc` removed says it was removed from outside, by gc, naming the remover.

    Before: "the worker exited unexpectedly (exit code None)", which blames the worker."""
    log = audit.Audit(tmp_path / "audit.jsonl")
    with Sandbox(audit=log) as sb:
        assert sb.call("run_python", {"code": "print(1)"}).result["stdout"] == "1\n"
        cid = sb.container_id
        assert cid is not None
        victim = reaper.Orphan("container", cid, sb.name, sb.run_id, "test: removed from outside")
        reaper.remove(engine, [victim], log, by="gc")
        with pytest.raises(SandboxError) as caught:
            sb.call("run_python", {"code": "print(2)"})
    msg = caught.value.message
    assert "removed from outside" in msg and "toolcage gc" in msg, msg
    assert f"pid {os.getpid()}" in msg, msg


def test_a_container_removed_by_someone_else_says_it_was_not_this_runner(engine: Any, tmp_path: Path) -> None:
    """A run whose container was removed by a plain engine call (no audit record) says so, not "the worker exited"."""
    with Sandbox(audit=audit.Audit(tmp_path / "audit.jsonl")) as sb:
        assert sb.call("run_python", {"code": "print(1)"}).result["stdout"] == "1\n"
        assert sb.container_id is not None
        engine.remove(sb.container_id)
        with pytest.raises(SandboxError) as caught:
            sb.call("run_python", {"code": "print(2)"})
    assert "removed from outside (not by this runner)" in caught.value.message, caught.value.message
