"""toolcage's tools as LangChain StructuredTools (``toolcage.integrations.langchain``), driven by LangChain's
own agent loop (``langchain.agents.create_agent``, a LangGraph graph; ``langgraph.prebuilt.create_react_agent``
where langchain is not installed) and a fake chat model that emits tool calls: no model, no network, no MCP
subprocess, a real hardened container. At the end, LangChain's standard tool tests (langchain-tests'
``ToolsUnitTests`` and ``ToolsIntegrationTests``) for every tool of one live sandbox.
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import os
import subprocess
import threading
import time
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.tools import BaseTool
from langchain_core.utils.function_calling import convert_to_openai_tool

from toolcage import AsyncSandbox, Sandbox
from toolcage.errors import UsageError
from toolcage.integrations.langchain import (
    INTERPRETER_TOOLS,
    PROCESS_TOOLS,
    STREAM_TOOLS,
    ToolcageToolException,
    aget_tools,
    get_tools,
)

pytestmark = [
    pytest.mark.usefixtures("no_leaks"),
    pytest.mark.runc_only(
        "a framework's adapter: its translation of the same calls, host-side (test_exec, test_files_* and "
        "test_workspace_copy run those calls under gVisor)"
    ),
]


class ScriptedModel(GenericFakeChatModel):
    """LangChain's fake chat model, answering a script of AIMessages (tool calls, then a final answer),
    with the ``bind_tools`` an agent needs (the tools are the graph's business; the script names them)."""

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> ScriptedModel:  # type: ignore[override]
        return self


def _step(*calls: tuple[str, str, dict[str, Any]]) -> AIMessage:
    """One model turn: tool calls given as (id, tool name, args)."""
    return AIMessage(content="", tool_calls=[{"name": n, "args": a, "id": i, "type": "tool_call"} for i, n, a in calls])


def _agent(tools: list[BaseTool], script: Iterable[AIMessage]) -> Any:
    """LangChain's current agent (a LangGraph graph) over ``tools``, driven by ``script`` (a generator's next
    step is made when the model is asked for it, after the last step's tool results came back)."""
    model = ScriptedModel(messages=itertools.chain(script, [AIMessage(content="done")]))
    try:
        from langchain.agents import create_agent
    except ImportError:  # langchain-core and langgraph only (the extra): LangGraph's prebuilt ReAct agent
        from langgraph.prebuilt import create_react_agent

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            return create_react_agent(model, tools)
    return create_agent(model, tools)


def _replies(messages: list[BaseMessage]) -> dict[str, ToolMessage]:
    """The ToolMessages of a finished run, by tool call id; fails unless the loop ended with the model's answer."""
    assert isinstance(messages[-1], AIMessage) and messages[-1].content == "done", messages[-1]
    return {m.tool_call_id: m for m in messages if isinstance(m, ToolMessage)}


def _by_name(tools: list[BaseTool]) -> dict[str, BaseTool]:
    return {t.name: t for t in tools}


def test_agent_commands_run_in_the_cage_and_files_come_back(engine: Any, tmp_path: Path) -> None:
    """The agent's calls run in the toolcage container (its labels, read-only root, no network), the file it
    wrote is read back from the host, and each tool's schema is the one tools.list gives."""
    (tmp_path / "hello.txt").write_text("hello from the host\n")
    tmp_path.chmod(0o755)
    (tmp_path / "hello.txt").chmod(0o644)
    with Sandbox(workspace=tmp_path) as sb:
        listing = {t["name"]: t for t in sb.call("tools.list").result}
        tools = get_tools(sb)
        by_name = _by_name(tools)
        # the schemas are tools.list's, as they are; the stream tools are left out
        assert set(by_name) == set(listing) - set(STREAM_TOOLS)
        for name, tool in by_name.items():
            assert tool.args_schema == listing[name]["params_schema"]
            assert tool.description == listing[name]["description"]
            assert tool.tool_call_schema == {**listing[name]["params_schema"], "description": tool.description}
            params = convert_to_openai_tool(tool)["function"]["parameters"]  # what a model is sent
            assert set(params["properties"]) == set(listing[name]["params_schema"]["properties"])
        assert set(_by_name(get_tools(sb, exclude=()))) == set(listing)

        probe = (
            "import json, socket, errno\n"
            "r = {'host': socket.gethostname(), 'ifaces': sorted(n for _, n in socket.if_nameindex())}\n"
            "try:\n    open('/etc/x', 'w')\nexcept OSError as e:\n    r['root'] = errno.errorcode[e.errno]\n"
            "print(json.dumps(r))"
        )
        script = [
            _step(("probe", "run_python", {"code": probe}), ("hello", "read_file", {"path": "/workspace/hello.txt"})),
            _step(("write", "write_file", {"path": "out/report.txt", "content": "written by the agent\n"})),
            _step(
                ("wc", "exec", {"argv": ["sh", "-c", "wc -c < out/report.txt"]}),
                ("bad", "list_files", {"max_entries": "ten"}),
            ),
        ]
        messages = _agent(tools, script).invoke({"messages": [HumanMessage("look around")]})["messages"]
        got = _replies(messages)

        seen = json.loads(json.loads(got["probe"].content)["stdout"])
        info = engine.inspect(sb.container_id)
        assert info["Config"]["Labels"]["toolcage.run_id"] == sb.run_id
        assert seen["host"] == info["Config"]["Hostname"]  # the agent's code ran in this very container
        assert info["HostConfig"]["ReadonlyRootfs"] is True and seen["root"] in ("EROFS", "EACCES")
        assert info["HostConfig"]["NetworkMode"] == "none" and seen["ifaces"] == ["lo"]
        if os.environ.get("TOOLCAGE_SANDBOX") == "gvisor":
            assert info["HostConfig"]["Runtime"] == "runsc"
        assert json.loads(got["hello"].content)["content"] == "hello from the host\n"
        # content is the result as JSON; the artifact is the whole CallResult
        art = got["write"].artifact
        assert art["status"] == "ok" and art["run_id"] == sb.run_id
        assert art["result"] == {"path": "/scratch/out/report.txt", "bytes_written": 21}
        assert json.loads(got["wc"].content)["stdout"].strip() == "21"
        # bad arguments: a failed tool call naming the field, and the loop went on
        bad = got["bad"]
        assert bad.status == "error" and "-32602" in bad.content and "max_entries" in bad.content
        # the file the agent wrote, read from the host
        assert sb.read_files(["out/report.txt"]) == {"out/report.txt": b"written by the agent\n"}

        # without handle_tool_error the failure reaches the caller as a ToolException carrying the status
        strict = _by_name(get_tools(sb, include=["run_shell"], handle_tool_error=False))
        with pytest.raises(ToolcageToolException) as exc:
            strict["run_shell"].invoke({"command": "echo bye; exit 3"})
        assert exc.value.status == "error" and exc.value.result["exit_code"] == 3 and not exc.value.sandbox_failed
        # a prefix for agents holding other tools; clear errors for bad options
        assert [t.name for t in get_tools(sb, include=["grep"], name_prefix="cage_")] == ["cage_grep"]
        for bad_options, says in [
            ({"include": "run_python"}, "list of tool names"),
            ({"include": ["run_pyton"]}, "no tool named 'run_pyton'"),
            ({"exclude": ["nope"]}, "no tool named 'nope'"),
            ({"name_prefix": "a b"}, "name_prefix"),
        ]:
            with pytest.raises(UsageError, match=says):
                get_tools(sb, **bad_options)
    with pytest.raises(UsageError, match="not running"):
        get_tools(Sandbox())  # never started: no container
    with pytest.raises(UsageError, match="Sandbox or AsyncSandbox"):
        get_tools("sb")  # type: ignore[arg-type]


def test_async_agent_edit_arrives_as_a_diff_and_a_snapshot_resumes(tmp_path: Path) -> None:
    """An AsyncSandbox with a workspace copy: the agent's edit comes back as a diff `git apply` takes on the
    host checkout; a snapshot of the session resumes in a new container, where the agent finds its files."""
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "app.py").write_text("GREETING = 'hello'\n")
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    repo.chmod(0o755)
    (repo / "app.py").chmod(0o644)
    snap = tmp_path / "session.tar"

    async def first() -> tuple[list[BaseMessage], str, str | None]:
        async with AsyncSandbox(workspace=repo, workspace_mode="copy", workspace_gitignore=True) as sb:
            tools = await aget_tools(sb)
            script = [
                _step(("sed", "exec", {"command": "sed -i s/hello/bonjour/ app.py", "cwd": "/workspace"})),
                _step(("notes", "write_file", {"path": "/workspace/notes.md", "content": "# notes\n"})),
                _step(("progress", "run_shell", {"command": "echo step-1 > progress.txt"})),
            ]
            out = await _agent(tools, script).ainvoke({"messages": [HumanMessage("edit the app")]})
            ch = await sb.changes()
            assert ch.changed == ("app.py",) and ch.added == ("notes.md",)
            await sb.snapshot(snap)
            return out["messages"], ch.diff, sb.container_id

    messages, diff, first_container = asyncio.run(first())
    assert all(m.status == "success" for m in _replies(messages).values())
    subprocess.run(["git", "apply", "-"], cwd=repo, input=diff, text=True, check=True)
    assert (repo / "app.py").read_text() == "GREETING = 'bonjour'\n" and (repo / "notes.md").read_text() == "# notes\n"

    async def resumed() -> tuple[list[BaseMessage], str | None]:
        async with AsyncSandbox(workspace=repo, resume=snap) as sb:
            tools = await aget_tools(sb, include=["run_shell", "read_file"])
            script = [
                _step(
                    ("cat", "run_shell", {"command": "cat progress.txt"}),
                    ("app", "read_file", {"path": "/workspace/app.py"}),
                )
            ]
            out = await _agent(tools, script).ainvoke({"messages": [HumanMessage("carry on")]})
            return out["messages"], sb.container_id

    messages, second_container = asyncio.run(resumed())
    got = _replies(messages)
    assert second_container != first_container
    assert json.loads(got["cat"].content)["stdout"] == "step-1\n"
    assert json.loads(got["app"].content)["content"] == "GREETING = 'bonjour'\n"


