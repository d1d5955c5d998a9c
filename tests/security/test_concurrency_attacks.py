"""Red-team attacks on concurrent calls (74a7bd3, 556f793) and on what runs beside a connector's call.

Each attack runs as tool code (or as a caller of the library) on the real engine. A connector's
call must run alone: no process of the run's tool code alive beside it, since any same-uid
process may read its memory (and the exposed secret it holds) through /proc/<pid>/mem.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tests.security.test_connector_secrets import (
    EXPOSED,
    HOSTILE,
    SCAN_BESIDE,
    TOKEN,
    _found,
    _policy,
    egress_net,  # noqa: F401 - a fixture
)
from toolcage import AsyncSandbox, CallResult, Sandbox
from toolcage.servers.serve import Forwarder

pytestmark = pytest.mark.usefixtures("no_leaks")

SECRETS = {"TOKEN": TOKEN, "EXPOSED": EXPOSED}


def _conn_sandbox(tmp_path: Path, net: str, name: str) -> Sandbox:
    pol = _policy(tmp_path, name, exposed=True)
    return Sandbox(pol, tool=name, tools=[HOSTILE], secrets=SECRETS, egress_network=net)


def _py(sb: Sandbox, code: str, **kw: Any) -> CallResult:
    r = sb.call("run_python", {"code": code, **kw})
    assert r.result is not None, r
    return r


# --------------------------------------------------------------------------------------------------
# 1. A batch carrying a connector call is served on the main thread without waiting for the code
#    calls in flight: the connector's child (holding an exposed secret) runs beside tool code.


def test_a_batch_cannot_run_a_connector_call_beside_a_code_call(egress_net: str, tmp_path: Path) -> None:  # noqa: F811
    with _conn_sandbox(tmp_path, egress_net, "conc-batch") as sb:
        got: dict[str, CallResult] = {}
        scan = threading.Thread(
            target=lambda: got.update(scan=_py(sb, SCAN_BESIDE.replace("DURATION", "3.0"))), daemon=True
        )
        scan.start()
        time.sleep(1.0)  # the scan runs
        batch = [{"jsonrpc": "2.0", "id": "b1", "method": "expose_hold", "params": {"seconds": 1.0}}]
        fw = Forwarder(sb)
        fw.forward((json.dumps(batch) + "\n").encode())
        answer = fw.next_answer()
        scan.join(30)
        assert isinstance(answer, list) and "result" in answer[0], answer
        seen = json.loads(got["scan"].result["stdout"])
        assert seen["scanned"] >= 1, seen
        assert EXPOSED not in _found(seen), "the scan read the exposed secret beside a batched connector call"


# --------------------------------------------------------------------------------------------------
# 2. Tool code plants a module in /scratch that a process the worker starts later imports: the
#    connector's handler child (`python3 -m`, cwd /scratch: sys.path[0] is /scratch) or the run_python
#    zygote (`python3 -c`, started while the worker is idle: sys.path[0] is '' = /scratch). Either runs
#    the tool code's payload outside any code call, where a connector's call is "alone".

# a stdlib module both import at start, shadowed: the payload runs, then the real module is loaded
SHADOW = r"""
import os as _os, sys as _sys
def _payload():
    PAYLOAD
try:
    _payload()
except BaseException:
    pass
_here = _sys.modules.pop(__name__)
_saved = list(_sys.path)
_sys.path[:] = [p for p in _sys.path if p not in ("", "/scratch")]
try:
    import importlib as _il
    _sys.modules[__name__] = _il.import_module(__name__)
finally:
    _sys.path[:] = _saved
"""

# in the handler child: ask the worker for the exposed secret on the child's own link
ASK_SECRET = r"""
    cmd = open("/proc/self/cmdline", "rb").read()
    if b"handler_host" not in cmd:
        return
    import socket
    s = socket.socket(fileno=_os.dup(int(_os.environ["TOOLCAGE_HANDLER_FD"])))
    s.sendall(b'{"op": "secret", "name": "EXPOSED"}\n')
    buf = b""
    while not buf.endswith(b"\n"):
        buf += s.recv(4096)
    s.detach()
    with open("/scratch/stolen", "w") as f:
        f.write(buf.decode()[::-1])
