"""A cached workspace copy (``workspace_cache``): /workspace as an overlay, laid by the worker at boot.

Why: a copy made file by file at start costs the extraction of every file (1.1 s for 100,000 here, 3.6x a
read-only start on its own). The engine keeps the copy instead (toolcage.engine.copycache: a volume holding
the tree as the sandbox user owns it, filled once by a run of toolcage's that runs no code, never written
after); each run mounts it read-only at ``contract.COPY_LOWER`` and the worker, first thing at boot, lays an
overlay over /workspace: that tree below, the run's own tmpfs at /workspace (the engine's, sized
``limits.workspace_copy`` as for any copy) above. A write copies the file up into the tmpfs; the cached
tree is never written. Mounted in about 2 ms, whatever the tree's size.

How (Linux >= 6.6: an overlay in a user namespace needs user extended attributes on tmpfs), in PID 1 before
it reads anything of the run, single-threaded (unshare of a user namespace requires it):

1. ``unshare(CLONE_NEWUSER | CLONE_NEWNS)``, the identity map of the worker's uid and gid (65532; files of
   other owners show as the overflow id, 65534), ``setgroups`` denied;
2. every mount private; ``upper`` and ``work`` made in the engine's tmpfs at /workspace, then the overlay
   mounted on /workspace over it (nosuid, nodev; ``userxattr``); the read-only lower covered by an empty
   read-only tmpfs. Threat: sandboxes of the same cached tree opening the same inodes (locks and inotify
   events are the kernel's, whoever opened them: the covert channel toolcage.engine.sharedfiles closes for
   the image's files). Through the overlay every run has inodes of its own; the lower itself is reachable
   by nothing after this step but a descriptor the worker keeps (close-on-exec; every child the worker
   starts is spawned with its descriptors closed) to list the copy's files for ``changes()``;
3. the capability bounding set emptied, the seccomp filter of worker.children.nsinit stacked on the
   container's (mount, umount2, unshare, setns, pivot_root, chroot and the new mount API refused; clone3
   ENOSYS, and mincore: below), every capability dropped (capset). Threat: tool code using what the container's
   profile grants this run's boot (``unshare``, ``mount``: toolcage.engine.seccomp's copy variant) to open a user
   namespace's kernel surface, or remount the overlay. Nothing runs in the container before this step
   but the worker; everything after it descends from this process and inherits the filter, but an exposed
   port's relay, which the engine execs and which stacks the same filter itself (toolcage.lifecycle.ports).
   Threat: a covert channel between runs of the tree through its page cache, which they share: mincore answers
   exactly for files the caller owns (the kept tree's are the sandbox user's), so it is answered ENOSYS
   (tests/security/test_copy_cache_attacks.py).

Any step failing fails the worker's start (exit ``contract.EXIT_NO_COPY``, the reason on stderr), and the run
with it, saying so (toolcage.backends.container.NO_COPY): never a copy that is not one. The runner asked the engine
first (toolcage.engine.copycache.usable: a probe once per engine, kernel and worker image), so only an engine that
changed since its answer fails a start so.
"""

from __future__ import annotations

import ctypes
import os
import stat
import time

from toolcage.policies import contract

CLONE_NEWNS, CLONE_NEWUSER = 0x00020000, 0x10000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REC, MS_PRIVATE = 0x1, 0x2, 0x4, 0x8, 0x4000, 0x40000
PR_CAPBSET_DROP = 24
_LINUX_CAPABILITY_VERSION_3 = 0x20080522
UPPER, WORK = ".toolcage-upper", ".toolcage-work"
SEAL_ENOSYS = ("mincore",)  # answered ENOSYS besides nsinit's calls (see _seal)

# the lower's root, kept open (close-on-exec) for changes(): the copy's own list of files; and when the overlay was
# laid (the coarse clock file times come from): every file of the cached tree is older, every later write newer
_lower_fd: int | None = None
_laid_ns = 0
_CLOCK_REALTIME_COARSE = 5


class CopyError(Exception):
    pass


def _check(ok: bool, step: str) -> None:
    if not ok:
        err = ctypes.get_errno()
        raise CopyError(f"{step}: {os.strerror(err)}")


