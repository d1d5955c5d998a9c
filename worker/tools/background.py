"""Background processes and terminals: the ``proc_*`` tools (the registry is ``worker.children.background``).

``proc_start`` starts a program (exec's argv or command, cwd and env rules) in the background, on pipes or on a
terminal (``pty``), and answers at once with its id. It lives across calls until ``proc_kill``, or the run's
end. ``proc_read`` returns its output since a cursor (stdout and stderr together, as they came; a terminal's
bytes), waiting up to ``timeout_s`` for more; ``proc_wait`` waits until it exits, its output matches a regular
expression, or it listens on a TCP port; ``proc_write`` types into its stdin (a terminal's keystrokes, Ctrl-C
as ``\\u0003``) and may close it; ``proc_signal``, ``proc_kill``, ``proc_resize`` and ``proc_list`` do what they
say. Calls that wait run on threads of their own, beside every other call.
"""

from __future__ import annotations

import base64
import binascii
import errno
import fcntl
import os
import re
import signal
import struct
import subprocess
import sys
import termios
import time
from typing import Annotated, Any, Literal

from annotated_types import Ge, Gt, Le, MaxLen, MinLen

from toolcage.worker import calls
from toolcage.worker.children import background, memguard, namespaces
from toolcage.worker.errors import BadParams, ToolError
from toolcage.worker.settings import Settings
from toolcage.worker.tools import Tool
from toolcage.worker.tools._params import doc, params
from toolcage.worker.tools.exec import check_program_params, program
from toolcage.worker.tools.paths import MAX_PATH
from toolcage.worker.tools.proc import _SPAWN_LOCK, _child_env, _image_env, stream_fields, worker_child_env

