"""Entry point: ``python -m toolcage.worker``. Claims the protocol fds, hardens itself, serves until EOF.

Start-up is kept lean (it is on the critical path of every run): only the JSON-RPC core
is imported here; pydantic, the tool modules and structlog load on first use.
"""

from __future__ import annotations

import _thread
import os
import sys

# Threat: tool code planting a module in the worker's working directory (/scratch, writable by every call).
# `python3 -m` puts that directory first on sys.path, so the worker's next lazy import of the name (tarfile
# on an upload, secrets on a download) ran the planted file in PID 1, which holds the channel (issue 36
# attack, tests/security/test_foreign_image_attacks.py). Dropped before anything is imported lazily.
if __name__ == "__main__" and sys.path and not sys.flags.safe_path and sys.path[0] in ("", os.getcwd()):
    del sys.path[0]

from toolcage.policies import contract

_IDLE_FLUSH_S = 0.05


def _watch_runner(fd: int) -> None:
    """Threat and leak: a runner SIGKILLed mid-call. Its end of our stdin closes (HUP); the call
    in progress would otherwise run to its timeout. Kill what it runs so the worker returns to
    its loop, reads EOF and exits, and the container stops at once, not at the deadline.
    (The runner itself never closes our stdin while a call is in flight.)"""
    import select

    def _run() -> None:
        poller = select.poll()
        poller.register(fd, 0)  # no events asked: poll() reports only hang-up and errors
        while True:
            for _fd, event in poller.poll():
                if event & (select.POLLHUP | select.POLLERR | select.POLLNVAL):
                    from toolcage.worker.tools.proc import kill_all_children

                    os.write(2, b'{"event": "worker.runner_gone", "level": "warning", "component": "worker"}\n')
                    kill_all_children()
                    return

    _thread.start_new_thread(_run, ())


def main() -> int:
    from toolcage.worker import hardening

    if os.environ.get(contract.ENV_COPY_LOWER):  # a cached workspace copy: laid before anything else, single-
        from toolcage.worker import copyfs  # threaded, while the worker can still write its own uid_map

        copyfs.boot()

    # First of all: nothing may open our fds or memory (the protocol stream) through /proc or ptrace.
    non_dumpable = hardening.make_non_dumpable()
    if not non_dumpable and os.environ.get(contract.ENV_IN_CONTAINER) == "1":
        os.write(2, b'{"event": "worker.refused", "level": "error", "reason": "cannot make the worker non-dumpable"}\n')
        return contract.EXIT_SOFTWARE

    if os.environ.get(contract.ENV_IMAGE_CONFIG):
        from toolcage.worker import image

        image.scrub()  # a user's own image: its variables, blanked by the runner, are not the worker's

    from toolcage.worker.protocol import Channel, readable

    channel = Channel.claim_stdio()  # before anything can print

    from toolcage.worker import deadline, logs
    from toolcage.worker.children import sweep
    from toolcage.worker.dispatch import Dispatcher
    from toolcage.worker.settings import Settings
    from toolcage.worker.tools import Catalog

    if sweep.active():
        hardening.as_init()
    settings = Settings.from_env()
    logs.bind(run_id=settings.run_id)
    deadline.arm(settings.deadline)  # a pooled sandbox gets its run's at adoption
    if settings.watch_runner:  # set by the runner, which never half-closes mid-call
        _watch_runner(channel.fd_in)
    if settings.proxy_socket:
        from toolcage.worker.egress import relay

        relay.start(settings.proxy_socket)
    from toolcage.worker import calls

    calls.attach(channel)  # cancels are read while a call runs; progress goes out on the channel
    dispatcher = Dispatcher(settings, Catalog.from_env())
    logs.info("worker.started", non_dumpable=non_dumpable, pid=os.getpid(), init=sweep.active())

    # a pool's slot whose runs may take secrets or connectors: their modules load while it waits (a slot whose
    # runs take neither, TOOLCAGE_POOLED=bare, is not "pooled" here: it loads no more than a cold run does)
    pooled = settings.pooled

    def idle() -> bool:
        """Between requests, nothing in flight; True: the channel is readable (a request came meanwhile)."""
        # write queued log lines only when no request is waiting (see worker.logs)
        zygote = sys.modules.get("toolcage.worker.children.zygote")  # loaded with run_python, never at start
        if zygote is not None:
            zygote.warm()  # (re)start the fork server a run_python call asked for
        if readable([channel.fd_in], _IDLE_FLUSH_S):
            return True
        logs.flush()
        settings.warm()  # a pooled sandbox's first request (sandbox.configure) needs the policy
        if pooled:
            dispatcher.warm()  # ... and the connectors' module, which takes the run's secrets
        # under gVisor: the next call's process, made ahead (both of its forks), once the zygote is ready
        return zygote is not None and zygote.make_ahead(channel.fd_in)

    from toolcage.worker.loop import Loop

    served = Loop(channel, dispatcher, idle).run()
    logs.info("worker.stopped", requests=served)
    logs.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
