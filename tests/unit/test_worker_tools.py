"""Tool handlers called directly (no Docker): confinement, caps, timeouts, process groups."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from toolcage.policies import validate_policy
from toolcage.worker.errors import BadParams, NoSpace, PathEscape, ToolError
from toolcage.worker.settings import Settings
from toolcage.worker.tools import Catalog


@pytest.fixture
def dirs(tmp_path: Path) -> tuple[Path, Path]:
    ws, scratch = tmp_path / "ws", tmp_path / "scratch"
    ws.mkdir()
    scratch.mkdir()
    (ws / "src").mkdir()
    (ws / "src" / "a.py").write_text("import os\nprint('hello')\n")
    (ws / "README").write_text("Hello world\nsecond line\n")
    (ws / "bin.dat").write_bytes(b"\x00\x01\x02hello")
    (ws / "escape").symlink_to("/etc")
    return ws, scratch


def settings(dirs: tuple[Path, Path], **limits: object) -> Settings:
    ws, scratch = dirs
    policy = validate_policy({"limits": limits, "timeouts": {"call_s": 5, "run_s": 20}})
    return Settings(policy.canonical_json(), str(ws), str(scratch), "test")


def call(s: Settings, name: str, **params: object) -> dict:  # type: ignore[type-arg]
    tool = Catalog().get(name)
    return tool.handler(s, tool.validate(params))


def test_list_files(dirs: tuple[Path, Path]) -> None:
    """Lists a directory, recursive on request, with types; symlinks are not followed."""
    s = settings(dirs)
    top = call(s, "list_files")
    names = {e["path"]: e["type"] for e in top["entries"]}
    assert names == {
        f"/workspace/{n}": t
        for n, t in (("README", "file"), ("bin.dat", "file"), ("escape", "symlink"), ("src", "dir"))
    }
    rec = call(s, "list_files", recursive=True)
    assert "/workspace/src/a.py" in {e["path"] for e in rec["entries"]}


def test_read_file_text_and_binary(dirs: tuple[Path, Path]) -> None:
    """Text comes back as utf-8, binary as base64."""
    s = settings(dirs)
    assert call(s, "read_file", path="/workspace/README")["content"].startswith("Hello")
    assert call(s, "read_file", path="/workspace/bin.dat")["encoding"] == "base64"


@pytest.mark.parametrize(
    "path",
    ["/etc/passwd", "../../../etc/passwd", "/workspace/escape/passwd", "/workspace/escape", "/proc/self/environ"],
)
def test_read_escapes_refused(dirs: tuple[Path, Path], path: str) -> None:
    """Absolute paths, .. and symlinks out of the roots are refused with PathEscape."""
    with pytest.raises(PathEscape):
        call(settings(dirs), "read_file", path=path)


def test_read_cap(dirs: tuple[Path, Path]) -> None:
    """read_file never returns more than the output cap."""
    ws, _ = dirs
    (ws / "big").write_text("x" * 10_000)
    r = call(settings(dirs, output_cap=1024), "read_file", path="/workspace/big")
    assert len(r["content"]) == 1024 and r["truncated"] is True


def test_grep(dirs: tuple[Path, Path]) -> None:
    """grep finds lines by regex or fixed string, skips binary files, reports invalid regexes as params errors."""
    s = settings(dirs)
    m = call(s, "grep", pattern="hel+o", ignore_case=True)["matches"]
    assert {(x["path"], x["line"]) for x in m} == {("/workspace/README", 1), ("/workspace/src/a.py", 2)}
    assert call(s, "grep", pattern="(", fixed_string=True)["matches"][0]["path"] == "/workspace/src/a.py"
    with pytest.raises(BadParams):
        call(s, "grep", pattern="(")


def test_write_file_only_in_scratch(dirs: tuple[Path, Path]) -> None:
    """write_file writes into scratch; the workspace and symlinks out are refused."""
    s = settings(dirs)
    ws, scratch = dirs
    r = call(s, "write_file", path="out/notes.txt", content="hi")
    assert (scratch / "out" / "notes.txt").read_text() == "hi" and r["bytes_written"] == 2
    with pytest.raises(PathEscape):
        call(s, "write_file", path=str(ws / "x"), content="no")
    (scratch / "link").symlink_to(ws / "README")
    with pytest.raises(ToolError, match="symlink"):
        call(s, "write_file", path="link", content="no")
    assert (ws / "README").read_text().startswith("Hello")


def test_write_file_full_disk(dirs: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    """ENOSPC becomes a NoSpace tool error."""
    import errno

    def full(*a: object) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "write", full)
    with pytest.raises(NoSpace):
        call(settings(dirs), "write_file", path="x", content="data")


def test_run_python(dirs: tuple[Path, Path]) -> None:
    """run_python returns stdout, stderr and exit code; runs in scratch."""
    r = call(settings(dirs), "run_python", code="import os,sys; print(os.getcwd()); sys.exit(3)")
    assert r["exit_code"] == 3 and r["stdout"].strip() == str(dirs[1]) and not r["timed_out"]


def test_run_shell_stdin(dirs: tuple[Path, Path]) -> None:
    """stdin is fed to the child."""
    assert call(settings(dirs), "run_shell", command="tr a-z A-Z", stdin="abc")["stdout"] == "ABC"


def test_timeout_kills_whole_group(dirs: tuple[Path, Path]) -> None:
    """At the timeout the child and its descendants die; partial output is kept."""
    _, scratch = dirs
    t = time.monotonic()
    r = call(
        settings(dirs),
        "run_shell",
        timeout_s=0.5,
        command=f"echo started; (sleep 30; touch {scratch}/survivor) & sleep 30",
    )
    assert time.monotonic() - t < 5
    assert r["timed_out"] is True and r["stdout"] == "started\n"
    time.sleep(0.3)
    assert not (scratch / "survivor").exists()


def test_background_child_does_not_hang_call(dirs: tuple[Path, Path]) -> None:
    """A background process holding the pipes does not keep the call open after the child exits."""
    t = time.monotonic()
    r = call(settings(dirs), "run_shell", command="sleep 30 & echo done")
    assert time.monotonic() - t < 3 and r["stdout"] == "done\n" and r["exit_code"] == 0


def test_output_cap(dirs: tuple[Path, Path]) -> None:
    """Output beyond the cap is dropped (and the child is not blocked), truncated is set."""
    r = call(settings(dirs, output_cap=4096), "run_python", code="import sys; sys.stdout.write('x' * 5_000_000)")
    assert len(r["stdout"]) == 4096 and r["truncated"] is True and r["exit_code"] == 0


def test_signal_reported(dirs: tuple[Path, Path]) -> None:
    """A child killed by a signal reports its name."""
    r = call(settings(dirs), "run_shell", command="kill -TERM $$")
    assert r["signal"] == "SIGTERM" and r["exit_code"] == -15


def test_long_code_goes_through_a_file(dirs: tuple[Path, Path]) -> None:
    """Code longer than one argv string may be (128 KiB) still runs."""
    code = "x = 1\n" * 40_000 + "print('long ok')"
    r = call(settings(dirs), "run_python", code=code)
    assert r["exit_code"] == 0 and r["stdout"] == "long ok\n"
    r = call(settings(dirs), "run_shell", command=": \n" * 60_000 + "echo shell ok")
    assert r["stdout"] == "shell ok\n"


def test_nul_in_code_is_a_params_error(dirs: tuple[Path, Path]) -> None:
    """A NUL byte in code is a clear params error, not an internal one."""
    with pytest.raises(BadParams, match="NUL"):
        call(settings(dirs), "run_python", code="print(1)\x00")


def test_timed_out_child_names_its_signal(dirs: tuple[Path, Path]) -> None:
    """A child killed at its timeout says so twice: timed_out and signal SIGKILL (signal was null)."""
    r = call(settings(dirs), "run_shell", command="sleep 30", timeout_s=0.5)
    assert r["timed_out"] is True and r["signal"] == "SIGKILL" and r["exit_code"] == -9
