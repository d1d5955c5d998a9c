"""Named attack cases, each run from inside a live sandbox on the real engine.

Every case asserts what was observed from inside (the attack failed) and why (the
kernel's error), so a weakened configuration turns a case red instead of passing by luck.
"""

from __future__ import annotations

import json
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from runner import Sandbox

pytestmark = pytest.mark.usefixtures("no_leaks")


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    ws = tmp_path_factory.mktemp("ws")
    # world-writable on the host: only the read-only bind mount stops writes from inside
    ws.chmod(0o777)
    (ws / "keep.txt").write_text("original\n")
    (ws / "keep.txt").chmod(0o666)
    return ws


@pytest.fixture(scope="module")
def sandbox(engine: Any, workspace: Path) -> Iterator[Sandbox]:
    with Sandbox(workspace=workspace, tool="security") as sb:
        yield sb


def probe(sb: Sandbox, code: str) -> dict[str, Any]:
    """Run python in the sandbox; the code prints one JSON object as its last line."""
    r = sb.call("run_python", {"code": textwrap.dedent(code), "timeout_s": 20})
    assert r.status == "ok", r
    return json.loads(r.result["stdout"].strip().splitlines()[-1])  # type: ignore[no-any-return]


TRY = """
import json, os, errno
def attempt(fn):
    try:
        fn()
        return "succeeded"
    except OSError as e:
        return errno.errorcode.get(e.errno, str(e.errno))
"""


CASES: list[tuple[str, str, dict[str, Any]]] = [
    ("write_root_fs", "print(json.dumps({'r': attempt(lambda: open('/etc/pwned', 'w'))}))", {"r": "EROFS"}),
    # /tmp is world-writable in the image: only the read-only root fs stops this
    ("write_world_writable_tmp", "print(json.dumps({'r': attempt(lambda: open('/tmp/pwned', 'w'))}))", {"r": "EROFS"}),
    ("write_workspace", "print(json.dumps({'r': attempt(lambda: open('/workspace/keep.txt', 'a'))}))", {"r": "EROFS"}),
    ("create_in_workspace", "print(json.dumps({'r': attempt(lambda: open('/workspace/new', 'w'))}))", {"r": "EROFS"}),
    (
        "uid_not_root",
        "print(json.dumps({'uid': os.getuid(), 'euid': os.geteuid(), 'gid': os.getgid()}))",
        {"uid": 65532, "euid": 65532, "gid": 65532},
    ),
    (
        "capabilities_all_zero",
        "s = dict(l.split(':\\t') for l in open('/proc/self/status').read().splitlines() if l.startswith('Cap'))\n"
        "print(json.dumps({k: v.strip() for k, v in s.items()}))",
        {
            "CapInh": "0000000000000000",
            "CapPrm": "0000000000000000",
            "CapEff": "0000000000000000",
            "CapBnd": "0000000000000000",
            "CapAmb": "0000000000000000",
        },
    ),
    (
        "no_new_privs_and_seccomp",
        "s = dict(l.split(':\\t') for l in open('/proc/self/status').read().splitlines() if ':\\t' in l)\n"
        "print(json.dumps({'nnp': s['NoNewPrivs'].strip(), 'seccomp': s['Seccomp'].strip()}))",
        {"nnp": "1", "seccomp": "2"},
    ),
    ("only_loopback_interface", "print(json.dumps({'ifs': sorted(os.listdir('/sys/class/net'))}))", {"ifs": ["lo"]}),
    (
        "no_route_to_metadata",
        "import socket\ns = socket.socket(); s.settimeout(3)\n"
        "print(json.dumps({'r': attempt(lambda: s.connect(('169.254.169.254', 80)))}))",
        {"r": "ENETUNREACH"},
    ),
    (
        "no_route_to_docker_gateway",
        "import socket\ns = socket.socket(); s.settimeout(3)\n"
        "print(json.dumps({'r': attempt(lambda: s.connect(('172.17.0.1', 2375)))}))",
        {"r": "ENETUNREACH"},
    ),
    (
        "no_dns",
        "import socket\ntry:\n    socket.getaddrinfo('example.com', 443); r = 'resolved'\n"
        "except socket.gaierror:\n    r = 'failed'\nprint(json.dumps({'r': r}))",
        {"r": "failed"},
    ),
    (
        "raw_socket_denied",
        "import socket\nprint(json.dumps({'r': attempt(lambda: socket.socket(socket.AF_INET, socket.SOCK_RAW, 1))}))",
        {"r": "EPERM"},
    ),
    (
        "mount_denied",
        "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        "rc = libc.mount(b'none', b'/scratch', b'tmpfs', 0, None)\n"
        "print(json.dumps({'rc': rc, 'errno': errno.errorcode[ctypes.get_errno()]}))",
        {"rc": -1, "errno": "EPERM"},
    ),
    (
        "unshare_userns_denied",
        "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\nrc = libc.unshare(0x10000000)\n"
        "print(json.dumps({'rc': rc, 'errno': errno.errorcode[ctypes.get_errno()]}))",
        {"rc": -1, "errno": "EPERM"},
    ),
    (
        "chown_denied",
        "open('/scratch/f', 'w').close()\nprint(json.dumps({'r': attempt(lambda: os.chown('/scratch/f', 0, 0))}))",
        {"r": "EPERM"},
    ),
    (
        "no_docker_socket",
        "print(json.dumps({'r': [p for p in ('/var/run/docker.sock', '/run/docker.sock', "
        "'/run/containerd/containerd.sock') if os.path.exists(p)]}))",
        {"r": []},
    ),
    (
        "no_setuid_binaries",
        "import stat\nfound = []\nfor d, _, fs in os.walk('/usr'):\n    for f in fs:\n        p = os.path.join(d, f)\n"
        "        try:\n            m = os.lstat(p).st_mode\n        except OSError:\n            continue\n"
        "        if stat.S_ISREG(m) and m & (stat.S_ISUID | stat.S_ISGID):\n            found.append(p)\n"
        "print(json.dumps({'r': found}))",
        {"r": []},
    ),
    (
        "proc_sys_read_only",
        "print(json.dumps({'r': attempt(lambda: open('/proc/sys/kernel/core_pattern', 'w'))}))",
        {"r": "EROFS"},
    ),
    (
        "sysrq_trigger_denied",
        "print(json.dumps({'r': attempt(lambda: open('/proc/sysrq-trigger', 'w'))}))",
        {"r": ("EROFS", "ENOENT", "EACCES")},
    ),  # read-only in /proc, or absent on this kernel
    (
        "own_pid_namespace",
        "print(json.dumps({'init': open('/proc/1/cmdline').read().split('\\0')[0].rsplit('/', 1)[-1]}))",
        {"init": "docker-init"},
    ),
    (
        "worker_fds_not_openable",
        "p = os.getppid()\nres = set()\nfor fd in range(0, 12):\n"
        "    res.add(attempt(lambda: open(f'/proc/{p}/fd/{fd}', 'wb')))\n"
        "res.add(attempt(lambda: open(f'/proc/{p}/mem', 'rb')))\nprint(json.dumps({'r': sorted(res)}))",
        {"r": ["EACCES"]},
    ),
    (
        "ptrace_worker_denied",
        "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\nrc = libc.ptrace(16, os.getppid(), 0, 0)\n"
        "print(json.dumps({'rc': rc, 'errno': errno.errorcode[ctypes.get_errno()]}))",
        {"rc": -1, "errno": "EPERM"},
    ),
    (
        "clean_child_environment",
        "print(json.dumps({'leak': sorted(k for k in os.environ if k.startswith('TOOLCAGE') or k == 'PYTHONPATH')}))",
        {"leak": []},
    ),
    (
        "memory_limit_visible",
        "v = None\nfor p in ('/sys/fs/cgroup/memory.max', '/sys/fs/cgroup/memory/memory.limit_in_bytes'):\n"
        "    if os.path.exists(p):\n        v = int(open(p).read())\n        break\nprint(json.dumps({'limit': v}))",
        {"limit": 512 * 1024 * 1024},
    ),
]


