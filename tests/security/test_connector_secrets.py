"""A hostile connector against the run's secrets: it hunts for the value from inside, the value
stays out of every view from outside, a handler cannot take its sandbox down, and a bad secret
is refused before anything starts.

The handlers are tests/fixtures/hostile_connectors.py. Each probe reports what it read (so a
probe that silently read nothing fails) and every token-shaped value it found, reversed: the
worker and the runner redact the value itself, so a probe that returned a found value as it is
would look clean. A decoy value planted where a probe looks shows that the search works.
Nothing leaves the machine: the egress network is internal and no bound host is ever reached.
"""

from __future__ import annotations

import dataclasses
import json
import os
import secrets
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.helpers import run_cli
from toolcage import CallResult, Sandbox, load_policy, wait_removed
from toolcage.errors import UsageError

pytestmark = pytest.mark.usefixtures("no_leaks")

ROOT = Path(__file__).resolve().parents[2]
HOSTILE = ROOT / "tests" / "fixtures" / "hostile_connectors.py"
BOUND = "api.example.test"  # TOKEN's origin: allowed, never reached
OTHER = "other.example.test"  # allowed, not TOKEN's (EXPOSED's, where a policy exposes it)
TOKEN = "tcsecret_" + secrets.token_hex(16)
EXPOSED = "tcsecret_" + secrets.token_hex(16)
DECOY = "tcsecret_" + "0123456789abcdef" * 2  # planted where a probe looks: it must be found
LONG = dict(call_s=60, run_s=900, idle_s=900)  # module sandboxes idle while other tests run


def _policy(where: Path, name: str, *, exposed: bool = False, **extra: Any) -> Path:
    secrets_ = {"TOKEN": {"send_to": {"host": BOUND}}}
    if exposed:
        secrets_["EXPOSED"] = {"send_to": {"host": OTHER}, "unsafe_expose_to_handler": True}
    doc = {
        "name": name,
        "network": {"mode": "proxy", "allow": [{"host": BOUND}, {"host": OTHER}]},
        "timeouts": LONG,
        "secrets": secrets_,
        **extra,
    }
    path = where / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def _found(value: Any) -> set[str]:
    """Every token-shaped value a probe reported (under any ``hits`` key), un-reversed."""
    out: set[str] = set()
    if isinstance(value, dict):
        for k, v in value.items():
            if k == "hits" and isinstance(v, list):
                out |= {h[::-1] for h in v}
            else:
                out |= _found(v)
    elif isinstance(value, list):
        for v in value:
            out |= _found(v)
    return out


def _assert_clean(r: CallResult) -> None:
    """Neither value in the result, and nothing token-shaped found by the probe but the decoy."""
    text = json.dumps(r.to_dict())
    assert TOKEN not in text and EXPOSED not in text, f"{r.tool}: a secret itself is in the result"
    assert not _found(r.result) - {DECOY}, f"{r.tool} found a secret: {_found(r.result)}"


@pytest.fixture(scope="module")
def egress_net(engine: Any) -> Iterator[str]:
    """An internal egress network: the proxy runs and answers, nothing can leave the machine."""
    tag = secrets.token_hex(3)
    net = f"toolcage-test-conn-{tag}"
    engine.create_network(net, internal=True, labels={"toolcage.test": tag})
    try:
        yield net
    finally:
        wait_removed(60)  # the runs that used it are removed in the background
        engine.remove_network(net)


@pytest.fixture(scope="module")
def probes(engine: Any, egress_net: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sandbox]:
    """One sandbox for the probes: TOKEN bound to an allowed host and not exposed; a decoy in scratch."""
    pol = _policy(tmp_path_factory.mktemp("pol"), "conn-probes")
    with Sandbox(pol, tool="conn-probes", tools=[HOSTILE], secrets={"TOKEN": TOKEN}, egress_network=egress_net) as sb:
        assert sb.call("write_file", {"path": "decoy.txt", "content": DECOY}).ok
        yield sb


# 1. a hostile handler hunts for the value ------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Probe:
    name: str
    tool: str
    params: dict[str, Any]
    ran: Callable[[dict[str, Any]], bool]  # the probe really read what it claims (so it can fail)
    # under gVisor, for a probe aimed at the worker (PID 1 under runc): the handler runs as PID 1 of a
    # PID namespace of its own (worker.children.namespaces), where the worker has no pid to aim at
    alone: bool = False


