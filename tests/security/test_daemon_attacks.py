"""Attacks on `toolcage daemon` from another local user and from hostile clients: a process of another uid
posing as the daemon (to be handed a command's environment, its secrets, and streams), a process of another
uid asking the daemon to run commands, and requests made to wedge or leak the daemon. Each runs against a
real daemon or a real `toolcage run` client; none needs a container."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench import daemon as bench_daemon
from tests.helpers import ROOT, run_cli

pytestmark = pytest.mark.runc_only("the daemon and its socket are host-side: no sandbox is involved")
NOBODY = 65534


def _python_for_others() -> str:
    """A Python that uid 65534 may run: every directory on its real path and the file itself open to others."""
    for candidate in ("/usr/bin/python3", "/usr/local/bin/python3", shutil.which("python3") or "", sys.executable):
        real = os.path.realpath(candidate) if candidate else ""
        if not real or not os.path.isfile(real):
            continue
        parts = [real, *[p for p in Path(real).parents]]
        if all(os.stat(p).st_mode & 0o001 for p in parts):
            return real
    pytest.fail("no Python on this host that another user (uid 65534) may run: these tests need one")


def _need_root() -> None:
    if os.geteuid() != 0:
        pytest.fail("these tests act as another user (uid 65534) and need root")


def _cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return run_cli(*args, env=env)


@pytest.fixture
def private_dir() -> Iterator[str]:
    where = tempfile.mkdtemp(prefix="tc-daemon-")  # 0700, this user's
    try:
        yield where
    finally:
        shutil.rmtree(where, ignore_errors=True)


# binds as root in the private directory, then becomes another user before it listens: the uid its socket
# reports (SO_PEERCRED) is that user's. It prints how many bytes a client sent it.
IMPOSTOR = textwrap.dedent(
    """
    import os, socket, sys
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(sys.argv[1])
    os.chmod(sys.argv[1], 0o666)
    os.setgid(65534); os.setuid(65534)
    srv.listen(1)
    print("listening", flush=True)
    srv.settimeout(20)
    got = 0
    try:
        conn, _ = srv.accept()
        conn.settimeout(3)
        conn.sendall(b"started 1\\n")
        while True:
            chunk = conn.recv(65536)
            if not chunk:
                break
            got += len(chunk)
    except OSError:
        pass
    print(got, flush=True)
    """
)


def test_an_impostor_of_another_user_is_handed_nothing(private_dir: str) -> None:
    """A process of another uid listening where the daemon would (say, a socket left in a directory that was
    once shared): the client checks the listener's uid and tells it nothing; the command runs in-process."""
    _need_root()
    path = os.path.join(private_dir, "d.sock")
    impostor = subprocess.Popen([sys.executable, "-c", IMPOSTOR, path], stdout=subprocess.PIPE, text=True)
    try:
        assert impostor.stdout is not None and impostor.stdout.readline().strip() == "listening"
        env = {**os.environ, "TOOLCAGE_DAEMON": path, "SECRET_TOKEN": "do-not-send"}
        out = _cli("run", "no_such_tool", "--sandbox", "none", env=env)
        assert out.returncode == 2 and "unknown tool" in out.stderr  # answered by this process itself
        got, _ = impostor.communicate(timeout=30)
    finally:
        impostor.kill()
    assert got.strip() == "0"  # connected, checked and left: not a byte of the environment


@pytest.fixture
def daemon(private_dir: str) -> Iterator[tuple[dict[str, str], int]]:
    """A daemon with its socket in ``private_dir``: its env and pid."""
    with bench_daemon.running(private_dir) as env:
        yield env, int(json.loads(_cli("daemon", "status", env=env).stdout)["pid"])


ASK = textwrap.dedent(
    """
    import json, os, socket, sys
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(10)
    s.connect(sys.argv[1])
    body = json.dumps({"op": sys.argv[2], "argv": ["run", "ping"], "env": {}, "umask": 18}).encode()
    try:
        s.sendall(len(body).to_bytes(4, "big") + body)
        print(repr(s.recv(4096)), flush=True)
    except (BrokenPipeError, ConnectionResetError):  # closed before or with the request unread: refused too
        print(repr(b""), flush=True)
    """
)


