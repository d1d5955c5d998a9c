"""How the ``toolcage`` process starts and ends, made fast for a command that runs once (issue 27):
what its signals do, structlog loaded without rich, the garbage collector off while it imports and
frozen after, and the exit without the interpreter's tear-down. The command's own process only
(``toolcage.cli.main.main``), never a program that calls ``cli()``."""

from __future__ import annotations

import gc
import os
import signal
import sys
from typing import Any

from toolcage.cli.output import say


def on_signal(signum: int, frame: Any) -> None:
    # unwinds through `with Sandbox`, so the container is removed before the process exits
    signal.signal(signum, signal.SIG_IGN)  # a second Ctrl-C must not interrupt the clean-up
    from toolcage.lifecycle import removal

    removal.stop_helper()  # interrupted, the container is removed before the process exits
    say(f"{signal.Signals(signum).name}: removing the sandbox")
    raise SystemExit(128 + signum)


def structlog_without_rich() -> None:
    """The command only (never the library, whose host application may want it): structlog's dev
    module imports rich, when installed, for pretty tracebacks that toolcage never renders (it
    prints exceptions as plain escaped text). Loading structlog without it saves about 50 ms on
    every run that logs; rich stays importable for the tables of `ps` and `audit`. structlog itself
    loads with the first record wanted (toolcage.logs)."""
    from toolcage import logs

    logs._Cli.without_rich = True


class Command:
    # set by main(): this process is the command itself, not a test or a program calling cli(), so
    # what is process-wide (the garbage collector, a forked helper) is the command's to decide
    own_process = False


def collect_from_here() -> None:
    """The garbage collector back on (main() turned it off), for the objects made from now on only:
    what the command imported lives as long as the process, and without this every collection,
    the last at exit (about 35 ms) among them, walks it all again."""
    if Command.own_process and not gc.isenabled():
        gc.freeze()
        gc.enable()


def exit_now(code: Any) -> None:
    """End the command without the interpreter's tear-down (about 30 ms of freeing everything it
    imported, on every run: issue 27). What must happen at exit happens first, in the interpreter's
    order: other threads' work (every non-daemon thread joined), the atexit hooks (pending
    removals, the audit writer's flush, logging's shutdown, weakref finalizers), stdout and stderr
    flushed. Only the command's own process does this (``main``), never a program calling ``cli()``."""
    import atexit
    import threading

    if code is None:
        status = 0
    elif isinstance(code, int):
        status = code & 0xFF
    else:  # SystemExit("message"): printed and 1, as the interpreter does
        print(code, file=sys.stderr)
        status = 1
    try:
        for t in threading.enumerate():
            if t is not threading.main_thread() and not t.daemon:
                t.join()
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                status = status or 120  # as the interpreter exits when it cannot flush stdout
        os._exit(status)


__all__ = ["Command", "collect_from_here", "exit_now", "on_signal", "structlog_without_rich"]
