"""The daemon's client and its checks, without a daemon process: where the socket is, which directory is trusted
with a command's environment, which request the daemon declines (another install, code changed on disk, a
command other than `run`), and that a command other than `run` never asks."""

from __future__ import annotations

import os
import socket
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from toolcage.cli import daemon, entry


def test_where_the_socket_is() -> None:
    assert entry.socket_path({"TOOLCAGE_DAEMON": "off"}) is None
    assert entry.socket_path({"TOOLCAGE_DAEMON": "OFF "}) is None
    assert entry.socket_path({"TOOLCAGE_DAEMON": "/x/d.sock"}) == "/x/d.sock"
    assert entry.socket_path({"XDG_STATE_HOME": "/s"}) == "/s/toolcage/daemon/daemon.sock"


def test_only_a_private_directory_of_this_user_is_trusted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / "d"
    home.mkdir(mode=0o700)
    assert entry.unsafe_dir(str(home / "s")) is None
    home.chmod(0o755)  # others may enter: another user's process could be reached, or sit, there
    assert "open to others" in str(entry.unsafe_dir(str(home / "s")))
    home.chmod(0o700)
    link = tmp_path / "link"
    link.symlink_to(home)
    assert "not a directory" in str(entry.unsafe_dir(str(link / "s")))
    assert "No such file" in str(entry.unsafe_dir(str(tmp_path / "none" / "s")))
    monkeypatch.setattr(os, "getuid", lambda: os.stat(home).st_uid + 1)
    assert "belongs to uid" in str(entry.unsafe_dir(str(home / "s")))


def _listener(path: str, answer: bytes) -> tuple[socket.socket, list[bytes], threading.Thread]:
    """A server at ``path`` that records what one client sends, then answers ``answer``."""
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(path)
    srv.listen(1)
    srv.settimeout(10)
    got: list[bytes] = []

    def serve() -> None:
        try:
            conn, _ = srv.accept()
        except OSError:
            return
        with conn:
            conn.settimeout(5)
            header = conn.recv(4)
            got.append(header)
            size = int.from_bytes(header, "big")
            body = b""
            while len(body) < size:
                body += conn.recv(size - len(body))
            got.append(body)
            conn.sendall(answer)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return srv, got, thread


def _asked_at(where: Path, answer: bytes, monkeypatch: pytest.MonkeyPatch) -> tuple[int | None, list[bytes]]:
    """``via_daemon`` against a listener in ``where`` that answers ``answer``: its result, and what it got."""
    path = str(where / "d.sock")
    srv, got, thread = _listener(path, answer)
    monkeypatch.setenv("TOOLCAGE_DAEMON", path)
    try:
        return entry.via_daemon(["run", "ping"]), got
    finally:
        srv.close()
        thread.join(5)


def test_a_socket_in_a_directory_open_to_others_is_never_asked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    where = tmp_path / "open"
    where.mkdir()
    where.chmod(0o777)
    status, got = _asked_at(where, b"started 1\n", monkeypatch)
    assert status is None and got == []  # not a byte of the environment went there


def test_a_declining_daemon_leaves_the_command_to_this_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    where = tmp_path / "d"
    where.mkdir(mode=0o700)
    status, got = _asked_at(where, b"declined stale\n", monkeypatch)
    assert status is None
    import json

    request = json.loads(got[1])
    assert request["op"] == "run" and request["argv"] == ["run", "ping"]
    assert request["env"]["TOOLCAGE_DAEMON"] == str(where / "d.sock")


