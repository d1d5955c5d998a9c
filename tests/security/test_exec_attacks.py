"""exec from the attacker's side: its cwd, env and output are doors, and each holds.

Named cases, each with what is observed and why: a cwd outside /scratch and /workspace (by name, by
``..``, through a symlink planted in scratch) is refused by the file tools' rule; env cannot set the
worker's TOOLCAGE_* variables, and PATH or LD_PRELOAD given in env reach the program only, never the
launcher that makes the tool namespaces under gVisor (a planted ``python3`` on that PATH would run
outside them); output with terminal escapes and bytes that are not UTF-8 comes back encoded.
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from toolcage import Sandbox

pytestmark = pytest.mark.usefixtures("no_leaks")


@pytest.fixture(scope="module")
def sandbox(engine: Any) -> Iterator[Sandbox]:
    with Sandbox(tool="exec-attacks") as sb:
        r = sb.call("exec", {"command": "ln -s / /scratch/up && ln -s /proc/1 /scratch/worker && mkdir /scratch/d"})
        assert r.ok, r
        yield sb


CWD_CASES = [
    ("root", "/", -32002, "outside the allowed directories"),
    ("etc", "/etc", -32002, "outside the allowed directories"),
    ("dotdot", "../../etc", -32002, "outside the allowed directories"),
    ("dotdot_from_root", "/scratch/d/../../proc", -32002, "outside the allowed directories"),
    ("symlink_to_root", "up", -32002, "through a symlink"),
    ("symlink_into", "/scratch/up/etc", -32002, "through a symlink"),
    ("symlink_to_worker_proc", "worker", -32002, "through a symlink"),
    ("no_workspace", "/workspace", -32001, "no workspace in this run"),
]


@pytest.mark.parametrize(("name", "cwd", "code", "words"), CWD_CASES, ids=[c[0] for c in CWD_CASES])
def test_cwd_cannot_leave_the_roots(sandbox: Sandbox, name: str, cwd: str, code: int, words: str) -> None:
    """Each cwd outside the roots is refused before anything runs, with the file tools' error."""
    r = sandbox.call("exec", {"argv": ["pwd"], "cwd": cwd})
    assert r.error is not None and r.error["code"] == code and words in r.error["message"], (name, r)


ENV_CASES = [
    ("scratch_root", {"TOOLCAGE_SCRATCH": "/"}),
    ("workspace_root", {"TOOLCAGE_WORKSPACE": "/etc"}),
    ("lower_case", {"toolcage_scratch": "/"}),
    ("any_toolcage", {"TOOLCAGE_TOOL_NAMESPACES": "0"}),
    ("not_a_name", {"X=Y": "1"}),
]


@pytest.mark.parametrize(("name", "env"), ENV_CASES, ids=[c[0] for c in ENV_CASES])
def test_env_cannot_set_the_workers_variables(sandbox: Sandbox, name: str, env: dict[str, str]) -> None:
    """TOOLCAGE_* (any case) and names that are not names are params errors: nothing runs."""
    r = sandbox.call("exec", {"command": "touch /scratch/ran", "env": env})
    assert r.error is not None and r.error["code"] == -32602, (name, r)
    assert sandbox.call("exec", {"argv": ["test", "-e", "/scratch/ran"]}).result["exit_code"] == 1  # type: ignore[index]


def test_path_in_env_does_not_reach_the_launcher(sandbox: Sandbox) -> None:
    """A python3 planted first on env's PATH is never run: env applies to the program only (under gVisor the
    namespace launcher is `python3 nsinit.py`, found on the worker's PATH). A second wall: scratch is noexec."""
    plant = "mkdir -p /scratch/evil && printf '#!/bin/sh\\ntouch /scratch/PWNED\\n' > /scratch/evil/python3"
    assert sandbox.call("exec", {"command": plant + " && chmod +x /scratch/evil/python3"}).ok
    r = sandbox.call("exec", {"argv": ["true"], "env": {"PATH": "/scratch/evil:/usr/bin:/bin"}})
    assert r.ok and r.result["exit_code"] == 0, r
    seen = sandbox.call("exec", {"argv": ["ls", "/scratch"]}).result["stdout"].split()  # type: ignore[index]
    assert "PWNED" not in seen, seen


def test_ld_preload_in_env_loads_into_the_program_only(sandbox: Sandbox) -> None:
    """LD_PRELOAD given in env is read by one dynamic loader only, the program's (the loader says so once on
    stderr): never by the launcher or the env shim before it (under gVisor, with env handed to the launcher,
    the loader said it twice: code preloaded there would run outside the tool namespaces)."""
    r = sandbox.call("exec", {"argv": ["true"], "env": {"LD_PRELOAD": "/scratch/missing.so"}})
    assert r.ok and r.result["exit_code"] == 0, r
    assert r.result["stderr"].count("cannot be preloaded") == 1, r.result["stderr"]


def test_nul_and_oversized_arguments_are_clear_errors(sandbox: Sandbox) -> None:
    """A NUL in argv and an argument over the kernel's 128 KiB are params errors, not tracebacks."""
    r = sandbox.call("exec", {"argv": ["echo", "a\x00b"]})
    assert r.error is not None and r.error["code"] == -32602 and "NUL" in str(r.error["data"]), r
    r = sandbox.call("exec", {"argv": ["echo", "x" * 200_000]})
    assert r.error is not None and r.error["code"] == -32602 and "too long" in str(r.error["data"]), r
    r = sandbox.call("exec", {"argv": ["echo", "\ud800"]})
    assert r.error is not None and r.error["code"] == -32602 and "lone surrogate" in str(r.error["data"]), r


HOSTILE = rb"\033]0;owned\007\033[2J\033[31mred\377\376\n"  # printf: title, clear screen, colour, bad UTF-8


def test_hostile_output_is_encoded_not_passed_to_a_terminal(engine: Any) -> None:
    """Escape sequences and bytes that are not UTF-8 reach `toolcage run`'s stdout encoded (no raw ESC, BEL
    or 0xFF byte), and stdout_b64 holds them exactly."""
    params = json.dumps({"argv": ["printf", HOSTILE.decode()]})
    out = subprocess.run(
        [sys.executable, "-m", "toolcage.cli", "run", "exec", "--params", params], capture_output=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    for raw in (b"\x1b", b"\x07", b"\xff"):
        assert raw not in out.stdout and raw not in out.stderr, out.stdout
    result = json.loads(out.stdout)["result"]
    assert base64.b64decode(result["stdout_b64"]) == b"\x1b]0;owned\x07\x1b[2J\x1b[31mred\xff\xfe\n"
