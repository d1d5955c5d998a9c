"""Named isolation probes, run inside a live sandbox: by ``toolcage doctor --probe`` and the security tests.

Each probe runs code in the sandbox and compares what it observed with what the kernel
must answer if the isolation holds, so a weakened configuration shows up as a failure.
"""

from __future__ import annotations

import json
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from toolcage.policies import codes

NO_WORKER = "no worker process visible"
TRY = """
import json, os, errno
def attempt(fn):
    try:
        fn()
        return "succeeded"
    except OSError as e:
        return errno.errorcode.get(e.errno, str(e.errno))
NO_WORKER = "@NO_WORKER@"
def worker_pids(main=False):
    # the worker and its zygote (main: the worker alone), as this process sees them (none in a PID
    # namespace of its own)
    found = []
    for p in os.listdir("/proc"):
        if p.isdigit() and int(p) != os.getpid():
            try:
                argv = open(f"/proc/{p}/cmdline", "rb").read().split(b"\\0")
            except OSError:
                continue
            ours = any(a.startswith(b"toolcage.worker") for a in argv)
            if ours and (not main or argv[3:4] == [b"toolcage.worker"]):
                found.append(int(p))
    return sorted(found)
""".replace("@NO_WORKER@", NO_WORKER)

# (name, what it shows, python code printing one JSON object, expected values; a tuple means "one of")
CODE_CASES: list[tuple[str, str, str, dict[str, Any]]] = [
    (
        "write_root_fs",
        "the root file system is read-only",
        "print(json.dumps({'r': attempt(lambda: open('/etc/pwned', 'w'))}))",
        {"r": "EROFS"},
    ),
    (
        "write_world_writable_tmp",
        "even world-writable dirs of the image are read-only",
        "print(json.dumps({'r': attempt(lambda: open('/tmp/pwned', 'w'))}))",
        {"r": "EROFS"},
    ),
    (
        "create_in_workspace",
        "the workspace is read-only",
        "print(json.dumps({'r': attempt(lambda: open('/workspace/new', 'w'))}))",
        {"r": "EROFS"},
    ),
    (
        "uid_not_root",
        "code runs as uid/gid 65532",
        "print(json.dumps({'uid': os.getuid(), 'euid': os.geteuid(), 'gid': os.getgid()}))",
        {"uid": 65532, "euid": 65532, "gid": 65532},
    ),
    (
        "capabilities_all_zero",
        "no capabilities in any set",
        # every Cap* line /proc/self/status shows is zero (gVisor shows no CapAmb line)
        "s = dict(l.split(':\\t') for l in open('/proc/self/status').read().splitlines() if l.startswith('Cap'))\n"
        "print(json.dumps({'nonzero': sorted(k for k, v in s.items() if int(v, 16)),\n"
        "                  'shown': all(k in s for k in ('CapInh', 'CapPrm', 'CapEff', 'CapBnd'))}))",
        {"nonzero": [], "shown": True},
    ),
    (
        "no_new_privs_and_seccomp",
        "no_new_privs is set and a seccomp filter is active",
        # asked of the kernel (PR_GET_NO_NEW_PRIVS, PR_GET_SECCOMP): gVisor's status has no such lines
        "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        "print(json.dumps({'nnp': libc.prctl(39, 0, 0, 0, 0), 'seccomp': libc.prctl(21, 0, 0, 0, 0)}))",
        {"nnp": 1, "seccomp": 2},
    ),
    (
        "only_loopback_interface",
        "no network interface but lo",
        "import socket\ntry:\n    ifs = os.listdir('/sys/class/net')\n"
        "except FileNotFoundError:  # gVisor has no /sys/class/net: ask the kernel\n"
        "    ifs = [name for _, name in socket.if_nameindex()]\nprint(json.dumps({'ifs': sorted(ifs)}))",
        {"ifs": ["lo"]},
    ),
    (
        "no_route_to_metadata",
        "the cloud metadata address is unreachable",
        "import socket\ns = socket.socket(); s.settimeout(3)\n"
        "print(json.dumps({'r': attempt(lambda: s.connect(('169.254.169.254', 80)))}))",
        {"r": "ENETUNREACH"},
    ),
    (
        "no_route_to_docker_gateway",
        "the host's docker0 address is unreachable",
        "import socket\ns = socket.socket(); s.settimeout(3)\n"
        "print(json.dumps({'r': attempt(lambda: s.connect(('172.17.0.1', 2375)))}))",
        {"r": "ENETUNREACH"},
    ),
    (
        "no_dns",
        "names do not resolve (no DNS exfiltration)",
        "import socket\ntry:\n    socket.getaddrinfo('exfil-probe.invalid', 443); r = 'resolved'\n"
        "except socket.gaierror:\n    r = 'failed'\nprint(json.dumps({'r': r}))",
        {"r": "failed"},
    ),
    (
        "raw_socket_denied",
        "raw sockets are refused (no CAP_NET_RAW)",
        "import socket\nprint(json.dumps({'r': attempt(lambda: socket.socket(socket.AF_INET, socket.SOCK_RAW, 1))}))",
        {"r": "EPERM"},
    ),
    (
        "mount_denied",
        "mount(2) is refused",
        "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        "rc = libc.mount(b'none', b'/scratch', b'tmpfs', 0, None)\n"
        "print(json.dumps({'rc': rc, 'errno': errno.errorcode[ctypes.get_errno()]}))",
        {"rc": -1, "errno": "EPERM"},
    ),
    (
        "unshare_userns_denied",
        "new user namespaces are refused",
        "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\nrc = libc.unshare(0x10000000)\n"
        "print(json.dumps({'r': 'succeeded' if rc == 0 else errno.errorcode[ctypes.get_errno()]}))",
        {"r": "EPERM"},
    ),
    (
        "chown_denied",
        "chown is refused (no CAP_CHOWN)",
        "open('/scratch/f', 'w').close()\nprint(json.dumps({'r': attempt(lambda: os.chown('/scratch/f', 0, 0))}))",
        {"r": "EPERM"},
    ),
    (
        "no_docker_socket",
        "no container engine socket is reachable",
        "print(json.dumps({'r': [p for p in ('/var/run/docker.sock', '/run/docker.sock', "
        "'/run/containerd/containerd.sock') if os.path.exists(p)]}))",
        {"r": []},
    ),
    (
        "no_setuid_binaries",
        "the image has no setuid/setgid binaries",
        "import stat\nfound = []\nfor d, _, fs in os.walk('/usr'):\n    for f in fs:\n        p = os.path.join(d, f)\n"
        "        try:\n            m = os.lstat(p).st_mode\n        except OSError:\n            continue\n"
        "        if stat.S_ISREG(m) and m & (stat.S_ISUID | stat.S_ISGID):\n            found.append(p)\n"
        "print(json.dumps({'r': found}))",
        {"r": []},
    ),
    (
        "proc_sys_read_only",
        "/proc/sys is read-only",
        "print(json.dumps({'r': attempt(lambda: open('/proc/sys/kernel/core_pattern', 'w'))}))",
        {"r": "EROFS"},
    ),
    (
        "sysrq_trigger_denied",
        "/proc/sysrq-trigger cannot be written",
        "print(json.dumps({'r': attempt(lambda: open('/proc/sysrq-trigger', 'w'))}))",
        {"r": ("EROFS", "ENOENT", "EACCES")},
    ),
    (
        "worker_is_init",
        "the worker itself is PID 1 of the sandbox's own PID namespace (no docker-init holding the stream)",
        "print(json.dumps({'init': 'the call itself' if os.getpid() == 1 else "
        "open('/proc/1/cmdline').read().split('\\0')[:4]}))",
        # the worker image's worker, or in a user's own image the runtime's (toolcage.engine.runtime.ENTRYPOINT)
        {
            "init": (
                ["python3", "-S", "-m", "toolcage.worker"],
                ["/opt/toolcage/rt/bin/python3", "-S", "-m", "toolcage.worker"],
            )
        },
    ),
    (
        "init_fds_not_openable",
        "tool code cannot open the worker's stdio (the protocol stream), environment or memory through /proc",
        "res = set()\nfor w in worker_pids():\n    for fd in (0, 1, 2):\n        for mode in ('rb', 'wb'):\n"
        "            res.add(attempt(lambda: open(f'/proc/{w}/fd/{fd}', mode)))\n"
        "    for f in ('environ', 'mem', 'maps'):\n"
        "        res.add(attempt(lambda: open(f'/proc/{w}/{f}', 'rb').read(1)))\n"
        "print(json.dumps({'r': sorted(res) or [NO_WORKER]}))",
        {"r": ["EACCES"]},
    ),
    (
        "ptrace_init_denied",
        "tool code cannot ptrace the worker",
        "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\nres = set()\nfor w in worker_pids() or [1]:\n"
        "    rc = libc.ptrace(16, w, 0, 0)\n    res.add(errno.errorcode[ctypes.get_errno()] if rc else 'succeeded')\n"
        "print(json.dumps({'r': sorted(res)}))",
        {"r": ["EPERM"]},
    ),
    (
        "worker_fds_not_openable",
        "tool code cannot open any file descriptor or the memory of the worker",
        "res = set()\nfor w in worker_pids():\n    for fd in range(0, 12):\n"
        "        res.add(attempt(lambda: open(f'/proc/{w}/fd/{fd}', 'wb')))\n"
        "    res.add(attempt(lambda: open(f'/proc/{w}/mem', 'rb')))\n"
        "print(json.dumps({'r': sorted(res) or [NO_WORKER]}))",
        {"r": ["EACCES"]},
    ),
    (
        "signals_to_worker_refused",
        "tool code cannot stop or kill the worker (PID 1 of the sandbox)",
        "import signal, time\nres = set()\nfor w in worker_pids(main=True):\n"
        "    res.add(attempt(lambda: os.kill(w, signal.SIGSTOP)))\n    time.sleep(0.2)\n"
        "    state = open(f'/proc/{w}/stat').read().rsplit(')', 1)[1].split()[0]\n"
        "    res.add('stopped' if state in 'Tt' else 'running')\n    os.kill(w, signal.SIGCONT)\n"
        "print(json.dumps({'r': sorted(res) or [NO_WORKER]}))",
        # the kernel lets the signal be sent (no error) and drops it, as for any namespace's init
        {"r": ["running", "succeeded"]},
    ),
    (
        "openat2_allowed",
        "openat2 is available, so the file tools resolve paths beneath their root (RESOLVE_BENEATH)",
        "import ctypes, struct\nlibc = ctypes.CDLL(None, use_errno=True)\nhow = struct.pack('QQQ', 0, 0, 0x08)\n"
        "fd = libc.syscall(437, -100, b'.', how, len(how))\n"
        "print(json.dumps({'r': 'succeeded' if fd >= 0 else errno.errorcode[ctypes.get_errno()]}))",
        {"r": "succeeded"},
    ),
    (
        "clean_child_environment",
        "tool code sees no toolcage internals in its environment",
        "print(json.dumps({'leak': sorted(k for k in os.environ if k.startswith('TOOLCAGE') and k != 'TOOLCAGE_PROXY' "
        "or k == 'PYTHONPATH')}))",
        {"leak": []},
    ),
]