"""

PLANT = "import sys\nopen(sys.argv[0] if False else {path!r}, 'w').write({src!r})\n"


def test_a_module_planted_in_scratch_never_runs_in_a_connector_child(egress_net: str, tmp_path: Path) -> None:  # noqa: F811
    """The handler child imports nothing from /scratch: a planted json.py does not run in it."""
    shadow = SHADOW.replace("    PAYLOAD", ASK_SECRET)
    with _conn_sandbox(tmp_path, egress_net, "conc-plant-handler") as sb:
        assert _py(sb, PLANT.format(path="/scratch/json.py", src=shadow)).ok
        held = sb.call("expose_hold", {"seconds": 0.1})
        assert held.ok, held
        seen = _py(sb, "import os\nprint(open('/scratch/stolen').read() if os.path.exists('/scratch/stolen') else '')")
        stolen = seen.result["stdout"].strip()[::-1]
        assert EXPOSED not in stolen, "tool code's module ran in the connector's child and read its secret"
        assert not stolen, f"tool code's module ran in the connector's child: {stolen!r}"


# in the zygote: a daemon that scans every process's memory for a while (beside whatever runs next). The
# marker is joined at run time: no call's own command line (KILL_ZYGOTE's, a plant's) may hold it, or a
# planted .pth/typing.py would start this daemon in that call, whose scan can write /scratch/zhits first
ZYGOTE_SCAN = r"""
    if b"The zygote" + b": a ready" not in open("/proc/self/cmdline", "rb").read():
        return
    if _os.fork():
        return
    _os.setsid()
    if _os.fork():
        _os._exit(0)
    _os.closerange(3, 1024)
    import re, time
    pat = re.compile((b"tc" + b"secret_") + rb"[0-9a-f]{32}")
    hits, end = set(), time.monotonic() + 8
    while time.monotonic() < end:
        for p in [p for p in _os.listdir("/proc") if p.isdigit() and int(p) != _os.getpid()]:
            try:
                maps = open(f"/proc/{p}/maps").read().splitlines()
                fd = _os.open(f"/proc/{p}/mem", _os.O_RDONLY)
            except OSError:
                continue
            for line in maps:
                f = line.split()
                if "r" not in f[1] or (len(f) > 5 and f[5] in ("[vvar]", "[vsyscall]")):
                    continue
                a, b = (int(x, 16) for x in f[0].split("-"))
                try:
                    hits |= {m.group().decode()[::-1] for m in pat.finditer(_os.pread(fd, b - a, a))}
                except OSError:
                    pass
            _os.close(fd)
        with open("/scratch/zhits", "w") as out:
            out.write(" ".join(sorted(hits)))
        time.sleep(0.05)
    _os._exit(0)
"""


USER_SITE = "/scratch/.local/lib/python3.11/site-packages"
KILL_ZYGOTE = r"""
import os, signal
for p in filter(str.isdigit, os.listdir("/proc")):
    try:
        c = open(f"/proc/{p}/cmdline", "rb").read()
    except OSError:
        continue
    if b"The zygote" + b": a ready" in c and int(p) != os.getpid():
        try:
            os.kill(int(p), signal.SIGKILL)
        except OSError:
            pass
"""


@pytest.mark.parametrize("where", ["typing.py", "usercustomize.py", "pth"])
def test_a_module_planted_in_scratch_never_runs_in_the_zygote(
    egress_net: str,  # noqa: F811
    tmp_path: Path,
    where: str,
) -> None:
    """The zygote, started while the worker is idle, runs nothing from /scratch: a planted typing.py
    (its cwd is first on its path), usercustomize.py or .pth file (HOME is /scratch: site runs the user
    site-packages) does not give tool code a process outside any call, beside a connector's call."""
    plain = "import os as _os, sys as _sys\ndef _payload():\n" + ZYGOTE_SCAN + "\n_payload()\n"
    plants = {
        "typing.py": [("/scratch/typing.py", SHADOW.replace("    PAYLOAD", ZYGOTE_SCAN))],
        "usercustomize.py": [(f"{USER_SITE}/usercustomize.py", plain)],
        "pth": [(f"{USER_SITE}/zz_payload.py", plain), (f"{USER_SITE}/zz.pth", "import zz_payload\n")],
    }[where]
    with _conn_sandbox(tmp_path, egress_net, "conc-plant-zygote") as sb:
        assert _py(sb, f"import os\nos.makedirs({USER_SITE!r}, exist_ok=True)").ok
        for path, src in plants:
            assert _py(sb, PLANT.format(path=path, src=src)).ok
        # kill the zygote (any child may): the next call finds it dead, and the worker starts a new one
        # when it is next idle, which now sees the plant
        assert _py(sb, KILL_ZYGOTE).ok
        assert _py(sb, "pass").ok
        time.sleep(1.0)  # idle: the worker starts its zygote
        held = sb.call("expose_hold", {"seconds": 2.0})
        assert held.ok, held
        seen = _py(sb, "import os\nprint(open('/scratch/zhits').read() if os.path.exists('/scratch/zhits') else '-')")
        hits = {h[::-1] for h in seen.result["stdout"].split()}
        assert EXPOSED not in hits, "planted code ran in the zygote and read a connector call's secret"
        assert seen.result["stdout"].strip() == "-", f"planted code ran in the zygote: {seen.result['stdout']!r}"


