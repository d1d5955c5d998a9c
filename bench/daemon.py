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
def running() -> Iterator[dict[str, str]]:
    """The environment in which ``toolcage run`` goes through a daemon started here (stopped at the end)."""
    where = tempfile.mkdtemp(prefix="tc-bench-")  # 0700: the daemon's socket directory must be private
    env = {**os.environ, contract.ENV_DAEMON: os.path.join(where, "d.sock")}
    cli = [sys.executable, "-m", "toolcage.cli", "daemon"]
    started = subprocess.run([*cli, "start"], env=env, capture_output=True, text=True, check=True)
    pid = int(json.loads(started.stdout)["pid"])
    try:
        yield env
    finally:
        subprocess.run([*cli, "stop"], env=env, capture_output=True, check=False)
        deadline = time.monotonic() + 30
        while os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline:
            time.sleep(0.05)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        shutil.rmtree(where, ignore_errors=True)