def _alone(r: dict[str, Any]) -> bool:
    """The handler saw no process but itself: PID 1 of its own PID namespace."""
    return bool(r["me"] == 1 and r["pids"] == [1])


def _init_refused(status: dict[str, str], what: str) -> bool:
    mine = [v for k, v in status.items() if k.startswith("/proc/1/") and k.endswith(what)]
    return bool(mine) and set(mine) == {"EACCES"}


PROBES = [
    Probe(
        "own_env_and_every_process_environ_and_cmdline",
        "env_and_proc",
        {},
        lambda r: (
            1 in r["pids"]
            and r["me"] in r["pids"]
            and r["status"][f"/proc/{r['me']}/environ"] == "ok"
            and r["status"]["/proc/1/cmdline"] == "ok"
            and _init_refused(r["status"], "/environ")
            and "PATH" in r["env_keys"]
        ),
        alone=True,
    ),
    Probe(
        "worker_memory_by_its_maps_ptrace_process_vm_readv_and_own_memory",
        "worker_memory",
        {"decoy": DECOY},
        lambda r: (
            r["init"]["maps"] == "EACCES"
            and r["init"]["mem"] == "EACCES"
            and set(r["init_tasks"].values()) == {"EACCES"}
            and r["ptrace_attach"] == r["ptrace_seize"] == r["process_vm_readv"] == "EPERM"
            and r["self"]["mem"] == "ok"
            and r["self"]["bytes"] > 1 << 20
            and DECOY[::-1] in r["self"]["hits"]
        ),
        alone=True,
    ),
    Probe(
        "worker_fds",
        "worker_fds",
        {},
        lambda r: r["opened"] == 0 and set(r["status"].values()) == {"EACCES"} and len(r["status"]) >= 5,
        alone=True,
    ),
    Probe(
        "what_docker_inspect_shows_seen_from_inside",
        "inside_view",
        {},
        lambda r: r["read"] == len(r["status"]) - 1 and r["status"]["/proc/1/environ"] == "EACCES" and r["hostname"],
        alone=True,
    ),
    Probe(
        "every_readable_file",
        "walk_fs",
        {"budget_s": 40.0},
        lambda r: r["complete"] and r["files"] > 1000 and r["bytes"] > 50 << 20 and DECOY[::-1] in r["hits"],
    ),
    Probe(
        "ask_for_a_secret_not_exposed",
        "ask_secret",
        {"name": "TOKEN"},
        lambda r: all(not r[k]["got"] and r[k]["reason"] == "secret_not_exposed" for k in ("sdk", "raw")),
    ),
    Probe(
        "ask_for_a_secret_that_does_not_exist",
        "ask_secret",
        {"name": "token"},
        lambda r: all(not r[k]["got"] and r[k]["reason"] == "unknown_secret" for k in ("sdk", "raw")),
    ),
    Probe(
        "fetch_another_allowed_host_with_auth",
        "fetch_auth",
        {"url": f"https://{OTHER}/echo", "auth": "TOKEN"},
        lambda r: r["raised"] == "EgressDenied" and r["reason"] == "secret_not_bound",
    ),
    Probe(
        "fetch_the_bound_host_over_another_scheme_with_auth",
        "fetch_auth",
        {"url": f"http://{BOUND}/echo", "auth": "TOKEN"},
        lambda r: r["raised"] == "EgressDenied" and "scheme" in r["message"],
    ),
    Probe(
        "fetch_with_an_unknown_secret",
        "fetch_auth",
        {"url": f"https://{BOUND}/echo", "auth": "NOPE"},
        lambda r: r["raised"] == "EgressDenied" and r["reason"] == "unknown_secret",
    ),
]


@pytest.mark.parametrize("probe", PROBES, ids=[p.name for p in PROBES])
def test_handler_cannot_find_the_secret(probes: Sandbox, probe: Probe) -> None:
    """The probe reads what it says it reads, and finds no trace of the secret (the decoy, where planted, it finds)."""
    r = probes.call(probe.tool, probe.params)
    assert r.status == "ok", r
    _assert_clean(r)
    if probe.alone and probes.kind == "gvisor":
        assert _alone(r.result), r.result
    else:
        assert probe.ran(r.result), r.result


@dataclasses.dataclass(frozen=True)
class Forgery:
    kind: str
    violation: str