def lay(lower: str, target: str, overlay: bool = True) -> None:
    """Steps 1 to 3 (the module's docstring); CopyError with the failing step. ``overlay`` False (the runner
    found the tree changed since the cached one it mounted): no overlay, /workspace stays the run's tmpfs for the
    runner to fill; the cached tree is covered and the worker sealed all the same."""
    global _lower_fd, _laid_ns
    libc = ctypes.CDLL(None, use_errno=True)
    uid, gid = os.getuid(), os.getgid()
    _check(libc.unshare(CLONE_NEWUSER | CLONE_NEWNS) == 0, "unshare")
    for name, line in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
        fd = os.open(f"/proc/self/{name}", os.O_WRONLY)
        try:
            os.write(fd, line.encode())
        finally:
            os.close(fd)
    _check(libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None) == 0, "mount --make-rprivate /")
    cover = MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC
    if not overlay:
        _check(libc.mount(b"tmpfs", lower.encode(), b"tmpfs", cover, b"size=4k,mode=0") == 0, "cover the lower")
        _seal(libc)
        return
    for d in (UPPER, WORK):
        os.mkdir(os.path.join(target, d), 0o755)
    upper, work = os.path.join(target, UPPER), os.path.join(target, WORK)
    for p in (lower, upper, work):
        if "," in p or ":" in p:  # overlay's option syntax (contract paths: never)
            raise CopyError(f"{p!r}: not a path an overlay takes")
    opts = f"lowerdir={lower},upperdir={upper},workdir={work},userxattr".encode()
    _check(libc.mount(b"overlay", target.encode(), b"overlay", MS_NOSUID | MS_NODEV, opts) == 0, "mount overlay")
    _lower_fd = os.open(lower, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    _check(libc.mount(b"tmpfs", lower.encode(), b"tmpfs", cover, b"size=4k,mode=0") == 0, "cover the lower")
    _seal(libc)
    _laid_ns = time.clock_gettime_ns(_CLOCK_REALTIME_COARSE)


def _seal(libc: ctypes.CDLL) -> None:
    """Step 3: no capability left, and the stacked filter."""
    from toolcage.worker.children.nsinit import stack_filter

    cap = 0
    while libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) == 0:
        cap += 1
    _check(cap > 0, "prctl(PR_CAPBSET_DROP)")
    # mincore too: the cached tree's files are the sandbox user's, so the kernel would answer it exactly for their
    # pages, which every run of the tree shares (a covert channel between runs; timing is left, as for the image's)
    _check(stack_filter(libc, SEAL_ENOSYS), "seccomp")
    header = (ctypes.c_uint32 * 2)(_LINUX_CAPABILITY_VERSION_3, 0)
    data = (ctypes.c_uint32 * 6)()  # effective, permitted, inheritable: twice (64 bits), all zero
    _check(libc.capset(header, data) == 0, "capset")


def laid_ns() -> int:
    return _laid_ns


def lower_fd() -> int | None:
    """The cached tree's root (the copy as it was made), or None: not a cached copy."""
    return _lower_fd


def base_names() -> str:
    """The cached copy's files and symlinks, "\\0"-joined, as ``upload`` records a filled copy's
    (toolcage.worker.tools.workspace.record_base)."""
    fd = _lower_fd
    if fd is None:
        return ""
    out: list[str] = []
    for dirpath, dirnames, filenames, dfd in os.fwalk(".", dir_fd=fd, follow_symlinks=False):
        prefix = "" if dirpath == "." else dirpath[2:] + "/"
        for name in filenames:
            out.append(prefix + name)
        for name in dirnames:  # a symlink to a directory is listed there, and never entered
            if stat.S_ISLNK(os.stat(name, dir_fd=dfd, follow_symlinks=False).st_mode):
                out.append(prefix + name)
    return "\0".join(out)


PREFACE_MAX = 16  # "lay\n" or "fill\n": the first bytes on stdin, before the protocol's first line


def _preface(fd: int = 0) -> bytes:
    """The runner's word, read a byte at a time (nothing of the protocol after it is consumed): ``lay`` the
    cached tree, or ``fill`` (the tree changed since: the runner copies it as without the cache)."""
    got = b""
    while not got.endswith(b"\n"):
        b = os.read(fd, 1)
        if not b or len(got) >= PREFACE_MAX:
            raise CopyError("no word from the runner on laying the copy")
        got += b
    return got[:-1]


def boot() -> None:
    """At the worker's start: wait for the runner's word (it decides while the container starts: a cached run
    starts the container before its walk of the tree is done), then lay the overlay, or only cover the cached
    tree; on failure, exit so the runner falls back (never serve a copy that is not one)."""
    lower = os.environ.get(contract.ENV_COPY_LOWER)
    if not lower:
        return
    try:
        word = _preface()
        if word not in (b"lay", b"fill"):
            raise CopyError(f"the runner's word on the copy is {word!r}, not lay or fill")
        lay(lower, contract.WORKSPACE, overlay=word == b"lay")
    except (CopyError, OSError) as exc:
        msg = str(exc).replace("\\", "\\\\").replace('"', '\\"')
        os.write(2, f'{{"event": "worker.copy_failed", "level": "error", "reason": "{msg}"}}\n'.encode())
        os._exit(contract.EXIT_NO_COPY)