# --------------------------------------------------------------------------------------------------
# 3. AsyncSandbox: a task cancelled while its request line (over 64 KiB) is still being written on an
#    executor thread. The line goes out anyway; the call must be cancelled in the worker and its
#    answer taken, never left in the queue of answers to forwarded lines (64 of those stop the reader).

PAD = "\n#" + "x" * 80_000  # over session._INLINE_SEND: written from a thread


def test_cancelling_a_call_while_its_long_request_is_sent_cancels_it(engine: Any) -> None:
    async def go() -> tuple[CallResult, int, int, CallResult]:
        async with AsyncSandbox(tool="conc-async-cancel", audit=False) as sb:
            code = "import time\ntime.sleep(1.5)\nopen('/scratch/ran', 'w').write('1')" + PAD
            task = asyncio.ensure_future(sb.call("run_python", {"code": code}))
            await asyncio.sleep(0)  # it runs up to the thread that writes its line
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            await asyncio.sleep(2.5)
            ran = await sb.call("run_python", {"code": "import os; print(os.path.exists('/scratch/ran'))"})
            for _ in range(70):  # more than the queue of forwarded answers holds
                t = asyncio.ensure_future(sb.call("run_python", {"code": "pass" + PAD}))
                await asyncio.sleep(0)
                t.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await t
            session = sb._sync._run.session
            assert session is not None
            # the calls that went out are cancelled in the worker, and their -32800 answers come back: 2 s
            # under runc, more under gVisor on a loaded host (seen: 27 still owed after 2 s); owed for good fails
            until = time.monotonic() + 30
            while session.parser.outstanding() and time.monotonic() < until:
                await asyncio.sleep(0.1)
            left, owed = session.parser.messages.qsize(), session.parser.outstanding()
            after = await sb.call("ping", timeout=10)
            return ran, left, owed, after

    ran, left, owed, after = asyncio.run(go())
    assert owed == 0, f"{owed} answers still owed for requests that were never sent (the idle timeout never fires)"
    assert ran.ok and ran.result["stdout"].strip() == "False", "the cancelled call ran to its end"
    assert left == 0, f"{left} answers of cancelled calls left in the forwarded queue"
    assert after.ok, after


# --------------------------------------------------------------------------------------------------
# 3b. A cancel sent a few milliseconds into a call: the worker knows the call's pid (its process group) as
#     soon as the zygote reports it. The child made its own group only when it first ran, so a killpg that came
#     before found none (ESRCH), was not tried again, and the code ran to its end (under gVisor 14 of 24 such
#     cancels, most in a process made ahead while the worker was idle). Now the child makes its group before
#     its pid is reported.

EARLY_CANCELS = (0.002, 0.004, 0.006)


def test_a_cancel_sent_as_the_call_starts_kills_its_code(engine: Any) -> None:
    async def go() -> list[tuple[str, float, str]]:
        ran = []
        async with AsyncSandbox(tool="conc-early-cancel", audit=False, run_s=300) as sb:
            assert (await sb.call("run_python", {"code": "pass"})).ok  # the zygote starts
            for i in range(12):
                await asyncio.sleep(0.4)  # idle: under gVisor the next call's process is made meanwhile
                mark = f"/scratch/ran_{i}"
                tool, params = (
                    ("run_python", {"code": f"import time\ntime.sleep(1)\nopen({mark!r}, 'w').write('1')"})
                    if i % 2 == 0
                    else ("run_shell", {"command": f"sleep 1; echo 1 > {mark}"})
                )
                delay = EARLY_CANCELS[i % len(EARLY_CANCELS)]
                task = asyncio.ensure_future(sb.call(tool, params))
                await asyncio.sleep(delay)
                task.cancel()
                try:
                    await task
                    continue  # answered before the cancel: nothing to check
                except asyncio.CancelledError:
                    pass
                await asyncio.sleep(1.5)
                r = await sb.call("run_shell", {"command": f"test -e {mark} && echo ran || echo killed"})
                if r.result["stdout"].strip() != "killed":
                    ran.append((tool, delay, r.result["stdout"].strip()))
        return ran

    ran = asyncio.run(go())
    assert not ran, f"cancelled calls whose code ran to its end: {ran}"


