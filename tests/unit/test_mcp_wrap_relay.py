"""The rules of `toolcage mcp wrap`'s relay (toolcage.servers.mcp_relay), the launcher's config line and
environment (toolcage.worker.mcp_host), and the command's usage errors; no Docker."""

from __future__ import annotations

import json
import os
from typing import Any

import pytest

from tests.helpers import run_cli
from tests.unit._helpers import run_spec
from toolcage.engine.hostconfig import container_config
from toolcage.policies import load_policy
from toolcage.servers.mcp_relay import SERVER_ENDED, Relay, ToolFilter


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def line(msg: Any) -> bytes:
    return json.dumps(msg).encode()


def req(rid: Any, method: str, params: Any = None) -> bytes:
    msg: dict[str, Any] = {"jsonrpc": "2.0", "id": rid, "method": method}
    if params is not None:
        msg["params"] = params
    return line(msg)


def call(rid: Any, name: str, args: Any = None) -> bytes:
    return req(rid, "tools/call", {"name": name, "arguments": args or {}})


def ok(rid: Any, result: Any) -> bytes:
    return line({"jsonrpc": "2.0", "id": rid, "result": result})


def test_an_answer_reaches_the_client_only_for_a_pending_request() -> None:
    """A response with an id the client never used (or already got an answer for) is dropped and noted."""
    r = Relay(ToolFilter(), Clock())
    assert r.from_server(ok(7, {"forged": True})).to_client == []
    acts = r.from_client(req(7, "ping"))
    assert acts.to_server and not acts.to_client
    assert r.from_server(ok(7, {})).to_client == [{"jsonrpc": "2.0", "id": 7, "result": {}}]
    second = r.from_server(ok(7, {"again": True}))
    assert second.to_client == [] and second.notes[0][0] == "mcp.server_answer_dropped"


def test_ids_keep_their_type() -> None:
    """The string id "1" and the number 1 are different requests (a forged "1" does not answer 1)."""
    r = Relay(ToolFilter(), Clock())
    r.from_client(req(1, "ping"))
    assert r.from_server(ok("1", {})).to_client == []
    assert r.from_server(ok(1, {})).to_client[0]["id"] == 1


def test_garbage_and_batches_from_the_server_are_dropped() -> None:
    """Not JSON, not JSON-RPC 2.0, a batch, a response with both result and error: noted, never forwarded."""
    r = Relay(ToolFilter(), Clock())
    r.from_client(req(1, "ping"))
    for bad in (b"hello", b"[]", line([{"jsonrpc": "2.0", "id": 1, "result": {}}]), line({"id": 1, "result": {}})):
        acts = r.from_server(bad)
        assert acts.to_client == [] and acts.notes, bad
    both = line({"jsonrpc": "2.0", "id": 1, "result": {}, "error": {"code": 1, "message": "x"}})
    assert r.from_server(both).to_client == []
    assert r.busy()  # still waiting for a real answer


def test_notifications_and_server_requests_pass_both_ways() -> None:
    """Progress notifications reach the client; a server request (sampling) does, and only the client's
    answer to it goes back; an answer to no server request is dropped."""
    r = Relay(ToolFilter(), Clock())
    note = {"jsonrpc": "2.0", "method": "notifications/progress", "params": {"progressToken": 1, "progress": 1}}
    assert r.from_server(line(note)).to_client == [note]
    assert r.from_client(line({"jsonrpc": "2.0", "id": "s1", "result": {}})).to_server == []
    r.from_server(req("s1", "sampling/createMessage", {}))
    assert r.from_client(line({"jsonrpc": "2.0", "id": "s1", "result": {}})).to_server
    assert r.from_client(line({"jsonrpc": "2.0", "id": "s1", "result": {}})).to_server == []


