"""The exec tool in a container (issue 24 item 4): argv and shell strings with cwd, env and stdin,
binary output exact, a timeout's partial output, and the same isolation and result as run_shell."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from toolcage import Sandbox

pytestmark = pytest.mark.usefixtures("no_leaks")


def test_exec_in_container(engine: Any, tmp_path: Path) -> None:
    """argv, command, cwd in scratch and the workspace, env, base64 stdin and binary stdout round-trip exactly."""
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "f.txt").write_text("from the workspace\n")
    tmp_path.chmod(0o755)
    (tmp_path / "sub").chmod(0o755)
    with Sandbox(workspace=tmp_path, tool="exec") as sb:
        r = sb.call("exec", {"argv": ["ls", "-la"]})
        assert r.ok and r.result["exit_code"] == 0 and "." in r.result["stdout"], r
        r = sb.call("exec", {"command": "mkdir -p a/b && cd a/b && pwd"})
        assert r.result["stdout"] == "/scratch/a/b\n", r
        assert sb.call("exec", {"argv": ["pwd"], "cwd": "a/b"}).result["stdout"] == "/scratch/a/b\n"
        r = sb.call("exec", {"argv": ["cat", "f.txt"], "cwd": "/workspace/sub"})
        assert r.result["stdout"] == "from the workspace\n", r
        r = sb.call("exec", {"argv": ["printenv", "GREETING"], "env": {"GREETING": "hi"}})
        assert r.result["stdout"] == "hi\n", r
        raw = bytes(range(256)) * 16
        r = sb.call("exec", {"argv": ["cat"], "stdin": base64.b64encode(raw).decode(), "stdin_encoding": "base64"})
        assert base64.b64decode(r.result["stdout_b64"]) == raw, r
        r = sb.call("exec", {"command": "echo before; sleep 30", "timeout_s": 5})  # a start took 0.9 s (gVisor)
        assert r.result["timed_out"] and r.result["signal"] == "SIGKILL" and r.result["stdout"] == "before\n", r
        r = sb.call("exec", {"argv": ["sh", "-c", "exit 4"]})
        assert r.result["exit_code"] == 4 and r.result["cpu_ms"] >= 0 and r.result["peak_rss_bytes"] > 0, r
        e = sb.call("exec", {"argv": ["pwd"], "cwd": "/etc"}).error
        assert e is not None and e["code"] == -32002, e
        e = sb.call("exec", {"argv": ["no-such-program"]}).error
        assert e is not None and e["code"] == -32001 and "no-such-program" in e["message"], e
        assert sb.call("exec", {"command": "echo 'echo ran' > t.sh && chmod +x t.sh"}).ok
        e = sb.call("exec", {"argv": ["./t.sh"]}).error  # scratch is noexec: the error says what to do
        assert e is not None and "not executable" in e["message"] and "noexec" in e["message"], e
        assert sb.call("exec", {"argv": ["sh", "t.sh"]}).result["stdout"] == "ran\n"


def test_exec_is_listed_with_its_schema(engine: Any) -> None:
    """tools.list (baked at image build) has exec with argv, command, cwd, env, stdin and stdin_encoding."""
    with Sandbox(tool="exec") as sb:
        tools = {t["name"]: t for t in sb.call("tools.list").result}
    props = tools["exec"]["params_schema"]["properties"]
    assert {"argv", "command", "cwd", "env", "stdin", "stdin_encoding", "timeout_s"} <= set(props)


def test_cli_run_exec(engine: Any) -> None:
    """`toolcage run exec --params '{"argv": ["ls", "-la"]}'` prints the result as JSON, exit 0; bad params exit 2."""
    cli = [sys.executable, "-m", "toolcage.cli"]
    out = subprocess.run([*cli, "run", "exec", "--params", '{"argv": ["ls", "-la"]}'], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["status"] == "ok" and doc["result"]["exit_code"] == 0 and "total" in doc["result"]["stdout"]
    bad = subprocess.run([*cli, "run", "exec", "--params", '{"argv": ["ls"], "command": "ls"}'], capture_output=True)
    assert bad.returncode == 2 and b"exactly one of argv" in bad.stderr


def test_exec_output_streams_as_progress(engine: Any) -> None:
    """Output arrives as progress notifications while the program runs, before the answer (as for run_shell)."""
    seen: list[str] = []
    with Sandbox(tool="exec") as sb:
        r = sb.call(
            "exec",
            {"argv": ["sh", "-c", "for i in 1 2 3; do echo $i; sleep 0.3; done"]},
            on_progress=lambda p: seen.append(p.get("message", "")),
        )
    assert r.ok and r.result["stdout"] == "1\n2\n3\n", r
    assert "".join(seen) == "1\n2\n3\n" and len(seen) >= 2, seen  # in pieces, as it came
