"""Attacks from inside a live sandbox on the host side: a host socket in the workspace,
symlinks swapped under the file tools, paths too long to be paths (real engine)."""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import toolcage.workspace
from toolcage import Sandbox
from toolcage.errors import WorkspaceError

pytestmark = pytest.mark.usefixtures("no_leaks")


@pytest.fixture
def host_socket(tmp_path: Path) -> Iterator[Path]:
    """A project directory holding a Unix socket a host service answers on (like an ssh-agent or a dev server)."""
    ws = tmp_path / "proj"
    ws.mkdir()
    ws.chmod(0o755)
    (ws / "README").write_text("project\n")
    (ws / "README").chmod(0o644)
    path = ws / "agent.sock"
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(str(path))
    path.chmod(0o777)
    srv.listen(4)
    srv.settimeout(0.2)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except OSError:
                continue
            with conn:
                conn.sendall(b"host-secret-from-agent\n")

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    yield ws
    stop.set()
    t.join(2)
    srv.close()


def test_host_socket_in_workspace_refused_before_any_container(engine: Any, host_socket: Path) -> None:
    """A workspace holding a Unix socket is refused, naming the socket, before a container exists.

    Before the fix the sandbox (no network at all) connected to /workspace/agent.sock and read
    the host service's answer: connect() works through a read-only bind mount.
    """
    label = "toolcage.tool=sec-socket"  # its own runs only: other test processes start theirs meanwhile (-n)
    before = {c["Id"] for c in engine.containers(label)}
    with pytest.raises(WorkspaceError, match=r"agent\.sock"):
        Sandbox(workspace=host_socket, tool="sec-socket")
    assert {c["Id"] for c in engine.containers(label)} <= before


def test_premise_host_socket_answers_through_read_only_mount(
    engine: Any, host_socket: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Why the check exists: with it bypassed (today's code had none), the sandbox, which has no
    network, connects to the host socket through the read-only bind mount and reads its answer."""

    monkeypatch.setattr(toolcage.workspace, "validate_workspace", lambda p: Path(p).resolve())
    code = (
        "import socket\ns = socket.socket(socket.AF_UNIX)\ns.connect('/workspace/agent.sock')\n"
        "print(s.recv(100).decode(), end='')"
    )
    with Sandbox(workspace=host_socket, tool="sec-socket") as sb:
        r = sb.call("run_python", {"code": code})
    assert r.result["stdout"] == "host-secret-from-agent\n", r


_SWAPPER = r"""
import os, sys, time
os.makedirs('/scratch/d/sub', exist_ok=True)
if os.fork():
    print('started')
    sys.exit(0)
os.setsid()
os.chdir('/scratch')
end = time.time() + {seconds}
while time.time() < end:
    # the file: a regular file, then a symlink to /etc/hostname, swapped atomically
    with open('t_reg', 'w') as f:
        f.write('inside\n')
    os.rename('t_reg', 'd/x')
    os.symlink('/etc/hostname', 't_lnk')
    os.rename('t_lnk', 'd/x')
    # the directory: a real one, then a symlink to /etc
    try:
        os.rmdir('d/sub')
        os.symlink('/etc', 'd/sub')
        os.unlink('d/sub')
    except OSError:
        pass
    os.makedirs('d/sub', exist_ok=True)
"""


def test_symlink_swap_in_scratch_never_leaks(engine: Any) -> None:
    """A leftover process swapping symlinks to /etc/hostname and /etc under scratch never makes
    grep, read_file or list_files return anything from outside the roots.

    Before the fix grep returned the container's /etc/hostname labelled as /scratch/d/x, and
    list_files listed /etc through the swapped directory.
    """
    with Sandbox(tool="sec-swap") as sb:
        hostname = sb.call("run_shell", {"command": "cat /etc/hostname"}).result["stdout"].strip()
        assert hostname
        r = sb.call("run_python", {"code": _SWAPPER.replace("{seconds}", "25")})
        assert r.result["stdout"] == "started\n", r
        leaks: list[str] = []
        for _ in range(300):
            g = sb.call("grep", {"pattern": ".", "path": "/scratch/d"})
            if g.status == "ok":
                leaks += [m["text"] for m in g.result["matches"] if hostname in m["text"]]
            f = sb.call("read_file", {"path": "/scratch/d/x"})
            if f.status == "ok":
                assert f.result["content"] == "inside\n", f
            else:
                assert f.error is not None and f.error["code"] in (-32001, -32002), f
            ls = sb.call("list_files", {"path": "/scratch/d", "recursive": True})
            if ls.status == "ok":
                names = {os.path.basename(e["path"]) for e in ls.result["entries"]}
                assert not names & {"hostname", "passwd", "os-release"}, ls.result
        assert not leaks, leaks[:3]


def test_planted_symlink_refused_or_skipped(engine: Any) -> None:
    """A symlink to /etc/hostname planted in scratch is refused by read_file, skipped by grep, and
    listed (not followed) by list_files."""
    with Sandbox(tool="sec-link") as sb:
        sb.call(
            "run_shell",
            {"command": "mkdir -p /scratch/p && echo in > /scratch/p/ok && ln -s /etc/hostname /scratch/p/h"},
        )
        f = sb.call("read_file", {"path": "/scratch/p/h"})
        assert f.error is not None and f.error["code"] == -32002, f
        g = sb.call("grep", {"pattern": ".", "path": "/scratch/p"})
        assert [m["path"] for m in g.result["matches"]] == ["/scratch/p/ok"], g
        ls = sb.call("list_files", {"path": "/scratch/p"})
        assert {e["path"]: e["type"] for e in ls.result["entries"]} == {
            "/scratch/p/h": "symlink",
            "/scratch/p/ok": "file",
        }


@pytest.mark.parametrize(
    ("tool", "params"),
    [
        ("read_file", {"path": "a" * 6000}),
        ("list_files", {"path": "/scratch/" + "b" * 300}),
        ("grep", {"pattern": "x", "path": "c/" * 3000}),
        ("write_file", {"path": "d" * 6000, "content": "x"}),
        ("read_file", {"path": "\ud800"}),
    ],
    ids=["read_6000", "list_component_300", "grep_6000", "write_6000", "lone_surrogate"],
)
def test_unusable_paths_are_params_errors(engine: Any, tool: str, params: dict[str, Any]) -> None:
    """A path too long (6,000 characters, or a component over 255 bytes) or not encodable is -32602
    naming the field, never an internal error (-32603 before the fix)."""
    with Sandbox(tool="sec-long") as sb:
        r = sb.call(tool, params)
    assert r.error is not None and r.error["code"] == -32602, r
    assert "path" in str(r.error.get("data")), r
