"""`toolcage mcp serve` loaded by third-party MCP clients (LangChain's adapter, the OpenAI Agents SDK), no model.

langchain-mcp-adapters 0.3 imports only with mcp 1.x and toolcage needs mcp 2.x, so the clients run in
their own venv (``mcp_clients/requirements.txt``), made once from PyPI under ``.cache/mcp-clients/`` and
kept: without PyPI the first run fails, it never skips. Each client script starts this checkout's
`toolcage` executable, as a user's configuration does, and prints what its framework saw as JSON.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.runc_only(
    "a framework's adapter: its translation of the same calls, host-side (test_exec, test_files_* and "
    "test_workspace_copy run those calls under gVisor)"
)

ROOT = Path(__file__).resolve().parents[2]
CLIENTS = Path(__file__).resolve().parent / "mcp_clients"
REQUIREMENTS = CLIENTS / "requirements.txt"
BUILTINS = {"run_python", "run_shell", "list_files", "read_file", "grep", "write_file", "http_fetch"}


def _make_venv() -> Path:
    """The clients' python: a venv per requirements file and interpreter, made once (about 20 s, from PyPI)."""
    key = hashlib.sha256(REQUIREMENTS.read_bytes() + f"{sys.version}|{sys.base_prefix}".encode()).hexdigest()[:16]
    venv = ROOT / ".cache" / "mcp-clients" / key
    if (venv / "bin" / "python").exists():
        return venv / "bin" / "python"
    # built beside it and renamed when complete, so an interrupted or failed install never counts as made
    tmp = venv.with_name(f"{key}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        subprocess.run([sys.executable, "-m", "venv", str(tmp)], check=True, capture_output=True, timeout=120)
        pip = [str(tmp / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-input"]
        pip += ["--only-binary=:all:", "-r", str(REQUIREMENTS)]  # wheels only: nothing is built, and it is faster
        proc = subprocess.run(pip, capture_output=True, text=True, timeout=900)
        if proc.returncode != 0:
            pytest.fail(
                f"could not install the MCP clients' venv from {REQUIREMENTS.name} (PyPI is needed the first time):\n"
                + proc.stderr[-3000:],
                pytrace=False,
            )
        try:
            tmp.rename(venv)
        except OSError:  # another test process finished first: use its venv
            if not (venv / "bin" / "python").exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return venv / "bin" / "python"


@pytest.fixture(scope="session")
def client_python() -> Path:
    """The python of the clients' venv (made on first use)."""
    return _make_venv()


def _run_client(engine: Any, python: Path, script: str, tmp_path: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Run ``mcp_clients/SCRIPT`` with a policy and a workspace of its own: (its JSON, this run's audit records).

    Also fails if a sandbox of that policy is still there after the client has exited."""
    toolcage = Path(sys.executable).with_name("toolcage")
    assert toolcage.exists(), f"no toolcage executable beside {sys.executable}"
    name = f"mcp-clients-{uuid.uuid4().hex[:8]}"
    policy = tmp_path / "policy.yaml"
    policy.write_text(f"version: 1\nname: {name}\ntimeouts:\n  run_s: 120\n")
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "hello.txt").write_text("hello from the workspace\n")
    workspace.chmod(0o755)
    (workspace / "hello.txt").chmod(0o644)
    audit = tmp_path / "audit.jsonl"
    env = {**os.environ, "TOOLCAGE_AUDIT_LOG": str(audit)}
    proc = subprocess.run(
        [str(python), str(CLIENTS / script), str(toolcage), str(policy), str(workspace)],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    left = engine.containers(f"toolcage.policy={name}")
    for c in left:
        engine.remove(c["Id"])
    assert not left, f"sandboxes left behind: {[c['Names'] for c in left]}"
    records = [json.loads(line) for line in audit.read_text().splitlines()]
    assert {r["policy"] for r in records if r["event"] == "run.started"} == {name}
    return json.loads(proc.stdout), records


def _runs(records: list[dict[str, Any]]) -> list[list[str]]:
    """The tools each sandbox was called with, sandboxes in start order; fails unless every one finished."""
    started = [r["run_id"] for r in records if r["event"] == "run.started"]
    assert sorted(started) == sorted(r["run_id"] for r in records if r["event"] == "run.finished")
    return [[r["tool"] for r in records if r["event"] == "run.call" and r["run_id"] == run] for run in started]


def test_langchain_mcp_adapters(engine: Any, client_python: Path, tmp_path: Path) -> None:
    """LangChain lists the tools, invokes them (one sandbox per session), and gets failures as error ToolMessages."""
    out, records = _run_client(engine, client_python, "langchain_client.py", tmp_path)

    assert set(out["tools"]) >= BUILTINS and all(out["descriptions"].values())
    assert "code" in out["tools"]["run_python"] and "path" in out["tools"]["read_file"]
    fresh = out["fresh"]
    assert fresh["status"] == "success" and fresh["structured"]["stdout"] == "42\n"
    assert json.loads(fresh["text"])["stdout"] == "42\n"

    s = out["session"]
    assert s["read_workspace"]["structured"]["content"] == "hello from the workspace\n"
    assert [e["path"] for e in s["list_workspace"]["structured"]["entries"]] == ["/workspace/hello.txt"]
    assert s["write"]["structured"] == {"path": "/scratch/note.txt", "bytes_written": 4}
    assert s["read_back"]["structured"]["stdout"] == "kept\n"  # the same sandbox for the whole session

    # failures reach the model as ToolMessage(status="error") with toolcage's text, not as a crash
    assert s["exit_3"]["status"] == "error" and "status error" in s["exit_3"]["text"]
    assert '"exit_code": 3' in s["exit_3"]["text"] and "bye" in s["exit_3"]["text"]
    assert s["missing"]["status"] == "error" and "-32001" in s["missing"]["text"]
    assert "/workspace/missing.txt" in s["missing"]["text"]
    assert s["write_workspace"]["status"] == "error" and "-32002" in s["write_workspace"]["text"]
    assert "read-only" in s["write_workspace"]["text"]
    assert s["bad_params"]["status"] == "error" and "-32602" in s["bad_params"]["text"]
    assert "max_entries" in s["bad_params"]["text"]
    # with handle_tool_errors=False the same kind of failure raises ToolException
    assert out["raised"] is not None and '"exit_code": 4' in out["raised"]["message"]

    # get_tools() lists in a sandbox of its own and each of its tools' calls starts another (a session
    # each); the explicit session is one sandbox, whose tools are listed once however often LangChain asks
    runs = _runs(records)
    assert runs[:2] == [["tools.list"], ["tools.list", "run_python"]]
    assert len(runs) == 3 and runs[2][0] == "tools.list" and runs[2].count("tools.list") == 1 and len(runs[2]) == 10


def test_openai_agents_mcp_server_stdio(engine: Any, client_python: Path, tmp_path: Path) -> None:
    """The Agents SDK's MCPServerStdio lists the tools and calls them in one sandbox; a failure is isError."""
    out, records = _run_client(engine, client_python, "agents_client.py", tmp_path)

    assert set(out["tools"]) >= BUILTINS
    assert not out["run_python"]["is_error"] and out["run_python"]["structured"]["stdout"] == "42\n"
    assert out["grep"]["structured"]["matches"][0]["path"] == "/workspace/hello.txt"
    assert out["exit_3"]["is_error"] and "status error" in out["exit_3"]["text"]
    assert out["exit_3"]["structured"]["exit_code"] == 3
    assert _runs(records) == [["tools.list", "run_python", "grep", "run_python"]]
