"""`toolcage daemon`: `toolcage run` through the resident process is the same run as in a process of its own
(its streams, directory, environment, exit status and audit records), and every way a run can end early
still removes its sandbox (a Ctrl-C, a client killed, the daemon killed). Host-side: the sandbox is the same."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bench import daemon as bench_daemon
from tests.helpers import ROOT, run_cli

pytestmark = pytest.mark.runc_only("the daemon is host-side: the sandbox it starts is the same under any runtime")


def _cli(*args: str, env: dict[str, str], cwd: Path | str = ROOT, stdin: str | None = None) -> Any:
    return run_cli(*args, env=env, cwd=cwd, stdin=stdin)


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[dict[str, str]]:
    """A daemon of this test's own (a short socket path: a Unix socket's is at most 107 bytes); its env."""
    with bench_daemon.running() as env:
        yield {**env, "TOOLCAGE_AUDIT_LOG": str(tmp_path / "a.jsonl")}


def _status(env: dict[str, str]) -> dict[str, Any]:
    out = _cli("daemon", "status", env=env)
    assert out.returncode == 0, out.stderr
    return dict(json.loads(out.stdout))


def test_a_run_through_the_daemon_is_the_run_of_its_own_process(daemon: dict[str, str], tmp_path: Path) -> None:
    """The client's directory (a relative --workspace), its stdin (--params -), its environment (the audit log's
    path) and its exit status all reach the command; the daemon served it (its count) and ran nothing stale."""
    from toolcage.lifecycle.audit import read, verify

    work = tmp_path / "ws"
    work.mkdir()
    (work / "hello.txt").write_text("hi from the client's directory")
    params = json.dumps({"code": "print(open('/workspace/hello.txt').read())"})
    out = _cli("run", "run_python", "--workspace", ".", "--params", "-", env=daemon, cwd=work, stdin=params)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["result"]["stdout"] == "hi from the client's directory\n"
    assert _status(daemon)["commands_served"] == 1
    log = Path(daemon["TOOLCAGE_AUDIT_LOG"])
    assert [r["event"] for r in read(log) if r["event"] != "gc.removed"] == ["run.started", "run.call", "run.finished"]
    assert verify(log) == []

    bad = _cli("run", "run_python", "--params", "{not json", env=daemon)  # a usage error: 2, said on stderr
    assert bad.returncode == 2 and "params" in bad.stderr and _status(daemon)["commands_served"] == 2
    # word for word what the command says in a process of its own, the program's name in a usage error too
    for args in (["run", "run_python", "--params", "{not json"], ["run", "--no-such-flag"]):
        through, alone = _cli(*args, env=daemon), _cli(*args, env={**daemon, "TOOLCAGE_DAEMON": "off"})
        assert (through.returncode, through.stdout, through.stderr) == (alone.returncode, alone.stdout, alone.stderr)
        assert "Try 'python -m toolcage.cli run --help'" in alone.stderr or args[1] != "--no-such-flag"
    assert _status(daemon)["commands_served"] == 4

    stopped = _cli("daemon", "stop", env=daemon)
    assert json.loads(stopped.stdout)["status"] == "stopping"
    assert not os.path.exists(daemon["TOOLCAGE_DAEMON"])  # it takes no command from now on
    alone = _cli("run", "run_python", "--params", '{"code": "print(5)"}', env=daemon)  # runs in its own process
    assert alone.returncode == 0 and json.loads(alone.stdout)["result"]["stdout"] == "5\n"
    assert json.loads(_cli("daemon", "status", env=daemon).stdout)["status"] == "not running"


def _sleeping_run(env: dict[str, str], engine: Any) -> tuple[subprocess.Popen[str], str]:
    """A `toolcage run` through the daemon that sleeps; its container's name, once it runs (the audit record
    of its start comes before the container)."""
    from toolcage.lifecycle.audit import read

    proc = subprocess.Popen(
        [
            *(sys.executable, "-m", "toolcage.cli", "run", "run_python", "--call-s", "300", "--run-s", "300"),
            *("--params", '{"code": "import time; time.sleep(300)"}'),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env=env,
    )
    log = Path(env["TOOLCAGE_AUDIT_LOG"])
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        started = [r for r in read(log) if r["event"] == "run.started"] if log.exists() else []
        if started and engine.inspect(started[-1]["name"]) is not None:
            return proc, str(started[-1]["name"])
        time.sleep(0.1)
    proc.kill()
    raise AssertionError("the run did not start")


def _gone(engine: Any, name: str, within: float = 20) -> bool:
    """Whether the container goes within ``within`` s: far sooner than its call's own end (300 s)."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if engine.inspect(name) is None:
            return True
        time.sleep(0.2)
    return False


def test_a_ctrl_c_reaches_the_command_and_removes_its_sandbox(daemon: dict[str, str], engine: Any) -> None:
    proc, name = _sleeping_run(daemon, engine)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "SIGINT: removing the sandbox" in err
    assert _gone(engine, name)


def test_a_killed_client_stops_its_command(daemon: dict[str, str], engine: Any) -> None:
    """The command's process is not the client's: the daemon sees the client go and stops the command."""
    proc, name = _sleeping_run(daemon, engine)
    proc.kill()
    proc.communicate(timeout=30)
    assert _gone(engine, name)
    deadline = time.monotonic() + 30
    while _status(daemon)["commands_running"] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _status(daemon)["commands_running"] == 0


def test_a_killed_daemon_stops_its_commands(daemon: dict[str, str], engine: Any) -> None:
    """The command dies with the daemon (PR_SET_PDEATHSIG: SIGTERM, the sandbox removed); the client says so."""
    pid = _status(daemon)["pid"]
    proc, name = _sleeping_run(daemon, engine)
    os.kill(pid, signal.SIGKILL)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 3 and "the toolcage daemon ended during the command" in err
    assert _gone(engine, name)
