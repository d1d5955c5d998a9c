"""gVisor (runsc) as a sandbox kind, on the real engine: `--sandbox gvisor`, `auto`, and a policy's
`isolation: gvisor` minimum, and the wall gVisor's own procfs would leave open (worker.children.namespaces).

Needs the engine to have runsc registered (README: gVisor; `.ci/run` registers it). Without it
these tests skip, saying so, unless TOOLCAGE_REQUIRE_GVISOR=1 (set by CI), when they fail.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from toolcage import Sandbox, UsageError, wait_removed
from toolcage.backends import available_kinds

pytestmark = pytest.mark.usefixtures("no_leaks")


@pytest.fixture
def gvisor(engine: Any) -> None:
    if "gvisor" not in available_kinds(engine):
        message = "the engine has no runsc runtime registered (README: gVisor)"
        if os.environ.get("TOOLCAGE_REQUIRE_GVISOR") == "1":
            pytest.fail(message)
        pytest.skip(message)


# Each child execs sleep at once: under gVisor a forked interpreter that goes on running Python writes to its
# heap's pages (reference counts), and gVisor breaks copy-on-write in 2 MiB units, so each such child took
# ~6 MiB (57 of them ~340 MiB of the policy's 512, seen from the host's cgroup); a loaded CI pass went past the
# policy's memory and the guard ended the bomb as oom_killed before it met the process limit this test is about.
FORK_BOMB = r"""
import os
n = 0
try:
    while True:
        if os.fork() == 0:
            try:
                os.execv("/bin/sleep", ["sleep", "30"])
            finally:
                os._exit(0)
        n += 1
except OSError as e:
    print(n, e.errno)
"""


@pytest.mark.usefixtures("gvisor")
def test_a_gvisor_sandbox_runs_under_runsc_with_the_same_walls(engine: Any, tmp_path: Path) -> None:
    """--sandbox gvisor: the container names runsc, the code sees gVisor's kernel, and the walls hold:
    non-root, read-only workspace, no network, a process limit a fork bomb meets; the sandbox lives on."""
    (tmp_path / "data.txt").write_text("hello")
    tmp_path.chmod(0o755)
    with Sandbox(sandbox="gvisor", workspace=tmp_path, audit=False) as sb:
        assert sb.kind == "gvisor"
        info = engine.inspect(sb.container_id)
        assert info["HostConfig"]["Runtime"] == "runsc"
        probe = (
            "import json, os, socket, errno\n"
            "r = {'uid': os.getuid(), 'kernel': open('/proc/version').read()}\n"
            "r['data'] = open('/workspace/data.txt').read()\n"
            "try:\n    open('/workspace/x', 'w')\nexcept OSError as e:\n    r['write'] = errno.errorcode[e.errno]\n"
            "s = socket.socket()\ntry:\n    s.connect(('10.0.0.1', 80))\nexcept OSError as e:\n"
            "    r['connect'] = errno.errorcode[e.errno]\n"
            "r['ifaces'] = sorted(n for _, n in socket.if_nameindex())\n"
            "print(json.dumps(r))"
        )
        r = sb.call("run_python", {"code": probe})
        assert r.ok, r
        seen = json.loads(r.result["stdout"])
        assert seen["uid"] == 65532 and seen["data"] == "hello"
        assert "gVisor" in seen["kernel"] or "4.4.0" in seen["kernel"], seen["kernel"]
        assert seen["write"] in ("EROFS", "EACCES") and seen["connect"] in ("ENETUNREACH", "EHOSTUNREACH")
        assert seen["ifaces"] == ["lo"]
        bomb = sb.call("run_python", {"code": FORK_BOMB, "timeout_s": 20})
        assert bomb.ok and len(bomb.result["stdout"].split()) == 2, bomb
        forked, errno_ = (int(x) for x in bomb.result["stdout"].split())
        assert forked < 64 and errno_ == 11, bomb.result  # EAGAIN at RLIMIT_NPROC (the policy's pids)
        assert sb.call("run_shell", {"command": "echo alive"}).result["stdout"] == "alive\n"


@pytest.mark.usefixtures("gvisor")
def test_isolation_gvisor_in_a_policy_refuses_runc_and_auto_picks_gvisor(tmp_path: Path) -> None:
    """A policy with isolation: gvisor is refused under --sandbox container (before anything starts,
    saying how to fix it), and --sandbox auto runs it under runsc."""
    pol = tmp_path / "strict.yaml"
    pol.write_text(yaml.safe_dump({"name": "strict", "isolation": "gvisor"}))
    with pytest.raises(UsageError, match="requires isolation 'gvisor'"):
        Sandbox(pol, sandbox="container", audit=False)
    with Sandbox(pol, sandbox="auto", audit=False) as sb:
        assert sb.kind == "gvisor"
        assert sb.call("ping").result == "pong"


OPEN_WORKER_FDS = r"""
import json, os
ok = []
for pid in [p for p in os.listdir("/proc") if p.isdigit() and int(p) != os.getpid()] + ["1"]:
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        continue
    for fd in fds:
        try:
            os.close(os.open(f"/proc/{pid}/fd/{fd}", os.O_WRONLY | os.O_NONBLOCK))
            ok.append(f"{pid}/{fd}")
        except OSError:
            pass
