"""The warm pool's pure pieces, without Docker: argument checks, the worker's deadline given at adoption,
and the pool's bookkeeping with local workers (``sandbox="none"``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from toolcage import Sandbox, UsageError
from toolcage.engine.labels import LABEL_POOL, RunSpec, labels
from toolcage.policies import Policy
from toolcage.pool import Pool
from toolcage.worker import deadline


def test_pool_refuses_bad_sizes_and_per_run_overrides(tmp_path: Path) -> None:
    """A pool has a positive size and idle time; a pooled Sandbox cannot bring its own workspace, image or timeout."""
    with pytest.raises(UsageError, match="size"):
        Pool(size=0, sandbox="none", audit=False)
    with pytest.raises(UsageError, match="idle_s"):
        Pool(size=1, idle_s=0, sandbox="none", audit=False)
    with Pool(size=1, sandbox="none", audit=False) as pool:
        for kw in ({"workspace": str(tmp_path)}, {"image": "other"}, {"run_timeout": 5.0}, {"keep": True}):
            with pytest.raises(UsageError, match="from its pool"):
                Sandbox(pool=pool, **kw)


def test_slot_labels_name_the_pool() -> None:
    """A slot carries toolcage.pool besides the usual run labels; a plain run does not."""
    run = RunSpec("r1", "t", "img", "default", "", 0.0, "h:1", "1")
    assert LABEL_POOL not in labels(Policy(), run)
    pooled = labels(Policy(), RunSpec("r1", "t", "img", "default", "", 0.0, "h:1", "1", pool="p9"))
    assert pooled[LABEL_POOL] == "p9" and pooled["toolcage.run_id"] == "r1"


def test_deadline_only_comes_earlier(monkeypatch: pytest.MonkeyPatch) -> None:
    """worker.deadline.arm takes a later deadline as a no-op and refuses what is not a number."""
    armed: list[float] = []

    monkeypatch.setattr(deadline, "_start", armed.append)
    monkeypatch.setattr(deadline, "_ARMED", [])
    now = time.time()
    assert deadline.arm(str(now + 100))
    assert deadline.arm(now + 200) and len(armed) == 1  # later: the earlier one holds
    assert deadline.arm(now + 10) and len(armed) == 2 and armed[-1] < armed[0]
    for bad in ("soon", True, None, "", float("nan"), float("inf")):
        assert not deadline.arm(bad)  # type: ignore[arg-type]
    assert len(armed) == 2


def _worker_env() -> dict[str, str]:
    """A worker process on the host, as a pooled slot's starts: a far deadline, no workspace."""
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "TOOLCAGE_DEADLINE": f"{time.time() + 600:.3f}",
        "TOOLCAGE_WORKSPACE": "",
        "TOOLCAGE_SCRATCH": "/tmp",
    }


def test_worker_exits_at_the_deadline_given_by_configure() -> None:
    """A worker started with a far deadline exits (124) at the earlier one sandbox.configure brings."""
    env = _worker_env()
    proc = subprocess.Popen(
        [sys.executable, "-m", "toolcage.worker"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=env,
    )
    assert proc.stdin is not None and proc.stdout is not None
    try:
        req = {"jsonrpc": "2.0", "method": "sandbox.configure", "params": {"deadline": time.time()}, "id": 1}
        proc.stdin.write((json.dumps(req) + "\n").encode())
        proc.stdin.flush()
        assert json.loads(proc.stdout.readline())["result"] == {"tools": [], "secrets": []}
        started = time.monotonic()
        assert proc.wait(timeout=10) == 124
        assert time.monotonic() - started < deadline.GRACE_S + 2
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdin.close()
        proc.stdout.close()


@pytest.mark.parametrize("sent", ["deadline alone", "as the runner sends it"])
def test_a_bare_configure_loads_nothing_and_is_taken_once(sent: str) -> None:
    """A pooled run with no secrets and no connectors is configured with its deadline (and, as the runner sends it,
    empty sources and secrets): answered without loading the connectors' module (a burst through a pool paid it
    per run; the runner's empty lists once sent every pooled run down the full path, 9 ms more to its first
    answer once its slot no longer loaded the module while it waited), and once only, as a full one."""
    from toolcage import connectors
    from toolcage.policies import Policy

    params: dict[str, object] = {"deadline": time.time() + 300}
    if sent == "as the runner sends it":
        params.update(connectors.configure_params((), True, connectors.secret_store(Policy(), None)))
    env = _worker_env()
    proc = subprocess.Popen(
        [sys.executable, "-X", "importtime", "-m", "toolcage.worker"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )
    try:
        lines = [
            {"jsonrpc": "2.0", "method": "sandbox.configure", "params": params, "id": 1},
            {"jsonrpc": "2.0", "method": "sandbox.configure", "params": {"secrets": {"A": "x" * 12}}, "id": 2},
            {"jsonrpc": "2.0", "method": "sandbox.configure", "params": {}, "id": 3},
        ]
        out, err = proc.communicate("".join(json.dumps(x) + "\n" for x in lines).encode(), timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    first, *again = (json.loads(line) for line in out.decode().splitlines())
    assert first["result"] == {"tools": [], "secrets": []}
    assert [a["error"]["message"] for a in again] == ["the sandbox is already configured"] * 2, again
    assert "toolcage.worker.connectors.host" not in err.decode()  # -X importtime lists every module imported


def test_local_pool_gives_each_run_its_own_slot(capfd: pytest.CaptureFixture[str]) -> None:
    """Each run adopts a different slot (its own id and scratch); the pool refills to its size, no further."""
    with Pool(size=2, sandbox="none", audit=False) as pool:
        assert pool.wait_ready(timeout=30)
        seen = []
        for _ in range(3):
            with pool.sandbox() as sb:
                r = sb.call("run_shell", {"command": "pwd; ls"})
                assert r.ok and r.result["stdout"].count("\n") == 1  # an empty scratch
                assert sb.call("write_file", {"path": "x", "content": "1"}).ok
                seen.append((sb.run_id, r.result["stdout"]))
            with pool._cond:
                assert len(pool._ready) + pool._starting <= 2
        assert len({s[0] for s in seen}) == 3 and len({s[1] for s in seen}) == 3
        assert pool.wait_ready(timeout=30) and pool.ready() == 2
        assert pool.adopted == 3
    assert pool.ready() == 0
