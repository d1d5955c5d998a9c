"""exec: run any program (an argv, or a shell string) in a directory the caller names, with its env and stdin.

The general door agent frameworks expect of a sandbox session. Underneath it is ``proc.run_child``,
as for run_shell: the same process group, timeout, output cap, streaming, cancel, sweep, memory guard
and (under gVisor) namespaces, and the same result. What it adds is checked here:
- ``cwd`` follows the file tools' rule (``worker.tools.paths.locate``): under /scratch or /workspace,
  relative to /scratch, no ``..`` or symlink out. It is where the program starts, not a cage (the
  program may ``cd`` anywhere the sandbox lets it): the sandbox's mounts are the boundary.
- ``env`` names must be plain names and never ``TOOLCAGE_*`` (the worker's). The variables reach the
  program only: ``/usr/bin/env`` sets them as the last step before the program, after the namespace
  launcher (``worker.children.nsinit``) has run, so ``PATH`` or ``LD_PRELOAD`` cannot redirect or
  load code into anything of the worker's.
"""

from __future__ import annotations

import base64
import binascii
import errno
import os
import re
from typing import Annotated, Any, Literal

from annotated_types import Gt, MaxLen, MinLen

from toolcage.worker.errors import BadParams, ToolError
from toolcage.worker.settings import SCRATCH, WORKSPACE, Settings
from toolcage.worker.tools import Tool
from toolcage.worker.tools._params import doc, params
from toolcage.worker.tools.paths import MAX_PATH, locate, opened
from toolcage.worker.tools.proc import _child_env, _program, run_child, shell_present

ENV_PROGRAM = "/usr/bin/env"  # sets the caller's variables, then execs the program (coreutils)
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_OWNED_PREFIX = "TOOLCAGE_"  # the worker's own variables (where the roots are, the proxy, ...)
_WHERE_EXEC = (
    f"cwd is {SCRATCH} by default (writable; a relative cwd resolves there, as in the file tools) or a directory "
    f"under it or under {WORKSPACE} (read-only). Where they are elsewhere (--sandbox none), $TOOLCAGE_SCRATCH "
    "and $TOOLCAGE_WORKSPACE name them. In a user's own image the programs are the image's, with its PATH and ENV; "
    "cwd is its WORKDIR by default and may be any of its directories."
)


@params
class ExecParams:
    argv: Annotated[list[str], MinLen(1)] | None = doc(
        "the program and its arguments, run as they are (no shell); a bare name is looked up on PATH", None
    )
    command: str | None = doc("a shell command, run as `/bin/sh -c command` (give argv or command, not both)", None)
    cwd: Annotated[str, MaxLen(MAX_PATH)] | None = doc(
        f"working directory, under {SCRATCH} or {WORKSPACE}; relative to {SCRATCH}; default {SCRATCH} (in a "
        "user's own image: its WORKDIR, and any directory of the image may be named)",
        None,
    )
    env: dict[str, str] | None = doc("extra environment variables for the program (names TOOLCAGE_* are refused)", None)
    stdin: str | None = doc("fed to the program's stdin: text, or bytes in base64 with stdin_encoding 'base64'", None)
    stdin_encoding: Literal["utf-8", "base64"] = "utf-8"
    timeout_s: Annotated[float, Gt(0)] | None = doc("seconds; default the policy's call timeout", None)

    def __post_init__(self) -> None:
        # checked here, not in the handler: the host's precheck (runner/precheck.py) then refuses
        # a bad call before a container starts, with the worker's own words
        check_program_params(self.argv, self.command, self.env)
        if self.stdin is not None and self.stdin_encoding == "base64":
            _stdin_bytes(self.stdin)


def check_program_params(argv: list[str] | None, command: str | None, env: dict[str, str] | None) -> None:
    """argv or command, and env, as exec and proc_start take them (ValueError: what is wrong)."""
    if (argv is None) == (command is None):
        raise ValueError("give exactly one of argv (a list: program and arguments) or command (a shell string)")
    if argv is not None:
        if not argv[0]:
            raise ValueError("argv[0] (the program) is empty")
        for i, a in enumerate(argv):
            _check_string(f"argv[{i}]", a)
        if env and "=" in argv[0]:
            raise ValueError("argv[0] contains '=': with env, name the program without one")
    if command is not None:
        _check_string("command", command, limit=None)  # a long one goes through a file (proc._program)
    for name, value in (env or {}).items():
        if not _NAME.fullmatch(name):
            raise ValueError(f"env: {name!r} is not a variable name (letters, digits, _; not first a digit)")
        if name.upper().startswith(_OWNED_PREFIX):
            raise ValueError(f"env: {name} is the worker's own (TOOLCAGE_* cannot be set)")
        _check_string(f"env: the value of {name}", f"{name}={value}")


_MAX_ARG_STRLEN = 128 * 1024  # Linux: one argv or environment string, its NUL included


def _check_string(what: str, text: str, limit: int | None = _MAX_ARG_STRLEN) -> None:
    """Refused here, the same under every runtime (the kernel's E2BIG, or an encoding error, would
    come back differently from each way a child is started)."""
    if "\x00" in text:
        raise ValueError(f"{what} contains a NUL byte")
    try:
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError:
        raise ValueError(f"{what} is not valid text (a lone surrogate)") from None
    if limit is not None and size >= limit:
        raise ValueError(f"{what} is too long: {size} bytes, the kernel takes under {limit} per string")


