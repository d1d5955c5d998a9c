"""Tool code against the namespaces it runs in (gVisor: worker.children.namespaces) and against the worker.

Under gVisor tool code starts in user, PID and mount namespaces of its own, made by nsinit, whose
seccomp profile must allow unshare and mount for that. These attacks try to use them: a nested
user namespace in which tool code is root, then remounts, bind mounts and unmounts meant to write
the workspace or the image, or to uncover the sandbox's own /proc and with it the worker. Found
while building it: gVisor does not lock a read-only mount inherited into a new user namespace, and
with unshare and mount allowed to tool code the remount wrote to the host's workspace; nsinit now
stacks a filter that refuses them. And clone3 (which gVisor's variant must allow) still makes a
user namespace: gVisor granted a raw socket from the capability held there (the profile now
refuses raw IP sockets to everyone; and nsinit's filter answers clone3 with ENOSYS, where
the container's profile cannot). Run by both passes of the suite.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from toolcage import Sandbox

pytestmark = pytest.mark.usefixtures("no_leaks")

NESTED = r"""
import ctypes, errno, json, os
libc = ctypes.CDLL(None, use_errno=True)
out = {}
def res(rc):
    return "succeeded" if rc == 0 else errno.errorcode.get(ctypes.get_errno(), "?")
def write(path):
    try:
        with open(path, "w") as f:
            f.write("planted")
        return "written"
    except OSError as e:
        return errno.errorcode.get(e.errno, "?")
uid, gid = os.getuid(), os.getgid()
out["unshare"] = res(libc.unshare(0x10000000 | 0x20000))  # CLONE_NEWUSER | CLONE_NEWNS
if out["unshare"] == "succeeded":
    for name, line in (("setgroups", "deny"), ("uid_map", f"0 {uid} 1"), ("gid_map", f"0 {gid} 1")):
        try:
            with open(f"/proc/self/{name}", "w") as f:
                f.write(line)
        except OSError as e:
            out[name] = errno.errorcode.get(e.errno, "?")
    out["uid_inside"] = os.getuid()
MS_RDONLY, MS_REMOUNT, MS_BIND, MS_REC = 1, 32, 4096, 0x4000
out["remount_workspace_rw"] = res(libc.mount(None, b"/workspace", None, MS_REMOUNT | MS_BIND, None))
out["workspace"] = write("/workspace/planted")
os.makedirs("/scratch/ws", exist_ok=True)
out["bind_workspace"] = res(libc.mount(b"/workspace", b"/scratch/ws", None, MS_BIND | MS_REC, None))
out["remount_bind_rw"] = res(libc.mount(None, b"/scratch/ws", None, MS_REMOUNT | MS_BIND, None))
out["workspace_through_bind"] = write("/scratch/ws/planted2")
out["remount_root_rw"] = res(libc.mount(None, b"/", None, MS_REMOUNT | MS_BIND, None))
out["image"] = write("/etc/planted")
out["umount_proc"] = res(libc.umount2(b"/proc", 2))  # MNT_DETACH: uncover the sandbox's own /proc
out["mount_proc"] = res(libc.mount(b"proc", b"/proc", b"proc", 0, None))
opened = []
for p in os.listdir("/proc"):
    if not p.isdigit() or int(p) == os.getpid():
        continue
    try:
        argv = open(f"/proc/{p}/cmdline", "rb").read()
    except OSError:
        continue
    if b"toolcage.worker" in argv:
        for fd in range(0, 8):
            try:
                os.close(os.open(f"/proc/{p}/fd/{fd}", os.O_WRONLY | os.O_NONBLOCK))
                opened.append(f"{p}/{fd}")
            except OSError:
                pass
out["worker_fds_opened"] = opened
print(json.dumps(out))
"""


def test_nested_namespaces_write_nothing_and_uncover_no_worker(tmp_path: Path) -> None:
    """Root in a nested user namespace: the workspace, the image and the worker's fds stay out of reach."""
    (tmp_path / "kept.txt").write_text("original")
    tmp_path.chmod(0o777)  # writable to anyone on the host: only the mount can refuse
    with Sandbox(workspace=tmp_path) as sb:
        r = sb.call("run_python", {"code": NESTED, "timeout_s": 30})
        assert r.status == "ok", r.result
        seen = json.loads(r.result["stdout"].strip().splitlines()[-1])
        assert seen["worker_fds_opened"] == [], seen
        assert seen["workspace"] == "EROFS" and seen["image"] in ("EROFS", "EACCES"), seen
        if seen["bind_workspace"] == "succeeded":  # else /scratch/ws is a directory of scratch
            assert seen["workspace_through_bind"] == "EROFS", seen
        # refused by the profile under runc, by nsinit's stacked filter under gVisor
        for step in ("unshare", "remount_workspace_rw", "bind_workspace", "remount_root_rw", "umount_proc"):
            assert seen[step] == "EPERM", (step, seen)
        assert sb.call("ping").result == "pong"  # the worker answers as before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kept.txt"]
    assert (tmp_path / "kept.txt").read_text() == "original"


STOP_EVERYTHING = r"""
import os, signal, json
sent = []
for p in os.listdir("/proc"):
    if p.isdigit() and int(p) != os.getpid():
        for sig in (signal.SIGSTOP, signal.SIGKILL):
            try:
                os.kill(int(p), sig)
                sent.append(f"{p}:{sig.name}")
            except OSError:
                pass
for sig in (signal.SIGSTOP, signal.SIGKILL):
    try:
        os.kill(-1, sig)
        sent.append(f"-1:{sig.name}")
    except OSError:
        pass
print(json.dumps(sent))
"""


