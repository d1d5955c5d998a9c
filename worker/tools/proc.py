"""run_python and run_shell (and, through run_child, exec and run_node): a child process in scratch,
killed as a whole group at its timeout; its output comes back binary-safe (``stream_fields``).

Threats handled here: output floods (kept up to the policy's cap per stream, the rest
drained and dropped), runaway children and their descendants (own process group,
SIGKILL at the deadline and again when the call ends), a memory bomb (reported as
``oom_killed`` from the cgroup's own counter, not guessed from exit 137; under gVisor from the
memory guard that kills it, ``worker.children.memguard``).
"""

from __future__ import annotations

import base64
import codecs
import contextlib
import os
import resource
import selectors
import signal
import subprocess
import sys
import threading
import time
from typing import Annotated, Any

from annotated_types import Gt

from toolcage.policies import contract
from toolcage.worker import calls
from toolcage.worker.children import cgroup, memguard, namespaces, sweep, zygote
from toolcage.worker.errors import BadParams, ToolError
from toolcage.worker.settings import Settings
from toolcage.worker.tools import Tool
from toolcage.worker.tools._params import doc, params

# the proxy settings let ordinary HTTP clients in tool code use the egress proxy (its only way out)
_CHILD_ENV_KEEP = (
    "LANG",
    "LC_ALL",
    "TZ",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "http_proxy",
    "https_proxy",
    "NO_PROXY",
    "no_proxy",
    contract.ENV_PROXY,
)
_GRACE_AFTER_EXIT_S = 0.2
_REAP_EVERY_S = 0.25
_LIVE_GROUPS: set[int] = set()  # the process group (= pid) of every call's child running now
_SPAWN_LOCK = threading.Lock()


_SHUTTING_DOWN = False


def kill_all_children() -> None:
    """Kill every process still running (as PID 1: every process of the sandbox), and start no
    new one (the run is over)."""
    global _SHUTTING_DOWN
    _SHUTTING_DOWN = True
    background = sys.modules.get("toolcage.worker.children.background")
    if background is not None:
        background.shutdown()  # calls waiting on a background process answer now
    for pgid in list(_LIVE_GROUPS):
        _kill_group(pgid)
    if sweep.active():
        sweep.kill_others()


@params
class RunPythonParams:
    code: str = doc("Python source, run as `python3 -c code` in /scratch")
    timeout_s: Annotated[float, Gt(0)] | None = doc("seconds; default the policy's call timeout", None)
    stdin: str | None = doc("text fed to the child's stdin", None)


@params
class RunShellParams:
    command: str = doc("shell command, run as `/bin/sh -c command` in /scratch")
    timeout_s: Annotated[float, Gt(0)] | None = doc("seconds; default the policy's call timeout", None)
    stdin: str | None = doc("text fed to the child's stdin", None)


DEPS_DIR = contract.DEPS_DIR  # packages `toolcage image build --requirements` added to the image


def python_path(worker_lib: bool = False) -> str | None:
    """A child's PYTHONPATH: the image's extra packages, after where the worker finds toolcage
    when ``worker_lib`` (a connector's handler imports toolcage.sdk; tool code does not need it).
    In a user's own image, never its ``DEPS_DIR``: that directory is the image's, not toolcage's."""
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p] if worker_lib else []
    if os.path.isdir(DEPS_DIR) and not os.environ.get(contract.ENV_IMAGE_CONFIG):
        paths.append(DEPS_DIR)
    return os.pathsep.join(paths) or None


# a user's own image: the variables of the worker's environment its programs get too (the proxy's)
_IMAGE_ENV_KEEP = tuple(k for k in _CHILD_ENV_KEEP if k not in ("LANG", "LC_ALL", "TZ"))


def _image_env(settings: Settings) -> dict[str, str]:
    """What the image's own programs run with (worker.image.Image.program_env), the roots' names too."""
    assert settings.image is not None
    env = settings.image.program_env(os.environ, _IMAGE_ENV_KEEP, settings.scratch)
    env.update(settings.child_env())
    return env