print(json.dumps({"pid": os.getpid(), "opened": [o for o in ok if not o.startswith(f"{os.getpid()}/")]}))
"""


@pytest.mark.usefixtures("gvisor")
def test_the_worker_fds_are_out_of_reach_under_gvisor() -> None:
    """gVisor's procfs ignores that the worker is non-dumpable, so tool code runs in a PID namespace of
    its own (worker.children.namespaces): it is PID 1 there, and no other process's descriptor opens."""
    with Sandbox(sandbox="gvisor", audit=False) as sb:
        seen = json.loads(sb.call("run_python", {"code": OPEN_WORKER_FDS}).result["stdout"])
        assert sb.call("ping").result == "pong"
    assert seen == {"pid": 1, "opened": []}, seen


FIX = Path(__file__).resolve().parent.parent / "fixtures" / "policies"
BOMB = "b = []\nwhile True: b.append(bytearray(16 * 1024 * 1024))"
# several processes of one call, each allocating: the call as a whole goes past the limit
FORKED_BOMB = (
    "import os, time\nfor _ in range(3):\n    if os.fork() == 0:\n        break\n"
    "b = []\nwhile True:\n    b.append(bytearray(4 * 1024 * 1024)); time.sleep(0.01)"
)
SLEEPER = "import time; time.sleep(4); print('slept')"


@pytest.mark.usefixtures("gvisor")
@pytest.mark.parametrize(
    ("tool", "params"),
    [
        ("run_python", {"code": BOMB}),  # a fork of the zygote
        ("run_shell", {"command": f"exec python3 -c '{BOMB}'"}),  # a subprocess through nsinit
        ("run_python", {"code": FORKED_BOMB}),
    ],
    ids=["zygote", "nsinit", "forked"],
)
def test_a_memory_bomb_under_gvisor_ends_its_call_not_the_sandbox(
    engine: Any, tool: str, params: dict[str, Any]
) -> None:
    """Under gVisor a call past the policy's memory ends as oom_killed while a call beside it and the sandbox
    live on, and the host's limit still bounds the container (it ended the whole run: SandboxOOM)."""
    from concurrent.futures import ThreadPoolExecutor

    with Sandbox(FIX / "good-small.yaml", sandbox="gvisor", audit=False) as sb, ThreadPoolExecutor(1) as pool:
        # its own timeout: the policy's call_s (5 s) is a 4 s sleep's, plus a spawn that took 0.7-0.9 s under gVisor
        # beside the bomb with two busy loops on the host (a loaded CI: past 5 s, a timeout with no output yet)
        beside = pool.submit(sb.call, "run_python", {"code": SLEEPER, "timeout_s": 15})
        r = sb.call(tool, {**params, "timeout_s": 15})
        assert r.status == "oom_killed" and r.result["oom_killed"] and r.result["signal"] == "SIGKILL", r
        slept = beside.result()
        assert slept.result["stdout"] == "slept\n", slept
        assert sb.call("run_python", {"code": "print('alive')"}).result["stdout"] == "alive\n"
        limit = engine.inspect(sb.container_id)["HostConfig"]["Memory"]
    assert 128 * 2**20 < limit <= 128 * 2**20 + 256 * 2**20, limit  # the policy's 128 MiB and a bounded headroom


# one system call that commits 1 GiB at once: nothing between its start and its end for the guard to see
POPULATE = "import mmap\nm = mmap.mmap(-1, 1 << 30, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | 0x8000)"


@pytest.mark.usefixtures("gvisor")
def test_memory_committed_in_one_system_call_under_gvisor_meets_the_hosts_limit(engine: Any) -> None:
    """The known limit of the guard: a call that commits past the headroom in one system call (mmap with
    MAP_POPULATE) is not seen in time; the host's limit then ends the whole run (SandboxOOM) and holds."""
    from toolcage import SandboxOOM

    with Sandbox(FIX / "good-small.yaml", sandbox="gvisor", audit=False) as sb, pytest.raises(SandboxOOM):
        sb.call("run_python", {"code": POPULATE, "timeout_s": 15})
    assert sb.summary is not None and sb.summary.status == "oom_killed"


