"""The cached workspace copy (``workspace_cache``: toolcage.engine.copycache, toolcage.worker.copyfs), attacked
from inside, on the real engine.

Threat: the run's container profile grants ``unshare`` and ``mount`` (the worker lays the overlay at boot in a
user namespace of its own); tool code using them would hold every capability in a user namespace it makes (the
kernel's large namespaced surface) and could remount the copy. Premise, checked first: in a container with that
profile and without the worker's seal, ``unshare(CLONE_NEWUSER)`` succeeds. Then, from tool code of a cached run
(a ``run_python`` child, a shell, a background process): every namespace and mount call is refused, no
capability is held, the worker's filter is stacked on the container's.

Threat: a run changing the tree later runs start from, or reaching another run of the same tree through it.
A run that writes, removes, renames and chmods in its copy leaves the next run's copy as the host's tree;
the tree under the overlay cannot be listed or written; a lock one run holds on a file of its copy is not
seen by a run beside it (each run's overlay has inodes of its own: a plain shared mount would pass it).
And: a tree changed on the host is never served stale; what the sandbox user could not read stays out of
the cached copy too; writes past limits.workspace_copy end in ENOSPC, the run lives on.
"""

from __future__ import annotations

import json
import secrets
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from toolcage import DEFAULT_IMAGE, Sandbox, wait_removed
from toolcage.engine import copycache, seccomp
from toolcage.engine.docker_adapter import Engine
from toolcage.files.treekey import key
from toolcage.policies import contract

pytestmark = pytest.mark.runc_only("a cached copy is laid under runc only: gVisor makes the copy at start")

ATTACK = r"""
import ctypes, errno, json, os
libc = ctypes.CDLL(None, use_errno=True)
def err(rc):
    return "done" if rc == 0 else errno.errorcode.get(ctypes.get_errno(), "?")
out = {}
out["unshare_user"] = err(libc.unshare(0x10000000))
out["unshare_mnt"] = err(libc.unshare(0x00020000))
out["mount_tmpfs"] = err(libc.mount(b"tmpfs", b"/scratch", b"tmpfs", 0, None))
out["remount_ws"] = err(libc.mount(b"none", b"/workspace", None, 32 | 4096, None))
out["umount_ws"] = err(libc.umount2(b"/workspace", 2))
fd = os.open("/proc/self/ns/mnt", os.O_RDONLY)
out["setns"] = err(libc.setns(fd, 0))
out["clone3"] = err(libc.syscall(435, 0, 0))
out["mincore"] = err(libc.syscall(27 if os.uname().machine == "x86_64" else 232, 0, 0, 0))
st = {l.split(":")[0]: l.split(":", 1)[1].strip() for l in open("/proc/self/status") if ":" in l}
out["caps"] = [st["CapInh"], st["CapPrm"], st["CapEff"], st["CapBnd"], st["CapAmb"]]
out["filters"], out["nnp"] = st.get("Seccomp_filters"), st["NoNewPrivs"]
for name, fn in (("list_lower", lambda: os.listdir("/opt/toolcage/copy")),
                 ("write_lower", lambda: open("/opt/toolcage/copy/planted", "w"))):
    try:
        fn(); out[name] = "done"
    except OSError as e:
        out[name] = errno.errorcode.get(e.errno, "?")
print(json.dumps(out))
"""


def _tree(root: Path) -> Path:
    (root / "d").mkdir(parents=True)
    for i in range(20):
        (root / "d" / f"f{i}").write_text(f"line {i}\n")
    (root / "keep.txt").write_text("original\n")
    secret = root / "secret.txt"
    secret.write_text("not for the sandbox\n")
    secret.chmod(0o600)
    for p in [root, *root.rglob("*")]:
        if p != secret:
            p.chmod(p.stat().st_mode | 0o005 | (0o050 if p.is_dir() else 0))
    return root


def _prime(root: Path) -> None:
    """As if the tree had been started once: its next start keeps it (a tree seen the first time is only noted)."""
    copycache.mark_seen(Engine.default(), key(root, False), copycache.path_label(root))


@pytest.fixture
def tree(tmp_path: Path) -> Iterator[Path]:
    root = _tree(tmp_path / f"ws-{secrets.token_hex(3)}")
    _prime(root)
    yield root
    wait_removed()  # (a run's container goes in the background: its volumes after it)
    engine = Engine.default()
    for v in engine.volumes(f"{copycache.LABEL_PATH}={copycache.path_label(root)}"):
        engine.remove_volume(str(v["Name"]))


def _cached(tree: Path, **kw: object) -> Sandbox:
    return Sandbox(workspace=tree, workspace_mode="copy", workspace_cache=True, **kw)  # type: ignore[arg-type]


def _lower_of(sb: Sandbox) -> str | None:
    info = Engine.default().inspect(sb.container_id or "") or {}
    return next((m.get("Name") for m in info.get("Mounts") or [] if m.get("Destination") == contract.COPY_LOWER), None)