def test_egress_the_policy_refuses_is_a_failed_tool_call() -> None:
    """Code reaching a host the default policy does not allow fails, and so does http_fetch to it: the agent
    sees failed tool calls (toolcage's status in them) and the loop finishes."""
    code = "import urllib.request\nprint(urllib.request.urlopen('http://example.com', timeout=5).status)"
    with Sandbox() as sb:
        script = [
            _step(("urllib", "run_python", {"code": code})),
            _step(("fetch", "http_fetch", {"url": "https://example.com/"})),
            _step(("after", "run_shell", {"command": "echo still here"})),
        ]
        got = _replies(_agent(get_tools(sb), script).invoke({"messages": [HumanMessage("fetch it")]})["messages"])
    urllib_call = got["urllib"]
    assert urllib_call.status == "error" and "tool failed: status error" in urllib_call.content
    assert "URLError" in urllib_call.content and '"exit_code": 1' in urllib_call.content
    fetch = got["fetch"]
    assert fetch.status == "error" and "-32010" in fetch.content and "example.com" in fetch.content
    assert json.loads(got["after"].content)["stdout"] == "still here\n"


@pytest.fixture
def kill_later() -> Iterator[Callable[[str, float], None]]:
    threads: list[threading.Thread] = []

    def schedule(name: str, after: float) -> None:
        def kill() -> None:
            time.sleep(after)
            subprocess.run(["docker", "kill", name], capture_output=True, check=True)

        threads.append(threading.Thread(target=kill, daemon=True))
        threads[-1].start()

    yield schedule
    for t in threads:
        t.join(30)