@pytest.mark.parametrize("method", ["tools/call", "resources/read", "prompts/get", "ping", "x"])
def test_a_request_method_without_an_id_is_dropped(method: str) -> None:
    """A client notification whose method is not a notification's (a denied tools/call without an id, which
    a lax server would run unanswered) is never sent: dropped, noted and handed over for the audit log."""
    r = Relay(ToolFilter(deny=frozenset({"mark"})), Clock())
    params = {"name": "mark", "arguments": {"a": 1}}
    acts = r.from_client(line({"jsonrpc": "2.0", "method": method, "params": params}))
    assert acts.to_server == [] and acts.to_client == []
    assert acts.notes == [("mcp.client_notification_dropped", {"method": method})]
    expected = {"method": method, "reason": "a request method sent as a notification"}
    if method == "tools/call":
        expected.update(tool="mark", arguments={"a": 1})
    assert acts.dropped == [expected]


def test_notifications_of_the_client_still_pass() -> None:
    """notifications/initialized, /cancelled, /roots/list_changed reach the server as they are."""
    r = Relay(ToolFilter(deny=frozenset({"mark"})), Clock())
    for method in ("notifications/initialized", "notifications/cancelled", "notifications/roots/list_changed"):
        acts = r.from_client(line({"jsonrpc": "2.0", "method": method, "params": {}}))
        assert len(acts.to_server) == 1 and acts.dropped == [], method


def test_only_the_clients_requests_and_answers_are_activity() -> None:
    """The idle clock moves when the client sends a request (even a refused one), when one is answered or
    cancelled, and when the client answers a server request; never for what the server sends by itself."""
    clock = Clock()
    r = Relay(ToolFilter(deny=frozenset({"mark"})), clock)
    start = r.last_activity()
    clock.t += 5
    r.from_server(line({"jsonrpc": "2.0", "method": "notifications/message", "params": {"data": "tick"}}))
    r.from_server(req("s1", "roots/list"))
    r.from_server(ok(99, {"forged": True}))
    r.from_client(line({"jsonrpc": "2.0", "method": "notifications/initialized"}))
    r.from_client(line({"jsonrpc": "2.0", "method": "tools/call", "params": {"name": "x"}}))
    r.from_client(line({"jsonrpc": "2.0", "id": "nobody", "result": {}}))
    assert r.last_activity() == start
    for step in (
        lambda: r.from_client(line({"jsonrpc": "2.0", "id": "s1", "result": {"roots": []}})),
        lambda: r.from_client(call(1, "mark")),  # refused here: still a request
        lambda: r.from_client(call(2, "ok")),
        lambda: r.from_server(ok(2, {"content": []})),  # answered: idle starts now, not when it was sent
        lambda: r.from_client(call(3, "ok")),
        lambda: r.from_client(
            line({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 3}})
        ),
    ):
        clock.t += 1
        step()
        assert r.last_activity() == clock.t
    clock.t += 1
    r.touch()
    assert r.last_activity() == clock.t


@pytest.mark.parametrize(
    ("flt", "offered"),
    [
        (ToolFilter(deny=frozenset({"convert_time"})), ["get_current_time"]),
        (ToolFilter(allow=frozenset({"convert_time"})), ["convert_time"]),
        (ToolFilter(), ["get_current_time", "convert_time"]),
    ],
)
def test_filters_hide_tools_and_refuse_calls_without_the_server(flt: ToolFilter, offered: list[str]) -> None:
    """tools/list loses the filtered tools; a tools/call naming one is -32602 here, sent nowhere, audited."""
    r = Relay(flt, Clock())
    r.from_client(req(1, "tools/list"))
    tools = [{"name": "get_current_time", "inputSchema": {}}, {"name": "convert_time", "inputSchema": {}}]
    got = r.from_server(ok(1, {"tools": tools, "nextCursor": "c"})).to_client[0]["result"]
    assert [t["name"] for t in got["tools"]] == offered and got["nextCursor"] == "c"
    for name in ("get_current_time", "convert_time"):
        acts = r.from_client(call(2, name, {"a": 1}))
        if name in offered:
            assert acts.to_server and not acts.to_client
            r.from_server(ok(2, {"content": []}))
        else:
            assert acts.to_server == []
            assert acts.to_client[0]["error"]["code"] == -32602 and name in acts.to_client[0]["error"]["message"]
            assert [(c.tool, c.status, c.error_code) for c in acts.calls] == [(name, "error", -32602)]