TTYINIT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "children", "ttyinit.py")
WAIT_MAX_S = 3600.0
_SIGNALS = ("SIGINT", "SIGTERM", "SIGKILL", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2", "SIGSTOP", "SIGCONT", "SIGWINCH")
_ID = Annotated[int, Ge(1)]


@params
class StartParams:
    argv: Annotated[list[str], MinLen(1)] | None = doc("the program and its arguments (no shell)", None)
    command: str | None = doc("a shell command, run as `/bin/sh -c command` (give argv or command, not both)", None)
    cwd: Annotated[str, MaxLen(MAX_PATH)] | None = doc("working directory, as exec's; default /scratch", None)
    env: dict[str, str] | None = doc("extra environment variables (names TOOLCAGE_* are refused)", None)
    pty: bool = doc("on a terminal (a pseudo-terminal of rows x cols): keystrokes in, the screen's bytes out", False)
    rows: Annotated[int, Ge(1), Le(1000)] = doc("the terminal's height", 24)
    cols: Annotated[int, Ge(1), Le(1000)] = doc("the terminal's width", 80)
    stdin: bool = doc("keep its stdin open for proc_write (a terminal always has one); else /dev/null", True)
    name: Annotated[str, MaxLen(200)] | None = doc("a label of your own, shown by proc_list", None)

    def __post_init__(self) -> None:
        check_program_params(self.argv, self.command, self.env)


@params
class IdParams:
    id: _ID = doc("the process's id (proc_start's answer)")


@params
class ListParams:
    running_only: bool = doc("only the processes still running", False)


@params
class ReadParams:
    id: _ID = doc("the process's id")
    since: Annotated[int, Ge(0)] = doc("the cursor to read from: 0, or a previous answer's cursor", 0)
    max_bytes: Annotated[int, Ge(1), Le(background.READ_MAX)] = doc("at most this much output", 65536)
    timeout_s: Annotated[float, Ge(0), Le(WAIT_MAX_S)] = doc(
        "wait up to this long for output past `since` (or the end); 0: answer at once", 0
    )


@params
class WaitParams:
    id: _ID = doc("the process's id")
    until: Literal["exit", "output", "port"] = doc(
        "exit: it ended; output: its output (from `since`) matches `pattern`; port: it listens on TCP `port`", "exit"
    )
    pattern: Annotated[str, MaxLen(4096)] | None = doc("a Python regular expression (until=output)", None)
    port: Annotated[int, Ge(1), Le(65535)] | None = doc("a TCP port in the sandbox (until=port)", None)
    since: Annotated[int, Ge(0)] = doc("where the output to match starts (a cursor)", 0)
    timeout_s: Annotated[float, Gt(0), Le(WAIT_MAX_S)] | None = doc(
        "how long to wait; default the policy's call timeout", None
    )

    def __post_init__(self) -> None:
        if self.until == "output":
            if self.pattern is None:
                raise ValueError("until=output needs a pattern")
            try:
                re.compile(self.pattern)
            except re.error as exc:
                raise ValueError(f"pattern is not a regular expression: {exc}") from None
        if self.until == "port" and self.port is None:
            raise ValueError("until=port needs a port")


@params
class WriteParams:
    id: _ID = doc("the process's id")
    data: str = doc("what to write: text (a terminal's keystrokes: Ctrl-C is \\u0003), or base64", "")
    encoding: Literal["utf-8", "base64"] = "utf-8"
    eof: bool = doc("then close its stdin (a terminal: type its EOF character, Ctrl-D)", False)


@params
class SignalParams:
    id: _ID = doc("the process's id")
    signal: Literal[_SIGNALS] = doc("the signal's name", "SIGTERM")  # type: ignore[valid-type]


@params
class ResizeParams:
    id: _ID = doc("the process's id")
    rows: Annotated[int, Ge(1), Le(1000)] = doc("the terminal's height")
    cols: Annotated[int, Ge(1), Le(1000)] = doc("the terminal's width")


def _proc(proc_id: int) -> background.Proc:
    try:
        return background.get(proc_id)
    except background.Refused as exc:
        raise ToolError(str(exc), {"id": proc_id}) from None


def start(s: Settings, p: StartParams) -> dict[str, Any]:
    argv, workdir = program(s, p.argv, p.command, p.cwd, p.env)
    foreign = s.image is not None
    program_env = {**(_image_env(s) if foreign else _child_env(s)), **(p.env or {})}
    info = {
        "command": p.command,
        "argv": p.argv,
        "cwd": workdir,
        "pty": p.pty,
        "name": p.name,
        **({"rows": p.rows, "cols": p.cols} if p.pty else {}),
    }
    proc, _ = launch(s, argv, workdir, program_env, info, pty=p.pty, rows=p.rows, cols=p.cols, stdin=p.stdin)
    return {"id": proc.id, "pid": proc.pid, "pty": p.pty, "started_at": round(proc.started_at, 3)}


def launch(
    s: Settings,
    argv: list[str],
    workdir: str | None,
    program_env: dict[str, str],
    info: dict[str, Any],
    *,
    pty: bool = False,
    rows: int = 24,
    cols: int = 80,
    stdin: bool = True,
    channel: bool = False,
) -> tuple[background.Proc, tuple[int, int] | None]:
    """Start ``argv`` as a background process (kept across calls, its output read into the registry).
    ``channel``: its stdin and stdout are a message channel of the caller's (returned as the write end to
    its stdin and the read end of its stdout, the caller's to close); only its stderr is the registry's
    output (a Python context, worker.tools.interpreter)."""
    try:
        background.room()
    except background.Refused as exc:
        raise ToolError(str(exc), {"max": background.MAX_LIVE}) from None
    if memguard.enabled():
        # under gVisor each background process costs its launcher and keeper too (~20 MiB); past 80% of the
        # policy's memory a new one would leave nothing for the calls (about 66 sleeps ended a 512 MiB run)
        used, budget = memguard.usage() or 0, s.policy.limits.memory
        if used > budget * 0.8:
            raise ToolError(
                f"the sandbox holds {used >> 20} MiB of its {budget >> 20} MiB: no room for another background "
                "process (kill one, or raise limits.memory)",
                {"used_bytes": used, "limit_bytes": budget},
            )
    foreign = s.image is not None
    launch_env = worker_child_env(s) if foreign else _child_env(s)
    gvisor = namespaces.enabled()
    master = slave = -1
    report_r = report_w = -1
    pass_fds: tuple[int, ...] = ()
    chan: tuple[int, int] | None = None
    if pty:
        master, slave = os.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
    if gvisor:
        report_r, report_w = os.pipe()
        pass_fds = (report_w,)
        full = namespaces.wrap(argv, env=program_env, bg=report_w, tty=pty)
        env = launch_env
    elif pty:
        full = [sys.executable, "-I", "-S", TTYINIT, "--env", _json(program_env), "--", *argv]
        env = launch_env
    else:
        full, env = argv, program_env
    try:
        with _SPAWN_LOCK:  # registered before any reaper could take its status
            popen = subprocess.Popen(
                full,
                stdin=slave if pty else (subprocess.PIPE if stdin or channel else subprocess.DEVNULL),
                stdout=slave if pty else subprocess.PIPE,
                stderr=slave if pty else (subprocess.PIPE if channel else subprocess.STDOUT),
                cwd=workdir,
                env=env,
                start_new_session=True,  # its own session: what it starts is told apart from a call's leftovers
                close_fds=True,
                pass_fds=pass_fds,
            )
            if pty:
                out_fd, in_fd = master, master
            elif channel:
                assert popen.stdin is not None and popen.stdout is not None and popen.stderr is not None
                chan = (os.dup(popen.stdin.fileno()), os.dup(popen.stdout.fileno()))
                out_fd, in_fd = os.dup(popen.stderr.fileno()), None
                for f in (popen.stdin, popen.stdout, popen.stderr):
                    f.close()
                popen.stdin = popen.stdout = popen.stderr = None
            else:
                assert popen.stdout is not None
                out_fd = os.dup(popen.stdout.fileno())
                popen.stdout.close()
                in_fd = None
                if popen.stdin is not None:
                    in_fd = os.dup(popen.stdin.fileno())
                    popen.stdin.close()
            proc = background.register(popen, out_fd, in_fd, info)
    except OSError as exc:
        for fd in (master, report_r):
            if fd >= 0:
                os.close(fd)
        if exc.errno == errno.E2BIG:
            raise BadParams("argv and env together are too long for the kernel") from None
        if exc.errno == errno.EAGAIN:  # the cgroup's pids limit, reached before MAX_LIVE (default policy: 64)
            pids = s.policy.limits.pids
            raise ToolError(
                f"the sandbox runs as many processes as its policy allows (limits.pids: {pids}): kill a "
                "background process, or raise limits.pids",
                {"pids": pids},
            ) from None
        raise ToolError(f"cannot start {argv[0]!r}: {exc.strerror}", {"program": argv[0]}) from None
    finally:
        for fd in (slave, report_w):
            if fd >= 0:
                os.close(fd)
    if gvisor:
        keeper = _read_keeper(report_r)
        if keeper:
            background.set_namespace(proc, keeper)
    if memguard.enabled():
        memguard.watch(proc.pid, s.policy.limits.memory)
    return proc, chan


def _json(env: dict[str, str]) -> str:
    import json

    return json.dumps(env)


def _read_keeper(fd: int) -> int:
    """The keeper's pid nsinit tells (0: it said nothing: it failed, and its process ends as it says)."""
    data = b""
    deadline = time.monotonic() + 10.0
    try:
        while time.monotonic() < deadline:
            chunk = os.read(fd, 16)
            if not chunk:
                break
            data += chunk
    finally:
        os.close(fd)
    return int(data) if data.isdigit() else 0


def read(s: Settings, p: ReadParams) -> dict[str, Any]:
    proc = _proc(p.id)
    if p.timeout_s > 0:
        background.wait(lambda: proc.end > p.since or (proc.eof and not proc.running), p.timeout_s, calls.cancelled)
    with background.locked():
        got = background.read(proc, p.since, p.max_bytes)
        fields = proc.exit_fields()
        eof = proc.eof
    data = got.pop("data")
    return {**stream_fields("output", data, False), **got, **fields, "eof": eof and got["cursor"] >= proc.end}


def wait(s: Settings, p: WaitParams) -> dict[str, Any]:
    proc = _proc(p.id)
    timeout = p.timeout_s or s.policy.timeouts.call_s
    found: dict[str, Any] = {}
    if p.until == "exit":
        met = background.wait(lambda: not proc.running, timeout, calls.cancelled)
    elif p.until == "output":
        assert p.pattern is not None
        rx = re.compile(p.pattern)

        def matched() -> bool:
            got = background.read(proc, p.since, background.KEEP_BYTES)
            m = rx.search(got["data"].decode("utf-8", "replace"))
            if m is None:
                return not proc.running and proc.eof  # it ended without: stop waiting
            text = got["data"].decode("utf-8", "replace")
            found.update(match=m.group(0), cursor=p.since + len(text[: m.end()].encode("utf-8")))
            return True

        background.wait(matched, timeout, calls.cancelled)
        met = "match" in found
    else:
        assert p.port is not None
        deadline = time.monotonic() + timeout
        met = False
        while not calls.cancelled() and not background.closing():
            if listening(p.port):
                met = True
                break
            if time.monotonic() >= deadline or (not proc.running and not background.members(proc)):
                break
            time.sleep(0.02)
    with background.locked():
        fields = proc.exit_fields()
        end = proc.end
    return {"met": met, **found, **fields, "output_bytes": end}


def listening(port: int) -> bool:
    """Whether anything in the sandbox listens on TCP ``port`` (its /proc/net tables; nothing connects)."""
    want = f":{port:04X}"
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table, encoding="ascii") as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            cols = row.split()
            if len(cols) > 3 and cols[1].endswith(want) and cols[3] == "0A":  # 0A: LISTEN
                return True
    return False


