"""The exec tool with --sandbox none: argv or a shell string, cwd by the file tools' rule, env, stdin,
binary-safe output, timeout and how the program ended; and the one rule for binary streams."""

from __future__ import annotations

import base64
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from toolcage import Sandbox
from toolcage.errors import BadToolCall
from toolcage.precheck import check_call
from toolcage.worker.tools.proc import stream_fields

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")  # --sandbox none warns that nothing is isolated


@pytest.fixture(scope="module")
def sb(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sandbox]:
    ws = tmp_path_factory.mktemp("ws")
    (ws / "sub").mkdir()
    (ws / "sub" / "f.txt").write_text("in workspace\n")
    with Sandbox(sandbox="none", workspace=ws) as box:
        yield box


def ok(sb: Sandbox, **params: Any) -> dict[str, Any]:
    r = sb.call("exec", params)
    assert r.error is None and r.result is not None, r
    return r.result


def err(sb: Sandbox, **params: Any) -> dict[str, Any]:
    r = sb.call("exec", params)
    assert r.error is not None, r
    return r.error


def test_argv_runs_without_a_shell(sb: Sandbox) -> None:
    """argv runs as given: shell syntax in an argument is just text, and the result has run_shell's fields."""
    r = ok(sb, argv=["echo", "$HOME; rm -rf /", "*"])
    assert r["stdout"] == "$HOME; rm -rf / *\n"
    assert r["exit_code"] == 0 and r["signal"] is None and not r["timed_out"] and not r["truncated"]
    assert {"wall_ms", "cpu_ms", "peak_rss_bytes", "oom_killed", "stderr"} <= set(r)


def test_command_is_a_shell_string(sb: Sandbox) -> None:
    """command runs under /bin/sh -c, with pipes and exit codes."""
    r = sb.call("exec", {"command": "echo a b | wc -w; echo oops >&2; exit 7"})
    assert r.result is not None and r.result["stdout"].strip() == "2" and r.result["stderr"] == "oops\n"
    assert r.result["exit_code"] == 7


def test_exactly_one_of_argv_or_command(sb: Sandbox) -> None:
    """Both, or neither, is a params error that says which fields to give (and the host precheck says it too)."""
    for params in ({}, {"argv": ["ls"], "command": "ls"}):
        e = err(sb, **params)
        assert e["code"] == -32602 and "exactly one of argv" in e["data"][0]["error"], e
        with pytest.raises(BadToolCall, match=r"invalid params for exec: give exactly one of argv"):
            check_call("exec", params)
    assert err(sb, argv=[])["code"] == -32602
    assert "argv[0]" in err(sb, argv=[""])["data"][0]["error"]


def test_cwd_default_relative_and_workspace(sb: Sandbox) -> None:
    """cwd defaults to scratch, a relative cwd is under scratch, and /workspace/... is the workspace."""
    scratch = ok(sb, argv=["pwd"])["stdout"].strip()
    ok(sb, argv=["mkdir", "-p", "d/e"])
    assert ok(sb, argv=["pwd"], cwd="d/e")["stdout"].strip() == os.path.join(scratch, "d/e")
    assert ok(sb, argv=["cat", "f.txt"], cwd="/workspace/sub")["stdout"] == "in workspace\n"


@pytest.mark.parametrize(
    ("cwd", "code", "words"),
    [
        ("/etc", -32002, "outside the allowed directories"),
        ("../..", -32002, "outside the allowed directories"),
        ("/scratch/../etc", -32002, "outside the allowed directories"),
        ("out", -32002, "through a symlink"),
        ("nowhere", -32001, "no such file or directory"),
        ("a-file", -32001, "not a directory"),
    ],
)
def test_cwd_rule_refuses(sb: Sandbox, cwd: str, code: int, words: str) -> None:
    """A cwd outside the roots, climbing out, through a symlink out, missing or not a directory is refused."""
    scratch = Path(ok(sb, argv=["pwd"])["stdout"].strip())
    if not (scratch / "out").is_symlink():
        (scratch / "out").symlink_to("/etc")
        (scratch / "a-file").write_text("x")
    e = err(sb, argv=["pwd"], cwd=cwd)
    assert e["code"] == code and words in e["message"], e