# Calls toolcage's seccomp profile denies (toolcage.engine.seccomp), each tried with arguments that work
# under Docker's default profile or without one, so EPERM here means the profile is applied.
# Syscall numbers per architecture: (x86_64, aarch64).
_SYSCALL = """
import ctypes, platform
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
def sys_errno(numbers, *args):
    nr = numbers[0] if platform.machine() in ('x86_64', 'amd64') else numbers[1]
    rc = libc.syscall(nr, *[ctypes.c_long(a) if isinstance(a, int) else a for a in args])
    return 'succeeded' if rc >= 0 else errno.errorcode.get(ctypes.get_errno(), str(ctypes.get_errno()))
"""
SECCOMP_CASES: list[tuple[str, str, str]] = [
    ("ptrace", "ptrace(PTRACE_TRACEME)", "sys_errno((101, 117), 0, 0, 0, 0)"),
    ("process_vm_readv", "process_vm_readv on itself", "sys_errno((310, 270), os.getpid(), 0, 0, 0, 0, 0)"),
    ("process_vm_writev", "process_vm_writev", "sys_errno((311, 271), os.getpid(), 0, 0, 0, 0, 0)"),
    ("pidfd_getfd", "taking another process's fd with pidfd_getfd", "sys_errno((438, 438), 0, 0, 0)"),
    ("io_uring_setup", "io_uring_setup", "sys_errno((425, 425), 1, ctypes.create_string_buffer(120))"),
    ("userfaultfd", "userfaultfd (user-mode only)", "sys_errno((323, 282), 1)"),
    ("perf_event_open", "perf_event_open", "sys_errno((298, 241), 0, 0, -1, -1, 0)"),
    ("bpf", "bpf", "sys_errno((321, 280), 0, 0, 0)"),
    ("keyctl", "keyctl(KEYCTL_GET_KEYRING_ID)", "sys_errno((250, 219), 0, -3, 0)"),
    ("add_key", "add_key", "sys_errno((248, 217), b'user', b'k', b'v', 1, -3)"),
    ("request_key", "request_key", "sys_errno((249, 218), b'user', b'k', 0, 0)"),
    ("personality", "a persona other than the default (PER_LINUX32)", "sys_errno((135, 92), 8)"),
    ("socket_af_alg", "the kernel crypto socket family AF_ALG", "sys_errno((41, 198), 38, 5, 0)"),
]  # fmt: skip
for _name, _what, _call in SECCOMP_CASES:
    CODE_CASES.append(
        (
            f"seccomp_denies_{_name}",
            f"seccomp denies {_what}",
            _SYSCALL + f"print(json.dumps({{'r': {_call}}}))",
            {"r": "EPERM"},
        )
    )