@pytest.mark.usefixtures("gvisor")
def test_an_oom_child_under_gvisor_ends_only_itself() -> None:
    """Under runsc by name (in every pass): a forked memory hog with oom_score_adj 1000 dies alone and the call's
    report comes back, as under runc (tests/security/test_oom_child.py: the scenario, and why)."""
    from tests.security.test_oom_child import check_oom_child_ends_only_itself

    check_oom_child_ends_only_itself("gvisor")


# what a call's process tells of itself: how long ago it was forked (the kernel's start time against its
# uptime), its pid in its namespaces, its limits, its session, working directory and environment
SELF_PYTHON = r"""
import ctypes, json, os, resource, sys
libc = ctypes.CDLL(None, use_errno=True)
unshared = libc.unshare(0x10000000)  # CLONE_NEWUSER: refused by the filter nsinit stacks
unshare_errno = ctypes.get_errno()
status = open("/proc/self/status").read().splitlines()
ticks = int(open("/proc/self/stat").read().rsplit(")", 1)[1].split()[19])
up = float(open("/proc/uptime").read().split()[0])
print(json.dumps({
    "age_s": up - ticks / os.sysconf("SC_CLK_TCK"), "pid": os.getpid(), "sid": os.getsid(0) == os.getpid(),
    "argv": sys.argv, "path0": sys.path[0], "cwd": os.getcwd(), "env": sorted(os.environ),
    "nproc": resource.getrlimit(resource.RLIMIT_NPROC), "fds": sorted(int(f) for f in os.listdir("/proc/self/fd")),
    "uid_map": open("/proc/self/uid_map").read().split(),
    "procs": sorted(p for p in os.listdir("/proc") if p.isdigit()),
    "unshare": [unshared, unshare_errno],
    "caps": [ln for ln in status if ln.startswith(("Cap", "Seccomp", "NoNewPrivs"))],
}))
"""
# its pid, and its age in ms: /proc/uptime in hundredths (two decimals) less its start time in clock ticks
SELF_SHELL = (
    "read -r up _ < /proc/uptime; t=$(cut -d' ' -f22 /proc/$$/stat); hz=$(getconf CLK_TCK); "
    "echo $$ $(( ${up%.*}${up#*.}0 - t * 1000 / hz ))"
)


@pytest.mark.usefixtures("gvisor")
def test_a_gvisor_call_after_idle_starts_in_a_process_made_ahead_as_fresh_as_a_fork() -> None:
    """Under gVisor the worker has the zygote make the next call's process while it is idle (both of its forks,
    most of a call's start there): a call after a pause runs in a process older than its request, and that
    process is what a fork at the call would have been (PID 1 alone in its namespaces, its own session, argv,
    path, directory, environment, limits, descriptors). Calls back to back, and run_shell, get the same."""
    with Sandbox(sandbox="gvisor", audit=False) as sb:
        assert sb.call("run_python", {"code": "pass"}).ok  # the zygote starts once a call asked for it
        forked = []
        for _ in range(2):  # back to back: no idle step, the zygote forks at the call
            r = sb.call("run_python", {"code": SELF_PYTHON})
            assert r.ok, r
            forked.append(json.loads(r.result["stdout"]))
        ahead = []
        for _ in range(2):
            time.sleep(1.0)  # idle: the zygote is ready, and the next call's process is made
            r = sb.call("run_python", {"code": SELF_PYTHON})
            assert r.ok, r
            ahead.append(json.loads(r.result["stdout"]))
        assert all(seen["age_s"] >= 0.5 for seen in ahead), ahead  # made ahead, while the worker was idle
        assert any(seen["age_s"] < 0.5 for seen in forked), forked
        for seen in forked + ahead:
            age = seen.pop("age_s")
            assert seen == forked[0], (age, seen, forked[0])
        assert forked[0]["pid"] == 1 and forked[0]["sid"] and forked[0]["procs"] == ["1"], forked[0]
        assert forked[0]["argv"] == ["-c"] and forked[0]["path0"] == "" and forked[0]["fds"] == [0, 1, 2, 3]
        assert forked[0]["unshare"][0] == -1 and "CapEff:\t0000000000000000" in forked[0]["caps"], forked[0]
        time.sleep(1.0)
        r = sb.call("run_shell", {"command": SELF_SHELL})
        assert r.ok, r
        pid, age_ms = r.result["stdout"].split()
        assert pid == "1" and int(age_ms) >= 500, r.result  # exec'd in the process made ahead