@pytest.mark.parametrize(("name", "code", "expected"), CASES, ids=[c[0] for c in CASES])
def test_attack_case(sandbox: Sandbox, name: str, code: str, expected: dict[str, Any]) -> None:
    """Each named attack fails inside the sandbox, for the stated kernel reason."""
    observed = probe(sandbox, TRY + code)
    assert observed.keys() == expected.keys()
    for key, want in expected.items():
        if isinstance(want, tuple):
            assert observed[key] in want, (key, observed)
        else:
            assert observed[key] == want, (key, observed)


def test_workspace_unchanged_on_host(sandbox: Sandbox, workspace: Path) -> None:
    """After every attack the host's workspace is exactly as it was."""
    sandbox.call("run_shell", {"command": "echo x >> /workspace/keep.txt; rm -f /workspace/keep.txt; true"})
    assert sorted(p.name for p in workspace.iterdir()) == ["keep.txt"]
    assert (workspace / "keep.txt").read_text() == "original\n"


def test_scratch_writable_and_capped(sandbox: Sandbox) -> None:
    """Scratch is writable, and filling it past its size fails with ENOSPC."""
    r = sandbox.call(
        "run_shell",
        {
            "command": "echo ok > /scratch/small && cat /scratch/small && "
            "dd if=/dev/zero of=/scratch/fill bs=1M count=100 2>&1; "
            "du -m /scratch/fill | cut -f1; rm -f /scratch/fill"
        },
    )
    out = r.result["stdout"]
    assert out.startswith("ok\n")
    assert "No space left on device" in out
    assert int(out.strip().splitlines()[-1]) <= 64


def test_inspect_matches_policy(sandbox: Sandbox, engine: Any) -> None:
    """docker inspect of the live container shows every CIS §5 knob the policy asks for."""
    info = engine.inspect(sandbox.container_id)
    hc = info["HostConfig"]
    assert hc["Privileged"] is False
    assert hc["ReadonlyRootfs"] is True
    assert hc["CapDrop"] == ["ALL"] and not hc.get("CapAdd")
    assert "no-new-privileges" in hc["SecurityOpt"]
    assert hc["PidsLimit"] == 64
    assert hc["Memory"] == hc["MemorySwap"] == 512 * 1024**2
    assert hc["NanoCpus"] == 1_000_000_000
    assert hc["Init"] is True
    assert not hc.get("PortBindings")
    assert hc["PidMode"] in ("", "private") and hc["IpcMode"] == "private" and hc["UTSMode"] == ""
    assert info["Config"]["User"] == "65532:65532"
    assert info["Config"]["NetworkDisabled"] is True
    assert all("docker.sock" not in m["Source"] for m in info["Mounts"])
    assert [(m["Destination"], m["RW"]) for m in info["Mounts"]] == [("/workspace", False)]
