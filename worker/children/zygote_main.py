"""The zygote: a ready Python interpreter that forks one fresh child per ``run_python`` call.

This file is not imported: its text is run as ``python3 -c <text>`` by ``worker.children.zygote``, with
the very environment, working directory and limits a ``run_python`` child gets, so each fork
starts where ``python3 -c code`` would (``sys.argv == ['-c']``, ``sys.path[0] == ''``, site run,
a clean ``__main__``) minus the ~20 ms of interpreter start-up.

Threat: a call reaching the next one through the zygote. The zygote never runs call code and
never holds call data: the code reaches the child through a pipe only the child reads, and the
zygote's socket carries file descriptors and pids only. It is non-dumpable (no ptrace, no
/proc/<pid>/mem or fd of it for the sandbox user) and ignores every catchable signal (so
nothing queues there); what a child can still do to it (kill or stop it, lower its limits or
priority with prlimit/setpriority/sched_setaffinity) the worker checks before every fork and
then discards it. Each child is a grandchild (the middle process exits at once), re-parented
to the worker, which waits for it, kills its process group and sweeps as for any child.
"""

import sys

# Threat: tool code planting a module in /scratch (typing.py, socket.py) for the zygote to import. The
# zygote starts while the worker is idle, outside any call: a planted module would run there, beside a
# connector's call (which runs "alone") and past every sweep. Its own imports never look in its working
# directory; a fork gets '' back first on its path, as `python3 -c` has it.
_PATH0 = sys.path.pop(0) if sys.path and sys.path[0] == "" else None

from typing import Any  # noqa: E402

import __main__  # noqa: E402

# what a fresh `python3 -c` __main__ holds (its dunders), before this file adds to it
_PRISTINE = {k: v for k, v in __main__.__dict__.items() if k.startswith("__") and k != "__main__"}
_PRISTINE["__doc__"] = None
_BASE_MODULES = set(sys.modules)

import atexit  # noqa: E402
import ctypes  # noqa: E402
import gc  # noqa: E402
import os  # noqa: E402
import signal  # noqa: E402
import socket  # noqa: E402

_libc = ctypes.CDLL(None, use_errno=True)
_libc.prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE 0: no other process of the sandbox user can reach in
if _libc.prctl(3, 0, 0, 0, 0) != 0:  # PR_GET_DUMPABLE: trust the kernel's answer
    os._exit(71)

_SIGNALS = {s: signal.getsignal(s) for s in signal.valid_signals()}
for _s in _SIGNALS:
    if _s not in (signal.SIGKILL, signal.SIGSTOP, signal.SIGCHLD):
        try:
            signal.signal(_s, signal.SIG_IGN)  # ignored, not blocked: nothing is queued for a later fork
        except (OSError, ValueError):
            pass

# the worker's socket (SOCK_SEQPACKET, one message per fork); the worker rewrites the number to its fd here
_CTL = 3  # fd
# the working directory a call's process starts in, as a path: entered again in each fork, so that it is whatever
# the path names at the call, as subprocess's cwd= is (the zygote's own was fixed when it started: a directory
# renamed since, and another put at its path, kept a fork in the old one). The worker rewrites it.
_CWD = None  # cwd
_ctl = socket.socket(fileno=_CTL)
_MAXFD = os.sysconf("SC_OPEN_MAX")
# Under gVisor the worker puts worker/children/nsinit.py's text here (worker.children.namespaces): each fork then enters
# user, PID and mount namespaces of its own before the call's code runs, as a subprocess child would.
_NAMESPACES = None  # nsinit
_unshare: Any = None
_become_init: Any = None
_init_done = False  # a process made ahead did it while it waited (_waiting)
_exec_tool: Any = None
if _NAMESPACES is not None:
    _nsinit: dict[str, Any] = {"__name__": "toolcage_nsinit"}
    exec(compile(_NAMESPACES, "nsinit.py", "exec"), _nsinit)  # noqa: S102 - the worker's own file
    _unshare, _become_init, _exec_tool = _nsinit["unshare"], _nsinit["become_init"], _nsinit["exec_tool"]
if _PATH0 is not None:
    sys.path.insert(0, _PATH0)  # (nothing is imported from here on in the zygote itself)
del _PATH0


