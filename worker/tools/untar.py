"""The workspace copy's tar, extracted by GNU tar from the worker's runtime, not by Python's tarfile.

Why: a tree of 100,000 small files took 3.3 s to extract in Python (its header parsing, then open, write,
chmod, utime and close for each) and 1.0 s with GNU tar. Only for the run's copy of its workspace as the
runner walks and writes it itself (``upload`` with ``base`` and ``native``), before any code of the run
exists: its headers are the runner's own (toolcage.files.upload: files, directories and symlinks only,
permission bits without setuid, setgid or sticky, directories owner-writable). Any other upload (a
resumed snapshot, the image's own paths, the caller's files) goes through the checks of ``upload.extract``.

Threat: the image is the attacker when it is the user's. The tar that runs is ``/opt/toolcage/rt/bin/tar``,
the worker image's own, started through rt's loader (``image/rt.py``), never one found on the image's
PATH; it gets an environment of its own (no ``TAR_OPTIONS``, no ``LD_*``), reads the archive on stdin and
writes beneath the staging directory only. GNU tar refuses names with ``..``, strips a leading ``/``, and
makes a symlink only after the entries that could have been written through it.
"""

from __future__ import annotations

import codecs
import collections
import os
import subprocess
import threading
from typing import Any

from toolcage.worker.errors import NoSpace, ToolError
from toolcage.worker.tools.files import full_message

TAR = "/opt/toolcage/rt/bin/tar"
_PIECE = 1 << 20
_STDERR_KEEP = 64  # the last lines of tar's complaints, kept for the error (the earlier ones are dropped)
_ARGS = (
    "-x", "-f", "-",
    "--no-same-owner", "--same-permissions",  # the sandbox user owns the copy; the modes are the runner's
    "--warning=no-unknown-keyword",  # tarfile's PAX hdrcharset (a name that is no UTF-8), which it ignores
)  # fmt: skip
# -v names one entry a line, every byte that is no printable ASCII escaped: only for a runner that does not
# name the entries itself (``listed``). Naming them costs 100,000 files about 0.3 s of tar's CPU and 0.35 s of
# the worker's reading its lines, both inside the sandbox's CPU quota, beside 1.2 s for the extraction itself.
_VERBOSE = ("-v", "--quoting-style=escape")


def available() -> bool:
    """Whether the runtime has its tar (an image from before it has not: then Python extracts)."""
    return os.access(TAR, os.X_OK)


class Result:
    """What ``upload._finish`` reads of an extraction: the paths made (``kinds``) and the counts. The native
    path tells a directory (its name ends with ``/``) from the rest; the runner counts the kinds it sent."""

    def __init__(self, kinds: dict[str, str]) -> None:
        self.kinds = kinds
        self.dirs = sum(v == "dir" for v in kinds.values())
        self.files = len(kinds) - self.dirs
        self.symlinks = self.bytes = 0


def _name(line: bytes) -> str:
    return os.fsdecode(codecs.escape_decode(line)[0])


def extract(fileobj: Any, stage: str, root_name: str, verbose: bool = True) -> Result:
    """Pipe the tar read from ``fileobj`` into rt's tar, which extracts it beneath ``stage`` (a path: nothing
    else runs in the sandbox yet); the entries it made, by what it says as it makes them (``verbose``; if not,
    none: the runner names what it sent, and a tar that ends with status 0 made every entry)."""
    proc = subprocess.Popen(
        [TAR, *_ARGS, *(_VERBOSE if verbose else ()), "-C", stage],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={"LC_ALL": "C", "PATH": "/nonexistent"},
        close_fds=True,
    )
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    names: list[bytes] = []
    complaints: collections.deque[bytes] = collections.deque(maxlen=_STDERR_KEEP)

    def read_names() -> None:
        assert proc.stdout is not None
        names.extend(line.rstrip(b"\n") for line in proc.stdout)

    def read_complaints() -> None:
        assert proc.stderr is not None
        complaints.extend(proc.stderr)

    readers = [threading.Thread(target=f, daemon=True) for f in (read_names, read_complaints)]
    for t in readers:
        t.start()
    try:
        while piece := fileobj.read(_PIECE):
            try:
                proc.stdin.write(piece)
            except BrokenPipeError:  # tar stopped: its status and complaints say why (the next call gets them)
                break
    finally:
        try:
            proc.stdin.close()
        except BrokenPipeError:
            pass
        status = proc.wait()
        for t in readers:
            t.join()
        proc.stdout.close()
        proc.stderr.close()
    if status != 0:
        said = b"".join(complaints).decode("utf-8", "replace")
        if "No space left on device" in said or "Disk quota exceeded" in said:
            raise NoSpace(
                f"upload: {full_message(root_name)}; nothing was kept", {"reason": f"{root_name.strip('/')}_full"}
            )
        raise ToolError(f"upload: the runtime's tar failed ({status}): {said[-800:]!r}; nothing was kept", {})
    kinds: dict[str, str] = {}
    for raw in names:
        name = _name(raw)
        if name.endswith("/"):
            kinds[name.rstrip("/")] = "dir"
        elif name:
            kinds[name] = "file"
    return Result(kinds)


__all__ = ["TAR", "Result", "available", "extract"]