def test_premise_the_profile_grants_the_boot_calls() -> None:
    """Without the worker's seal, a process under the cached run's profile makes a user namespace."""
    engine = Engine.default()
    name = f"toolcage-test-copyprofile-{secrets.token_hex(4)}"
    config = {
        "Image": DEFAULT_IMAGE,
        "Entrypoint": ["python3", "-S", "-c", "import ctypes; print(ctypes.CDLL(None).unshare(0x10000000))"],
        "User": "65532:65532",
        "NetworkDisabled": True,
        "HostConfig": {
            "NetworkMode": "none", "ReadonlyRootfs": True, "CapDrop": ["ALL"],
            "SecurityOpt": ["no-new-privileges", seccomp.security_opt(copy=True)], "LogConfig": {"Type": "json-file"},
        },
    }  # fmt: skip
    cid = engine.create(config, name)
    try:
        engine.start(cid)
        assert engine.wait(cid, 60) == 0
        assert engine.logs(cid).strip() == "0", "the copy profile no longer grants unshare: the premise is gone"
    finally:
        engine.remove(cid)


def test_tool_code_cannot_use_the_boot_grants(tree: Path) -> None:
    with _cached(tree) as sb:
        assert _lower_of(sb) is not None, "not a cached copy: nothing was tested"
        sb.call("write_file", {"path": "/scratch/attack.py", "content": ATTACK})
        python = json.loads(sb.call("run_python", {"code": ATTACK}).result["stdout"])
        shell = json.loads(sb.call("run_shell", {"command": "python3 /scratch/attack.py"}).result["stdout"])
        bg = sb.call("run_shell", {"command": "(python3 /scratch/attack.py > /scratch/bg.json &) ; sleep 1"})
        assert bg.ok
        for _ in range(50):
            raw = sb.call("run_shell", {"command": "cat /scratch/bg.json 2>/dev/null"}).result["stdout"]
            if raw.strip():
                break
            time.sleep(0.1)
        background = json.loads(raw)
    for got in (python, shell, background):
        for call in ("unshare_user", "unshare_mnt", "mount_tmpfs", "remount_ws", "umount_ws", "setns"):
            assert got[call] == "EPERM", (call, got)
        assert got["clone3"] == "ENOSYS" and got["mincore"] == "ENOSYS", got
        assert got["caps"] == ["0000000000000000"] * 5, got
        assert got["filters"] == "2" and got["nnp"] == "1", got
        assert got["list_lower"] in ("EACCES", "EPERM") and got["write_lower"] in ("EACCES", "EROFS", "EPERM"), got


RELAY_STATUS = r"""
import json, os
out = []
for pid in os.listdir("/proc"):
    try:
        cmd = open(f"/proc/{pid}/cmdline", "rb").read()
        if b"create_connection" in cmd:
            st = open(f"/proc/{pid}/status").read()
            out.append([l.split(":")[1].strip() for l in st.splitlines() if l.startswith("Seccomp_filters")][0])
    except (OSError, IndexError):
        pass
print(json.dumps(out))
"""


def test_the_port_relay_the_engine_execs_seals_itself_too(tree: Path) -> None:
    """The relay of an exposed port does not descend from the worker (the engine execs it): in a cached run it
    stacks the worker's filter on itself before it relays a byte (found by a helper session's attack: it ran with
    the container's filter alone, which grants unshare and mount for the worker's boot)."""
    import socket

    with _cached(tree, expose=(8000,)) as sb:
        assert _lower_of(sb) is not None
        sb.spawn("python3 -m http.server 8000 --bind 127.0.0.1 -d /workspace")
        exposed = sb.exposed()[8000]
        for _ in range(50):
            try:
                conn = socket.create_connection((exposed.host, exposed.port), timeout=5)
                conn.sendall(b"GET /keep.txt HTTP/1.0\r\n\r\n")
                reply = conn.recv(4096)
                if reply:
                    break
                conn.close()
            except OSError:
                pass
            time.sleep(0.2)
        try:
            assert b"200" in reply.split(b"\r\n")[0], reply
            found = json.loads(sb.call("run_python", {"code": RELAY_STATUS}).result["stdout"])
        finally:
            conn.close()
    assert found and all(f == "2" for f in found), found


def test_a_run_never_changes_the_tree_later_runs_start_from(tree: Path) -> None:
    with _cached(tree) as sb:
        lower = _lower_of(sb)
        assert lower is not None
        out = sb.call(
            "run_shell",
            {
                "command": "cd /workspace && echo changed > keep.txt && rm d/f1 && mv d/f2 d/moved && chmod 777 d/f3 "
                "&& echo new > planted.txt && rm -rf d/f4 && ls /workspace | sort | tr '\\n' ' '"
            },
        )
        assert out.result["exit_code"] == 0, out.result
        assert "planted.txt" in out.result["stdout"]
        assert sorted(sb.changes().added) == ["d/moved", "planted.txt"]
    with _cached(tree) as sb2:
        assert _lower_of(sb2) == lower, "the second run did not use the cache"
        got = sb2.call(
            "run_shell",
            {"command": "cd /workspace && cat keep.txt && ls d | sort | tr '\\n' ' ' && stat -c %a d/f3 && ls"},
        ).result["stdout"]
        assert got.startswith("original\n")
        assert "f1 " in got and "f2 " in got and "f4 " in got and "moved" not in got
        assert "planted.txt" not in got and "secret.txt" not in got  # withheld as without the cache
        assert " 645\n" in got, got  # d/f3's mode as on the host
        assert sb2.changes().diff == ""


