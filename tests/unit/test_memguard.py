"""The gVisor memory split, without Docker: the host's limit (policy + a bounded headroom) and the worker's
memory guard, which ends the call past the policy's memory (worker.children.memguard), on a fake usage file."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.unit._helpers import run_spec
from toolcage.engine.hostconfig import container_config
from toolcage.engine.knobs import GVISOR, gvisor_memory_headroom
from toolcage.ops.views import inspect_findings
from toolcage.policies import load_policy
from toolcage.worker.children import memguard

FIX = Path(__file__).resolve().parent.parent / "fixtures" / "policies"
MiB = 1024**2


def test_gvisor_host_limit_is_the_policy_memory_and_a_bounded_headroom() -> None:
    """Under runsc the host's memory limit is the policy's plus 64 MiB and 1 MiB per process (at most 1 GiB
    of them), swap still equal; under runc it is the policy's own, unchanged."""
    p = load_policy(FIX / "good-small.yaml")  # 128 MiB, 32 processes
    runc = container_config(p, run_spec())["HostConfig"]
    gvisor = container_config(p, run_spec(runtime=GVISOR))["HostConfig"]
    assert runc["Memory"] == runc["MemorySwap"] == 128 * MiB
    assert gvisor["Memory"] == gvisor["MemorySwap"] == (128 + 64 + 32) * MiB
    assert gvisor_memory_headroom(32768) == gvisor_memory_headroom(1024) == (64 + 1024) * MiB


def test_doctor_takes_the_gvisor_headroom_and_no_more() -> None:
    """inspect_findings passes a gVisor sandbox as configured and flags a memory limit above the headroom."""
    cfg = container_config(load_policy("default"), run_spec(runtime=GVISOR))
    hc = {**cfg["HostConfig"], "PidMode": "", "UTSMode": "", "UsernsMode": ""}
    info = {"Name": "/toolcage-t-r", "Config": {k: v for k, v in cfg.items() if k != "HostConfig"}, "HostConfig": hc}
    assert inspect_findings(info) == []
    hc["Memory"] = hc["MemorySwap"] = hc["Memory"] + MiB
    assert any("memory" in f for f in inspect_findings(info))


@pytest.fixture
def usage_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """memguard reading a file this test writes, as if under gVisor."""
    path = tmp_path / "memory.usage_in_bytes"
    path.write_text(f"{10 * MiB}\n")
    monkeypatch.setenv("TOOLCAGE_TOOL_NAMESPACES", "1")
    monkeypatch.setattr(memguard, "USAGE", str(path))
    yield path


def _group() -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], start_new_session=True)


def _ended(proc: subprocess.Popen[bytes], within: float) -> int | None:
    try:
        return proc.wait(within)
    except subprocess.TimeoutExpired:
        return None


def test_a_call_past_the_budget_is_killed_and_told(usage_file: Path) -> None:
    """Under the budget the call lives; past it its group is SIGKILLed and release() says the guard did it;
    a call the guard never killed is released as not killed."""
    assert memguard.enabled() and memguard.usage() == 10 * MiB
    calm, bomb = _group(), _group()
    try:
        memguard.watch(calm.pid, 100 * MiB)
        assert _ended(calm, 0.3) is None
        assert memguard.release(calm.pid) is False
        memguard.watch(bomb.pid, 100 * MiB)
        usage_file.write_text(f"{101 * MiB}\n")
        assert _ended(bomb, 5) == -9
        assert memguard.release(bomb.pid) is True and memguard.release(bomb.pid) is False
        assert (memguard.peak() or 0) >= 101 * MiB
    finally:
        usage_file.write_text("0\n")
        for p in (calm, bomb):
            p.kill()
            p.wait()


def test_of_two_calls_the_one_holding_more_is_the_victim(usage_file: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With several calls live, the guard kills the one whose processes (the call's first and its descendants)
    hold the most resident memory, as the kernel's OOM killer picks the largest under runc; the other lives,
    also while the victim's memory is still being freed after its first process was reaped."""
    small, big = _group(), _group()
    try:
        # big's child (pid 999999) holds the memory, not big itself
        fake = ({small.pid: 1, big.pid: 1, 999999: big.pid}, {small.pid: 500, big.pid: 100, 999999: 1000})
        monkeypatch.setattr(memguard, "_processes", lambda: fake)
        memguard.watch(small.pid, 100 * MiB)
        memguard.watch(big.pid, 100 * MiB)
        usage_file.write_text(f"{200 * MiB}\n")
        assert _ended(big, 5) == -9
        assert memguard.release(big.pid) is True  # reaped, and the usage not down yet: no second victim
        time.sleep(0.3)
        usage_file.write_text(f"{50 * MiB}\n")  # its memory freed
        time.sleep(0.2)
        assert small.poll() is None
        assert memguard.release(small.pid) is False
    finally:
        usage_file.write_text("0\n")
        for p in (small, big):
            p.kill()
            p.wait()


def test_not_under_gvisor_the_guard_is_off(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without the tool namespaces (runc, --sandbox none) there is no guard and no peak from it."""
    monkeypatch.delenv("TOOLCAGE_TOOL_NAMESPACES", raising=False)
    assert not memguard.enabled() and memguard.peak() is None