_OWN_PIDNS = (
    "tool code runs in a PID namespace of its own (worker.children.namespaces), where gVisor's procfs and signals "
    "would reach the worker: it has no pid there to open or signal"
)
# Where gVisor's kernel answers with another errno but the same wall holds: (what it answers, why).
# Only these; any other difference under gVisor is a failure.
GVISOR_ANSWERS: dict[str, tuple[dict[str, Any], str]] = {
    "write_root_fs": (
        {"r": ("EROFS", "EACCES")},
        "gVisor checks the mode bits before the read-only mount (root's /etc); write_world_writable_tmp proves it",
    ),
    "create_in_workspace": (
        {"r": ("EROFS", "EACCES")},
        "gVisor checks the mode bits before the read-only mount; a world-writable workspace answers EROFS",
    ),
    "no_route_to_metadata": ({"r": ("ENETUNREACH", "EHOSTUNREACH")}, "gVisor's netstack has no route: EHOSTUNREACH"),
    "no_route_to_docker_gateway": (
        {"r": ("ENETUNREACH", "EHOSTUNREACH")},
        "gVisor's netstack has no route: EHOSTUNREACH",
    ),
    "proc_sys_read_only": ({"r": ("EROFS", "EACCES")}, "gVisor's /proc/sys refuses writes by mode (EACCES)"),
    "worker_is_init": (
        {"init": "the call itself"},
        "tool code runs as PID 1 of a PID namespace of its own (worker.children.namespaces): the worker has no pid",
    ),
    "chown_denied": ({"r": "EINVAL"}, "uid 0 has no mapping in the tool's user namespace (worker.children.namespaces)"),
    "init_fds_not_openable": ({"r": [NO_WORKER]}, _OWN_PIDNS),
    "worker_fds_not_openable": ({"r": [NO_WORKER]}, _OWN_PIDNS),
    "signals_to_worker_refused": ({"r": [NO_WORKER]}, _OWN_PIDNS),
    "openat2_allowed": (
        {"r": ("succeeded", "ENOSYS", "EPERM")},
        "no openat2 under gVisor: the file tools resolve beneath their root component by component (O_NOFOLLOW)",
    ),
}