def test_the_daemon_serves_no_other_user(daemon: tuple[dict[str, str], int], private_dir: str) -> None:
    """Even with its socket opened to everyone (a misconfiguration), a process of another uid is refused
    before a byte is read: neither a status, nor a stop, nor a command."""
    _need_root()
    env, pid = daemon
    path = env["TOOLCAGE_DAEMON"]
    os.chmod(private_dir, 0o711)
    os.chmod(path, 0o666)
    try:
        for op in ("ping", "stop", "run"):
            out = subprocess.run(
                [_python_for_others(), "-c", ASK, path, op], capture_output=True, text=True, timeout=30, user=NOBODY
            )
            assert out.stdout.strip() == "b''", (op, out.stdout, out.stderr)  # closed, unanswered
    finally:
        os.chmod(private_dir, 0o700)
    status = json.loads(_cli("daemon", "status", env=env).stdout)
    assert status["status"] == "running" and status["pid"] == pid and status["commands_served"] == 0
    assert "refused a client of another user" in Path(private_dir, "daemon.log").read_text()


def _fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def _raw(path: str, data: bytes, fds: list[int] | None = None) -> bytes:
    import array

    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(15)
        s.connect(path)
        if fds:
            s.sendmsg([data[:4]], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds).tobytes())])
            data = data[4:]
        out = b""
        try:
            s.sendall(data)
            s.shutdown(socket.SHUT_WR)
            while chunk := s.recv(4096):
                out += chunk
        except (ConnectionResetError, BrokenPipeError):  # closed with the request unread: refused
            pass
        return out


def _frame(obj: object) -> bytes:
    body = json.dumps(obj).encode()
    return len(body).to_bytes(4, "big") + body


def test_hostile_requests_leave_the_daemon_serving_and_leak_nothing(daemon: tuple[dict[str, str], int]) -> None:
    env, pid = daemon
    path = env["TOOLCAGE_DAEMON"]
    before = _fds(pid)
    devnull = os.open(os.devnull, os.O_RDONLY)
    try:
        assert _raw(path, (2**31).to_bytes(4, "big") + b"{") == b""  # a 2 GiB request: refused, never read
        assert _raw(path, _frame("not an object")) == b""
        assert _raw(path, b"\x00\x00\x00\x05{nope") == b""
        assert _raw(path, b"\x00\x00") == b""  # ends inside its header
        assert _raw(path, _frame({"op": "ping"}), fds=[devnull] * 9) == b""  # more descriptors than a command has
        install = json.loads(_cli("daemon", "status", env=env).stdout)
        assert install["status"] == "running"
        # a command other than `run` (the daemon runs nothing else), and one with four descriptors but a bad env
        import toolcage

        mine = [sys.prefix, os.path.dirname(os.path.abspath(toolcage.__file__)), toolcage.__version__]
        run = {"op": "run", "argv": ["daemon", "stop"], "env": {}, "umask": 18, "install": mine}
        assert _raw(path, _frame(run), fds=[devnull] * 4) == b"declined bad-argv\n"
        run.update(argv=["run", "ping"], env={"A": ["b"]})
        assert _raw(path, _frame(run), fds=[devnull] * 4) == b"declined bad-env\n"
        nested = "[" * 200_000 + "]" * 200_000  # past the JSON parser's depth: a RecursionError, not a ValueError
        assert _raw(path, len(nested).to_bytes(4, "big") + nested.encode()) == b""
        # a client trickling its request a byte a second holds the daemon for its read bound (5 s in all), no
        # longer: the bound is on the whole request, not on each read
        import threading

        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as slow:
            slow.connect(path)

            def trickle() -> None:
                for byte in _frame({"op": "ping", "pad": "x" * 20})[:30]:
                    try:
                        slow.send(bytes([byte]))
                    except OSError:
                        return
                    time.sleep(1)

            threading.Thread(target=trickle, daemon=True).start()
            time.sleep(0.5)
            t0 = time.monotonic()
            status = _cli("daemon", "status", env=env)
            assert json.loads(status.stdout)["status"] == "running"
            assert time.monotonic() - t0 < 10, time.monotonic() - t0  # the trickle alone would take 30 s
    finally:
        os.close(devnull)
    deadline = time.monotonic() + 5
    while _fds(pid) != before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _fds(pid) == before  # every descriptor it was sent is closed again
    assert json.loads(_cli("daemon", "status", env=env).stdout)["commands_served"] == 0


# Found by an attack on the first version, which checked the uid alone: a process of this user confined
# beyond it (capabilities dropped, no_new_privs, another mount namespace, a container) asked the daemon, and
# its command ran with the daemon's rights and namespaces. `--sandbox none` makes the command a host
# process, so what it prints is where it ran.
SHOW = json.dumps({"command": "grep -E '^(CapEff|NoNewPrivs)' /proc/self/status; readlink /proc/self/ns/mnt"})


