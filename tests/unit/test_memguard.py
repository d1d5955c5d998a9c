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
    """Under runsc the host's memory limit is the policy's plus 128 MiB and 2 MiB per process (at most 1 GiB
    of them), swap still equal; under runc it is the policy's own, unchanged."""
    p = load_policy(FIX / "good-small.yaml")  # 128 MiB, 32 processes
    runc = container_config(p, run_spec())["HostConfig"]
    gvisor = container_config(p, run_spec(runtime=GVISOR))["HostConfig"]
    assert runc["Memory"] == runc["MemorySwap"] == 128 * MiB
    assert gvisor["Memory"] == gvisor["MemorySwap"] == (128 + 128 + 2 * 32) * MiB
    assert gvisor_memory_headroom(32768) == gvisor_memory_headroom(512) == (128 + 1024) * MiB


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


def _fake_proc(monkeypatch: pytest.MonkeyPatch, procs: dict[int, tuple[int, int]], adj: dict[int, int]) -> None:
    """The guard's view of /proc: each pid's (parent, resident pages) and oom_score_adj."""
    monkeypatch.setattr(memguard, "_processes", lambda: procs)
    monkeypatch.setattr(memguard, "_adj", lambda pid: adj.get(pid, 0))


def test_the_victim_is_the_process_the_kernel_would_choose(monkeypatch: pytest.MonkeyPatch) -> None:
    """Among every process of the watched calls (never the worker's): the highest oom_score_adj first, else the
    biggest, scored as Linux's oom_badness; a value below the worker's own counts as the worker's."""
    budget, pages = 100 * MiB, 100 * MiB // memguard.PAGE
    # call 10 (its child 11, grandchild 12), call 20 (child 21); 5 is the worker's own, 7 an orphan of none
    tree = {10: (1, 100), 11: (10, 300), 12: (11, 200), 20: (1, 250), 21: (20, 50), 5: (1, 9999), 7: (1, 9000)}
    monkeypatch.setattr(memguard, "_watched", {10, 20})
    _fake_proc(monkeypatch, tree, {})
    assert memguard._victim(budget, 0) == (11, 10, 300)  # the biggest, in a call that is not the biggest's group
    _fake_proc(monkeypatch, tree, {21: 1000})
    assert memguard._victim(budget, 0) == (21, 20, 50)  # adj 1000: chosen though the smallest
    _fake_proc(monkeypatch, tree, {12: 5})
    assert memguard._victim(budget, 0) == (12, 10, 200)  # 200 + 5 * pages / 1000 > 300
    assert 200 + 5 * pages // 1000 > 300
    _fake_proc(monkeypatch, tree, {11: -1000, 10: -1000})
    assert memguard._victim(budget, 0) == (11, 10, 300)  # no call makes itself immune: the worker's 0 is the floor
    assert memguard._victim(budget, -1000) == (20, 20, 250)  # (where the worker's own is -1000, the kernel's rule)
    monkeypatch.setattr(memguard, "_watched", set())
    assert memguard._victim(budget, 0) is None


def test_a_child_past_the_budget_ends_alone_and_its_call_goes_on(usage_file: Path) -> None:
    """The biggest process is a child of the call's main process: only the child is SIGKILLed, the main process
    lives, release() says the guard killed a process of the call, and the kill is counted."""
    code = (
        "import subprocess, sys, time\n"
        "c = subprocess.Popen([sys.executable, '-c', 'import time; b = b\"x\" * (64 << 20); time.sleep(30)'])\n"
        "print(c.pid, flush=True)\nprint(c.wait(), flush=True)\ntime.sleep(30)"
    )
    main = subprocess.Popen([sys.executable, "-c", code], start_new_session=True, stdout=subprocess.PIPE, text=True)
    try:
        assert main.stdout is not None
        child = int(main.stdout.readline())
        time.sleep(0.5)  # its 64 MiB resident
        before = memguard.kills()
        memguard.watch(main.pid, 100 * MiB)
        time.sleep(0.3)  # the guard read the usage under the budget: a new episode (no kill before it counts)
        usage_file.write_text(f"{101 * MiB}\n")
        assert main.stdout.readline().strip() == "-9", child  # the child died of SIGKILL, its parent saw it
        usage_file.write_text(f"{50 * MiB}\n")
        time.sleep(0.2)
        assert main.poll() is None
        assert memguard.release(main.pid) is True and memguard.kills() == before + 1
    finally:
        usage_file.write_text("0\n")
        main.kill()
        main.wait()
        if main.stdout is not None:
            main.stdout.close()


