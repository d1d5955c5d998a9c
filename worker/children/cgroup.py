"""Read the container's own memory cgroup (v1 or v2): OOM-kill counter and peak usage."""

from __future__ import annotations

_V2 = "/sys/fs/cgroup/"
_V1 = "/sys/fs/cgroup/memory/"


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="ascii") as f:
            return f.read()
    except OSError:
        return None


def _field(text: str | None, name: str) -> int | None:
    for line in (text or "").splitlines():
        key, _, value = line.partition(" ")
        if key == name and value.strip().isdigit():
            return int(value)
    return None


def oom_kills() -> int:
    """How many processes the kernel's OOM killer has killed in this cgroup (0 if unknown)."""
    n = _field(_read(_V2 + "memory.events"), "oom_kill")
    if n is None:
        n = _field(_read(_V1 + "memory.oom_control"), "oom_kill")
    return n or 0


def peak_memory() -> int | None:
    """The cgroup's peak memory use in bytes, if the kernel exposes it."""
    for path in (_V2 + "memory.peak", _V1 + "memory.max_usage_in_bytes"):
        text = _read(path)
        if text and text.strip().isdigit():
            return int(text)
    return None


def cpu_usage_ns() -> int | None:
    """CPU time used by every process of the cgroup, in nanoseconds."""
    text = _read(_V2 + "cpu.stat")
    usec = _field(text, "usage_usec")
    if usec is not None:
        return usec * 1000
    for path in ("/sys/fs/cgroup/cpuacct/cpuacct.usage", "/sys/fs/cgroup/cpu,cpuacct/cpuacct.usage"):
        raw = _read(path)
        if raw and raw.strip().isdigit():
            return int(raw)
    return None
