"""`toolcage mcp serve`'s pure pieces: tool listings and call outcomes as MCP, the SDK kept out of `import toolcage`."""

from __future__ import annotations

import subprocess
import sys

import mcp_types as types

from toolcage.errors import SandboxTimeout
from toolcage.results import CallResult
from toolcage.servers.mcp_serve import call_content, mcp_tools, sandbox_failure


def _text(out: dict) -> str:
    return out["content"][0]["text"]


def test_ok_object_result_is_text_and_structured() -> None:
    """An ok result that is an object: its JSON as text, and the object as structuredContent."""
    res = CallResult("ok", "run_python", "r1", result={"stdout": "4\n", "exit_code": 0})
    out = call_content(res)
    assert out["isError"] is False
    assert out["structuredContent"] == {"stdout": "4\n", "exit_code": 0}
    assert '"stdout": "4\\n"' in _text(out)
    types.CallToolResult.model_validate(out)


def test_ok_non_object_result_has_no_structured_content() -> None:
    """A list or string result is text only (structuredContent must be an object before MCP 2026-07-28)."""
    out = call_content(CallResult("ok", "list_files", "r1", result=["a", "b"]))
    assert "structuredContent" not in out and _text(out) == '["a", "b"]'


def test_json_rpc_error_is_an_is_error_result() -> None:
    """A worker error (bad params) is isError naming status, code, message and the data (the bad field)."""
    err = {"code": -32602, "message": "Invalid params", "data": [{"loc": ["a"], "msg": "not an int"}]}
    out = call_content(CallResult("error", "add", "r1", error=err))
    assert out["isError"] is True
    assert "status error" in _text(out) and "-32602" in _text(out) and "Invalid params" in _text(out)
    assert '"loc": ["a"]' in _text(out)
    assert "structuredContent" not in out


def test_child_failure_keeps_the_result() -> None:
    """A child that exited 1 (or timed out, or was capped) is isError with the status and its output."""
    result = {"stdout": "", "stderr": "boom\n", "exit_code": 1, "timed_out": False, "truncated": False}
    out = call_content(CallResult("error", "run_python", "r1", result=result))
    assert out["isError"] is True and "status error" in _text(out) and "boom" in _text(out)
    assert out["structuredContent"]["exit_code"] == 1
    out = call_content(CallResult("output_capped", "run_python", "r1", result={**result, "exit_code": 0}))
    assert out["isError"] is True and "status output_capped" in _text(out)


def test_text_is_escaped_ascii() -> None:
    """Text a sandbox chose reaches the client with control characters escaped (a terminal escape stays inert)."""
    out = call_content(CallResult("ok", "run_python", "r1", result={"stdout": "\x1b[2J\u202e"}))
    assert "\x1b" not in _text(out) and "\u202e" not in _text(out) and _text(out).isascii()


def test_sandbox_failure_names_the_status() -> None:
    """A dead sandbox (deadline) is isError naming status and reason."""
    out = sandbox_failure(SandboxTimeout("run exceeded its deadline of 3s"))
    assert out["isError"] is True and "status timeout" in _text(out) and "run_deadline" in _text(out)
    types.CallToolResult.model_validate(out)


def test_tool_listing_as_mcp_tools() -> None:
    """tools.list entries become MCP tools: name, description, inputSchema (an object schema)."""
    listing = [
        {"name": "add", "description": "Add.", "params_schema": {"type": "object", "properties": {"a": {}}}},
        {"name": "noop", "description": "Nothing.", "params_schema": {}},
    ]
    tools = mcp_tools(listing)
    assert tools[0] == {"name": "add", "description": "Add.", "inputSchema": listing[0]["params_schema"]}
    assert tools[1]["inputSchema"] == {"type": "object"}
    types.ListToolsResult.model_validate({"tools": tools})


def test_sdk_not_imported_by_toolcage_or_its_cli() -> None:
    """`import toolcage` and the CLI module load without the MCP SDK (it is imported when `mcp serve` runs)."""
    code = (
        "import sys, toolcage, toolcage.cli.main; "
        "assert not any(m == 'mcp' or m.startswith('mcp.') for m in sys.modules)"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_error_message_is_escaped() -> None:
    """An error message a connector chose is escaped too."""
    out = call_content(CallResult("error", "x", "r1", error={"code": -32001, "message": "bad\x1b[31m"}))
    assert "\x1b" not in _text(out)