def _stdin_bytes(text: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("stdin is not valid base64 (stdin_encoding is 'base64')") from None


def _workdir(s: Settings, cwd: str) -> str:
    """The real directory for ``cwd``, placed and opened by the file tools' rule."""
    loc = locate(cwd, s.workspace, s.scratch)
    with opened(loc, os.O_PATH | os.O_DIRECTORY):  # a directory beneath its root, no symlink out
        pass
    assert loc.real is not None  # opened() refuses a run without a workspace
    return os.path.normpath(os.path.join(loc.real, loc.rel))


def _runnable(path: str) -> bool:
    """Executable, and not on a noexec mount (gVisor's access(2) does not check that one)."""
    try:
        return os.access(path, os.X_OK) and not os.statvfs(path).f_flag & os.ST_NOEXEC
    except OSError:
        return False


def _check_program(program: str, workdir: str, path: str) -> None:
    """Refuse a program that is not there, the same way under every runtime (each would say it differently)."""
    if "/" in program:
        candidates = [os.path.join(workdir, program)]
    else:
        candidates = [os.path.join(workdir, d, program) for d in path.split(os.pathsep)]  # "": the cwd, as execvp
    present = [c for c in candidates if os.path.isfile(c)]
    if any(_runnable(c) for c in present):
        return
    where = "" if "/" in program else f" (looked up on PATH={path})"
    if not present:
        raise ToolError(f"no such program: {program!r}{where}", {"program": program})
    raise ToolError(
        f"not executable: {program!r}{where}: it lacks the x bit, or lies on a noexec mount ({SCRATCH} is one "
        f"in a container); run it with its interpreter, e.g. argv ['sh', {program!r}]",
        {"program": program, "path": present[0]},
    )


def _image_workdir(s: Settings, cwd: str | None) -> str:
    """A user's own image: its WORKDIR by default, any directory of the image by absolute path (the image is
    the program's; the mounts are the boundary), a relative one under scratch as elsewhere."""
    assert s.image is not None
    if cwd is None:
        return s.image.default_dir(s.scratch)
    inside = any(cwd == root or cwd.startswith(root + "/") for root in (SCRATCH, WORKSPACE))
    if cwd.startswith("/") and not inside:
        if "\0" in cwd or not os.path.isdir(cwd):
            raise ToolError(f"cwd {cwd!r} is not a directory of the image", {"cwd": cwd})
        return os.path.normpath(cwd)
    return _workdir(s, cwd)


def workdir(s: Settings, cwd: str | None) -> str:
    """The directory a program starts in for ``cwd`` (exec's rule): scratch by default, the image's WORKDIR."""
    return _image_workdir(s, cwd) if s.image is not None else _workdir(s, cwd or SCRATCH)


def program(
    s: Settings, argv: list[str] | None, command: str | None, cwd: str | None, env: dict[str, str] | None
) -> tuple[list[str], str]:
    """The argv to start and the directory to start it in, checked (exec's rules; background processes' too)."""
    where = workdir(s, cwd)
    if command is not None:
        if s.image is not None:
            shell_present(s)
        return _program(s, ["/bin/sh"], command, ".sh"), where
    assert argv is not None
    path = (env or {}).get("PATH", _child_env(s)["PATH"])
    _check_program(argv[0], where, path)
    return list(argv), where


def run_exec(s: Settings, p: ExecParams) -> dict[str, Any]:
    argv, workdir = program(s, p.argv, p.command, p.cwd, p.env)
    extra: dict[str, str] | None = None
    if p.env and s.image is not None:
        # the program's environment goes to it alone (nsinit starts with the worker's, worker.tools.proc): the
        # image may have no /usr/bin/env (busybox, distroless)
        extra = dict(p.env)
    elif p.env:
        argv = [ENV_PROGRAM, "--", *(f"{k}={v}" for k, v in p.env.items()), *argv]
    stdin: str | bytes | None = p.stdin
    if p.stdin is not None and p.stdin_encoding == "base64":
        stdin = _stdin_bytes(p.stdin)
    try:
        return run_child(argv, s, p.timeout_s, stdin, cwd=workdir, extra_env=extra)
    except OSError as exc:  # the program went away, or all of argv and env are over the kernel's limit
        if exc.errno == errno.E2BIG:
            raise BadParams("argv and env together are too long for the kernel") from None
        raise ToolError(f"cannot start {argv[0]!r}: {exc.strerror}", {"program": argv[0]}) from None


TOOLS = [
    Tool(
        "exec",
        "Run a program: argv (no shell) or command (/bin/sh -c), in cwd, with extra env and stdin (text or "
        "base64); returns stdout, stderr (plus stdout_b64/stderr_b64, the exact bytes, when they are not UTF-8), "
        f"exit_code, signal, timed_out, truncated, wall_ms, cpu_ms, peak_rss_bytes. {_WHERE_EXEC}",
        ExecParams,
        run_exec,
        in_process_timeout=False,
        runs_code=True,
    ),
]