def worker_child_env(settings: Settings) -> dict[str, str]:
    """The worker's own children in a user's own image (a connector's handler, the namespace launcher):
    the worker's environment, never the image's (worker.image.worker_env)."""
    from toolcage.worker.image import worker_env

    env = worker_env(os.environ, _IMAGE_ENV_KEEP, settings.scratch)
    env.update(settings.child_env())
    return env


def _child_env(settings: Settings) -> dict[str, str]:
    if settings.image is not None:
        return _image_env(settings)
    env = {k: v for k, v in os.environ.items() if k in _CHILD_ENV_KEEP}
    path = python_path()
    if path:
        env["PYTHONPATH"] = path
    env.update(
        PATH="/usr/local/bin:/usr/bin:/bin",
        HOME=settings.scratch,
        TMPDIR=settings.scratch,
        PYTHONDONTWRITEBYTECODE="1",
        LANG=env.get("LANG", "C.UTF-8"),
    )
    env.update(settings.child_env())  # TOOLCAGE_WORKSPACE/_SCRATCH with --sandbox none: where the roots are
    return env


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def run_child(
    argv: list[str],
    settings: Settings,
    timeout_s: float | None,
    stdin: str | bytes | None,
    *,
    cwd: str | None = None,
    link: Any = None,
    extra_env: dict[str, str] | None = None,
    pass_fds: tuple[int, ...] = (),
    stream_output: bool = True,
    fast_source: str | None = None,
    own: bool = False,
) -> dict[str, Any]:
    """Run argv; return stdout/stderr (capped), exit code, and how it ended. ``link`` (a connector
    child's socket, worker.connectors.Link) is served while the child runs. The call in progress
    (``worker.calls``) can be cancelled meanwhile, and gets the output as progress when it asked for
    it and ``stream_output`` is on (a connector's output is its log, not its progress).
    ``fast_source``: argv is ``python3 -c fast_source``, which a fork of the zygote may serve
    (``worker.children.zygote``); everything after the start is the same for both. ``cwd``: where
    it starts (default scratch; the caller has checked it). The streams come back as
    :func:`stream_fields` gives them. ``own``: the worker's own program (a connector's handler), which in
    a user's own image runs with the worker's environment, not the image's."""
    cap = settings.policy.limits.output_cap
    timeout = min(timeout_s or settings.policy.timeouts.call_s, settings.policy.timeouts.run_s)
    if _SHUTTING_DOWN:
        raise ToolError("the run is over (its runner went away or its deadline passed)")
    oom_before = cgroup.oom_kills()
    guarded = memguard.enabled()
    foreign = settings.image is not None
    base = worker_child_env(settings) if own and foreign else _child_env(settings)
    env = {**base, **(extra_env or {})}
    workdir = cwd or settings.scratch
    launch_env, tool_env = env, None
    if foreign and namespaces.enabled():
        # the namespace launcher is the runtime's interpreter: it starts with the worker's environment (an
        # image's LD_PRELOAD would run in it before its seccomp filter), and hands the program its own
        launch_env, tool_env = worker_child_env(settings), env
    started = time.monotonic()
    proc: Any = None
    # spawned and registered under the lock the orphan reaper takes: a child that exits at once is
    # never reaped as an orphan by a concurrent call before it is known to be a call's own
    with _SPAWN_LOCK:
        # (never in a user's own image: the zygote is the runtime's interpreter, the image's programs are its own)
        if fast_source is not None and not pass_fds and not foreign and zygote.enabled():
            proc = zygote.spawn(fast_source, stdin is not None, env, workdir)
        elif not pass_fds and not settings.policy.unsafe_background_processes and zygote.enabled():
            # under gVisor only: an exec from a fork of the zygote (never where processes outlive their
            # call: that takes nsinit's keeper, and an earlier call's process could tamper with the zygote).
            # A user's own image: the zygote runs with the worker's environment, the program gets the image's
            proc = zygote.spawn_argv(argv, stdin is not None, launch_env, workdir, tool_env)
        try:
            proc = proc or subprocess.Popen(
                # under gVisor: in namespaces of its own (worker.children.namespaces)
                namespaces.wrap(argv, keep=settings.policy.unsafe_background_processes, env=tool_env),
                stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                cwd=workdir,
                env=launch_env,
                start_new_session=True,  # own process group: killpg reaches every descendant
                close_fds=True,
                pass_fds=pass_fds,
            )
        finally:
            for fd in pass_fds:  # handed over: the child's now (our copy would hide the child closing its end)
                os.close(fd)
        pgid = proc.pid
        _LIVE_GROUPS.add(pgid)
        if guarded:
            memguard.watch(pgid, settings.policy.limits.memory)  # under gVisor: past the limit, this call ends
    call = calls.current()
    if call is not None:
        call.pgid = pgid  # a cancel kills the group at once
        if call.cancelled:
            _kill_group(pgid)
    out = {"stdout": bytearray(), "stderr": bytearray()}
    cut = {"stdout": False, "stderr": False}  # each stream's own: kept up to the cap, the rest dropped
    timed_out = False
    sel = selectors.DefaultSelector()
    assert proc.stdout is not None and proc.stderr is not None
    sel.register(proc.stdout, selectors.EVENT_READ, "stdout")
    sel.register(proc.stderr, selectors.EVENT_READ, "stderr")
    if link is not None:
        sel.register(link.sock, selectors.EVENT_READ, "link")
    control = calls.control_fd()
    if control is not None:
        sel.register(control, selectors.EVENT_READ, "control")
    pending = memoryview(stdin.encode() if isinstance(stdin, str) else stdin) if stdin is not None else None
    if proc.stdin is not None:
        os.set_blocking(proc.stdin.fileno(), False)
        sel.register(proc.stdin, selectors.EVENT_WRITE, "stdin")
    deadline = started + timeout
    as_init = sweep.active()
    next_reap = started + _REAP_EVERY_S
    exited_at: float | None = None
    reaped: tuple[int, resource.struct_rusage] | None = None
    try:
        # until the child's own streams are closed (the channel is watched only meanwhile)
        while any(key.data != "control" for key in sel.get_map().values()):
            now = time.monotonic()
            if reaped is None:
                # wait4 ourselves (not Popen.poll) so the child's rusage is not thrown away
                pid, status, rusage = os.wait4(proc.pid, os.WNOHANG)
                if pid:
                    reaped = (status, rusage)
                    exited_at = now
            if as_init and now >= next_reap:
                # orphans of this call are re-parented to us (PID 1): collect their zombies as they
                # appear, so they do not pile up against the pids limit during a long call
                with _SPAWN_LOCK:  # never another call's child (each is its group's leader)
                    sweep.reap(exclude=frozenset(_LIVE_GROUPS | {proc.pid}))
                next_reap = now + _REAP_EVERY_S
            if now >= deadline:
                timed_out = reaped is None
                break
            if exited_at is not None and now - exited_at > _GRACE_AFTER_EXIT_S:
                break  # a background descendant still holds the pipes: stop waiting for it
            wait = min(deadline - now, 0.05 if exited_at is None else _GRACE_AFTER_EXIT_S)
            for key, _ in sel.select(timeout=wait):
                if key.data == "stdin":
                    try:
                        n = os.write(key.fd, pending[:65536]) if pending else 0
                    except (BrokenPipeError, BlockingIOError):
                        n = -1
                    if n < 0 or pending is None or n >= len(pending):
                        sel.unregister(key.fileobj)
                        key.fileobj.close()  # type: ignore[union-attr]
                        pending = None
                    else:
                        pending = pending[n:]
                    continue
                if key.data == "control":
                    calls.read_control()  # queues requests, acts on a cancel (kills the group now)
                    if calls.control_fd() is None:
                        sel.unregister(key.fileobj)
                    continue
                if key.data == "link":
                    if not link.on_readable():
                        sel.unregister(key.fileobj)
                        if link.violation:
                            _kill_group(pgid)  # it broke the rules of its channel: the call ends now
                    continue
                chunk = os.read(key.fd, 65536)
                if not chunk:
                    sel.unregister(key.fileobj)
                    continue
                buf = out[key.data]
                room = cap - len(buf)
                if call is not None and stream_output:
                    call.output(key.data, chunk, room)  # streamed as progress when the caller asked
                if room > 0:
                    buf += chunk[:room]
                if len(chunk) > room:
                    cut[key.data] = True  # keep draining so the child never blocks on a full pipe
            if call is not None and stream_output:
                call.flush_due()  # the loop wakes at least every 50 ms: what waits goes out within ~0.1 s
        if reaped is None and not timed_out:
            # its streams closed before it ended (coreutils close stdout and stderr at exit): let it
            # finish exiting, briefly, rather than kill it on its way out (its exit status became -9)
            until = min(time.monotonic() + _GRACE_AFTER_EXIT_S, deadline)
            while reaped is None and time.monotonic() < until:
                pid, status, rusage = os.wait4(proc.pid, os.WNOHANG)
                if pid:
                    reaped = (status, rusage)
                else:
                    time.sleep(0.001)
    except BaseException:
        # whatever went wrong in the worker, the call's processes must not outlive it
        _kill_group(pgid)
        _LIVE_GROUPS.discard(pgid)
        memguard.release(pgid)
        if call is not None:
            call.pgid = None
        for stream in (proc.stdout, proc.stderr, proc.stdin):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()
        sel.close()
        raise
    if settings.policy.unsafe_background_processes and not timed_out:
        # what it left in the background (`cmd &`, nohup) lives on, as the policy says; its main process
        # only, if its streams closed before it ended
        if reaped is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(proc.pid, signal.SIGKILL)
    else:
        _kill_group(pgid)
    if call is not None:
        call.pgid = None
        call.flush(final=True)  # progress never comes after the answer
    for key in list(sel.get_map().values()):
        sel.unregister(key.fileobj)
        if key.data not in ("link", "control"):  # the link's socket is its owner's to close
            key.fileobj.close()  # type: ignore[union-attr]
    sel.close()
    if reaped is None:
        _, status, rusage = os.wait4(proc.pid, 0)
    else:
        status, rusage = reaped
    _LIVE_GROUPS.discard(pgid)  # only now: until reaped, no other call's reaper may take its status
    guard_killed = memguard.release(pgid)
    proc.returncode = os.waitstatus_to_exitcode(status)
    for stream in (proc.stdout, proc.stderr, proc.stdin):
        if stream is not None and not stream.closed:
            stream.close()
    exit_code = proc.returncode
    killed_by = -exit_code if exit_code < 0 else None
    # the kernel's OOM killer (runc), or under gVisor the memory guard, which stands in for it
    oom_killed = killed_by == signal.SIGKILL and not timed_out and (cgroup.oom_kills() > oom_before or guard_killed)
    return {
        **stream_fields("stdout", bytes(out["stdout"]), cut["stdout"]),
        **stream_fields("stderr", bytes(out["stderr"]), cut["stderr"]),
        "exit_code": exit_code,  # negative: killed by that signal (Python's convention)
        "signal": signal.Signals(killed_by).name if killed_by else None,  # SIGKILL at a timeout, too
        "timed_out": timed_out,
        "truncated": cut["stdout"] or cut["stderr"],
        "oom_killed": oom_killed,
        "wall_ms": round((time.monotonic() - started) * 1000, 3),
        "cpu_ms": round((rusage.ru_utime + rusage.ru_stime) * 1000, 3),
        "peak_rss_bytes": rusage.ru_maxrss * 1024,
    }