def _child(fds: list[int], argv_mode: bool = False, with_env: bool = False) -> None:
    """In the forked child: become what ``python3 -c code`` is, then run the code. Never returns.
    ``argv_mode`` (only with namespaces, where a subprocess would pay a launcher's interpreter start):
    the pipe carries an argv (NUL-separated) to exec in the namespaces, as ``subprocess`` would start it."""
    code_r, stdin_fd, out_w, err_w = fds
    try:
        _ctl.detach()  # its fd is closed below; the object must not close that number again later
        if os.getsid(0) != os.getpid():  # (made by _made_group before the worker learnt its pid)
            os.setsid()  # its own session and process group: killpg reaches every descendant
        for s, handler in _SIGNALS.items():  # the dispositions a fresh interpreter has
            if s not in (signal.SIGKILL, signal.SIGSTOP) and handler is not None:
                try:
                    signal.signal(s, handler)
                except (OSError, ValueError):
                    pass
        if _CWD is not None:
            os.chdir(_CWD)
        os.dup2(stdin_fd, 0)
        os.dup2(out_w, 1)
        os.dup2(err_w, 2)
        keep = os.dup(code_r)
        os.closerange(3, keep)  # the zygote's socket and pipes, the fds as received: only 0, 1, 2 stay
        os.closerange(keep + 1, _MAXFD)
        chunks = []
        while True:
            b = os.read(keep, 1 << 20)
            if not b:
                break
            chunks.append(b)
        os.close(keep)
        source = b"".join(chunks).decode("utf-8", "surrogateescape")
        _libc.prctl(4, 1, 0, 0, 0)  # dumpable again, as after an exec (and so it may write its uid_map)
        if argv_mode and with_env:  # a user's own image: the program's environment (JSON), a newline, the argv
            import json

            head, _, rest = source.partition("\n")
            _exec(rest.split("\0"), json.loads(head))
        if argv_mode:
            _exec(source.split("\0"))
        if _become_init is not None and not _init_done:
            _become_init(_libc)  # PID 1 of namespaces of its own (the middle process made them)
        code = compile(source, "<string>", "exec", dont_inherit=True)
    except (SyntaxError, ValueError):  # as `python3 -c` reports it: no traceback of ours
        _finish_with(sys.exc_info(), skip=None)
    except BaseException:
        os._exit(70)
    sys.orig_argv = [sys.orig_argv[0], "-c", source]
    for name in set(sys.modules) - _BASE_MODULES:  # the zygote's own imports (ctypes, socket)
        del sys.modules[name]
    g = __main__.__dict__
    pristine = _PRISTINE
    run = exec
    finish = _finish_with
    end = _end
    exc_info = sys.exc_info
    g.clear()
    g.update(pristine)
    try:
        try:
            run(code, g)
        except SystemExit:
            raise
        except BaseException:
            finish(exc_info(), skip=1)
    except SystemExit as exc:
        end(exc.code)
    end(None)


def _exec(argv: list[str], env: dict[str, str] | None = None) -> None:
    """Exec ``argv`` in namespaces of its own, as nsinit does for a subprocess (with ``env``, a user's own
    image's: the zygote itself runs with the worker's). Never returns."""
    if _become_init is None or not argv or not argv[0]:
        os._exit(70)
    if not _init_done:
        _become_init(_libc)
    _exec_tool(argv, env)


def _end(code: Any, sys: Any = sys, os: Any = os, gc: Any = gc, atexit: Any = atexit) -> None:
    """The end of the call's program, as ``python3 -c`` ends it in everything a program can see
    (its exit status, SystemExit's message, non-daemon threads joined, atexit callbacks, its own
    objects released so that files it left open are flushed and closed, stdio flushed), then
    ``os._exit``: the interpreter's own teardown would walk the zygote's whole heap and copy each
    page it touches, 3 of the 5 ms a ``pass`` took."""
    if code is None:
        status = 0
    elif isinstance(code, int):  # True too, as 1
        status = code if -(2**31) <= code < 2**31 else -1
    else:
        status = 1  # `sys.exit("message")`: the message on stderr, status 1
        try:
            print(code, file=sys.stderr)
        except BaseException:  # noqa: S110 - as the interpreter: it cannot say more
            pass
    try:
        threading = sys.modules.get("threading")
        if threading is not None:
            threading._shutdown()  # what Py_FinalizeEx waits for first
    except BaseException:  # noqa: S110
        pass
    try:
        atexit._run_exitfuncs()  # logging.shutdown, weakref.finalize, tempfile's cleanups, ...
    except BaseException:  # noqa: S110 - each callback's error is printed by atexit itself
        pass
    try:
        sys.modules["__main__"].__dict__.clear()  # the program's globals: files it left open flush and close
        gc.collect()  # (the zygote's own objects are frozen: not walked)
    except BaseException:  # noqa: S110
        pass
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:
            if status == 0:
                status = 120  # what the interpreter exits with when it cannot flush stdout
    os._exit(status & 0xFF)


def _finish_with(info: Any, skip: int | None, sys: Any = sys, os: Any = os, signal: Any = signal) -> None:
    """An uncaught exception: printed as `python3 -c` would (without this file's frame), exit 1.
    (Its modules are bound as defaults: by then ``__main__``'s globals are the call's, not ours.)"""
    etype, value, tb = info
    if skip is None:
        tb = None
    for _ in range(skip or 0):
        tb = tb.tb_next if tb is not None else None
    sys.excepthook(etype, value.with_traceback(tb), tb)
    if issubclass(etype, KeyboardInterrupt):  # the interpreter dies of SIGINT then
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        sys.stdout.flush()
        os.kill(os.getpid(), signal.SIGINT)
    raise SystemExit(1)