def test_a_sandbox_killed_mid_run_is_a_failed_tool_call(kill_later: Callable[[str, float], None]) -> None:
    """`docker kill` of the container mid-call: that call and the next are failed tool calls carrying toolcage's
    status and reason, not an exception out of the graph; the loop reaches the model's answer, and a new sandbox
    works."""
    with Sandbox() as sb:
        tools = get_tools(sb)

        def script() -> Iterator[AIMessage]:
            yield _step(("before", "run_shell", {"command": "echo before"}))
            kill_later(sb.name, 1.0)  # the next step's call sleeps; it is killed a second into it
            yield _step(("sleep", "run_python", {"code": "import time; time.sleep(60)", "timeout_s": 60}))
            yield _step(("after", "run_shell", {"command": "echo after"}))

        started = time.monotonic()
        got = _replies(_agent(tools, script()).invoke({"messages": [HumanMessage("go")]})["messages"])
        assert time.monotonic() - started < 30
        assert sb.dead is not None
    assert json.loads(got["before"].content)["stdout"] == "before\n"
    for call in ("sleep", "after"):  # killed mid-call; then a sandbox that takes no more calls
        assert got[call].status == "error", got[call]
        assert "sandbox failed: status crashed (worker_crashed)" in got[call].content, got[call].content
    with Sandbox() as again:  # the next session works
        (shell,) = get_tools(again, include=["run_shell"])
        assert json.loads(shell.invoke({"command": "echo ok"}))["stdout"] == "ok\n"