def stream_fields(name: str, data: bytes, cut: bool) -> dict[str, str]:
    """One output stream in a result, by one rule for every tool that runs a child: ``name`` is
    always text (a byte that is not UTF-8 shows as U+FFFD, as before); when the bytes are not
    UTF-8, ``name_b64`` is added with them exactly, in base64 (binary output round-trips). A
    stream cut at the output cap in the middle of a character is still text: it ends at the
    last whole character (``truncated`` says it was cut), and ``name_b64``, if any, keeps every byte kept."""
    try:
        if cut:  # an incomplete character at the very end is left in the decoder, not an error
            return {name: codecs.getincrementaldecoder("utf-8")().decode(data, final=False)}
        return {name: data.decode("utf-8")}
    except UnicodeDecodeError:
        return {name: data.decode("utf-8", errors="replace"), f"{name}_b64": base64.b64encode(data).decode("ascii")}


# Linux caps one argv string at 128 KiB (MAX_ARG_STRLEN): longer code goes through a file
_MAX_INLINE = 100_000


def _program(settings: Settings, interpreter: list[str], source: str, suffix: str) -> list[str]:
    if "\x00" in source:
        raise BadParams("the code contains a NUL byte")
    if len(source.encode()) <= _MAX_INLINE:
        return [*interpreter, "-c", source]
    import tempfile  # here: its shutil, bz2 and lzma cost a cold sandbox's first call ~10 ms, for long code only

    try:
        fd, path = tempfile.mkstemp(prefix=".toolcage-code-", suffix=suffix, dir=settings.scratch)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(source)
    except OSError as exc:
        raise ToolError(f"cannot stage the code in scratch: {exc.strerror}") from None
    return [*interpreter, path]