def expected_for(name: str, expected: dict[str, Any], kind: str) -> tuple[dict[str, Any], str]:
    """The answers that prove ``name`` under sandbox ``kind``, and why they differ from runc's ("" if not)."""
    if kind == "gvisor" and name in GVISOR_ANSWERS:
        return GVISOR_ANSWERS[name]
    return expected, ""


@dataclass(frozen=True)
class ProbeResult:
    name: str
    what: str
    passed: bool
    observed: Any
    note: str = ""  # why the runtime's answer differs from runc's and still proves the wall


def check(observed: dict[str, Any], expected: dict[str, Any]) -> bool:
    if observed.keys() != expected.keys():
        return False
    return all(observed[k] in v if isinstance(v, tuple) else observed[k] == v for k, v in expected.items())


def run_code_probe(sb: Any, code: str) -> dict[str, Any]:
    r = sb.call("run_python", {"code": textwrap.dedent(TRY + code), "timeout_s": 20})
    if r.status != "ok":
        return {"error": r.status, "stderr": (r.result or {}).get("stderr", "")[-300:]}
    return dict(json.loads(r.result["stdout"].strip().splitlines()[-1]))


def _limit_probes(sb: Any) -> list[tuple[str, str, Callable[[], tuple[bool, Any]]]]:
    policy = sb.policy
    mem = policy.limits.memory

    def memory() -> tuple[bool, Any]:
        # the call ends, not the sandbox: under gVisor too (the worker's memory guard, worker.children.memguard)
        code = f"b = bytearray({mem + 64 * 1024 * 1024})\nb[::4096] = b'x' * len(b[::4096])"
        r = sb.call("run_python", {"code": code, "timeout_s": 30})
        return r.status == "oom_killed", r.status

    def child_oom() -> tuple[bool, Any]:
        # a child that asks to go first (oom_score_adj 1000) ends alone, and its call goes on: under gVisor
        # too, where the memory guard picks the victim as Linux's OOM killer does. The child holds what it took
        # for a few seconds: the guard reads the usage every few ms, and a child that exits at once on a loaded
        # host (the guard's thread not scheduled meanwhile) was gone before it was seen, once in a full pass
        code = (
            "import os, signal, time\npid = os.fork()\nif pid == 0:\n"
            "    with open('/proc/self/oom_score_adj', 'w') as f:\n        f.write('1000')\n"
            f"    b = b'x' * {mem + 64 * 1024 * 1024}\n    time.sleep(5)\n    os._exit(0)\n"
            "s = os.waitpid(pid, 0)[1]\nprint(signal.Signals(os.WTERMSIG(s)).name if os.WIFSIGNALED(s) else s)"
        )
        r = sb.call("run_python", {"code": code, "timeout_s": 30})
        seen = (r.result or {}).get("stdout", "").strip()
        return r.status == "ok" and seen == "SIGKILL", f"{r.status}: {seen}"

    def pids() -> tuple[bool, Any]:
        # processes that share nothing with the prober (spawned, not forked: under gVisor 64 forked
        # interpreters would meet the memory limit before the process limit)
        code = (
            "import subprocess\nn, kids = 0, []\ntry:\n    for _ in range(100000):\n"
            "        kids.append(subprocess.Popen(['sleep', '5']))\n        n += 1\n"
            "except OSError as e:\n    print(n, e.errno)\n"
        )
        r = sb.call("run_python", {"code": code, "timeout_s": 20})
        out = (r.result or {}).get("stdout", "").split()
        ok = len(out) == 2 and int(out[0]) < policy.limits.pids and out[1] == "11"  # EAGAIN
        return ok, out

    def egress() -> tuple[bool, Any]:
        r = sb.call("http_fetch", {"url": "http://169.254.169.254/latest/meta-data/"})
        return bool(r.error and r.error.get("code") == codes.EGRESS_DENIED), (r.error or {}).get("message")

    def smuggling() -> tuple[bool, Any]:
        # a bare-LF head: the proxy must refuse it (400) before deciding anything
        code = (
            "import socket\ns = socket.create_connection(('127.0.0.1', 3128), timeout=10)\n"
            "s.sendall(b'GET http://probe.invalid/ HTTP/1.1\\nHost: probe.invalid\\n\\n')\n"
            "print(s.recv(200).split(b'\\r\\n')[0].decode(errors='replace'))"
        )
        r = sb.call("run_python", {"code": code, "timeout_s": 20})
        line = (r.result or {}).get("stdout", "").strip()
        return line.startswith("HTTP/1.1 400"), line or (r.result or {}).get("stderr", "")[-200:]

    probes = [
        ("pids_limit_fires", f"forking stops below the pids limit ({policy.limits.pids}) with EAGAIN", pids),
        ("egress_refuses_metadata", "http_fetch to the metadata address is refused by policy", egress),
    ]
    if policy.network.mode == "proxy":
        probes.append(("egress_refuses_smuggling", "the egress proxy refuses a bare-LF request head (400)", smuggling))
    probes.append(("memory_limit_fires", f"allocating past {mem} bytes ends as oom_killed", memory))
    probes.append(("memory_child_ends_alone", "a child past the memory limit is killed, its call goes on", child_oom))
    return probes


def run_all(sb: Any) -> list[ProbeResult]:
    results = []
    kind = getattr(sb, "kind", "container")
    for name, what, code, expected in CODE_CASES:
        seen = run_code_probe(sb, code)
        want, note = expected_for(name, expected, kind)
        results.append(ProbeResult(name, what, check(seen, want), seen, note if seen != expected else ""))
    for name, what, fn in _limit_probes(sb):
        try:
            ok, observed = fn()
        except Exception as exc:  # a sandbox failure is a failed probe, with its reason
            ok, observed = False, f"{type(exc).__name__}: {exc}"
        results.append(ProbeResult(name, what, ok, observed))
    return results
