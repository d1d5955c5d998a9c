"""Entry point: ``python -m worker``. Claims the protocol fds, hardens itself, serves until EOF."""

from __future__ import annotations

import os
import sys
import threading
import time

# After the run deadline (plus this grace, so the runner's own kill is seen first) the
# worker exits by itself: an orphaned sandbox whose runner was SIGKILLed still ends.
_DEADLINE_GRACE_S = 2.0


def _arm_deadline(raw: str | None) -> None:
    if not raw:
        return
    try:
        delay = float(raw) + _DEADLINE_GRACE_S - time.time()
    except ValueError:
        return

    def _expire() -> None:
        from worker.tools.proc import kill_all_children

        print('{"event":"worker.deadline","level":"warning"}', file=sys.stderr, flush=True)
        kill_all_children()
        os._exit(124)

    timer = threading.Timer(max(delay, 0.0), _expire)
    timer.daemon = True
    timer.start()


def main() -> int:
    from worker.protocol import Channel

    channel = Channel.claim_stdio()  # first, before any import can print

    from worker import hardening, logs
    from worker.settings import Settings

    dumpable_off = hardening.make_non_dumpable()
    try:
        settings = Settings.from_env()
    except ValueError as exc:
        print(f"toolcage worker: bad settings: {exc}", file=sys.stderr)
        return 2
    logs.configure(settings.run_id)

    import structlog

    from worker.dispatch import Dispatcher
    from worker.tools import builtin_tools

    log = structlog.get_logger()
    _arm_deadline(os.environ.get("TOOLCAGE_DEADLINE"))
    dispatcher = Dispatcher(settings, builtin_tools())
    log.info("worker.started", policy=settings.policy.name, non_dumpable=dumpable_off)
    served = 0
    for line in channel.lines():
        response = dispatcher.handle(line)
        if response:
            channel.send(response)
        served += 1
    log.info("worker.stopped", requests=served)
    return 0


if __name__ == "__main__":
    sys.exit(main())