FORGERIES = [
    Forgery("unknown_op", "an unknown operation 'shell'"),
    Forgery("oversize", "a message over the size limit"),
    Forgery("not_json", "a message that is not JSON"),
    Forgery("not_object", "a message after its answer, or not an object"),
    Forgery("second_result", "a message after its answer, or not an object"),
]


@pytest.mark.parametrize("forgery", FORGERIES, ids=[f.kind for f in FORGERIES])
def test_forged_messages_end_the_call_as_a_crash(probes: Sandbox, forgery: Forgery) -> None:
    """A message that breaks the socket's rules ends the call as a crash (-32021, naming it); the worker lives on."""
    r = probes.call("forge", {"kind": forgery.kind})
    assert r.status == "error" and r.error is not None, r
    assert r.error["code"] == -32021 and forgery.violation in r.error["message"], r.error
    assert r.error["data"]["signal"] == "SIGKILL", r.error  # killed at once, not waited for
    assert probes.call("ping").result == "pong"
    assert probes.call("hello", {"name": forgery.kind}).result == {"hello": forgery.kind}


def test_a_daemon_cannot_wait_for_the_next_calls_secret(probes: Sandbox) -> None:
    """A setsid daemon scanning every new process's environ, cmdline and memory is gone when its call ends:
    it never sees the next calls (one using the secret, one holding a decoy in its memory for a second)."""
    r = probes.call("daemon_start")
    assert r.result["alive"], r.result
    used = probes.call("fetch_auth", {"url": f"https://{OTHER}/", "auth": "TOKEN"})
    assert used.result["reason"] == "secret_not_bound", used.result
    assert probes.call("hold", {"name": DECOY}).ok
    report = probes.call("daemon_report")
    _assert_clean(report)
    seen = report.result
    assert seen["others"] == [] and seen["beats"] > 0 and seen["hits"] == [], seen


def test_premise_a_surviving_daemon_reads_later_handlers(engine: Any) -> None:
    """With unsafe_background_processes the same daemon lives on and reads a later handler's params from its
    memory: the end-of-call sweep is what stops it (and it would read an exposed secret the same way)."""
    policy = dataclasses.replace(load_policy("default"), unsafe_background_processes=True)
    with Sandbox(policy, tool="conn-premise", tools=[HOSTILE]) as sb:
        assert sb.call("daemon_start").result["alive"]
        assert sb.call("hold", {"name": DECOY}).ok
        seen = sb.call("daemon_report").result
    assert seen["others"] and seen["hits"] == [DECOY[::-1]], seen


# 2. outside views --------------------------------------------------------------------------------

OUTSIDE_CALLS: list[tuple[str, dict[str, Any]]] = [
    ("expose", {}),
    ("expose_error", {}),
    ("ask_secret", {"name": "TOKEN"}),
    ("fetch_auth", {"url": f"https://{OTHER}/", "auth": "TOKEN"}),
    ("env_and_proc", {}),
    ("crash_exit", {}),
    ("hello", {}),
]


def test_outside_views_never_show_a_secret(engine: Any, egress_net: str, tmp_path: Path) -> None:
    """docker inspect of the sandbox and its proxy, their container logs, the audit log and every CallResult
    hold neither value; an exposed value a handler returns or raises with comes back as [secret EXPOSED]."""
    from toolcage.lifecycle.audit import read

    pol = _policy(tmp_path, "conn-outside", exposed=True)
    audit = tmp_path / "audit.jsonl"
    with Sandbox(
        pol,
        tool="conn-outside",
        tools=[HOSTILE],
        secrets={"TOKEN": TOKEN, "EXPOSED": EXPOSED},
        egress_network=egress_net,
        audit=audit,
    ) as sb:
        results = {tool: sb.call(tool, params) for tool, params in OUTSIDE_CALLS}
        mine = [c["Id"] for c in engine.containers(f"toolcage.run_id={sb.run_id}")]
        inspected = json.dumps([engine.inspect(cid) for cid in mine])
        time.sleep(0.3)  # the worker writes its log lines when idle
        # the sandbox's and the proxy's containers keep no log (LogConfig none: their streams are not copied to the
        # host's disk); one that had a log would be read
        drivers = {cid: engine.inspect(cid)["HostConfig"]["LogConfig"]["Type"] for cid in mine}
        logs = "\n".join(engine.logs(cid) for cid in mine if drivers[cid] != "none")
    records = list(read(audit))
    views = {"inspect": inspected, "container logs": logs, "audit": audit.read_text()}
    views |= {f"CallResult {t}": json.dumps(r.to_dict()) + repr(r) for t, r in results.items()}
    for view, text in views.items():
        assert TOKEN not in text and EXPOSED not in text, f"a secret is in {view}"
    # each view is the real thing
    assert len(mine) == 2 and '"Env"' in inspected and "TOOLCAGE_POLICY" in inspected
    assert set(drivers.values()) == {"none"}  # nothing of the run's streams at rest on the host
    configured = [r for r in records if r["event"] == "run.configured"]
    assert configured and configured[0]["secrets"] == ["EXPOSED", "TOKEN"], records
    assert len([r for r in records if r["event"] == "run.call"]) == len(OUTSIDE_CALLS)
    assert results["expose"].result == {
        "plain": "[secret EXPOSED]",
        "in_text": "token=[secret EXPOSED];",
        "nested": {"[secret EXPOSED]": ["[secret EXPOSED]"]},
        "json": json.dumps({"v": "[secret EXPOSED]"}),
    }
    err = results["expose_error"].error
    assert (
        err is not None
        and err["message"] == "failed with [secret EXPOSED]"
        and err["data"] == {"token": "[secret EXPOSED]"}
    )
    assert results["crash_exit"].error["code"] == -32021 and results["hello"].ok  # type: ignore[index]


