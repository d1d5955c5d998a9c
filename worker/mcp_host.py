"""``python3 -S -m toolcage.worker.mcp_host``: PID 1 of a ``toolcage mcp wrap`` container.

It hardens itself like the worker, starts the egress relay (``network.mode: proxy``), reads
one bounded config line from stdin (the server's argv and the secrets, as env vars: they
never appear in the container's settings), then runs the server with the container's
stdin/stdout (the MCP stream) and stderr (its log). It stays init: reaps orphans, forwards
SIGTERM, kills everything left when the server ends, and exits with the server's status.

In a user's own image (issue 36) it runs from the worker image's runtime mount, as the worker does: it drops
the image's variables the runner blanked (``worker.image.scrub``), and starts the server as the image expects
it, with the image's ENV, PATH and WORKDIR (:func:`image_server_env`), never with its own.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from typing import Any

# Threat: the wrapped server planting a module in /scratch (this process's working directory, which `python3 -m`
# puts first on sys.path) for a later lazy import here, in PID 1: dropped first, as the worker does
if __name__ == "__main__" and sys.path and not sys.flags.safe_path and sys.path[0] in ("", os.getcwd()):
    del sys.path[0]

from toolcage.policies import contract

MAX_CONFIG_BYTES = 1 << 20
CONFIG_ERROR = contract.EXIT_CONFIG  # the runner sent no usable config line
NOT_STARTED = contract.EXIT_NOT_STARTED
DEPS_DIR = contract.DEPS_DIR
SCRATCH = contract.SCRATCH
# as for run_python children (worker.tools.proc): ordinary HTTP clients find the egress relay
ENV_KEEP = ("LANG", "LC_ALL", "TZ", "HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "NO_PROXY", "no_proxy")
# a user's own image: its locale and zone are its own; only the egress proxy's settings pass from ours
IMAGE_ENV_KEEP = tuple(k for k in ENV_KEEP if k not in ("LANG", "LC_ALL", "TZ"))


def _say(event: str, **fields: Any) -> None:
    """One JSON line on stderr (the runner shows it with the server's log)."""
    os.write(2, (json.dumps({"event": event, "component": "mcp_host", **fields}) + "\n").encode())


def read_config(fd: int = 0, limit: int = MAX_CONFIG_BYTES) -> dict[str, Any]:
    """The first line of stdin, read one byte at a time: not one byte of the MCP stream after it is
    consumed here (a buffered read would swallow the client's first request)."""
    buf = bytearray()
    while True:
        b = os.read(fd, 1)
        if not b:
            raise ValueError("stdin ended before the config line")
        if b == b"\n":
            break
        buf += b
        if len(buf) > limit:
            raise ValueError(f"config line over {limit} bytes")
    cfg = json.loads(buf)
    argv, env = cfg.get("argv"), cfg.get("env", {})
    if not isinstance(argv, list) or not argv or not all(isinstance(a, str) and "\0" not in a for a in argv):
        raise ValueError("argv must be a non-empty list of strings")
    if not isinstance(env, dict) or not all(
        isinstance(k, str) and isinstance(v, str) and k and "=" not in k and "\0" not in k + v for k, v in env.items()
    ):
        raise ValueError("env must map names to strings")
    return {"argv": argv, "env": env}


def server_env(secrets: dict[str, str], environ: dict[str, str] | None = None) -> dict[str, str]:
    """A clean environment: HOME and TMPDIR in scratch (a read-only root leaves package managers and
    caches nowhere else to write), the image's packages and their scripts, the proxy settings, the secrets."""
    environ = dict(os.environ) if environ is None else environ
    env = {k: v for k, v in environ.items() if k in ENV_KEEP}
    deps = os.path.isdir(DEPS_DIR)
    env.update(
        PATH=(f"{DEPS_DIR}/bin:" if deps else "") + "/usr/local/bin:/usr/bin:/bin",
        HOME=SCRATCH,
        TMPDIR=SCRATCH,
        XDG_CACHE_HOME=f"{SCRATCH}/.cache",
        PYTHONDONTWRITEBYTECODE="1",
        LANG=env.get("LANG", "C.UTF-8"),
    )
    if deps:
        env["PYTHONPATH"] = DEPS_DIR
    env.update(secrets)  # last: the secrets are what the server reads (its API keys)
    return env


def image_server_env(image: Any, secrets: dict[str, str], environ: dict[str, str] | None = None) -> dict[str, str]:
    """The server's environment in a user's own image (``worker.image.Image``), as the tools run the image's
    programs (``Image.program_env``), then the secrets. None of the worker's own variables."""
    env: dict[str, str] = image.program_env(os.environ if environ is None else environ, IMAGE_ENV_KEEP, SCRATCH)
    env.update(secrets)
    return env


def _launcher_env(environ: dict[str, str] | None = None) -> dict[str, str]:
    """What the namespace launcher (nsinit, the runtime's interpreter) starts with in a user's own image: ours,
    never the image's (its LD_PRELOAD would run in nsinit before its seccomp filter and namespaces)."""
    from toolcage.worker.image import worker_env

    return worker_env(os.environ if environ is None else environ, IMAGE_ENV_KEEP, SCRATCH)


def _kill_everything(pgid: int | None) -> None:
    from toolcage.worker.children import sweep

    if pgid is not None:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    if sweep.active():
        sweep.kill_others()


def _arm_deadline(raw: str | None, pgid: list[int | None]) -> None:
    """An orphaned container (its runner SIGKILLed) still ends at the run deadline."""
    try:
        delay = float(raw or "") + contract.GRACE_S - time.time()  # the runner's own kill comes first
    except ValueError:
        return

    def expire() -> None:
        _say("mcp_host.deadline", level="warning")
        _kill_everything(pgid[0])
        os._exit(contract.EXIT_DEADLINE)

    timer = threading.Timer(max(delay, 0.0), expire)
    timer.daemon = True
    timer.start()


def _exit_code(status: int) -> int:
    return os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status)