# --------------------------------------------------------------------------------------------------
# 4. (defence pinned) A code call leaves a scanning daemon behind while another code call is still in
#    flight (so no sweep yet), and a connector call is sent meanwhile: it waits for the last code call
#    to end, and the sweep then kills the daemon before the connector's child starts.

DAEMON_SCAN = (
    "import os\nif os.fork() == 0:\n    os.setsid()\n    if os.fork():\n        os._exit(0)\n"
    + "    def _payload():\n"
    + ZYGOTE_SCAN.replace(
        '    if b"The zygote" + b": a ready" not in open("/proc/self/cmdline", "rb").read():\n        return\n', ""
    )
    .replace("    if _os.fork():\n        return\n    _os.setsid()\n    if _os.fork():\n        _os._exit(0)\n", "")
    .replace("\n    ", "\n        ")
    + "\n    import os as _os\n    _payload()\n"
)


def test_a_daemon_left_while_calls_are_in_flight_is_gone_before_a_connector_call(
    egress_net: str,  # noqa: F811
    tmp_path: Path,
) -> None:
    pol = _policy(tmp_path, "conc-daemon", exposed=True)

    kind = []

    async def go() -> tuple[CallResult, CallResult, CallResult]:
        async with AsyncSandbox(
            pol, tool="conc-daemon", tools=[HOSTILE], secrets=SECRETS, egress_network=egress_net
        ) as sb:
            kind.append(sb._sync.kind)
            long = asyncio.ensure_future(sb.call("run_shell", {"command": "sleep 2"}))
            await asyncio.sleep(0.3)
            left = await sb.call("run_python", {"code": DAEMON_SCAN})  # ends; the daemon lives on (a call is in flight)
            held = await sb.call("expose_hold", {"seconds": 1.5})  # waits for `long`, then the sweep
            await long
            seen = await sb.call(
                "run_python", {"code": "import os\nprint(open('zhits').read() if os.path.exists('zhits') else '-')"}
            )
            return left, held, seen

    left, held, seen = asyncio.run(go())
    assert left.ok and held.ok, (left, held)
    hits = {h[::-1] for h in seen.result["stdout"].split()}
    if kind == ["gvisor"]:
        # there the daemon ends with its call's PID namespace, before any other call starts
        assert seen.result["stdout"].strip() in ("-", ""), seen.result
    else:
        assert seen.result["stdout"].strip() != "-", "the daemon never ran: this would prove nothing"
    assert EXPOSED not in hits, "a daemon left by a call read the secret of a connector call"


# --------------------------------------------------------------------------------------------------
# 5. `toolcage serve` marks the end of its input with a ping of a fixed id; a client request with that
#    very id had its answer swallowed, and its answer made serve close the worker's stdin early.


def test_serve_answers_a_request_whatever_its_id(engine: Any) -> None:
    import io
    import os

    from toolcage.servers.serve import bridge

    r, w = os.pipe()
    out = io.BytesIO()
    with Sandbox(tool="conc-serve-drain", audit=False) as sb, os.fdopen(r, "rb") as infile:
        t = threading.Thread(target=bridge, args=(sb, infile, out), daemon=True)
        t.start()
        os.write(w, b'{"jsonrpc": "2.0", "method": "ping", "id": "toolcage.serve.drain"}\n')
        time.sleep(1.0)
        os.write(w, b'{"jsonrpc": "2.0", "method": "ping", "id": "after"}\n')
        os.close(w)
        t.join(30)
    ids = [json.loads(line).get("id") for line in out.getvalue().splitlines()]
    assert ids == ["toolcage.serve.drain", "after"], ids