def test_filter_refuses_a_call_without_a_name() -> None:
    """A tools/call with no string name cannot be checked against an allow list: refused."""
    r = Relay(ToolFilter(allow=frozenset({"a"})), Clock())
    acts = r.from_client(req(1, "tools/call", {"arguments": {}}))
    assert acts.to_server == [] and acts.to_client[0]["error"]["code"] == -32602


def test_each_call_is_audited_with_its_outcome_and_duration() -> None:
    """ok, isError and a JSON-RPC error each give one Call record with status, code and wall time."""
    clock = Clock()
    r = Relay(ToolFilter(), clock)
    r.from_client(call(1, "t", {"x": 1}))
    clock.t += 0.25
    (c,) = r.from_server(ok(1, {"content": [], "isError": False})).calls
    assert (c.tool, c.arguments, c.status, c.error_code, c.wall_ms) == ("t", {"x": 1}, "ok", None, 250.0)
    r.from_client(call(2, "t"))
    assert r.from_server(ok(2, {"content": [], "isError": True})).calls[0].status == "error"
    r.from_client(call(3, "t"))
    err = line({"jsonrpc": "2.0", "id": 3, "error": {"code": -32000, "message": "x"}})
    assert [(c.status, c.error_code) for c in r.from_server(err).calls] == [("error", -32000)]
    r.from_client(req(4, "tools/list"))
    assert r.from_server(ok(4, {"tools": []})).calls == []  # only tools/call is a call


def test_cancel_forgets_the_request() -> None:
    """notifications/cancelled is forwarded; the request is no longer pending, so a late answer is dropped."""
    r = Relay(ToolFilter(), Clock())
    r.from_client(call(5, "slow"))
    cancel = {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 5}}
    acts = r.from_client(line(cancel))
    assert acts.to_server and [(c.tool, c.status) for c in acts.calls] == [("slow", "interrupted")]
    assert not r.busy() and r.from_server(ok(5, {})).to_client == []


def test_overdue_and_fail_all() -> None:
    """A request older than the limit is overdue; fail_all answers each pending one with -32004, and
    every later request gets the same answer at once."""
    clock = Clock()
    r = Relay(ToolFilter(), clock)
    r.from_client(call("a", "t"))
    r.from_client(req("b", "ping"))
    clock.t += 10
    assert {p.method for p in r.overdue(5)} == {"tools/call", "ping"} and r.overdue(20) == []
    acts = r.fail_all("crashed", "the wrapped MCP server exited with code 3", {"reason": "server_exited"})
    assert sorted(m["id"] for m in acts.to_client) == ["a", "b"]
    assert {m["error"]["code"] for m in acts.to_client} == {SERVER_ENDED}
    assert acts.to_client[0]["error"]["data"]["status"] == "crashed"
    assert [(c.tool, c.status) for c in acts.calls] == [("t", "crashed")]
    later = r.from_client(req("c", "ping"))
    assert later.to_server == [] and later.to_client[0]["id"] == "c"
    assert "code 3" in later.to_client[0]["error"]["message"]


def test_client_errors_are_answered_here() -> None:
    """A client line that is not JSON, or a batch, is answered with -32700/-32600 and never sent on;
    a second request with an id still pending is refused."""
    r = Relay(ToolFilter(), Clock())
    assert r.from_client(b"{nope").to_client[0]["error"]["code"] == -32700
    assert r.from_client(line([{"jsonrpc": "2.0", "id": 1, "method": "ping"}])).to_client[0]["error"]["code"] == -32600
    r.from_client(req(1, "ping"))
    dup = r.from_client(req(1, "ping"))
    assert dup.to_server == [] and dup.to_client[0]["error"]["code"] == -32600


def test_launcher_reads_exactly_one_line(tmp_path: Any) -> None:
    """The config line is read byte by byte: what follows it (the client's first MCP message) stays unread."""
    from toolcage.worker.mcp_host import read_config

    r, w = os.pipe()
    os.write(w, b'{"argv": ["srv", "-x"], "env": {"API_KEY": "k"}}\n{"jsonrpc": "2.0"}\n')
    os.close(w)
    assert read_config(r) == {"argv": ["srv", "-x"], "env": {"API_KEY": "k"}}
    assert os.read(r, 100) == b'{"jsonrpc": "2.0"}\n'
    os.close(r)


