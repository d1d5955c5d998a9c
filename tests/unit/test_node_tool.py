"""run_node called directly (no Docker): argv, heap size, staging, and a real node where the host has one."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from toolcage.policies import validate_policy
from toolcage.worker.errors import BadParams, ToolError
from toolcage.worker.settings import Settings
from toolcage.worker.tools import BUILTIN, Catalog, describe_tool
from toolcage.worker.tools import node as node_tool

needs_node = pytest.mark.skipif(shutil.which("node") is None, reason="no node on this host")


def settings(tmp_path: Path, **limits: object) -> Settings:
    (tmp_path / "ws").mkdir(exist_ok=True)
    (tmp_path / "scratch").mkdir(exist_ok=True)
    policy = validate_policy({"limits": limits, "timeouts": {"call_s": 5, "run_s": 20}})
    return Settings(policy.canonical_json(), str(tmp_path / "ws"), str(tmp_path / "scratch"), "test")


def call(s: Settings, **params: object) -> dict:  # type: ignore[type-arg]
    tool = Catalog().get("run_node")
    return tool.handler(s, tool.validate(params))


def test_registered_with_schema() -> None:
    """run_node is a built-in tool; its tools.list entry has code, timeout_s and stdin."""
    assert BUILTIN["run_node"] == "toolcage.worker.tools.node"
    tool = Catalog().get("run_node")
    assert tool.runs_code and not tool.in_process_timeout
    schema = describe_tool(tool)["params_schema"]
    assert set(schema["properties"]) == {"code", "timeout_s", "stdin"}
    assert schema["required"] == ["code"]


def test_heap_from_policy_memory() -> None:
    """V8's heap is three quarters of the policy's memory, never below 16 MiB."""
    assert node_tool.heap_mib(512 * 1024 * 1024) == 384
    assert node_tool.heap_mib(16 * 1024 * 1024) == 16


def test_argv_inline_and_staged(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Short code is `node FLAGS -e code` (node's -c is --check); long code is a .js file staged in scratch."""
    monkeypatch.setattr(node_tool, "node_binary", lambda: "/usr/bin/node")
    s = settings(tmp_path, memory="256MiB")
    argv = node_tool.node_argv(s, "console.log(1)")
    assert argv == ["/usr/bin/node", "--max-old-space-size=192", "--v8-pool-size=2", "-e", "console.log(1)"]
    long = "//" + "x" * 200_000 + "\nconsole.log(2)"
    staged = node_tool.node_argv(s, long)
    assert "-e" not in staged and staged[-1].endswith(".js") and Path(staged[-1]).parent == tmp_path / "scratch"
    assert Path(staged[-1]).read_text() == long
    with pytest.raises(BadParams):
        node_tool.node_argv(s, "a\x00b")


def test_no_node_is_a_tool_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An image without node says so in one sentence (a ToolError), not a FileNotFoundError."""
    monkeypatch.setattr(node_tool.shutil, "which", lambda *a, **k: None)
    with pytest.raises(ToolError, match="node is not installed"):
        call(settings(tmp_path), code="1")


@needs_node
def test_hello_stdin_exit_code(tmp_path: Path) -> None:
    """stdout, stdin and the exit code, in the result shape of run_python."""
    s = settings(tmp_path)
    out = call(s, code="console.log('hello', process.cwd())")
    assert out["stdout"] == f"hello {tmp_path / 'scratch'}\n" and out["exit_code"] == 0
    assert set(out) == set(Catalog().get("run_python").handler(s, Catalog().get("run_python").validate({"code": "1"})))
    echo = "let d='';process.stdin.on('data',c=>d+=c).on('end',()=>console.log(d.toUpperCase()))"
    assert call(s, code=echo, stdin="abc")["stdout"] == "ABC\n"
    fail = call(s, code="console.error('bad'); process.exit(3)")
    assert fail["exit_code"] == 3 and fail["stderr"] == "bad\n"
    thrown = call(s, code="throw new Error('boom')")
    assert thrown["exit_code"] == 1 and "Error: boom" in thrown["stderr"]


@needs_node
def test_timeout_keeps_partial_output(tmp_path: Path) -> None:
    """A loop past its timeout is killed (SIGKILL); what it printed before comes back."""
    out = call(settings(tmp_path), code="console.log('before'); while (true) {}", timeout_s=1)
    assert out["timed_out"] and out["signal"] == "SIGKILL" and out["stdout"] == "before\n"


@needs_node
def test_staged_code_runs(tmp_path: Path) -> None:
    """Code over the argv limit runs from its staged file."""
    out = call(settings(tmp_path), code="//" + "x" * 200_000 + "\nconsole.log(6 * 7)")
    assert out["stdout"] == "42\n" and out["exit_code"] == 0


@needs_node
def test_heap_limit_is_a_clean_error(tmp_path: Path) -> None:
    """A memory bomb meets V8's heap limit (from the policy's memory): it ends, with V8's message on stderr."""
    bomb = "const a = []; while (true) a.push(new Array(1e6).fill(1.5));"
    out = call(settings(tmp_path, memory="64MiB"), code=bomb, timeout_s=20)
    assert not out["timed_out"] and out["exit_code"] != 0
    assert "heap" in out["stderr"].lower()