def test_only_run_asks_the_daemon(monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[list[str]] = []
    monkeypatch.setattr(entry, "via_daemon", lambda argv: asked.append(argv))  # None: run here
    ran: list[int] = []
    import toolcage.cli.main as cli_main

    monkeypatch.setattr(cli_main, "main", lambda: ran.append(1))
    for argv in (["daemon", "stop"], ["gc"], ["image", "build"], ["run", "ping"]):
        monkeypatch.setattr(sys, "argv", ["toolcage", *argv])
        entry.main()
    assert asked == [["run", "ping"]] and ran == [1, 1, 1, 1]


def _daemon(tmp_path: Path) -> daemon.Daemon:
    d = daemon.Daemon(str(tmp_path / "d.sock"))
    code = tmp_path / "mod.py"
    code.write_text("x = 1\n")
    d.files = [str(code)]
    d.stamp = daemon.code_stamp(d.files)
    return d


def _request(d: daemon.Daemon, **over: Any) -> dict[str, Any]:
    return {"op": "run", "argv": ["run", "ping"], "env": {"A": "b"}, "umask": 0o22, "install": d.install, **over}


def test_the_daemon_declines_what_it_must_not_run(tmp_path: Path) -> None:
    d = _daemon(tmp_path)
    assert d._declined(_request(d), [3, 4, 5, 6]) == ""
    assert d._declined(_request(d, install=["/other/venv", d.root, "0.1.0"]), [3, 4, 5, 6]) == "another-install"
    assert d._declined(_request(d, argv=["daemon", "stop"]), [3, 4, 5, 6]) == "bad-argv"
    assert d._declined(_request(d, argv=["run", 1]), [3, 4, 5, 6]) == "bad-argv"
    assert d._declined(_request(d, env={"A": 1}), [3, 4, 5, 6]) == "bad-env"
    assert d._declined(_request(d), [3, 4, 5]) == "bad-request"
    assert d._declined(_request(d, umask="022"), [3, 4, 5, 6]) == "bad-request"
    assert not d.stopping


def test_a_daemon_whose_code_changed_on_disk_runs_nothing_more(tmp_path: Path) -> None:
    d = _daemon(tmp_path)
    Path(d.files[0]).write_text("x = 22\n")  # an upgrade, an edit: the size or the time differs
    assert d._declined(_request(d), [3, 4, 5, 6]) == "stale"
    assert d.stopping  # and it stops taking commands
    assert d._declined(_request(d), [3, 4, 5, 6]) == "stopping"


def test_the_stamp_covers_the_packages_own_modules_only(tmp_path: Path) -> None:
    import json as some_stdlib

    import toolcage.cli.entry as ours

    files = daemon.package_files({"a": ours, "b": some_stdlib, "c": object()}, os.path.dirname(entry.__file__))
    assert files == [ours.__file__]
    assert daemon.code_stamp([str(tmp_path / "gone.py")]) == ((-1, -1),)


def test_status_says_when_the_code_changed(tmp_path: Path) -> None:
    d = _daemon(tmp_path)
    assert d.status()["stale"] is False and d.status()["install"] == d.install[:2]
    Path(d.files[0]).write_text("x = 22\n")
    assert d.status()["stale"] is True


def _start(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, answers: list[dict[str, Any] | None]) -> Any:
    """`toolcage daemon start` against canned answers from the socket (no daemon process is started)."""
    from click.testing import CliRunner

    where = tmp_path / "d"
    where.mkdir(mode=0o700, exist_ok=True)
    monkeypatch.setenv("TOOLCAGE_DAEMON", str(where / "d.sock"))
    asked: list[str] = []

    def ask(path: str, op: str) -> dict[str, Any] | None:
        asked.append(op)
        return answers.pop(0) if answers else None

    monkeypatch.setattr(daemon, "ask", ask)
    result = CliRunner().invoke(daemon.daemon, ["start"])
    return result, asked


def test_start_refuses_the_socket_of_another_install(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    other = {"pid": 1, "install": ["/other/venv", "/other/venv/lib/toolcage"], "stale": False}
    result, asked = _start(monkeypatch, tmp_path, [other])
    assert result.exit_code != 0 and "another install" in str(result.exception) and asked == ["ping"]


def test_start_leaves_a_running_current_daemon_alone(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    mine = {"pid": 1, "install": entry.install()[:2], "stale": False}
    result, asked = _start(monkeypatch, tmp_path, [mine])
    assert result.exit_code == 0 and '"running"' in result.output and asked == ["ping"]


def test_start_replaces_a_stale_daemon(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A daemon whose code changed on disk is told to stop, and a new one is started (here: Popen faked)."""
    import subprocess

    stale = {"pid": 1, "install": entry.install()[:2], "stale": True}
    started: list[list[str]] = []

    class FakeProc:
        pid = 4242

        def __init__(self, argv: list[str], **_: Any) -> None:
            started.append(argv)

        def poll(self) -> None:
            return None

    monkeypatch.setattr(subprocess, "Popen", FakeProc)
    fresh = {"pid": 4242, "install": entry.install()[:2], "stale": False}
    result, asked = _start(monkeypatch, tmp_path, [stale, {"stopping": True}, fresh])
    assert result.exit_code == 0, result.output
    assert asked == ["ping", "stop", "ping"] and started and '"started"' in result.output


def test_start_never_orphans_a_daemon_that_is_slow_to_answer(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Something listens on the socket but does not answer (a daemon held up): no second daemon is started,
    whose new socket would leave the first unreachable."""
    import subprocess

    monkeypatch.setattr(subprocess, "Popen", lambda *a, **k: pytest.fail("a second daemon was started"))
    where = tmp_path / "d"
    where.mkdir(mode=0o700)
    busy = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    busy.bind(str(where / "d.sock"))
    busy.listen(1)
    try:
        result, asked = _start(monkeypatch, tmp_path, [None])
    finally:
        busy.close()
    assert result.exit_code != 0 and "did not answer" in str(result.exception) and asked == ["ping"]
