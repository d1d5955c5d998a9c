"""Under gVisor, tool code starts in user, PID and mount namespaces of its own, with its own /proc.

Threat: tool code (the worker's uid) opening the worker's protocol stream through /proc/1/fd,
reading /proc/1/environ and /proc/1/maps, or stopping and killing the worker with a signal.
Under runc the kernel stops all of it (the worker is non-dumpable, and a namespace's init only
gets the signals it handles). gVisor's kernel does neither: its procfs ignores dumpability for
those files and it delivers SIGSTOP and SIGKILL to PID 1. So there every process of a call (a
``run_python``/``run_shell`` child, a connector's handler, a wrapped MCP server) starts as PID 1
of a PID namespace of its own, in a mount namespace with a /proc of its own: it cannot name the
worker, the zygote, or another call, and when it ends the kernel ends everything it left in
there. ``worker/children/nsinit.py`` makes them, then stacks a seccomp filter that takes mount and
namespace calls away from the tool again, and execs it.

Only under gVisor (the runner sets ``TOOLCAGE_TOOL_NAMESPACES`` there): the namespaces are then the
sentry's, not the host kernel's, and the gVisor variant of the seccomp profile allows ``unshare``
and ``mount`` for nsinit. Under runc the profile refuses both (user namespaces open large parts of
the host kernel) and the kernel's own checks already hold. If the namespaces cannot be made the
tool never runs: nsinit fails the call (exit 126, the reason on stderr) instead of falling back.
"""

from __future__ import annotations

import json
import os
import sys

from toolcage.policies import contract

ENV = contract.ENV_TOOL_NAMESPACES
NSINIT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "nsinit.py")
# -I: no PYTHONPATH, no user site, and not the script's directory from the cwd (scratch, which
# tool code writes); -S: no site import (faster, and nothing of site-packages runs)
# the worker's own interpreter by absolute path: in a user's own image "python3" on PATH is the image's
LAUNCHER = (sys.executable or "python3", "-I", "-S", NSINIT, "--")


def enabled() -> bool:
    return os.environ.get(ENV) == "1"


def wrap(
    argv: list[str], keep: bool = False, env: dict[str, str] | None = None, bg: int = -1, tty: bool = False
) -> list[str]:
    """``argv`` as it must be started: in namespaces of its own where they are on, else unchanged.
    ``keep``: what it leaves in the background outlives it (``unsafe_background_processes``). ``env``: the
    program's own environment (a user's own image), which nsinit execs it with; nsinit itself then starts
    with the worker's (worker.tools.proc.run_child), so the image's LD_PRELOAD never runs in it. ``bg``: a
    background process (worker.children.background), the descriptor nsinit tells its keeper's pid on;
    ``tty``: its stdin is a terminal, made its controlling one."""
    if not enabled():
        return argv
    extra = ["--bg", str(bg)] if bg >= 0 else []
    extra += ["--tty"] if tty else []
    extra += ["--env", json.dumps(env)] if env is not None else []
    return [*LAUNCHER[:-1], *(["--keep"] if keep else []), *extra, LAUNCHER[-1], *argv]