@pytest.mark.parametrize(
    "raw",
    [b"", b'{"argv": []}\n', b'{"argv": "srv"}\n', b'{"argv": ["a"], "env": {"A=B": "x"}}\n', b"x" * 70 + b"\n"],
)
def test_launcher_refuses_a_bad_config_line(raw: bytes) -> None:
    """No line, no argv, a string argv, an env name with '=', an over-long line: refused (ValueError)."""
    from toolcage.worker.mcp_host import read_config

    r, w = os.pipe()
    os.write(w, raw)
    os.close(w)
    with pytest.raises(ValueError):
        read_config(r, limit=64)
    os.close(r)


def test_server_env_is_clean_with_home_in_scratch_and_the_secrets() -> None:
    """Only the proxy and locale settings pass from the container's env (not the policy, not the run id);
    HOME/TMPDIR are scratch (a read-only root has no other writable place); the secrets are added."""
    from toolcage.worker import mcp_host
    from toolcage.worker.tools import proc

    environ = {"TOOLCAGE_POLICY": "{}", "TOOLCAGE_RUN_ID": "r", "HTTP_PROXY": "http://127.0.0.1:3128", "LANG": "C"}
    env = mcp_host.server_env({"API_KEY": "secret-value"}, environ)
    assert env["HOME"] == env["TMPDIR"] == "/scratch" and env["API_KEY"] == "secret-value"
    assert env["HTTP_PROXY"] == "http://127.0.0.1:3128" and not any(k.startswith("TOOLCAGE_") for k in env)
    assert set(mcp_host.ENV_KEEP) <= set(proc._CHILD_ENV_KEEP) and mcp_host.DEPS_DIR == proc.DEPS_DIR


def test_the_launcher_replaces_only_the_command() -> None:
    """RunSpec.entrypoint sets Entrypoint and nothing else: the hardening is the same as a worker's."""
    from toolcage.servers.mcp_wrap import LAUNCHER

    policy = load_policy("default")
    plain = container_config(policy, run_spec())
    wrapped = container_config(policy, run_spec(entrypoint=LAUNCHER))
    assert wrapped.pop("Entrypoint") == list(LAUNCHER) and "Entrypoint" not in plain
    assert wrapped == plain


@pytest.mark.parametrize(
    ("args", "says"),
    [
        ([], "command after --"),
        (["--allow-tool", "a", "--deny-tool", "b", "--", "srv"], "not both"),
        (["--image", "x:1", "--pip", "mcp-server-time", "--", "srv"], "not both"),
        (["--policy", "no-such-policy", "--", "srv"], "no-such-policy"),
        (["--pip", "-e .", "--", "srv"], "not supported"),
        (["--secret", "BAD-NAME=env:PATH", "--", "srv"], "environment variable"),
        (["--secret", "SHORT=env:SHORT_VALUE", "--", "srv"], "at least 8"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args: list[str], says: str) -> None:
    """Usage errors stop before Docker is asked anything: exit 2, one stderr line, no traceback, no stdout."""
    proc = run_cli("mcp", "wrap", *args, env={"SHORT_VALUE": "abc"})
    assert proc.returncode == 2, proc.stderr
    assert says in proc.stderr and "Traceback" not in proc.stderr and proc.stdout == ""


def test_pip_requirements() -> None:
    """--pip packages become a requirements file, checked like one; the image tag depends on them and the parent."""
    from toolcage.cli.mcp import wrap_image_tag
    from toolcage.errors import RequirementsError
    from toolcage.image.derived import pip_requirements

    data = pip_requirements(("mcp-server-time==2025.9.25", "tzdata"))
    assert data == b"mcp-server-time==2025.9.25\ntzdata\n"
    for bad in ("", "a\nb", "https://x/y.whl", "--index-url=x"):
        with pytest.raises(RequirementsError):
            pip_requirements((bad,))
    assert wrap_image_tag(data, "w:1") == wrap_image_tag(data, "w:1") != wrap_image_tag(data, "w:2")
    assert wrap_image_tag(data, "w:1").startswith("toolcage-mcp:")