# LangChain's standard tool tests (langchain-tests), for every tool of one live sandbox --------------------------
_LIVE: dict[str, BaseTool] = {}
_CONTEXTS: dict[str, Any] = {}  # the fixture's sandbox and the context it made for code_context_restart


def _removable() -> dict[str, Any]:
    """A context of its own for each code_context_remove example (the suite calls it four times)."""
    return {"context": _CONTEXTS["sandbox"].create_code_context().id}


_EXAMPLES: dict[str, dict[str, Any] | Callable[[], dict[str, Any]]] = {
    "run_python": {"code": "print(1)"},
    "run_shell": {"command": "echo hi"},
    "run_node": {"code": "console.log(1)"},
    "exec": {"argv": ["echo", "hi"]},
    "list_files": {"path": "/scratch"},
    "read_file": {"path": "seed.txt"},
    "grep": {"pattern": "seed", "path": "/scratch"},
    "write_file": {"path": "written.txt", "content": "x"},
    "remove": {"paths": ["nothing-here"], "missing_ok": True},
    "http_fetch": {"url": "https://example.com/"},
    # background processes: 1 (sleep on pipes), 2 (cat on a terminal), 3 (to kill) are started by the fixture
    "proc_start": {"command": "true"},
    "proc_read": {"id": 1},
    "proc_wait": {"id": 1, "until": "exit", "timeout_s": 0.1},
    "proc_write": {"id": 1, "data": ""},
    "proc_signal": {"id": 1, "signal": "SIGCONT"},
    "proc_kill": {"id": 3},
    "proc_resize": {"id": 2, "rows": 30, "cols": 100},
    "proc_list": {"running_only": False},
    # the interpreter (issue 38): a cell in the default context; contexts the fixture (or the example) made
    "code_run": {"code": "x = 1\nx + 1"},
    "code_context_create": {"cwd": "/scratch"},
    "code_context_list": {},
    "code_context_restart": lambda: {"context": _CONTEXTS["restart"]},
    "code_context_remove": _removable,
}
# the suite checks that a call's ToolMessage carries an artifact; LangChain's error path drops it, and
# http_fetch's example fails by design here (the default policy allows no host; the tests have no network)
_NO_NETWORK = (
    "http_fetch's example call is refused (no host allowed, no network): LangChain's error path has no artifact"
)
# code_context_list takes no argument: the suite's schema check builds LangChain's input model from the example's
# keys, and from none it refuses (the tool's calls with {} pass the other tests)
_NO_ARGS = "code_context_list takes no argument: the suite's schema check needs at least one key in the example"
_KNOWN = {
    **{("http_fetch", n): _NO_NETWORK for n in ("test_invoke_matches_output_schema",
                                                "test_async_invoke_matches_output_schema")},
    ("code_context_list", "test_input_schema_matches_invoke_params"): _NO_ARGS,
}  # fmt: skip


