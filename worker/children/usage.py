"""``sandbox.usage``: CPU time and peak memory of the whole sandbox so far.

In a container the numbers come from its own cgroup (every process counted); with
``--sandbox none`` they come from the worker's own rusage and its reaped children.
"""

from __future__ import annotations

import os
import resource
import sys
from typing import Any

from toolcage.policies import contract
from toolcage.worker.children import cgroup, memguard


def _zygote_pid() -> int | None:
    """The run_python fork server's pid (a process of the worker's, not of any call), if one runs."""
    zygote = sys.modules.get("toolcage.worker.children.zygote")
    pid: int | None = zygote.pid() if zygote is not None else None
    return pid


def _ahead_pid() -> int | None:
    """Under gVisor, the next call's process the zygote made ahead, while it waits (the worker's, no call's yet)."""
    zygote = sys.modules.get("toolcage.worker.children.zygote")
    pid: int | None = zygote.ahead_pid() if zygote is not None else None
    return pid


def usage() -> dict[str, Any]:
    if os.environ.get(contract.ENV_IN_CONTAINER) == "1":
        cpu = cgroup.cpu_usage_ns()
        return {
            "cpu_ms": round(cpu / 1e6, 3) if cpu is not None else None,
            # gVisor's cgroupfs keeps no peak: the highest usage its memory guard saw
            "peak_memory_bytes": cgroup.peak_memory() or memguard.peak(),
            # under gVisor the memory guard is the OOM killer: its kills count as the kernel's do under runc
            "oom_kills": cgroup.oom_kills() + memguard.kills(),
            "source": "cgroup",
            "zygote_pid": _zygote_pid(),
            "ahead_pid": _ahead_pid(),
        }
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return {
        "cpu_ms": round((me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime) * 1000, 3),
        "peak_memory_bytes": max(me.ru_maxrss, kids.ru_maxrss) * 1024,
        "oom_kills": 0,
        "source": "rusage",
        "zygote_pid": _zygote_pid(),
        "ahead_pid": _ahead_pid(),
    }