def test_no_lock_crosses_two_runs_of_one_tree(tree: Path) -> None:
    hold = (
        "import fcntl, time\nf = open('/workspace/keep.txt', 'r+')\nfcntl.lockf(f, fcntl.LOCK_EX)\n"
        "open('/scratch/held', 'w').write('1')\ntime.sleep(6)\n"
    )
    probe = (
        "import fcntl, struct\nf = open('/workspace/keep.txt', 'r+')\n"
        "r = fcntl.fcntl(f, fcntl.F_GETLK, struct.pack('hhqqi', fcntl.F_WRLCK, 0, 0, 0, 0))\n"
        "print(struct.unpack('hhqqi', r)[0] == fcntl.F_UNLCK)\n"
    )
    with _cached(tree) as a, _cached(tree) as b:
        assert _lower_of(a) == _lower_of(b) is not None
        holder = threading.Thread(target=a.call, args=("run_python", {"code": hold}))
        holder.start()
        try:
            for _ in range(50):
                if a.call("run_shell", {"command": "cat /scratch/held 2>/dev/null"}).result["stdout"] == "1":
                    break
                time.sleep(0.1)
            # the premise: within the run, the lock is seen
            assert a.call("run_python", {"code": probe}).result["stdout"].strip() == "False"
            assert b.call("run_python", {"code": probe}).result["stdout"].strip() == "True"
        finally:
            holder.join()


def test_a_tree_changed_on_the_host_is_never_served_stale(tree: Path) -> None:
    """The container starts with the newest kept tree while the walk checks it: a tree changed since is filled
    as without the cache (the kept one covered all the same, and the worker sealed), then kept anew."""
    with _cached(tree) as sb:
        first = _lower_of(sb)
        assert first is not None
    (tree / "keep.txt").write_text("edited on the host\n")
    with _cached(tree) as sb:
        assert _lower_of(sb) == first  # mounted on the guess, found changed: not laid
        got = json.loads(sb.call("run_python", {"code": ATTACK}).result["stdout"])
        assert got["unshare_user"] == "EPERM" and got["filters"] == "2" and got["list_lower"] in ("EACCES", "EPERM")
        out = sb.call("run_shell", {"command": "cat /workspace/keep.txt; grep -c ' /workspace overlay' /proc/mounts"})
        assert out.result["stdout"] == "edited on the host\n0\n", out.result
        assert sb.changes().diff == ""
    with _cached(tree) as sb:
        assert _lower_of(sb) not in (None, first)  # kept anew: the second start of the changed tree
        assert sb.call("run_shell", {"command": "cat /workspace/keep.txt"}).result["stdout"] == "edited on the host\n"
        assert sb.changes().diff == ""


def test_writes_past_the_copy_limit_end_in_enospc(tree: Path) -> None:
    with _cached(tree, memory="512m") as sb:
        got = sb.call(
            "run_shell",
            {"command": "head -c 400M /dev/zero > /workspace/big; echo rc=$?; rm -f /workspace/big; echo alive"},
        ).result
        assert "rc=1" in got["stdout"] and "alive" in got["stdout"], got
        assert "No space left" in got["stderr"], got


def test_gc_copies_lists_the_cache_and_never_one_in_use(tree: Path) -> None:
    """``toolcage gc --copies`` names every cached tree no run uses (a dry run: other tests' trees stay), never
    one a run mounts; what it names, the engine removes."""
    import json as _json

    from tests.helpers import run_cli

    where = f"{copycache.LABEL_PATH}={copycache.path_label(tree)}"
    with _cached(tree) as sb:
        lower = _lower_of(sb)
        assert lower is not None
        res = run_cli("gc", "--copies", "--dry-run", "--json")
        assert res.returncode == 0, res.stderr
        listed = {o["name"] for o in _json.loads(res.stdout)["would_remove"]}
        assert lower not in listed and copycache.marker_name(_key_of(where)) not in listed  # in use: kept
    wait_removed()
    res = run_cli("gc", "--copies", "--dry-run", "--json")
    listed = {o["name"] for o in _json.loads(res.stdout)["would_remove"]}
    ours = {str(v["Name"]) for v in Engine.default().volumes(where)}
    assert len(ours) == 2 and ours <= listed, (ours, listed)
    for name in ours:
        Engine.default().remove_volume(name)
    assert (tree / "keep.txt").read_text() == "original\n"


def _key_of(where: str) -> str:
    return next(
        str(v["Labels"][copycache.LABEL])
        for v in Engine.default().volumes(where)
        if copycache.LABEL_DATA in v["Labels"]
    )
