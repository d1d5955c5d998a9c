"""Removing a finished run's container (and its proxy, network, volume) off the caller's path.

``Sandbox.close()`` hands the removal to one background thread and returns: the 40-60 ms an
engine takes to delete a container no longer sit between a caller and its next step. Nothing
is lost by it: the removals still pending when the process exits are finished by an ``atexit``
hook, and if the process is SIGKILLed first, the run's owner labels let the reaper and
``toolcage gc`` remove what is left (the same as for a runner killed mid-run).

``toolcage run`` does not wait for it at exit either: it forks a helper while it is still
single-threaded (:func:`start_helper`), a copy of itself that removes the containers handed
to it (:func:`hand_off`), also after the command has exited. It holds nothing the command's
caller waits on (no stdout, stderr or process group) and ends once the command's end of
its pipe is closed and every container handed to it is removed. Only in the machine's own PID
namespace: in a container the command removes its container before it exits, since the helper
would die with the container's init (a runner container's script ends right after the command).
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import os
import queue
import signal
import sys
import threading
from collections.abc import Callable
from typing import Any

from toolcage import logs
from toolcage.errors import ToolcageError

EXIT_WAIT_S = 30.0  # at interpreter exit, how long pending removals may hold it


class _Remover:
    def __init__(self) -> None:
        self._jobs: queue.Queue[Callable[[], None]] = queue.Queue()
        self._pending = 0
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._pid = os.getpid()

    def schedule(self, job: Callable[[], None]) -> None:
        with self._cond:
            if self._thread is None or not self._thread.is_alive() or self._pid != os.getpid():
                self._pid = os.getpid()  # a forked child has no remover thread of its own yet
                self._thread = threading.Thread(target=self._run, name="toolcage-remover", daemon=True)
                self._thread.start()
            self._pending += 1
        self._jobs.put(job)

    def _run(self) -> None:
        while True:
            job = self._jobs.get()
            try:
                job()
            except Exception as exc:  # the reaper and gc remove what a failed removal leaves
                logs.get_logger().warning("run.remove_failed", error=type(exc).__name__, detail=str(exc)[:200])
            finally:
                with self._cond:
                    self._pending -= 1
                    self._cond.notify_all()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until every scheduled removal has run (True), or ``timeout`` passed (False)."""
        with self._cond:
            return self._cond.wait_for(lambda: self._pending == 0, timeout)


_REMOVER = _Remover()
schedule = _REMOVER.schedule


def wait_removed(timeout: float | None = None) -> bool:
    """Wait until the containers of closed sandboxes are removed (True), or ``timeout`` passed."""
    return _REMOVER.wait(timeout)


atexit.register(wait_removed, EXIT_WAIT_S)


# the helper that outlives the command ---------------------------------------------------------
_helper_fd: int | None = None  # the write end of the helper's pipe, while removals go to it


def start_helper() -> bool:
    """Fork the helper (once per process): from now on :func:`hand_off` gives it containers to
    remove. Only on Linux, and only while this process has one thread (a fork copies no other
    thread, nor what one holds); False when it was not started, and removals stay in-process.
    For a command's own process only: it also freezes the garbage collector's generations."""
    global _helper_fd
    if _helper_fd is not None:
        return True
    from toolcage.engine import ownership

    # Only in the machine's own PID namespace, whose init never exits. In any other (a container, a pod)
    # the namespace's init may exit right after the command does, and the kernel then kills every process
    # in it, the helper too, leaving the container to the reaper.
    if sys.platform != "linux" or threading.active_count() != 1 or not ownership.in_initial_pid_namespace():
        return False
    from toolcage.engine.docker_adapter import Engine  # imported here: the helper then imports nothing

    read_end, write_end = os.pipe()  # both close-on-exec: no worker or tool process inherits them
    # what exists now is shared with the helper until either writes to it: the garbage collector
    # leaves it alone from here on, so it is not copied page by page as the run goes on
    gc.freeze()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # the helper
        try:
            os.close(write_end)
            _helper(read_end, Engine)
        finally:
            os._exit(0)  # never the command's atexit hooks or buffered output
    os.close(read_end)
    _helper_fd = write_end
    return True


def stop_helper() -> None:
    """Removals stay in-process again (they finish before exit); what was handed off still goes.
    Safe in a signal handler: the pipe stays open (another thread may be writing to it) and the
    helper ends when this process does."""
    global _helper_fd
    _helper_fd = None


def end(engine: Any, cid: str, exit_wait_s: float = 0.0) -> None:
    """Remove a sandbox's container: when ``exit_wait_s``, first up to that long for it to end by itself (its
    worker exits at EOF, and every caller closed its input first: gVisor's ``engine.knobs.exit_wait_s``), then the
    engine's removal, which kills what still runs."""
    if exit_wait_s:
        with contextlib.suppress(ToolcageError):  # a failed wait changes nothing: the removal kills it
            engine.wait(cid, exit_wait_s)
    engine.remove(cid)


def hand_off(container_id: str, volumes: list[str] | tuple[str, ...] = (), exit_wait_s: float = 0.0) -> bool:
    """Give the helper a container to remove (:func:`end`), then ``volumes`` (True), or False: remove them here."""
    fd = _helper_fd
    if fd is None:
        return False
    try:
        line = " ".join([repr(float(exit_wait_s)), container_id, *volumes])
        os.write(fd, f"{line}\n".encode())  # one short line: a single atomic write to the pipe
    except OSError:
        return False  # the helper is gone: the caller removes it itself
    return True


def _helper(read_end: int, engine_class: Callable[[], Any]) -> None:
    """The helper's life: detached from the command's session and output, remove each container
    named on the pipe as it comes, end at the pipe's end. A removal that fails is left to the
    reaper and ``toolcage gc`` (its owner, the command, is gone by then)."""
    os.setsid()  # no terminal, no process group of the command's: Ctrl-C or a group kill is not for it
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)  # not the command's handlers
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)  # a caller reading the command's output to its end must not wait for this
    keep = os.dup2(read_end, 3) if read_end != 3 else 3
    os.closerange(4, os.sysconf("SC_OPEN_MAX") if hasattr(os, "sysconf") else 1024)
    engine = None
    with os.fdopen(keep, "rb") as pipe:
        for line in pipe:
            names = line.decode("ascii", "replace").split()  # its wait, a container, then the volumes it mounted
            if len(names) < 2:
                continue
            try:
                if engine is None:
                    engine = engine_class()  # a connection of its own, never the command's
                end(engine, names[1], float(names[0]))
                for volume in names[2:]:
                    engine.remove_volume(volume)
            except Exception:  # noqa: S112 - the reaper and gc remove what is left
                continue


__all__ = ["end", "hand_off", "schedule", "start_helper", "stop_helper", "wait_removed"]