def test_signals_from_tool_code_never_stop_the_worker() -> None:
    """SIGSTOP and SIGKILL to every pid tool code can name, and to -1, leave the run answering."""
    with Sandbox() as sb:
        sb.call("run_python", {"code": "pass"})  # a zygote to hit too, where there is one
        r = sb.call("run_python", {"code": STOP_EVERYTHING, "timeout_s": 10})
        assert r.status == "ok", r.result
        for _ in range(3):
            assert sb.call("ping").result == "pong"
            after = sb.call("run_python", {"code": "print(6 * 7)"})
            assert after.status == "ok" and after.result["stdout"] == "42\n", after.result


CLONE3_RAW = r"""
import ctypes, errno, json, os, socket, struct
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
r, w = os.pipe()
args = struct.pack("QQQQQQQQ", 0x10000000, 0, 0, 0, 17, 0, 0, 0)  # clone3(CLONE_NEWUSER), SIGCHLD
pid = libc.syscall(435, ctypes.create_string_buffer(args), len(args))
if pid == 0:
    out = {}
    for name, fam, typ in (("raw", socket.AF_INET, socket.SOCK_RAW), ("raw6", socket.AF_INET6, socket.SOCK_RAW),
                           ("packet", 17, socket.SOCK_RAW)):
        try:
            socket.socket(fam, typ, 1 if fam != 17 else 0).close()
            out[name] = "opened"
        except OSError as e:
            out[name] = errno.errorcode.get(e.errno, "?")
    os.write(w, json.dumps(out).encode())
    os._exit(0)
os.close(w)
clone3 = "succeeded" if pid > 0 else errno.errorcode.get(ctypes.get_errno(), "?")
if pid > 0:
    os.waitpid(pid, 0)
print(json.dumps({"clone3": clone3, "inside": json.loads(os.read(r, 4096) or b"{}")}))
"""


def test_no_user_namespace_from_clone3() -> None:
    """clone3(CLONE_NEWUSER) answers ENOSYS: under runc by the container's profile, under gVisor by
    nsinit's stacked filter. Found there: gVisor honours the capabilities a process holds in a user
    namespace of its own beyond it: a raw socket (now refused by type in both profiles as well),
    CAP_NET_ADMIN over the sandbox's network namespace (a red-team run deleted loopback's address,
    for every later call) and no RLIMIT_NPROC (200 processes crashed the sandbox)."""
    with Sandbox() as sb:
        r = sb.call("run_python", {"code": CLONE3_RAW, "timeout_s": 30})
        assert r.status == "ok", r.result
        seen = json.loads(r.result["stdout"].strip().splitlines()[-1])
        assert seen == {"clone3": "ENOSYS", "inside": {}}, seen
        threads = "import threading\nt = threading.Thread(target=print, args=('thread',)); t.start(); t.join()"
        assert sb.call("run_python", {"code": threads}).result["stdout"] == "thread\n"  # (glibc fell back to clone)
        lo = sb.call("run_python", {"code": "import socket\nsocket.socket().bind(('127.0.0.1', 0)); print('lo')"})
        assert lo.result["stdout"] == "lo\n", lo.result


SHM_LEFT = (
    "mkdir -p /dev/shm/d/e && echo SECRET-1 > /dev/shm/d/f && mkfifo /dev/shm/d/p && echo x > /dev/shm/top"
    " && chmod 000 /dev/shm/d/e && ln -s /scratch /dev/shm/link && echo made"
)


def test_nothing_left_in_dev_shm_reaches_the_next_call() -> None:
    """Files, a FIFO, a mode-000 directory and a link left in a directory of /dev/shm are gone before
    the next call (a red-team run found the sweep unlinked only /dev/shm's top level: the directory
    and what it held stayed); the link's target is left alone."""
    with Sandbox() as sb:
        sb.call("write_file", {"path": "kept.txt", "content": "kept"})
        assert sb.call("run_shell", {"command": SHM_LEFT}).result["stdout"] == "made\n"
        r = sb.call("run_shell", {"command": "ls -A /dev/shm; cat /scratch/kept.txt"})
        assert r.result["stdout"] == "kept", r.result


@pytest.mark.parametrize("unsafe", [False, True], ids=["zygote_fork", "nsinit"])
def test_a_program_starts_with_every_signal_at_its_default(unsafe: bool) -> None:
    """What a call's program starts with, whichever way it was started (under gVisor: a fork of the
    zygote, or nsinit for unsafe_background_processes): no signal ignored. nsinit's interpreter
    ignores SIGPIPE, and an exec kept that: `kill -PIPE` did not end a shell, `yes` saw EPIPE."""
    import dataclasses

    from toolcage import load_policy

    policy = dataclasses.replace(load_policy("default"), unsafe_background_processes=unsafe)
    with Sandbox(policy) as sb:
        sb.call("run_python", {"code": "pass"})  # the zygote is up, where it is used
        r = sb.call("run_shell", {"command": "sh -c 'kill -PIPE $$'; echo $?; yes | head -c1"})
        assert r.result["stdout"] == "141\ny", r.result
        assert "Broken pipe" not in r.result["stderr"], r.result