def main() -> int:
    from toolcage.worker import hardening
    from toolcage.worker.children import namespaces, sweep

    in_container = os.environ.get(contract.ENV_IN_CONTAINER) == "1"
    # Threat: the server reading this process's memory (the config line held the secrets) through ptrace or /proc.
    if not hardening.make_non_dumpable() and in_container:
        _say("mcp_host.refused", level="error", reason="cannot make the launcher non-dumpable")
        return contract.EXIT_SOFTWARE
    image = None
    if os.environ.get(contract.ENV_IMAGE_CONFIG):
        from toolcage.worker import image as own_image

        image = own_image.from_env()  # read before the scrub: the config is data for the server's start
        own_image.scrub()  # a user's own image: its variables, blanked by the runner, are not this launcher's
    try:
        cfg = read_config()
    except ValueError as exc:
        _say("mcp_host.bad_config", level="error", reason=str(exc)[:200])
        return CONFIG_ERROR
    pgid: list[int | None] = [None]
    _arm_deadline(os.environ.get(contract.ENV_DEADLINE), pgid)
    if os.environ.get(contract.ENV_PROXY_SOCKET):
        from toolcage.worker.egress import relay

        relay.start(os.environ[contract.ENV_PROXY_SOCKET])

    def forward(signum: int, _frame: Any) -> None:
        # as init, a signal we do not handle would be ignored: pass SIGTERM/SIGINT/SIGHUP on to the server
        if pgid[0] is not None:
            try:
                os.killpg(pgid[0], signum)
            except (ProcessLookupError, PermissionError):
                pass

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, forward)
    argv, launch_env, tool_env = cfg["argv"], server_env(cfg["env"]), None
    cwd = SCRATCH if os.path.isdir(SCRATCH) else None
    if image is not None:
        # the image's server, as the image would start it: its ENV and PATH (the command is looked up there),
        # its WORKDIR when that is a directory
        launch_env, cwd = image_server_env(image, cfg["env"]), image.default_dir(SCRATCH)
        if namespaces.enabled():
            # nsinit is the runtime's interpreter: our environment for it, the server's handed over as an
            # argument (under gVisor, where an argv is seen only inside the sandbox: by nothing but us and nsinit)
            launch_env, tool_env = _launcher_env(), launch_env
    try:
        proc = subprocess.Popen(
            # under gVisor: in namespaces of its own (worker.children.namespaces)
            namespaces.wrap(argv, env=tool_env),
            stdin=0,
            stdout=1,
            stderr=2,
            env=launch_env,
            cwd=cwd,
            start_new_session=True,  # its own group: a signal reaches its children too
            close_fds=True,
            restore_signals=True,
        )
    except OSError as exc:
        _say("mcp_host.not_started", level="error", command=cfg["argv"][0][:200], reason=exc.strerror or str(exc))
        return NOT_STARTED
    del cfg, launch_env, tool_env  # the secrets now live in the server's environment only
    pgid[0] = proc.pid
    # this process keeps no copy of the MCP stream: the server alone reads and writes it
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    os.dup2(devnull, 1)
    os.close(devnull)
    status = _wait(proc.pid, reap_others=sweep.active())
    _kill_everything(proc.pid)  # what the server left running ends with it
    return _exit_code(status)


def _wait(pid: int, reap_others: bool) -> int:
    """Wait for the server, reaping orphans re-parented to us (PID 1) meanwhile; its wait status."""
    while True:
        try:
            got, status = os.waitpid(-1 if reap_others else pid, 0)
        except InterruptedError:
            continue
        except ChildProcessError:
            return 0
        if got == pid:
            return status


if __name__ == "__main__":
    sys.exit(main())