@pytest.fixture(scope="module")
def standard_tools(engine: Any) -> Iterator[dict[str, BaseTool]]:
    with Sandbox() as sb:
        sb.call("write_file", {"path": "seed.txt", "content": "seed\n"})
        sb.spawn("sleep 600"), sb.spawn(argv=["cat"], pty=True), sb.spawn("sleep 600")  # ids 1, 2, 3
        _CONTEXTS.update(sandbox=sb, restart=sb.create_code_context().id)
        _LIVE.update(_by_name(get_tools(sb)))
        yield _LIVE
        _LIVE.clear()
        _CONTEXTS.clear()


@pytest.mark.anyio
@pytest.mark.usefixtures("standard_tools")
class _Standard:
    """One toolcage tool under langchain-tests' ToolsUnitTests or ToolsIntegrationTests."""

    tool_name = ""

    @property
    def tool_constructor(self) -> BaseTool:
        return _LIVE[self.tool_name]

    @property
    def tool_invoke_params_example(self) -> dict[str, Any]:
        example = _EXAMPLES[self.tool_name]
        return example() if callable(example) else example

    @pytest.fixture(autouse=True)
    def _known(self, request: pytest.FixtureRequest) -> None:
        reason = _KNOWN.get((self.tool_name, request.node.originalname))
        if reason:
            request.applymarker(pytest.mark.xfail(strict=True, reason=reason))

    @pytest.fixture
    def anyio_backend(self) -> str:
        return "asyncio"


def _standard_classes() -> dict[str, type]:
    from langchain_tests.integration_tests import ToolsIntegrationTests
    from langchain_tests.unit_tests import ToolsUnitTests

    out: dict[str, type] = {}
    for name in _EXAMPLES:
        for kind, base in (("Unit", ToolsUnitTests), ("Integration", ToolsIntegrationTests)):
            cls_name = f"TestStandard{kind}_{name}"
            out[cls_name] = type(cls_name, (_Standard, base), {"tool_name": name})
    return out


globals().update(_standard_classes())


def test_the_standard_tests_cover_every_tool(standard_tools: dict[str, BaseTool]) -> None:
    """Each tool get_tools binds by default has its standard tests (a new tool needs an example above)."""
    assert set(standard_tools) == set(_EXAMPLES)


def test_a_background_process_started_followed_and_stopped_by_the_agent() -> None:
    """Issue 37: the ``proc_*`` tools (``PROCESS_TOOLS``, bound by default) under LangChain's agent loop: start a
    server that prints as it goes, wait for a line, read its output, type into a terminal, stop both; the
    processes live across tool calls and are gone after ``proc_kill``."""
    ticker = "for i in 1 2 3; do echo tick $i; sleep 0.2; done; sleep 300"
    with Sandbox() as sb:
        tools = get_tools(sb)
        assert set(PROCESS_TOOLS) <= set(_by_name(tools))
        assert set(_by_name(get_tools(sb, include=PROCESS_TOOLS))) == set(PROCESS_TOOLS)
        script = [
            # one after the other: started in one turn, the two calls run side by side and take ids 1 and 2 in
            # whichever order they reach the worker (seen with three test processes on 2 cores)
            _step(("start", "proc_start", {"command": ticker})),
            _step(("repl", "proc_start", {"argv": ["cat"], "pty": True})),
            _step(("wait", "proc_wait", {"id": 1, "until": "output", "pattern": "tick 3", "timeout_s": 20})),
            _step(("read", "proc_read", {"id": 1, "since": 0}), ("type", "proc_write", {"id": 2, "data": "hello\n"})),
            _step(("echo", "proc_read", {"id": 2, "since": 0, "timeout_s": 5})),
            _step(("kill", "proc_kill", {"id": 1}), ("ctrl-c", "proc_write", {"id": 2, "data": "\u0003"})),
            _step(("list", "proc_list", {})),
        ]
        got = _replies(_agent(tools, script).invoke({"messages": [HumanMessage("run it")]})["messages"])
        assert sb.process(2).wait(timeout=10)  # Ctrl-C ended cat
    assert json.loads(got["start"].content)["id"] == 1 and json.loads(got["repl"].content)["pty"] is True
    assert json.loads(got["wait"].content)["met"] is True
    read = json.loads(got["read"].content)
    assert read["output"].split() == ["tick", "1", "tick", "2", "tick", "3"] and read["state"] == "running"
    assert "hello" in json.loads(got["echo"].content)["output"]
    assert json.loads(got["kill"].content)["state"] == "exited", got["kill"].content
    listed = {p["id"]: p for p in json.loads(got["list"].content)["processes"]}
    assert listed[1]["state"] == "exited" and listed[1]["signal"] == "SIGKILL", listed