def test_env_reaches_the_program(sb: Sandbox) -> None:
    """env adds variables for the program; PATH given there is the program's, used to find argv[0]."""
    r = ok(sb, command='echo "$GREETING $PATH"', env={"GREETING": "hi there", "PATH": "/bin:/usr/bin"})
    assert r["stdout"] == "hi there /bin:/usr/bin\n"
    assert ok(sb, argv=["printenv", "X"], env={"X": "a=b c"})["stdout"] == "a=b c\n"


@pytest.mark.parametrize(
    ("env", "words"),
    [
        ({"TOOLCAGE_SCRATCH": "/"}, "worker's own"),
        ({"toolcage_workspace": "/"}, "worker's own"),
        ({"A=B": "1"}, "not a variable name"),
        ({"1X": "1"}, "not a variable name"),
        ({"": "1"}, "not a variable name"),
        ({"X": "a\x00b"}, "NUL"),
    ],
)
def test_env_refusals(sb: Sandbox, env: dict[str, str], words: str) -> None:
    """Names the worker owns (TOOLCAGE_*), names that are not names, and NUL in a value are params errors."""
    e = err(sb, argv=["true"], env=env)
    assert e["code"] == -32602 and words in e["data"][0]["error"], e


def test_stdin_text_and_base64(sb: Sandbox) -> None:
    """stdin is text, or exact bytes given as base64; bad base64 is a params error."""
    assert ok(sb, argv=["cat"], stdin="héllo")["stdout"] == "héllo"
    raw = bytes(range(256))
    r = ok(sb, argv=["od", "-An", "-v", "-tx1"], stdin=base64.b64encode(raw).decode(), stdin_encoding="base64")
    assert bytes.fromhex(r["stdout"].replace("\n", "").replace(" ", "")) == raw
    e = err(sb, argv=["cat"], stdin="not base64!", stdin_encoding="base64")
    assert e["code"] == -32602 and "not valid base64" in e["data"][0]["error"], e


def test_binary_output_round_trips_exactly(sb: Sandbox) -> None:
    """Bytes that are not UTF-8 come back exactly in stdout_b64 (stdout stays text); UTF-8 output has no _b64."""
    raw = bytes(range(256)) * 4
    r = ok(sb, argv=["cat"], stdin=base64.b64encode(raw).decode(), stdin_encoding="base64")
    assert base64.b64decode(r["stdout_b64"]) == raw
    assert "\ufffd" in r["stdout"]
    assert "stdout_b64" not in ok(sb, argv=["echo", "héllo ✓"])
    e = ok(sb, command=r"printf '\377\376' >&2")
    assert base64.b64decode(e["stderr_b64"]) == b"\xff\xfe" and "stdout_b64" not in e


def test_run_shell_gains_the_same_field(sb: Sandbox) -> None:
    """run_shell keeps stdout as text (U+FFFD as before) and adds stdout_b64 with the exact bytes."""
    r = sb.call("run_shell", {"command": r"printf 'a\377b'"}).result
    assert r is not None and r["stdout"] == "a\ufffdb" and base64.b64decode(r["stdout_b64"]) == b"a\xffb"


def test_timeout_keeps_partial_output(sb: Sandbox) -> None:
    """At its timeout the program is killed (SIGKILL), and what it wrote before is kept."""
    r = ok(sb, command="echo before; sleep 30; echo after", timeout_s=0.5)
    assert r["timed_out"] and r["signal"] == "SIGKILL" and r["exit_code"] == -9
    assert r["stdout"] == "before\n" and r["wall_ms"] < 10_000


def test_exit_code_and_signal(sb: Sandbox) -> None:
    """A program's exit code comes back, and a signal that kills it is named."""
    assert sb.call("exec", {"argv": ["sh", "-c", "exit 3"]}).result["exit_code"] == 3  # type: ignore[index]
    r = sb.call("exec", {"argv": ["sh", "-c", "kill -TERM $$"]}).result
    assert r is not None and r["signal"] == "SIGTERM" and r["exit_code"] == -15