def _cli(*args: str, env: dict[str, str] | None = None, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return run_cli(*args, env=env, stdin=stdin, timeout=180)


SECRET_ENV = {"TC_TOKEN": TOKEN, "TC_EXPOSED": EXPOSED}
SECRET_ARGS = ("--secret", "TOKEN=env:TC_TOKEN", "--secret", "EXPOSED=env:TC_EXPOSED")


def test_cli_run_vv_never_prints_a_secret(engine: Any, egress_net: str, tmp_path: Path) -> None:
    """`toolcage run -vv` with --secret NAME=env:VAR: a handler returning, logging and printing the exposed
    value leaves [secret EXPOSED] on stdout and stderr, never a value."""
    pol = _policy(tmp_path, "conn-cli", exposed=True)
    tools = ("--tools", str(HOSTILE), "--policy", str(pol), "--egress-network", egress_net)
    out = _cli("run", "expose", *tools, *SECRET_ARGS, "-vv", env=SECRET_ENV)
    assert out.returncode == 0, out.stderr[-3000:]
    for stream in (out.stdout, out.stderr):
        assert TOKEN not in stream and EXPOSED not in stream
    assert json.loads(out.stdout)["result"]["plain"] == "[secret EXPOSED]"
    warned = [ln for ln in out.stderr.splitlines() if "handler.warns" in ln]
    assert warned and "[secret EXPOSED]" in warned[0], out.stderr[-3000:]  # the handler's own log line


STRADDLES = ["message", "raise", "traceback", "log", "stdout", "stderr", "progress"]


def test_a_limit_never_cuts_an_exposed_value_in_two(engine: Any, egress_net: str, tmp_path: Path) -> None:
    """An exposed value placed across each length limit (error message, the child's message and traceback,
    log line, stdout and stderr tails, progress message) is redacted before the cut: no half of it reaches
    `serve -vv`."""
    pol = _policy(tmp_path, "conn-straddle", exposed=True)
    # with a progress token (one per request: the calls may run side by side), so that progress is sent
    calls = [("expose", {})] + [("expose_straddle", {"where": w, "_meta": {"progressToken": w}}) for w in STRADDLES]
    lines = "".join(
        json.dumps({"jsonrpc": "2.0", "method": m, "params": p, "id": i}) + "\n" for i, (m, p) in enumerate(calls)
    )
    tools = ("--tools", str(HOSTILE), "--policy", str(pol), "--egress-network", egress_net)
    out = _cli("serve", *tools, *SECRET_ARGS, "-vv", env=SECRET_ENV, stdin=lines)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = [json.loads(line) for line in out.stdout.splitlines()]
    answers = {a["id"]: a for a in lines if "id" in a}
    progress = [n["params"] for n in lines if n.get("method") == "notifications/progress"]
    assert sorted(answers) == list(range(len(calls))), out.stdout[-3000:]
    half = len(EXPOSED) // 2
    leaks = {
        (where, piece): stream
        for where, stream in (("answers", out.stdout), ("stderr", out.stderr))
        for piece in (EXPOSED[:half], EXPOSED[half:])
        if piece in stream
    }
    assert not leaks, f"half a value survived redaction: {sorted(leaks)}"
    # every straddle really ran: its message, traceback, log line and output tails are there, redacted
    for i in (1, 2, 3):
        assert answers[i]["error"]["code"] in (-32001, -32020), answers[i]
    assert "[secret EXPOSED]" in answers[3]["error"]["data"]["traceback"]
    assert any("[secret EXPOSED]" in p.get("message", "") for p in progress), progress
    for event in ("handler.says", "handler.long", "handler.output"):
        assert any(event in ln and "[secret EXPOSED]" in ln for ln in out.stderr.splitlines()), event


# Tool code in a call beside a connector call (concurrent calls on one sandbox): it reads every other
# process's memory through /proc/<pid>/mem, as any same-uid process may, while the connector holds an
# exposed secret. On 74a7bd3 the two ran side by side and the scan found the value; a connector call
# now runs with no other code call in flight (after the sweep), so nothing of the run is there to read.
SCAN_BESIDE = r"""
import os, re, time, json
pat = re.compile((b"tc" + b"secret_") + rb"[0-9a-f]{32}")
decoy = os.fork()
if decoy == 0:  # a sibling of ours holding the decoy: the scan must find it
    held = [(b"tc" + b"secret_") + b"0123456789abcdef" * 2]
    time.sleep(30)
    os._exit(0)
hits, scanned, end = set(), 0, time.monotonic() + DURATION
while time.monotonic() < end:
    for p in [p for p in os.listdir("/proc") if p.isdigit() and int(p) != os.getpid()]:
        try:
            maps = open(f"/proc/{p}/maps").read().splitlines()
            fd = os.open(f"/proc/{p}/mem", os.O_RDONLY)
        except OSError:
            continue
        scanned += 1
        for line in maps:
            f = line.split()
            if "r" not in f[1] or (len(f) > 5 and f[5] in ("[vvar]", "[vsyscall]")):
                continue
            a, b = (int(x, 16) for x in f[0].split("-"))
            try:
                hits |= {m.group().decode()[::-1] for m in pat.finditer(os.pread(fd, b - a, a))}
            except OSError:
                pass
        os.close(fd)
    time.sleep(0.05)
os.kill(decoy, 9)
print(json.dumps({"scanned": scanned, "hits": sorted(hits)}))
"""


def test_tool_code_beside_a_connector_call_cannot_read_its_secret(engine: Any, egress_net: str, tmp_path: Path) -> None:
    """A run_python call sent while a connector call holds an exposed secret scans every process's
    memory: it runs only once the connector call has ended (and the sweep), and finds nothing but the
    decoy it planted itself; the connector call first, the scan second, as sent."""
    import asyncio

    from toolcage import AsyncSandbox

    pol = _policy(tmp_path, "conn-beside", exposed=True)

    async def go() -> tuple[CallResult, CallResult, float]:
        async with AsyncSandbox(
            pol, tool="conn-beside", tools=[HOSTILE], secrets={"TOKEN": TOKEN, "EXPOSED": EXPOSED},
            egress_network=egress_net,
        ) as sb:  # fmt: skip
            hold = asyncio.ensure_future(sb.call("expose_hold", {"seconds": 2.0}))
            await asyncio.sleep(0.5)  # the connector holds the value now
            t0 = time.monotonic()
            scan = await sb.call("run_python", {"code": SCAN_BESIDE.replace("DURATION", "1.5")})
            return await hold, scan, time.monotonic() - t0

    held, scan, _ = asyncio.run(go())
    assert held.ok and held.result == {"held": 2 * len(EXPOSED)}, held
    assert scan.ok and scan.result["exit_code"] == 0, scan.result
    seen = json.loads(scan.result["stdout"])
    assert seen["scanned"] >= 1, seen  # it could read a process's memory: the decoy
    assert _found(seen) == {DECOY}, f"found beside a connector call: {_found(seen)}"


# 3. containment ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def contained(engine: Any, egress_net: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sandbox]:
    """A sandbox with small limits (call 5 s, 256 MiB, 64 pids) whose worker holds TOKEN."""
    pol = _policy(
        tmp_path_factory.mktemp("pol"),
        "conn-contain",
        timeouts={**LONG, "call_s": 5},
        limits={"memory": "256m", "pids": 64},
    )
    with Sandbox(pol, tool="conn-contain", tools=[HOSTILE], secrets={"TOKEN": TOKEN}, egress_network=egress_net) as sb:
        yield sb


@dataclasses.dataclass(frozen=True)
class Abuse:
    name: str
    tool: str
    params: dict[str, Any]
    status: str
    code: int | None  # the error code, None for a result
    gvisor: tuple[str, int] | None = None  # also clear under gVisor: that status and error code


ABUSES = [
    Abuse("exit_without_answer", "crash_exit", {}, "error", -32021),
    Abuse("segfault", "crash_segv", {}, "error", -32021),
    Abuse("hang_past_call_timeout", "hang", {}, "timeout", -32003),
    Abuse("flood_100mib_stdout_and_stderr", "flood", {"mib": 100}, "ok", None),
    # 10,000 notes, ten times what one call may write (_MAX_NOTES): about 1 s here, 4 s for 20,000 lines, which a
    # loaded CI machine under gVisor pushed past the 5 s call limit
    Abuse("log_and_progress_spam", "spam_log", {"lines": 5000}, "ok", None),
    # under gVisor a forked interpreter costs more (gVisor copies a written page's 2 MiB around it), and the
    # 64 of them meet the 256 MiB before the process limit about half the time: then the guard ends the call
    Abuse("fork_bomb", "fork_bomb", {}, "ok", None, gvisor=("oom_killed", -32022)),
    Abuse("memory_to_the_limit", "eat_memory", {}, "oom_killed", -32022),
]


@pytest.mark.parametrize("abuse", ABUSES, ids=[a.name for a in ABUSES])
def test_handler_abuse_ends_its_call_and_nothing_else(contained: Sandbox, abuse: Abuse) -> None:
    """Each abuse ends its call with a clear status; then ping and a connector call work, and no process is left."""
    r = contained.call(abuse.tool, abuse.params)
    _assert_clean(r)
    seen = (r.status, (r.error or {}).get("code"))
    assert seen == (abuse.status, abuse.code) or (contained.kind == "gvisor" and seen == abuse.gvisor), r
    assert contained.call("ping").result == "pong"
    assert contained.call("hello", {"name": abuse.name}).result == {"hello": abuse.name}
    assert contained.call("census").result == {"others": {}}
    ps = contained.call("run_shell", {"command": "cd /proc && echo $$ [0-9]*"}).result["stdout"].split()
    # only the worker and this shell (under gVisor the shell is PID 1 of a PID namespace of its own)
    assert sorted(ps[1:]) == sorted({"1", ps[0]}), ps


def test_a_storm_of_refused_fetches_cannot_kill_the_sandbox(engine: Any, egress_net: str, tmp_path: Path) -> None:
    """Thousands of refused fetches with long URLs (or a few with huge ones), each a decision kept for the audit,
    cannot grow the call's answer past what the runner accepts: past a budget the fetches are refused, URLs over
    8 KiB always; the sandbox lives on."""
    pol = _policy(tmp_path, "conn-storm", limits={"output_cap": "64k"})  # the runner takes lines up to 2 MiB
    url = f"https://{OTHER}/" + "a" * 4000
    with Sandbox(pol, tool="conn-storm", tools=[HOSTILE], secrets={"TOKEN": TOKEN}, egress_network=egress_net) as sb:
        r = sb.call("fetch_storm", {"n": 2000, "url": url, "auth": "TOKEN"})
        assert r.status == "ok", r
        reasons = r.result["reasons"]
        assert reasons.get("secret_not_bound", 0) > 10 and reasons.get("too_many_requests", 0) > 0, reasons
        huge = sb.call("fetch_storm", {"n": 3, "url": f"https://{OTHER}/" + "a" * (1 << 20)})
        assert huge.result == {"reasons": {"BadParams": 3}}, huge  # refused before any decision is kept
        assert sb.call("hello").ok and sb.call("ping").result == "pong"


# 4. usage errors ---------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Misuse:
    name: str
    args: tuple[str, ...]
    env: dict[str, str]
    says: str
    bind_elsewhere: bool = False  # the policy binds TOKEN to a host its allowlist does not name


MISUSES = [
    Misuse("missing_secret", (), {}, "the policy 'conn-usage' needs TOKEN (give --secret NAME=env:VAR)"),
    Misuse(
        "secret_not_in_policy",
        ("--secret", "TOKEN=env:TC_TOKEN", "--secret", "OTHER=env:TC_TOKEN"),
        {"TC_TOKEN": TOKEN},
        "the policy 'conn-usage' binds no secret named OTHER",
    ),
    Misuse(
        "bound_to_a_host_not_allowed",
        ("--secret", "TOKEN=env:TC_TOKEN"),
        {"TC_TOKEN": TOKEN},
        "secret TOKEN is bound to https://elsewhere.example.test:443, which network.allow does not allow",
        bind_elsewhere=True,
    ),
    Misuse("literal_value", ("--secret", f"TOKEN={TOKEN}"), {}, "give NAME=env:VAR or NAME=file:PATH"),
    Misuse("shorter_than_8", ("--secret", "TOKEN=env:TC_SHORT"), {"TC_SHORT": "7-chars"}, "at least 8 characters"),
    Misuse(
        "trailing_newline",
        ("--secret", "TOKEN=env:TC_NL"),
        {"TC_NL": TOKEN + "\n"},
        "TOKEN: secret values must not contain control characters",
    ),
]


def _run_watched(engine: Any, argv: list[str], env: dict[str, str]) -> tuple[int, str, str, list[dict[str, Any]]]:
    """A CLI run, and every Docker object event of a run that process owned (a created container, network, ...)."""
    since = time.time() - 0.1
    proc = subprocess.Popen(
        [sys.executable, "-m", "toolcage.cli", *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env={**os.environ, **env},
    )
    stdout, stderr = proc.communicate(timeout=120)
    label = {"label": f"toolcage.owner={socket.gethostname()}:{proc.pid}"}
    events = list(engine.api.events(since=since, until=time.time(), filters=label, decode=True))
    return proc.returncode, stdout, stderr, events


@pytest.mark.parametrize("misuse", MISUSES, ids=[m.name for m in MISUSES])
def test_bad_secret_is_a_usage_error_before_anything_starts(engine: Any, tmp_path: Path, misuse: Misuse) -> None:
    """Exit 2 with one clear stderr line (and the JSON error on stdout), no value echoed, no Docker object created."""
    doc = {
        "name": "conn-usage",
        "network": {"mode": "proxy", "allow": [{"host": BOUND}]},
        "secrets": {"TOKEN": {"send_to": {"host": "elsewhere.example.test" if misuse.bind_elsewhere else BOUND}}},
    }
    pol = tmp_path / "usage.yaml"
    pol.write_text(yaml.safe_dump(doc))
    audit = tmp_path / "audit.jsonl"
    argv = ["run", "hello", "--tools", str(HOSTILE), "--policy", str(pol), *misuse.args, "--audit-log", str(audit)]
    rc, stdout, stderr, events = _run_watched(engine, argv, misuse.env)
    assert rc == 2, (stdout, stderr)
    assert stderr.splitlines() == [stderr.rstrip("\n")] and stderr.startswith("toolcage: "), stderr
    assert misuse.says in stderr, stderr
    assert json.loads(stdout)["error"]["message"] in stderr
    assert TOKEN not in stdout + stderr
    assert not audit.exists() or "run.started" not in audit.read_text()
    assert events == [], events


def test_library_refuses_a_bad_secret_before_anything_starts(engine: Any, tmp_path: Path) -> None:
    """Sandbox(secrets=...) raises UsageError at construction for each bad value: nothing to clean up."""
    pol = _policy(tmp_path, "conn-lib")
    for bad in ({}, {"TOKEN": TOKEN, "OTHER": TOKEN}, {"TOKEN": "short"}, {"TOKEN": TOKEN + "\r"}):
        with pytest.raises(UsageError):
            Sandbox(pol, tools=[HOSTILE], secrets=bad)


def test_premise_the_no_container_check_sees_a_run_that_starts(engine: Any, egress_net: str, tmp_path: Path) -> None:
    """The same check on a correct run finds its container and its audit record: the usage cases' check can fail."""
    pol = _policy(tmp_path, "conn-usage-ok")
    audit = tmp_path / "audit.jsonl"
    argv = ["run", "hello", "--tools", str(HOSTILE), "--policy", str(pol), "--egress-network", egress_net]
    argv += ["--secret", "TOKEN=env:TC_TOKEN", "--audit-log", str(audit)]
    rc, _, stderr, events = _run_watched(engine, argv, SECRET_ENV)
    assert rc == 0, stderr
    created = {e["Type"] for e in events if e.get("Action") == "create"}
    assert "container" in created, events
    assert "run.started" in audit.read_text()