# a 4x4 PNG drawn in the cell (the worker image has no matplotlib), and a JPEG's signature
_IMAGES_CELL = r"""
import base64, struct, zlib
from IPython.display import Image, display

def png(w, h):
    raw = b"".join(b"\x00" + b"\xff\x00\x00" * w for _ in range(h))
    def chunk(t, d):
        return struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d) & 0xFFFFFFFF)
    ihdr = struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b"")

display(Image(data=png(4, 4)))
display({"image/jpeg": base64.b64encode(b"\xff\xd8\xff\xe0" + b"j" * 64).decode()}, raw=True)
"""


def test_a_python_context_keeps_state_and_its_images_are_the_artifact() -> None:
    """Issue 38: the ``code_*`` tools (``INTERPRETER_TOOLS``, bound by default) under LangChain's agent loop: a
    context keeps a variable across calls, a cell's PNG and JPEG come back in the artifact's ``images`` (the
    content names them with a short placeholder, no base64), an exception is the cell's, not the call's."""
    with Sandbox() as sb:
        tools = get_tools(sb)
        assert set(INTERPRETER_TOOLS) <= set(_by_name(tools))
        assert [t.name for t in get_tools(sb, include=INTERPRETER_TOOLS)] == list(INTERPRETER_TOOLS)

        def script() -> Iterator[AIMessage]:
            yield _step(("create", "code_context_create", {}))
            ctx = sb.list_code_contexts()[-1].id
            yield _step(("set", "code_run", {"code": "rows = [3, 1, 2]", "context": ctx}))
            yield _step(("use", "code_run", {"code": "sorted(rows)", "context": ctx}))
            yield _step(("plot", "code_run", {"code": _IMAGES_CELL, "context": ctx}))
            yield _step(("boom", "code_run", {"code": "1 / 0", "context": ctx}), ("list", "code_context_list", {}))

        got = _replies(_agent(tools, script()).invoke({"messages": [HumanMessage("analyse")]})["messages"])
    ctx = json.loads(got["create"].content)["id"]
    assert json.loads(got["use"].content)["results"][0]["data"]["text/plain"] == "[1, 2, 3]"
    plot = got["plot"]
    images = plot.artifact["images"]
    assert [i["mime"] for i in images] == ["image/png", "image/jpeg"]
    assert base64.b64decode(images[0]["data"]).startswith(b"\x89PNG\r\n\x1a\n")
    assert images[0]["data"] not in plot.content and len(plot.content) < 1500, plot.content
    shown = [r["data"] for r in json.loads(plot.content)["results"]]
    assert "image 1, in the tool message's artifact" in shown[0]["image/png"]
    assert "image 2" in shown[1]["image/jpeg"]
    # the artifact's result keeps the whole answer (the base64 too)
    assert plot.artifact["result"]["results"][0]["data"]["image/png"] == images[0]["data"]
    boom = json.loads(got["boom"].content)
    assert got["boom"].status == "success" and boom["error"]["name"] == "ZeroDivisionError"
    assert ctx in {c["id"] for c in json.loads(got["list"].content)["contexts"]}
