"""run_node called directly (no Docker): argv, heap size, staging, the child through run_child."""

from __future__ import annotations

from pathlib import Path

import pytest

from toolcage.policies import validate_policy
from toolcage.worker.errors import BadParams, ToolError
from toolcage.worker.settings import Settings
from toolcage.worker.tools import BUILTIN, Catalog, describe_tool
from toolcage.worker.tools import node as node_tool


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


def test_runs_through_run_child(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The child (a stand-in for node) gets the flags, the code, stdin, /scratch as cwd and HOME, and the small
    thread pool; its output, exit code and the run_python result shape come back. (Real node runs in
    tests/integration/test_node.py, in the image.)"""
    fake = tmp_path / "node"
    fake.write_text('#!/bin/sh\necho "$@"; echo "$PWD $HOME $UV_THREADPOOL_SIZE"; cat; exit 4\n')
    fake.chmod(0o755)
    monkeypatch.setattr(node_tool, "node_binary", lambda: str(fake))
    s = settings(tmp_path)
    out = call(s, code="console.log(1)", stdin="in")
    scratch = tmp_path / "scratch"
    assert out["stdout"] == f"--max-old-space-size=384 --v8-pool-size=2 -e console.log(1)\n{scratch} {scratch} 2\nin"
    assert out["exit_code"] == 4
    python = Catalog().get("run_python")
    assert set(out) == set(python.handler(s, python.validate({"code": "1"})))


def test_timeout_is_cut_to_the_time_left_in_the_run() -> None:
    """As run_python's: near the run's deadline the worker ends node itself (partial output kept, status
    timeout) instead of the deadline killing the sandbox and losing the output (runner/timing.py)."""
    from toolcage.timing import GRACE_S, fit_params

    assert fit_params("run_node", {"code": "1", "timeout_s": 60}, 30, 10) == {"code": "1", "timeout_s": 10 - GRACE_S}
    assert fit_params("run_node", {"code": "1"}, 30, 100) == {"code": "1"}