def test_missing_program_is_a_clear_error(sb: Sandbox) -> None:
    """A program that is not on PATH (or not executable) is a tool error naming it, not a traceback."""
    e = err(sb, argv=["no-such-program-xyz"])
    assert e["code"] == -32001 and "'no-such-program-xyz'" in e["message"] and "PATH=" in e["message"], e
    e = err(sb, argv=["./missing.sh"])
    assert e["code"] == -32001 and "no such program: './missing.sh'" in e["message"], e
    ok(sb, command="echo 'echo via sh' > plain.sh")
    e = err(sb, argv=["./plain.sh"])
    assert e["code"] == -32001 and "not executable: './plain.sh'" in e["message"] and "['sh'," in e["message"], e
    assert ok(sb, argv=["sh", "plain.sh"])["stdout"] == "via sh\n"


def test_relative_program_runs_from_cwd(sb: Sandbox) -> None:
    """argv[0] with a slash is found from cwd, as a shell would."""
    ok(sb, command="mkdir -p bin && printf '#!/bin/sh\\necho ran $1\\n' > bin/t.sh && chmod +x bin/t.sh")
    assert ok(sb, argv=["./t.sh", "x"], cwd="bin")["stdout"] == "ran x\n"
    # a relative PATH entry is relative to cwd, as execvp takes it
    assert ok(sb, argv=["t.sh", "y"], cwd="bin", env={"PATH": ".:/usr/bin:/bin"})["stdout"] == "ran y\n"


@pytest.mark.skipif(shutil.which("python3") is None, reason="needs python3 on PATH")
def test_output_streams_as_progress(sb: Sandbox) -> None:
    """Output comes as progress notifications while the program runs, as for run_shell."""
    seen: list[str] = []
    r = sb.call(
        "exec",
        {"argv": ["python3", "-u", "-c", "import time\nfor i in range(3): print(i); time.sleep(0.2)"]},
        on_progress=lambda p: seen.append(p.get("message", "")),
    )
    assert r.ok and "".join(seen) == "0\n1\n2\n", (r, seen)


@pytest.mark.parametrize(
    ("data", "cut", "expected"),
    [
        (b"plain", False, {"out": "plain"}),
        ("é✓".encode(), True, {"out": "é✓"}),
        ("ab✓".encode()[:4], True, {"out": "ab"}),  # cut at the cap inside ✓: text to the last whole character
        ("ab✓".encode()[:4], False, {"out": "ab\ufffd", "out_b64": base64.b64encode(b"ab\xe2\x9c").decode()}),
        (b"\xff" + "ab✓".encode()[:4], True, {"out": "\ufffdab\ufffd", "out_b64": "/2Fi4pw="}),
    ],
)
def test_stream_fields_rule(data: bytes, cut: bool, expected: dict[str, str]) -> None:
    """The one rule: text always; _b64 with the exact bytes when not UTF-8; a cut mid-character stays text."""
    assert stream_fields("out", data, cut) == expected


def test_exit_status_of_a_program_that_closes_its_streams_first(sb: Sandbox) -> None:
    """coreutils close stdout/stderr just before they exit: the status is theirs, never -9 from the end-of-call
    kill racing their exit (it was, about one call in three, for exec and run_shell alike)."""
    codes = {sb.call("exec", {"argv": ["test", "-e", "/nonexistent"]}).result["exit_code"] for _ in range(40)}  # type: ignore[index]
    codes |= {sb.call("run_shell", {"command": "exec test -e /nonexistent"}).result["exit_code"] for _ in range(20)}  # type: ignore[index]
    assert codes == {1}, codes


def test_timeout_is_cut_to_the_run_left_as_for_run_shell(tmp_path: Path) -> None:
    """Past the run's end, exec's child is ended by the worker with its partial output (status timeout), as
    run_shell's is (runner/timing.py), rather than the whole sandbox killed and the output lost."""
    policy = tmp_path / "short.yaml"
    policy.write_text("version: 1\nname: short\ntimeouts: {run_s: 3, idle_s: 3, call_s: 30}\n")
    with Sandbox(policy, sandbox="none", audit=False) as box:
        r = box.call("exec", {"command": "echo partial; sleep 10", "timeout_s": 10})
        assert r.status == "timeout" and r.result is not None and r.result["stdout"] == "partial\n", r
        assert r.result["timed_out"]