@pytest.mark.parametrize(
    "confine",
    [
        ["setpriv", "--inh-caps=-all", "--bounding-set=-all"],  # every capability dropped
        ["setpriv", "--no-new-privs"],
        ["unshare", "--mount"],  # a mount namespace of its own
    ],
    ids=["capabilities", "no-new-privs", "mount-namespace"],
)
def test_a_client_confined_beyond_its_uid_is_not_run_with_the_daemons_rights(
    daemon: tuple[dict[str, str], int], confine: list[str]
) -> None:
    _need_root()
    env, _ = daemon
    cmd = [*confine, sys.executable, "-m", "toolcage.cli"]
    run = [*cmd, "run", "run_shell", "--sandbox", "none", "--params", SHOW]
    confined = subprocess.run(run, capture_output=True, text=True, timeout=120, env=env, cwd=ROOT)
    alone = subprocess.run(
        run, capture_output=True, text=True, timeout=120, env={**env, "TOOLCAGE_DAEMON": "off"}, cwd=ROOT
    )
    assert confined.returncode == 0, confined.stderr
    said = json.loads(confined.stdout)["result"]["stdout"].splitlines()
    cold = json.loads(alone.stdout)["result"]["stdout"].splitlines()
    assert said[:-1] == cold[:-1]  # it ran as the client, confined: its capabilities, its no_new_privs
    # and in the client's mount namespace. Each `unshare --mount` makes a new one, so the two runs' need not have
    # the same inode (a freed namespace's number is reused only when nothing took it meanwhile, which a loaded
    # pass breaks): the confined run's is not the daemon's (the host's) but, unshared, one of its own
    daemon_mnt = os.readlink(f"/proc/{daemon[1]}/ns/mnt")
    assert said[-1] != daemon_mnt or confine[0] != "unshare", (said, daemon_mnt)
    assert (said[-1] == daemon_mnt) == (cold[-1] == daemon_mnt), (said, cold, daemon_mnt)
    status = json.loads(subprocess.run([*cmd, "daemon", "status"], capture_output=True, text=True, env=env).stdout)
    assert status["commands_served"] == 0 and status["serves_you"] is False, status
    assert "differ from the daemon's" in status["why_not"]
    refused = subprocess.run([*cmd, "daemon", "stop"], capture_output=True, text=True, env=env)
    assert refused.returncode == 2 and "will not be stopped from this process" in refused.stderr
    assert json.loads(_cli("daemon", "status", env=env).stdout)["serves_you"] is True  # as the daemon is: served


ESCAPE = textwrap.dedent(
    """
    import array, json, os, socket, sys
    path = sys.argv[1]
    s = socket.socket(socket.AF_UNIX)
    s.connect(path)
    b = json.dumps({"op": "ping"}).encode()
    s.sendall(len(b).to_bytes(4, "big") + b)
    status = json.loads(s.recv(65536).decode().partition(" ")[2])
    s.close()
    request = {"op": "run", "argv": ["run", "run_shell", "--sandbox", "none", "--params",
               json.dumps({"command": "echo ESCAPED"})],
               "env": {"PATH": "/usr/bin:/bin"}, "umask": 18, "install": status["install"] + [status["version"]]}
    b = json.dumps(request).encode()
    b = len(b).to_bytes(4, "big") + b
    cwd = os.open("/", os.O_RDONLY | os.O_DIRECTORY)
    s = socket.socket(socket.AF_UNIX)
    s.connect(path)
    s.sendmsg([b[:4]], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [0, 1, 2, cwd]).tobytes())])
    s.sendall(b[4:])
    print("ANSWER", s.recv(200).decode().strip(), flush=True)
    """
)


def test_a_container_of_the_same_uid_cannot_have_the_daemon_run_a_host_command(
    daemon: tuple[dict[str, str], int], private_dir: str, engine: object
) -> None:
    """A container (every capability dropped, as a sandbox's) running as the daemon's uid, with the socket's
    directory mounted (a dev container with $HOME bind-mounted, say): the daemon declines it."""
    from toolcage import DEFAULT_IMAGE

    env, _ = daemon
    name = f"toolcage-test-daemon-escape-{os.getpid()}"
    out = subprocess.run(
        ["docker", "run", "--rm", "--name", name, "--network", "none", "--cap-drop", "ALL",
         "--security-opt", "no-new-privileges", "-u", f"{os.getuid()}:{os.getgid()}",
         "-v", f"{private_dir}:{private_dir}", "--entrypoint", "python3",
         os.environ.get("TOOLCAGE_IMAGE", DEFAULT_IMAGE), "-c", ESCAPE, env["TOOLCAGE_DAEMON"]],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert "ESCAPED" not in out.stdout, out.stdout
    assert "ANSWER declined confined:" in out.stdout, (out.stdout, out.stderr)
    assert json.loads(_cli("daemon", "status", env=env).stdout)["commands_served"] == 0