def image_program(settings: Settings, names: tuple[str, ...], what: str) -> str:
    """A user's own image: its interpreter, found on its PATH, or a ToolError naming what is missing."""
    assert settings.image is not None
    found = settings.image.which(*names)
    if found is None:
        raise ToolError(
            f"the image {settings.image.ref or ''} has no {what} (looked for {', '.join(names)} on its PATH="
            f"{settings.image.path}); exec runs its own programs",
            {"missing": names[0], "path": settings.image.path},
        )
    return found


def run_python(settings: Settings, p: RunPythonParams) -> dict[str, Any]:
    if settings.image is not None:  # a user's own image: its Python, with its packages
        python = image_program(settings, ("python3", "python"), "Python")
        argv = _program(settings, [python], p.code, ".py")
        return run_child(argv, settings, p.timeout_s, p.stdin, cwd=settings.image.default_dir(settings.scratch))
    argv = _program(settings, [sys.executable], p.code, ".py")
    # the zygote's fork serves `python3 -c code` only, and never where processes outlive their call
    fast = argv[1:2] == ["-c"] and not settings.policy.unsafe_background_processes
    return run_child(argv, settings, p.timeout_s, p.stdin, fast_source=p.code if fast else None)


def run_shell(settings: Settings, p: RunShellParams) -> dict[str, Any]:
    cwd = None
    if settings.image is not None:
        shell_present(settings)
        cwd = settings.image.default_dir(settings.scratch)
    return run_child(_program(settings, ["/bin/sh"], p.command, ".sh"), settings, p.timeout_s, p.stdin, cwd=cwd)


