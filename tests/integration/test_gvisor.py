"""gVisor (runsc) as a sandbox kind, on the real engine: `--sandbox gvisor`, `auto`, and a policy's
`isolation: gvisor` minimum, and the wall gVisor's own procfs would leave open (worker.children.namespaces).

Needs the engine to have runsc registered (README: gVisor; `.ci/run` registers it). Without it
these tests skip, saying so, unless TOOLCAGE_REQUIRE_GVISOR=1 (set by CI), when they fail.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from toolcage import Sandbox, UsageError
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