def write(s: Settings, p: WriteParams) -> dict[str, Any]:
    proc = _proc(p.id)
    if p.encoding == "base64":
        try:
            data = base64.b64decode(p.data, validate=True)
        except (binascii.Error, ValueError):
            raise BadParams("data is not valid base64 (encoding is 'base64')") from None
    else:
        data = p.data.encode("utf-8", "surrogatepass")
    try:
        n = background.write(proc, data, p.eof)
    except background.Refused as exc:
        raise ToolError(str(exc), {"id": p.id}) from None
    return {"written": n, "stdin_open": proc.in_fd is not None}


def send(s: Settings, p: SignalParams) -> dict[str, Any]:
    proc = _proc(p.id)
    try:
        background.send_signal(proc, getattr(signal, p.signal))
    except background.Refused as exc:
        raise ToolError(str(exc), {"id": p.id}) from None
    return {"sent": p.signal}


def kill(s: Settings, p: IdParams) -> dict[str, Any]:
    proc = _proc(p.id)
    background.kill(proc)
    background.wait(lambda: not proc.running, 2.0, lambda: False)
    with background.locked():
        return {"id": proc.id, **proc.exit_fields()}


def resize(s: Settings, p: ResizeParams) -> dict[str, Any]:
    proc = _proc(p.id)
    try:
        background.resize(proc, p.rows, p.cols)
    except background.Refused as exc:
        raise ToolError(str(exc), {"id": p.id}) from None
    except OSError as exc:
        raise ToolError(f"cannot resize the terminal of process {p.id}: {exc.strerror}", {"id": p.id}) from None
    return {"rows": p.rows, "cols": p.cols}


