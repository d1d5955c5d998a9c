"""The run_python fast path (a fork of the zygote per call): nothing of one call reaches the next.

Each case runs, on the real engine, a call that attacks the zygote or leaves state behind, then a
second call that looks for it. The zygote must be in use (checked first), and whatever the first
call did, the second one starts as a fresh `python3 -c` would: the worker's limits, priority and
affinity, no module, thread, fd, env or signal state of the first call, and no copy of its code.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Iterator
from typing import Any

import pytest

from toolcage import Sandbox

pytestmark = pytest.mark.usefixtures("no_leaks")

FIND_ZYGOTE = """
import os
def zygote():
    for p in os.listdir('/proc'):
        if p.isdigit() and int(p) not in (1, os.getpid()):
            try:
                cmd = open(f'/proc/{p}/cmdline', 'rb').read()
            except OSError:
                continue
            if b'The zygote: a ready Python interpreter' in cmd:
                return int(p)
    return None
"""


def run(sb: Sandbox, code: str) -> dict[str, Any]:
    r = sb.call("run_python", {"code": code})
    assert r.result is not None, r
    return dict(r.result)


def out(sb: Sandbox, code: str) -> Any:
    res = run(sb, code)
    assert res["exit_code"] == 0, res
    return json.loads(res["stdout"])


def warm(sb: Sandbox) -> int:
    """A call, then idle time for the worker to (re)start the zygote; its pid, seen from a child.
    Under gVisor a child runs in a PID namespace of its own (worker.children.namespaces) where the zygote has
    no pid: the worker's own report (sandbox.usage) shows the fast path is in use, and the child
    must not find it. The attacks below then cannot even name it."""
    run(sb, "pass")
    time.sleep(0.3)
    pid = out(sb, FIND_ZYGOTE + "import json\nprint(json.dumps(zygote()))")
    if sb.kind == "gvisor":
        assert pid is None, f"a call's child found the zygote ({pid}) from its own PID namespace"
        pid = sb.call("sandbox.usage").result["zygote_pid"]
    assert isinstance(pid, int), "the fast path is not in use: these cases would prove nothing"
    return pid


@pytest.fixture
def sandbox(engine: Any) -> Iterator[Sandbox]:
    with Sandbox(tool="security-zygote", audit=False) as sb:
        yield sb


def test_fast_path_is_used_and_looks_like_python_c(sandbox: Sandbox) -> None:
    """A fast-path child is what `python3 -c` is: argv, path, a clean __main__, fds 0-2 only, own group."""
    warm(sandbox)
    seen = out(
        sandbox,
        "import os, sys, json\n"
        "print(json.dumps({'argv': sys.argv, 'path0': sys.path[0], 'main': sorted(globals()),\n"
        "  'fds': sorted(os.listdir('/proc/self/fd')), 'pgid': os.getpgrp() == os.getpid(),\n"
        "  'sid': os.getsid(0) == os.getpid(), 'ppid': os.getppid(), 'cwd': os.getcwd(),\n"
        "  'mods': [m for m in ('ctypes', 'socket', 'gc') if m in sys.modules]}))",
    )
    assert seen["argv"] == ["-c"] and seen["path0"] == "" and seen["cwd"] == "/scratch"
    dunders = ["__annotations__", "__builtins__", "__doc__", "__loader__", "__name__", "__package__", "__spec__"]
    assert seen["main"] == sorted([*dunders, "json", "os", "sys"])
    assert seen["fds"] == ["0", "1", "2", "3"]  # 3: the directory listing itself
    # re-parented to the worker (PID 1); under gVisor PID 1 itself, of its own namespace (no parent there),
    # a session of its own there too
    assert seen["pgid"] and seen["sid"] and seen["ppid"] == (0 if sandbox.kind == "gvisor" else 1)
    assert seen["mods"] == []
    err = run(sandbox, "raise ValueError('boom')")
    assert err["exit_code"] == 1
    assert (
        err["stderr"]
        == 'Traceback (most recent call last):\n  File "<string>", line 1, in <module>\nValueError: boom\n'
    )


def test_zygote_memory_and_fds_unreachable(sandbox: Sandbox) -> None:
    """A child cannot open the zygote's memory, fds or environment, nor ptrace it (non-dumpable)."""
    zpid = warm(sandbox)
    seen = out(
        sandbox,
        FIND_ZYGOTE + "import ctypes, json\n"
        "z = zygote()\n"
        "def attempt(f):\n"
        "    try:\n        f(); return 'ok'\n"
        "    except OSError as e:\n        return e.__class__.__name__\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "r = libc.ptrace(16, z, 0, 0)\n"  # PTRACE_ATTACH
        "print(json.dumps({'z': z, 'mem': attempt(lambda: open(f'/proc/{z}/mem', 'r+b')),\n"
        "  'fd': attempt(lambda: os.listdir(f'/proc/{z}/fd')),\n"
        "  'environ': attempt(lambda: open(f'/proc/{z}/environ').read()),\n"
        "  'ptrace': r == -1}))",
    )
    if sandbox.kind == "gvisor":  # nothing to open: no pid for it in the child's namespace
        assert seen["z"] is None and zpid
        return
    assert seen["z"] == zpid
    assert seen["mem"] == "PermissionError" and seen["fd"] == "PermissionError" and seen["environ"] == "PermissionError"
    assert seen["ptrace"]