def _made_group(sync_w: int) -> None:
    """In the forked child, first: its own session and process group, then say so on ``sync_w``. Its parent
    reports the pid only after that, so the worker's first killpg (a cancel sent at once) finds the group, never
    an ESRCH while the child has not run yet. (Exits on a failure.)"""
    try:
        os.setsid()
        os.write(sync_w, b"s")
        os.close(sync_w)
    except BaseException:
        os._exit(70)


def _fork_twice(in_mid: Any, child: Any, *args: Any, **kwargs: Any) -> bytes:
    """Fork a call's process: a middle process (which runs ``in_mid`` first, when given, then makes the call's
    namespaces when they are on: the next child is PID 1 of them) forks it, and it runs
    ``child(*args, **kwargs)`` (which never returns) once it has its own session and group (_made_group).
    Returns its pid (8 bytes, little-endian) once the middle process is reaped (the call's process is the
    worker's then: re-parented to PID 1), or b""."""
    pid_r, pid_w = os.pipe()
    try:
        mid = os.fork()
    except OSError:
        mid = -1
    if mid == 0:
        try:
            os.close(pid_r)
            if in_mid is not None:
                in_mid()
            if _unshare is not None:
                _libc.prctl(4, 1, 0, 0, 0)  # dumpable: it writes its own uid_map (it exits at once)
                _unshare(_libc)
            sync_r, sync_w = os.pipe()  # _made_group
            pid = os.fork()
        except BaseException:
            os._exit(1)
        if pid == 0:
            os.close(sync_r)
            os.close(pid_w)
            _made_group(sync_w)
            child(*args, **kwargs)
            os._exit(70)  # (child never returns)
        os.close(sync_w)
        if os.read(sync_r, 1) == b"s":  # else it died first: no pid to report
            os.write(pid_w, pid.to_bytes(8, "little"))
        os._exit(0)
    os.close(pid_w)
    data = os.read(pid_r, 8) if mid > 0 else b""
    os.close(pid_r)
    if mid > 0:
        os.waitpid(mid, 0)
    return data


def _prepare() -> None:
    """With namespaces (gVisor), while the worker is idle: the next call's process, made ahead. Its two forks
    (the middle process that makes the namespaces, and the process that is PID 1 in them) are most of a call's
    start there (~12 ms each under gVisor's ptrace platform). It waits for its call's four descriptors on a
    socket of its own, whose other end goes to the worker with its pid (on a failure: b"E"). It holds nothing
    of the zygote's but what a fork does: the zygote's socket is closed in the middle process already."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)

    def in_mid() -> None:
        os.close(_CTL)  # never in the process that waits (nor in the call it becomes)
        ours.close()

    data = _fork_twice(in_mid, _waiting, theirs)
    theirs.close()
    try:
        if len(data) == 8:
            socket.send_fds(_ctl, [data], [ours.fileno()])
        else:
            _ctl.send(b"E")
    finally:
        ours.close()


def _waiting(sock: Any) -> None:
    """The process made ahead (PID 1 of its namespaces): non-dumpable while it waits, it takes its call's kind
    and four descriptors, then becomes the call's process as a fork of the zygote does. Never returns."""
    global _init_done
    try:
        # what PID 1 of its namespaces does before any call's code (its /proc, the seccomp filter that takes
        # mount and namespace calls away, no capability), done now: the call pays none of it
        _become_init(_libc)
        _init_done = True
        _libc.prctl(4, 0, 0, 0, 0)  # non-dumpable while it waits (_child makes it dumpable with the call)
        msg, fds, _flags, _addr = socket.recv_fds(sock, 16, 4)
        sock.detach()  # (its fd is closed by _child with every other)
    except BaseException:
        os._exit(0)
    if msg not in (b"F", b"X", b"E") or len(fds) != 4:
        os._exit(0)  # the worker dropped it (EOF) or broke the protocol
    _child(fds, argv_mode=msg in (b"X", b"E"), with_env=msg == b"E")


def _serve() -> None:
    # Every object so far moves to the permanent generation: a child's collections and its exit
    # never walk (and so never copy) the zygote's heap. 4.4 -> 3.0 ms for a fork that exits.
    gc.freeze()
    _ctl.send(b"R")  # ready
    while True:
        try:
            msg, fds, _flags, _addr = socket.recv_fds(_ctl, 16, 4)
        except OSError:
            os._exit(0)
        if msg == b"P" and not fds and _unshare is not None:
            _prepare()
            continue
        if not msg or len(fds) != 4:
            os._exit(0)  # the worker is gone (EOF) or broke the protocol
        data = _fork_twice(None, _child, fds, argv_mode=msg in (b"X", b"E"), with_env=msg == b"E")
        for fd in fds:
            os.close(fd)
        _ctl.send(data if len(data) == 8 else b"E")


_serve()
