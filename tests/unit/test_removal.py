"""The removal helper of `toolcage run`: the command exits without waiting for a removal, and the
removals it handed off still happen, after it, in a process that holds none of its output."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

from toolcage.lifecycle import removal

# A command that hands two containers to the helper and exits. The engine is a fake whose remove()
# waits for the test's go-ahead, then records the id: the command can only have exited without
# waiting for a removal, and the test sees when the removals happen.
COMMAND = """
import sys, time
from pathlib import Path
import toolcage.engine.docker_adapter as adapter
from toolcage.lifecycle import removal

go, record = Path(sys.argv[1]), Path(sys.argv[2])

class FakeEngine:
    def remove(self, cid):
        while not go.exists():
            time.sleep(0.02)
        with record.open("a") as f:
            f.write(cid + "\\n")

adapter.Engine = FakeEngine
assert removal.start_helper()
assert removal.hand_off("c1") and removal.hand_off("c2")
print("handed off", flush=True)
if sys.argv[3:4] == ["sigkill"]:
    import os, signal
    os.kill(os.getpid(), signal.SIGKILL)  # no exit path of its own at all: the helper still removes them
"""


def _helper_pids(marker: str) -> list[int]:
    """Processes whose command line holds ``marker`` (the helper keeps the command's)."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        if marker.encode() in cmdline and int(entry) != os.getpid():
            pids.append(int(entry))
    return pids


@pytest.mark.skipif(sys.platform != "linux", reason="the helper is forked on Linux only")
@pytest.mark.parametrize("how", ["exit", "sigkill"])
def test_command_exits_first_and_the_helper_removes_what_it_was_handed(tmp_path: Path, how: str) -> None:
    """The command's exit (or its SIGKILL) waits neither for the removals nor for the helper (its output
    pipes close at once); the helper then removes every container handed to it, and ends."""
    marker = uuid.uuid4().hex
    go, record = tmp_path / "go", tmp_path / "record"
    out = subprocess.run(
        [sys.executable, "-c", COMMAND, str(go), str(record), how, marker],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == (0 if how == "exit" else -9), out.stderr
    assert out.stdout == "handed off\n" and out.stderr == ""
    assert not record.exists()  # nothing removed yet: the command did not wait for it
    assert _helper_pids(marker)  # the helper is still at work, detached
    go.touch()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and (_helper_pids(marker) or not record.exists()):
        time.sleep(0.05)
    assert record.read_text().split() == ["c1", "c2"]
    assert _helper_pids(marker) == []


def test_hand_off_without_a_helper_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """With no helper (the library, or after stop_helper) the caller removes the container itself."""
    monkeypatch.setattr(removal, "_helper_fd", None)
    assert removal.hand_off("c1") is False


def test_hand_off_to_a_helper_that_is_gone_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """A helper that died (its pipe has no reader) is not relied on: the caller removes it itself."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    monkeypatch.setattr(removal, "_helper_fd", write_end)
    try:
        assert removal.hand_off("c1") is False
    finally:
        os.close(write_end)


def test_stop_helper_keeps_removals_in_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """After stop_helper (the command was interrupted) removals are the process's own again."""
    read_end, write_end = os.pipe()
    monkeypatch.setattr(removal, "_helper_fd", write_end)
    try:
        removal.stop_helper()
        assert removal.hand_off("c1") is False
    finally:
        os.close(read_end)
        os.close(write_end)


def test_no_helper_with_threads_running() -> None:
    """A process with other threads forks no helper (a fork copies none of them, nor their locks)."""
    stop = threading.Event()
    t = threading.Thread(target=stop.wait, daemon=True)
    t.start()
    try:
        if removal._helper_fd is None:
            assert removal.start_helper() is False
            assert removal._helper_fd is None
    finally:
        stop.set()
        t.join()


def test_no_helper_outside_the_machines_pid_namespace() -> None:
    """In a PID namespace of its own (a runner container), the command removes its container itself:
    the namespace's init may exit right after the command, and the kernel would kill the helper with
    it, leaving the container behind (a runner container's script ends with the command)."""
    probe = "from toolcage.lifecycle import removal; print(removal.start_helper())"
    here = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert here.stdout.strip() == "True", here.stderr
    inside = subprocess.run(  # (a user namespace too: no root needed)
        ["unshare", "--user", "--map-root-user", "--pid", "--fork", "--mount-proc", sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert inside.stdout.strip() == "False", inside.stderr


def test_end_waits_for_the_container_to_end_by_itself_only_when_asked_then_removes_it() -> None:
    """``exit_wait_s`` (gVisor): the engine's wait first, then the removal, even when the wait failed; 0: no wait."""
    from toolcage.errors import SandboxError

    class Engine:
        def __init__(self, fail: bool = False) -> None:
            self.calls: list[tuple[str, ...]] = []
            self.fail = fail

        def wait(self, cid: str, timeout: float) -> int | None:
            self.calls.append(("wait", cid, str(timeout)))
            if self.fail:
                raise SandboxError("the engine did not answer")
            return 0

        def remove(self, cid: str) -> None:
            self.calls.append(("remove", cid))

    engine = Engine()
    removal.end(engine, "c1")
    removal.end(engine, "c2", 1.0)
    assert engine.calls == [("remove", "c1"), ("wait", "c2", "1.0"), ("remove", "c2")]
    failing = Engine(fail=True)
    removal.end(failing, "c3", 1.0)
    assert failing.calls == [("wait", "c3", "1.0"), ("remove", "c3")]