@pytest.mark.parametrize("signal_name", ["SIGKILL", "SIGSTOP", "SIGTERM", "SIGUSR1", "SIGINT"])
def test_signalled_zygote_does_not_break_the_next_call(sandbox: Sandbox, signal_name: str) -> None:
    """Killing, stopping or signalling the zygote costs the next call nothing but the fast path."""
    zpid = warm(sandbox)
    run(sandbox, FIND_ZYGOTE + f"import signal; os.kill(zygote(), signal.{signal_name})")
    t = time.monotonic()
    res = run(sandbox, "print('fine')")
    assert res["stdout"] == "fine\n" and res["exit_code"] == 0
    assert time.monotonic() - t < 3.0
    if signal_name in ("SIGKILL", "SIGSTOP") and sandbox.kind != "gvisor":  # (there: not reached at all)
        assert warm(sandbox) != zpid  # the damaged one was replaced
    else:
        assert warm(sandbox) == zpid  # ignored: nothing was queued, nothing changed


def test_lowered_limits_priority_and_affinity_do_not_reach_the_next_call(sandbox: Sandbox) -> None:
    """prlimit, setpriority and sched_setaffinity on the zygote are refused by the seccomp profile (the
    kernel would allow them to any same-uid process), and the zygote would be discarded if one got
    through: the next call has the worker's values, as a subprocess child would."""
    before = out(
        sandbox,
        "import os, resource, json\n"
        "print(json.dumps([resource.getrlimit(resource.RLIMIT_NOFILE), resource.getrlimit(resource.RLIMIT_STACK),\n"
        "  os.getpriority(os.PRIO_PROCESS, 0), sorted(os.sched_getaffinity(0))]))",
    )
    for attack in (
        "import resource; resource.prlimit(zygote(), resource.RLIMIT_NOFILE, (16, 16))",
        "import resource; resource.prlimit(zygote(), resource.RLIMIT_STACK, (1 << 20, 1 << 20))",
        "os.setpriority(os.PRIO_PROCESS, zygote(), 19)",
        "os.sched_setaffinity(zygote(), {sorted(os.sched_getaffinity(0))[0]})",
    ):
        zpid = warm(sandbox)
        res = run(sandbox, FIND_ZYGOTE + attack)
        # refused by seccomp; under gVisor zygote() is None: no pid to aim at
        refused = "TypeError" if sandbox.kind == "gvisor" else "PermissionError"
        assert res["exit_code"] == 1 and refused in res["stderr"], res
        after = out(
            sandbox,
            "import os, resource, json\n"
            "print(json.dumps([resource.getrlimit(resource.RLIMIT_NOFILE), resource.getrlimit(resource.RLIMIT_STACK),\n"
            "  os.getpriority(os.PRIO_PROCESS, 0), sorted(os.sched_getaffinity(0))]))",
        )
        assert after == before, attack
        assert warm(sandbox) == zpid, attack  # refused: nothing to discard