def listing(s: Settings, p: ListParams) -> dict[str, Any]:
    with background.locked():
        procs = [proc for proc in background.all_procs() if proc.running or not p.running_only]
        return {"processes": [proc.describe() for proc in procs]}


_ANSWER = "returns output (text; plus output_b64, the exact bytes, when they are not UTF-8), cursor, dropped"

TOOLS = [
    Tool(
        "proc_start",
        "Start a program in the background (argv, or a /bin/sh command), on pipes or on a terminal (pty); "
        "answers at once with its id. It lives across calls until proc_kill or the run's end. Its stdout and "
        "stderr are kept together (the last 1 MiB); read them with proc_read.",
        StartParams,
        start,
        in_process_timeout=False,
        runs_code=True,
    ),
    Tool(
        "proc_read",
        f"Read a background process's output from a cursor, waiting up to timeout_s for more; {_ANSWER} (bytes "
        "lost before the kept window), state, exit_code, signal, eof.",
        ReadParams,
        read,
        in_process_timeout=False,
        waits=True,
    ),
    Tool(
        "proc_wait",
        "Wait until a background process exits, its output matches a regular expression, or it listens on a "
        "TCP port; returns met (true/false), match and cursor (after the match), state, exit_code, signal.",
        WaitParams,
        wait,
        in_process_timeout=False,
        waits=True,
    ),
    Tool(
        "proc_write",
        "Write to a background process's stdin (a terminal: keystrokes); eof closes it.",
        WriteParams,
        write,
    ),
    Tool("proc_signal", "Send a signal to a background process.", SignalParams, send),
    Tool("proc_kill", "Kill a background process and everything it started.", IdParams, kill, in_process_timeout=False),
    Tool("proc_resize", "Resize a background process's terminal.", ResizeParams, resize),
    Tool(
        "proc_list",
        "List the background processes: id, command, state, exit_code, times, output size.",
        ListParams,
        listing,
    ),
]