# --------------------------------------------------------------------------------------------------
# 6. Tool code fills the pids limit (threads count in it) while a second code call arrives: the worker
#    cannot start that call's thread, _thread.start_new_thread raises in Loop._serve, nothing catches
#    it, and the worker exits 1: every call in flight, the bomb's own included, ends WorkerCrashed.
#    Fail-closed (no hang, nothing leaks), but any tool code can end its run and its siblings' calls.

PID_BOMB = r"""
import os, time
kids = []
while True:
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:
        time.sleep(4)
        os._exit(0)
    kids.append(pid)
print(len(kids))
time.sleep(3)
"""


def test_a_pids_limit_filled_by_one_call_does_not_crash_the_worker(engine: Any) -> None:
    """A call fills the pids limit while a second code call arrives: on b319cf5 the worker could not
    start the second call's thread and exited (every call in flight ended WorkerCrashed); now the
    call is served on the main thread, and the sandbox goes on."""

    async def go() -> tuple[CallResult, CallResult, CallResult]:
        async with AsyncSandbox(tool="conc-pids", audit=False) as sb:
            bomb = asyncio.ensure_future(sb.call("run_python", {"code": PID_BOMB}))
            await asyncio.sleep(1.5)
            other = await sb.call("run_shell", {"command": "echo hi"})  # may fail, must be answered
            return await bomb, other, await sb.call("ping")

    bomb, _other, ping = asyncio.run(go())
    assert bomb.result is not None and int(bomb.result["stdout"]) > 0, bomb
    assert ping.ok, ping


# --------------------------------------------------------------------------------------------------
# 8. Calls in flight side by side in one run: under runc they share one uid and one PID namespace, so
#    one call can open another's /proc/<pid>/fd/1 and write into its output (issue 21). The seccomp
#    profile denies the user namespace that a PID namespace per call would need, so this is a
#    documented limit (README "Concurrent calls", docs/security.md): calls of one run must trust each
#    other. One call at a time (limits.concurrency: 1), or a sandbox per snippet (a pool), closes it;
#    under gVisor each call is PID 1 of its own namespace and finds nothing to write to.

_FORGER = r"""
import os, time
me = os.getpid()
hits = 0
until = time.monotonic() + 3
while time.monotonic() < until and not hits:
    for p in os.listdir("/proc"):
        if not p.isdigit() or int(p) == me:
            continue
        try:
            with open(f"/proc/{p}/cmdline", "rb") as f:
                if b"VICTIM" not in f.read():
                    continue
            fd = os.open(f"/proc/{p}/fd/1", os.O_WRONLY)
            os.write(fd, b"FORGED\n")
            os.close(fd)
            hits += 1
        except OSError:
            pass
    time.sleep(0.05)
print("hits", hits)
"""


def _victim_stdout_beside_a_forger(policy: Path | str) -> str:
    """A victim call and a forger call in flight at once on one sandbox (when the policy lets them):
    what the victim's stdout holds."""
    victim = "import subprocess; subprocess.run(['python3', '-c', 'import time; time.sleep(2.5)', 'VICTIM'])"
    out: dict[str, CallResult] = {}
    with Sandbox(policy) as sb:

        def call(name: str, code: str) -> None:
            out[name] = sb.call("run_python", {"code": code, "timeout_s": 15})

        first = threading.Thread(target=call, args=("victim", victim))
        first.start()
        time.sleep(0.5)
        call("forger", _FORGER)
        first.join(30)
    r = out["victim"]
    assert r.result is not None, r
    return str(r.result["stdout"])


def test_calls_side_by_side_can_write_each_others_output_under_runc_only(engine: Any) -> None:
    """The documented limit, pinned: under runc a call in flight can write another's stdout through
    /proc/<pid>/fd/1 (calls of one run must trust each other); under gVisor it finds nothing to open."""
    import os

    forged = "FORGED" in _victim_stdout_beside_a_forger("default")
    assert forged is (os.environ.get("TOOLCAGE_SANDBOX") != "gvisor")


def test_one_call_at_a_time_leaves_no_call_to_write_into(engine: Any, tmp_path: Path) -> None:
    """With limits.concurrency: 1 (the documented way to keep snippets apart in one run) the forger
    runs after the victim ended, and every process of the victim was killed in between."""
    pol = tmp_path / "one.yaml"
    pol.write_text("limits:\n  concurrency: 1\n")
    assert "FORGED" not in _victim_stdout_beside_a_forger(pol)
