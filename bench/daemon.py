"""A ``toolcage daemon`` of the benchmark's own, on a socket of its own, for as long as a measure needs it.

``toolcage run`` asks the daemon named by ``TOOLCAGE_DAEMON``: the measures that time a run through the
daemon set it to this one's socket, and the cold measures set it to ``off``, so a daemon the user may have
started never blurs either.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator

from toolcage.policies import contract

COLD = {**os.environ, contract.ENV_DAEMON: "off"}


@contextlib.contextmanager
def running(where: str | None = None) -> Iterator[dict[str, str]]:
    """The environment in which ``toolcage run`` goes through a daemon started here, its socket in ``where``
    (a directory of this user's, mode 0700; None: a temporary one, removed after). Stopped at the end, killed
    if it has not ended 30 s later."""
    own = where is None
    where = tempfile.mkdtemp(prefix="tc-bench-") if where is None else where  # mkdtemp: 0700, as it must be
    env = {**os.environ, contract.ENV_DAEMON: os.path.join(where, "d.sock")}
    cli = [sys.executable, "-m", "toolcage.cli", "daemon"]
    try:
        started = subprocess.run([*cli, "start"], env=env, capture_output=True, text=True, check=False)
        if started.returncode != 0:
            raise RuntimeError(f"toolcage daemon start failed ({started.returncode}): {started.stderr.strip()}")
        pid = int(json.loads(started.stdout)["pid"])
        try:
            yield env
        finally:
            subprocess.run([*cli, "stop"], env=env, capture_output=True, check=False)
            deadline = time.monotonic() + 30
            while os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline:
                time.sleep(0.05)
            if os.path.exists(f"/proc/{pid}"):  # never a pid that ended and may be another process's by now
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
    finally:
        if own:
            shutil.rmtree(where, ignore_errors=True)