def shell_present(settings: Settings) -> None:
    """A user's own image may have no shell at all (distroless): say so, not "cannot start"."""
    if not os.access("/bin/sh", os.X_OK):
        ref = settings.image.ref if settings.image is not None else ""
        raise ToolError(
            f"the image {ref} has no /bin/sh (a distroless image?): run its programs with exec argv=[...]",
            {"missing": "/bin/sh"},
        )


_RETURNS = (
    "returns stdout, stderr (text; plus stdout_b64/stderr_b64, the exact bytes in base64, when they are not UTF-8), "
    "exit_code, timed_out, truncated"
)
# the same rule as the file tools' (worker.tools.files.PATH_RULE), from the child's side
_WHERE = (
    "The working directory is /scratch (writable; relative paths resolve there, as in the file tools); "
    "the workspace, if any, is /workspace (read-only). Where they are elsewhere (--sandbox none), "
    "$TOOLCAGE_SCRATCH and $TOOLCAGE_WORKSPACE name them. In a user's own image the program is the image's "
    "(its python3, its /bin/sh), with the image's environment, in its WORKDIR."
)

TOOLS = [
    Tool(
        "run_python",
        f"Run Python code in a child process; {_RETURNS}. {_WHERE}",
        RunPythonParams,
        run_python,
        in_process_timeout=False,
        runs_code=True,
    ),
    Tool(
        "run_shell",
        f"Run a /bin/sh command; {_RETURNS}. {_WHERE}",
        RunShellParams,
        run_shell,
        in_process_timeout=False,
        runs_code=True,
    ),
]