# seen from the worker's namespaces (gVisor's /proc/<pid>/status has no NSpid): the zygote and the process made
# ahead share the zygote's command line, and the one made ahead is the younger
FIND_AHEAD = r"""
import os, resource, sys
found = []
for p in (d for d in os.listdir("/proc") if d.isdigit() and d not in ("1", str(os.getpid()))):
    try:
        if b"The zygote" in open(f"/proc/{p}/cmdline", "rb").read():
            found.append((int(open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()[19]), int(p)))
    except OSError:
        continue
if len(found) == 2:
    ahead = max(found)[1]
    resource.prlimit(ahead, resource.RLIMIT_NOFILE, (64, 64))
    print(ahead)
"""


@pytest.mark.usefixtures("gvisor")
def test_a_process_made_ahead_that_was_touched_is_not_used() -> None:
    """The worker checks the process made ahead before it hands it a call, as it checks the zygote before a fork
    (its limits, nice value, affinity, scheduling): one whose limit something lowered (here from outside, by
    the engine's exec as the sandbox user, the one way to name it) is dropped, and the call gets a fresh fork
    with the limits a call has."""
    with Sandbox(sandbox="gvisor", audit=False) as sb:
        assert sb.call("run_python", {"code": "pass"}).ok
        time.sleep(1.0)  # the next call's process is made
        assert sb.container_id is not None
        touch = ["docker", "exec", "-u", "65532", sb.container_id, "python3", "-I", "-S", "-c", FIND_AHEAD]
        out = subprocess.run(touch, capture_output=True, text=True, timeout=60)
        assert out.returncode == 0 and len(out.stdout.split()) == 1, out  # one process made ahead, now touched
        nofile_code = "import resource; print(resource.getrlimit(resource.RLIMIT_NOFILE))"
        r = sb.call("run_python", {"code": SELF_PYTHON + nofile_code})
        assert r.ok, r
        seen, nofile = r.result["stdout"].splitlines()
        assert json.loads(seen)["age_s"] < 0.5 and nofile != "(64, 64)", r.result  # forked at the call, untouched


@pytest.mark.usefixtures("gvisor")
def test_a_call_starts_in_what_its_cwd_names_at_the_call_not_when_the_zygote_started() -> None:
    """Under gVisor `exec` with a cwd runs in a fork of a zygote started in that directory (or in a process it
    made ahead). A background process renames the directory and puts another at its path: the next call starts
    in the new one, as subprocess's cwd= would (under runc it does; the zygote kept the old one)."""
    with Sandbox(sandbox="gvisor", audit=False) as sb:
        sb.call("run_shell", {"command": "mkdir -p /scratch/sub && echo original > /scratch/sub/marker"})
        probe = {"argv": ["sh", "-c", "pwd; cat marker"], "cwd": "sub"}
        assert sb.call("exec", probe).result["stdout"].split() == ["/scratch/sub", "original"]
        time.sleep(1.0)  # idle: the zygote starts in /scratch/sub, and makes the next call's process there
        swap = sb.spawn("mv /scratch/sub /scratch/moved && mkdir /scratch/sub && echo fresh > /scratch/sub/marker")
        assert swap.wait(timeout=30) and swap.read().exit_code == 0
        time.sleep(0.5)
        for _ in range(2):  # in the process made ahead, then forked at the call
            r = sb.call("exec", probe)
            assert r.ok and r.result["stdout"].split() == ["/scratch/sub", "fresh"], r.result


@pytest.mark.usefixtures("gvisor")
def test_a_closed_gvisor_sandbox_ends_by_its_workers_exit_not_by_a_kill(engine: Any) -> None:
    """Closed, a gVisor sandbox ends because its worker exits at EOF (exit code 0), before the removal would kill
    it: killed, the engine sometimes went on showing it running for 10 to 28 s after runsc's process was gone
    (2 in ~20 removals after a fork bomb on a loaded host), and a program waits for its removals at exit."""
    since = time.time()
    with Sandbox(sandbox="gvisor", audit=False) as sb:
        # what made the worker's exit slow enough for the kill to come first: many processes just ended
        assert sb.call("run_python", {"code": FORK_BOMB, "timeout_s": 30}).ok
        cid = sb.container_id
    assert cid is not None
    wait_removed(60)
    events = list(engine.api.events(since=since, until=time.time(), filters={"container": cid}, decode=True))
    actions = [(e.get("Action") or e.get("status"), e.get("Actor", {}).get("Attributes", {})) for e in events]
    assert [a for a, _ in actions if a in ("kill", "die", "destroy")] == ["die", "destroy"], actions
    assert next(attrs for a, attrs in actions if a == "die").get("exitCode") == "0", actions
