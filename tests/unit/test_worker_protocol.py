"""The worker as a process: framing survives noisy handlers, errors map to JSON-RPC codes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def run_worker(lines: list[bytes], tmp_path: Path, **env: str) -> tuple[list[Any], str]:
    e = {
        "PATH": os.environ["PATH"],
        "PYTHONPATH": str(ROOT),
        "TOOLCAGE_SCRATCH": str(tmp_path),
        "TOOLCAGE_WORKSPACE": str(tmp_path),
        **env,
    }
    proc = subprocess.run(
        [sys.executable, "-m", "toolcage.worker"], input=b"".join(lines), capture_output=True, env=e, timeout=60
    )
    out = [json.loads(x) for x in proc.stdout.splitlines()]
    return out, proc.stderr.decode()


def req(method: str, params: Any = None, id: Any = 1) -> bytes:
    obj: dict[str, Any] = {"jsonrpc": "2.0", "method": method, "id": id}
    if params is not None:
        obj["params"] = params
    return json.dumps(obj).encode() + b"\n"


def test_noisy_handler_cannot_corrupt_stream(tmp_path: Path) -> None:
    """print(), sys.stdout, fd 1 and a flooding child all miss the protocol: one clean response per request."""
    out, err = run_worker(
        [req("noisy", {}, 1), req("ping", None, 2)], tmp_path, TOOLCAGE_TOOL_MODULES="tests.fixtures.noisy_tools"
    )
    assert out == [{"jsonrpc": "2.0", "result": {"ok": True}, "id": 1}, {"jsonrpc": "2.0", "result": "pong", "id": 2}]
    assert "this print must not reach" in err  # it went to the log stream


def test_malformed_then_valid(tmp_path: Path) -> None:
    """A parse error answers -32700 with id null, and the next request still works."""
    out, _ = run_worker([b"{not json\n", req("ping")], tmp_path)
    assert out[0]["error"]["code"] == -32700 and out[0]["id"] is None
    assert out[1] == {"jsonrpc": "2.0", "result": "pong", "id": 1}


def test_error_codes(tmp_path: Path) -> None:
    """-32600 invalid request, -32601 unknown method, -32602 bad params (named fields)."""
    out, _ = run_worker(
        [
            b'{"jsonrpc": "1.0", "method": "ping", "id": 1}\n',
            b"[]\n",
            b'{"jsonrpc": "2.0", "method": "ping", "id": true}\n',
            req("no_such_tool", {}, 2),
            req("run_python", {"cod": "x"}, 3),
            req("run_python", ["positional"], 4),
            req("run_python", {"code": 5}, 5),
        ],
        tmp_path,
    )
    # calls of a tool that runs code answer as they end (concurrently), the others in order
    codes = {o["id"]: o["error"]["code"] for o in out[4:]} | {"first": [o["error"]["code"] for o in out[:4]]}
    assert codes == {"first": [-32600, -32600, -32600, -32601], 3: -32602, 4: -32602, 5: -32602}
    fields = {e["field"] for o in out if o["id"] == 3 for e in o["error"]["data"]}
    assert fields == {"code", "cod"}


def test_internal_error_does_not_leak(tmp_path: Path) -> None:
    """An unexpected exception answers -32603 with an error id only; details go to stderr."""
    out, err = run_worker([req("boom", {})], tmp_path, TOOLCAGE_TOOL_MODULES="tests.fixtures.noisy_tools")
    error = out[0]["error"]
    assert error["code"] == -32603
    assert "shadow" not in json.dumps(error)
    assert set(error["data"]) == {"error_id"}
    assert error["data"]["error_id"] in err and "shadow" in err


def test_oversized_line(tmp_path: Path) -> None:
    """A request line over the limit gets -32600 and the worker keeps serving."""
    big = b'{"jsonrpc": "2.0", "method": "ping", "params": ["' + b"a" * (17 * 1024 * 1024) + b'"], "id": 1}\n'
    out, _ = run_worker([big, req("ping", None, 2)], tmp_path)
    assert out[0]["error"]["code"] == -32600
    assert out[1]["result"] == "pong"


def test_notification_gets_no_response(tmp_path: Path) -> None:
    """A notification (no id) is executed but not answered; batches are answered as batches."""
    out, _ = run_worker(
        [
            b'{"jsonrpc": "2.0", "method": "ping"}\n',
            b'[{"jsonrpc": "2.0", "method": "ping", "id": 7}, {"jsonrpc": "2.0", "method": "ping", "id": 8}]\n',
        ],
        tmp_path,
    )
    assert out == [[{"jsonrpc": "2.0", "result": "pong", "id": 7}, {"jsonrpc": "2.0", "result": "pong", "id": 8}]]


def test_logs_are_json_on_stderr(tmp_path: Path) -> None:
    """Worker logs are JSON lines on stderr (structlog's shape, without structlog) with stable event names."""
    _, err = run_worker([req("ping")], tmp_path)
    events = [json.loads(line)["event"] for line in err.splitlines() if line.startswith("{")]
    assert "worker.started" in events and "worker.stopped" in events


def test_lean_start_up_imports() -> None:
    """Start-up and a tool call import neither asyncio, jsonschema, pydantic nor structlog (~400 ms in a container)."""
    code = (
        "import sys, worker.__main__, worker.dispatch, worker.protocol, worker.settings\n"
        "from worker.tools import Catalog\n"
        "from policies import Policy, policy_from_json\n"
        "p = policy_from_json(Policy().canonical_json())\n"
        "for name, params in (('run_python', {'code': 'x', 'timeout_s': 1}), ('grep', {'pattern': 'a'})):\n"
        "    Catalog().get(name).validate(params)\n"
        "print([m for m in ('asyncio', 'jsonschema', 'pydantic', 'structlog') if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.strip() == "[]"


def test_first_answer_imports_only_the_core() -> None:
    """What the worker imports before its first answer (a ping): jsonrpcserver's dispatch core (the project's
    JSON-RPC library) and no policy model, dataclasses, structlog, tool or connector module (issue 11)."""
    code = (
        "import sys\n"
        "import worker.__main__, worker.dispatch, worker.protocol, worker.settings, worker.logs\n"
        "import worker.children.sweep\n"
        "from worker.tools import Catalog\n"
        "from worker.settings import Settings\n"
        "d = worker.dispatch.Dispatcher(Settings(None, None, '.', 'x'), Catalog())\n"
        'assert d.handle(b\'{"jsonrpc": "2.0", "method": "ping", "id": 1}\') == '
        '\'{"jsonrpc": "2.0", "result": "pong", "id": 1}\'\n'
        "heavy = ('structlog', 'asyncio', 'pydantic', 'dataclasses', 'uuid', 'subprocess',\n"
        "         'toolcage.policies.model', 'toolcage.policies.loader',\n"
        "         'toolcage.worker.connectors.host', 'toolcage.worker.tools.proc', 'toolcage.worker.children.zygote',\n"
        "         'oslash.cont', 'oslash.observable', 'oslash.list')  # oslash: Either only (~35 ms)\n"
        "print([m for m in heavy if m in sys.modules or m.replace('toolcage.', '') in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.strip() == "[]"


def test_baked_tool_schemas_match_the_code() -> None:
    """schemas.json (made at image build) is exactly what tools.list would compute from the tool declarations."""
    from toolcage.worker.tools import BUILTIN, Catalog, describe_tool
    from toolcage.worker.tools.schemas import entries

    catalog = Catalog(modules=BUILTIN)
    assert entries() == [describe_tool(catalog.get(name)) for name in BUILTIN]
    assert json.loads(json.dumps(entries())) == entries()  # survives the file round trip unchanged


# each call marks itself started, then waits (up to 10 s) until all three have: only calls that run
# side by side can all finish in time
RENDEZVOUS = (
    "touch started.$N; i=0; while [ $(ls started.* | wc -l) -lt 3 ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i+1)); done;"
    " ls started.* | wc -l"
)


def _policy(concurrency: int) -> str:
    return json.dumps({"name": "t", "limits": {"concurrency": concurrency}})


def test_code_calls_run_side_by_side_and_answer_by_id(tmp_path: Path) -> None:
    """Three run_shell calls meet while all run; a ping sent behind them is answered at once, before them."""
    lines = [req("run_shell", {"command": RENDEZVOUS.replace("$N", str(i))}, i) for i in (1, 2, 3)]
    out, _ = run_worker([*lines, req("ping", None, "p")], tmp_path)
    assert out[0] == {"jsonrpc": "2.0", "result": "pong", "id": "p"}
    assert sorted(o["id"] for o in out[1:]) == [1, 2, 3]
    assert all(o["result"]["stdout"] == "3\n" for o in out[1:]), out


def test_concurrency_one_serves_one_at_a_time_in_order(tmp_path: Path) -> None:
    """limits.concurrency 1: the calls run one after another (none meets the others), answered in order."""
    lines = [req("run_shell", {"command": RENDEZVOUS.replace("$N", str(i)).replace("100", "3")}, i) for i in (1, 2)]
    out, _ = run_worker([*lines, req("ping", None, "p")], tmp_path, TOOLCAGE_POLICY=_policy(1))
    assert [o["id"] for o in out] == [1, 2, "p"]
    assert [o["result"]["stdout"] for o in out[:2]] == ["1\n", "2\n"]


def test_calls_beyond_the_limit_wait_for_a_free_slot(tmp_path: Path) -> None:
    """limits.concurrency 2: the third call starts only when one of the first two has ended."""
    wait_for = "i=0; while [ ! -e {f} ] && [ $i -lt 100 ]; do sleep 0.05; i=$((i+1)); done; "
    lines = [
        req("run_shell", {"command": wait_for.format(f="go") + "echo a > done.a; ls"}, "a"),
        req("run_shell", {"command": "sleep 0.3; touch go; echo b"}, "b"),
        req("run_shell", {"command": "ls done.a go 2>/dev/null | wc -l"}, "c"),
    ]
    out, _ = run_worker(lines, tmp_path, TOOLCAGE_POLICY=_policy(2))
    by_id = {o["id"]: o["result"] for o in out}
    assert by_id["b"]["stdout"] == "b\n" and "done.a" in by_id["a"]["stdout"]
    assert by_id["c"]["stdout"] in ("1\n", "2\n"), out  # started after b made `go` (unlimited: "0")


def test_a_cancel_reaches_one_call_among_several(tmp_path: Path) -> None:
    """A cancel read while three calls run kills the one it names, at once; the others end as they would."""
    lines = [
        req("run_shell", {"command": "sleep 30"}, "slow"),
        req("run_shell", {"command": "sleep 0.5; echo one"}, 1),
        req("run_shell", {"command": "sleep 0.5; echo two"}, 2),
        json.dumps({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": "slow"}}).encode()
        + b"\n",
    ]
    started = __import__("time").monotonic()
    out, _ = run_worker(lines, tmp_path)
    assert __import__("time").monotonic() - started < 10
    by_id = {o["id"]: o for o in out}
    assert by_id["slow"]["error"]["code"] == -32800
    assert by_id[1]["result"]["stdout"] == "one\n" and by_id[2]["result"]["stdout"] == "two\n"


def test_a_kept_tools_list_answer_is_the_usual_one_but_for_its_id(monkeypatch: Any) -> None:
    """``tools.list`` is answered from a line kept from the last one (worker.dispatch._tools_list_line): byte for
    byte what jsonrpcserver's path makes, for any id; made again when the catalog or the redaction changes (a
    secret's value in a description is redacted in both); any other shape of request takes the usual path."""
    from toolcage.worker import dispatch
    from toolcage.worker.secrets import SecretStore
    from toolcage.worker.settings import Settings
    from toolcage.worker.tools import Catalog, Tool

    d = dispatch.Dispatcher(Settings(None, None, ".", "x"), Catalog())

    def both(rid: Any) -> tuple[str, str]:
        line = json.dumps({"jsonrpc": "2.0", "method": "tools.list", "id": rid}).encode()
        kept = d.handle(line)
        with monkeypatch.context() as m:
            m.setattr(d, "_tools_list_line", lambda msg: None)
            usual = d.handle(line)
        return kept, usual

    for rid in (1, 0, -7, 2**70, "a", "", 'q"uote\\\n', "été ☃", "x" * 300):
        kept, usual = both(rid)
        assert kept == usual and json.loads(kept)["id"] == rid
    first = d._listed
    both(3)
    assert d._listed is first  # kept, not made again
    monkeypatch.setattr(dispatch, "STORE", SecretStore.unbound({"S": "Run Python code"}))
    kept, usual = both(4)
    assert kept == usual and "Run Python code" not in kept and d._listed is not first
    entry = {"name": "extra_tool", "description": "an extra tool", "params_schema": {"type": "object"}}
    d.catalog.add(Tool("extra_tool", "an extra tool", None, lambda s, p: None, info=lambda: entry))
    kept, usual = both(5)
    assert kept == usual and "extra_tool" in kept
    for other in (
        {"jsonrpc": "2.0", "method": "tools.list", "id": 6, "params": {"x": 1}},  # params it takes not
        {"jsonrpc": "2.0", "method": "tools.list", "id": True},  # not an id
        {"jsonrpc": "2.0", "method": "tools.list"},  # a notification
        {"jsonrpc": "2.0", "method": "tools.list", "id": 7, "extra": 1},
        {"jsonrpc": "1.0", "method": "tools.list", "id": 8},
    ):
        assert d._tools_list_line(other) is None