def test_not_under_gvisor_the_guard_is_off(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without the tool namespaces (runc, --sandbox none) there is no guard and no peak from it."""
    monkeypatch.delenv("TOOLCAGE_TOOL_NAMESPACES", raising=False)
    assert not memguard.enabled() and memguard.peak() is None


def test_a_dead_childs_memory_counts_as_freed_when_the_usage_falls_or_soon_after(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """After a child (not a call's first process) is killed, the next victim may come as soon as that child is
    dead and its pages are back (the usage fell by half of what it held), or _FREED_S after its death: a fixed
    second let a call's other allocators reach the host's limit (gVisor's CI pass, forked bomb)."""
    alive = {True}
    monkeypatch.setattr(memguard, "_alive", lambda pid: True in alive)
    dying: list[float] = [11, 200 * MiB, 40 * MiB, 0.0]
    assert not memguard._freed(dying, 150 * MiB, 10.0)  # still alive: whatever the usage says
    alive.clear()
    assert not memguard._freed(dying, 190 * MiB, 10.0)  # dead, its pages not back yet
    assert dying[3] == 10.0
    assert memguard._freed(dying, 175 * MiB, 10.01)  # fell by half of its 40 MiB
    assert memguard._freed(dying, 199 * MiB, 10.0 + memguard._FREED_S)  # or dead long enough


def test_after_a_kill_a_bystander_dies_only_for_memory_it_allocates(
    usage_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A call's first process killed, its pages slow to come back (the usage flat above the budget for longer
    than _SETTLE_S, as under CI's load): the call beside it lives; it is chosen only when the usage grows GROW
    past its lowest since the kill (someone allocates now), as the kernel's OOM killer runs when an allocation
    fails (gVisor's CI pass: the sleeper beside a forked bomb died)."""
    calm, bomb = _group(), _group()
    tree = {bomb.pid: (1, 10_000), calm.pid: (1, 100)}
    monkeypatch.setattr(memguard, "_processes", lambda: dict(tree))
    try:
        memguard.watch(bomb.pid, 100 * MiB)
        memguard.watch(calm.pid, 100 * MiB)
        time.sleep(0.3)  # the guard read the usage under the budget
        usage_file.write_text(f"{150 * MiB}\n")
        assert _ended(bomb, 5) == -9
        del tree[bomb.pid]
        time.sleep(memguard._SETTLE_S + 1.0)  # flat at 150 MiB, the dead call's pages not back
        assert calm.poll() is None
        usage_file.write_text(f"{150 * MiB + memguard.GROW + MiB}\n")  # now someone allocates
        assert _ended(calm, 5) == -9
        assert memguard.release(bomb.pid) is True and memguard.release(calm.pid) is True
    finally:
        usage_file.write_text("0\n")
        for p in (calm, bomb):
            p.kill()
            p.wait()


def test_after_a_calls_first_process_is_killed_growth_ends_the_wait(
    usage_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A call's first process killed (its PID namespace ends with it), then the usage grows GROW past its lowest
    since: a process of that call that still runs (gVisor slow to end the namespace) is the next victim at once,
    not after _SETTLE_S, and the call beside it lives (a forked bomb in a loaded run reached the host's limit)."""
    first, child, calm = _group(), _group(), _group()
    tree = {first.pid: (1, 10_000), child.pid: (first.pid, 5_000), calm.pid: (1, 100)}
    monkeypatch.setattr(memguard, "_processes", lambda: dict(tree))
    try:
        memguard.watch(first.pid, 100 * MiB)
        memguard.watch(calm.pid, 100 * MiB)
        time.sleep(0.3)  # the guard read the usage under the budget: a new episode
        usage_file.write_text(f"{150 * MiB}\n")
        assert _ended(first, 5) == -9
        del tree[first.pid]
        started = time.monotonic()
        usage_file.write_text(f"{150 * MiB + memguard.GROW + MiB}\n")  # its namespace's child allocates on
        assert _ended(child, 5) == -9
        assert time.monotonic() - started < memguard._SETTLE_S * 0.8  # the old rule waited the whole second
        assert calm.poll() is None
    finally:
        usage_file.write_text("0\n")
        for p in (first, child, calm):
            p.kill()
            p.wait()
        memguard.release(first.pid)
        memguard.release(calm.pid)