def test_state_left_by_a_child_is_not_inherited(sandbox: Sandbox) -> None:
    """Modules, builtins, env, threads, fds, cwd, umask and signal handlers of one call are gone in the next."""
    warm(sandbox)
    run(
        sandbox,
        "import os, sys, builtins, threading, signal, types, time\n"
        "sys.modules['planted'] = types.ModuleType('planted'); builtins.planted = 1\n"
        "os.environ['PLANTED'] = '1'; os.putenv('PLANTED2', '1')\n"
        "threading.Thread(target=time.sleep, args=(30,), daemon=True).start()\n"
        "fd = os.open('/dev/null', os.O_RDONLY); os.set_inheritable(fd, True)\n"
        "os.umask(0o000); signal.signal(signal.SIGUSR1, signal.SIG_IGN)\n"
        "os.makedirs('/scratch/d', exist_ok=True); os.chdir('/scratch/d')",
    )
    seen = out(
        sandbox,
        "import os, sys, builtins, threading, signal, json\n"
        "u = os.umask(0o22)\n"
        "print(json.dumps({'mod': 'planted' in sys.modules, 'builtin': hasattr(builtins, 'planted'),\n"
        "  'env': [k for k in os.environ if k.startswith('PLANTED')], 'threads': threading.active_count(),\n"
        "  'fds': sorted(os.listdir('/proc/self/fd')), 'umask': u, 'cwd': os.getcwd(),\n"
        "  'usr1': signal.getsignal(signal.SIGUSR1) == signal.SIG_DFL}))",
    )
    assert seen == {
        "mod": False,
        "builtin": False,
        "env": [],
        "threads": 1,
        "fds": ["0", "1", "2", "3"],
        "umask": 0o022,
        "cwd": "/scratch",
        "usr1": True,
    }


def test_no_copy_of_a_call_code_in_the_next(sandbox: Sandbox) -> None:
    """The code (and stdin) of one call never passes through the zygote: the next child's memory,
    all of it a copy of the zygote's, holds no more copies of it than of a value never sent."""
    warm(sandbox)
    sent, never = secrets.token_hex(16), secrets.token_hex(16)
    sandbox.call("run_python", {"code": f"x = '{sent}'", "stdin": sent})
    scan = (
        "import re, json\n"
        "def count(needle):\n"
        "    n = 0\n"
        "    with open('/proc/self/maps') as maps, open('/proc/self/mem', 'rb', 0) as mem:\n"
        "        for line in maps:\n"
        "            m = re.match(r'([0-9a-f]+)-([0-9a-f]+) r', line)\n"
        "            if not m or '[vvar]' in line or '[vsyscall]' in line:\n                continue\n"
        "            a, b = int(m.group(1), 16), int(m.group(2), 16)\n"
        "            try:\n                mem.seek(a); n += mem.read(b - a).count(needle)\n"
        "            except OSError:\n                pass\n"
        "    return n\n"
        f"print(json.dumps([count('{sent[::-1]}'[::-1].encode()), count('{never[::-1]}'[::-1].encode())]))"
    )
    counts = out(sandbox, scan)
    assert counts[0] == counts[1], counts


ENDINGS = [
    "import sys; sys.exit(3)",
    "import sys; sys.exit('bye')",
    "raise SystemExit(True)",
    "raise SystemExit(None)",
    "import atexit; atexit.register(lambda: print('atexit ran'))",
    "import sys; sys.stdout.write('no newline')",
    "import sys; sys.stdout.write('buffered'); sys.stderr.write('err buffered')",
    "f = open('left.txt', 'w'); f.write('unflushed')",
    "class A:\n    def __del__(self):\n        print('del ran')\na = A()",
    "import threading, time\nthreading.Thread(target=lambda: (time.sleep(0.2), print('thread done'))).start()",
    "import logging; logging.basicConfig(); logging.getLogger().warning('logged')",
    "import tempfile, os; d = tempfile.TemporaryDirectory(dir='.'); open('tdname', 'w').write(d.name)",
]


@pytest.mark.parametrize("code", ENDINGS)
def test_a_fast_path_child_ends_as_python_c_does(sandbox: Sandbox, code: str) -> None:
    """The fast path ends a child without the interpreter's teardown: what a program can see of its
    end (status, SystemExit's message, atexit, threads, open files flushed, __del__ of its objects,
    stdio flushed, temporary directories removed) is what a `python3` subprocess shows."""
    after = "import os; print(sorted(os.listdir('.')), open('left.txt').read() if os.path.exists('left.txt') else None,"
    after += " os.path.exists(open('tdname').read()) if os.path.exists('tdname') else None)"
    seen = []
    for how in ("fast", "subprocess"):
        run(sandbox, "import os\nfor f in os.listdir('.'): os.remove(f)")
        if how == "fast":
            warm(sandbox)
            res = run(sandbox, code)
        else:
            r = sandbox.call("run_shell", {"command": "python3 -", "stdin": code})
            assert r.result is not None
            res = dict(r.result)
        seen.append((res["exit_code"], res["stdout"], res["stderr"], run(sandbox, after)["stdout"]))
    assert seen[0] == seen[1], seen
