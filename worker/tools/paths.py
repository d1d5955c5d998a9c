"""Path confinement by descriptor: the file tools open everything relative to a root's fd.

Threat: a path checked by name and opened later (``realpath``, then ``open``) lets code in
the sandbox swap a symlink in between and read outside the roots (a leftover process made
``grep`` return /etc/hostname labelled as a scratch file). Here a path is first placed
lexically under a root, then the kernel resolves it beneath that root's directory fd in one
step: ``openat2(2)`` with ``RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS`` (Linux 5.6+). Where
openat2 is missing (ENOSYS, or a seccomp profile that refuses it) each component is opened
with ``O_NOFOLLOW`` from the previous one's fd, and no symlink is followed at all.

The kernel boundary is still the container's mount namespace (read-only /workspace, tmpfs
scratch); this is the only guard when the worker runs with ``--sandbox none``.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from toolcage.worker.errors import BadParams, PathEscape, ToolError

MAX_PATH = 4096  # PATH_MAX: longer is a params error, never an OSError deep inside a tool
NAME_MAX = 255  # bytes per component, as every Linux file system limits it

_RESOLVE_NO_MAGICLINKS = 0x02
_RESOLVE_BENEATH = 0x08
_SYS_OPENAT2 = 437  # the same number on every Linux architecture but alpha


@dataclass(frozen=True)
class Located:
    """A path placed lexically under one root: ``rel`` is ``"."`` for the root itself."""

    given: str
    root: str
    rel: str

    def join(self, *parts: str) -> str:
        """Where a path beneath this one sits, as the tools report it: relative for the
        workspace, absolute for scratch."""
        return os.path.normpath(os.path.join(self.rel, *parts))


def _params_error(path: str, problem: str) -> BadParams:
    return BadParams(f"invalid params: path {problem}", [{"field": "path", "error": problem}])


def locate(path: str, roots: tuple[str, ...], base: str) -> Located:
    """Place ``path`` (relative to ``base``, or absolute) under one of ``roots``, lexically.

    ``..`` is resolved on the text, before any file system lookup, so it can never climb
    out through a symlink; symlinks are then left to :func:`opened`.
    """
    if "\x00" in path:
        raise PathEscape("path contains a NUL byte", {"path": path})
    try:
        raw = os.fsencode(path)
    except UnicodeEncodeError:
        raise _params_error(path, "is not valid text (a lone surrogate)") from None
    if len(raw) > MAX_PATH:
        raise _params_error(path, f"is longer than {MAX_PATH} bytes")
    if any(len(part) > NAME_MAX for part in raw.split(b"/")):
        raise _params_error(path, f"has a component longer than {NAME_MAX} bytes")
    joined = os.path.normpath(os.path.join(base, path))  # an absolute path replaces base
    if joined.startswith("//"):
        joined = "/" + joined.lstrip("/")
    for root in roots:
        root = os.path.normpath(root)
        if joined == root:
            return Located(path, root, ".")
        if joined.startswith(root.rstrip("/") + "/"):
            return Located(path, root, joined[len(root.rstrip("/")) + 1 :])
    raise PathEscape(
        f"path {path!r} lies outside the allowed directories ({', '.join(roots)})",
        {"path": path, "allowed": list(roots)},
    )


class _Openat2:
    """openat2(2) through ctypes, probed once: None when the kernel or seccomp refuses it."""

    _fn: Any = None
    _probed = False

    @classmethod
    def get(cls) -> Any:
        if not cls._probed:
            cls._probed = True
            cls._fn = cls._load()
        return cls._fn

    @staticmethod
    def _load() -> Any:
        import ctypes
        import platform

        if platform.system() != "Linux" or platform.machine() == "alpha":
            return None

        class OpenHow(ctypes.Structure):
            _fields_ = (("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64))

        libc = ctypes.CDLL(None, use_errno=True)
        libc.syscall.restype = ctypes.c_long

        def openat2(dirfd: int, rel: bytes, flags: int, resolve: int) -> int:
            how = OpenHow(flags | os.O_CLOEXEC, 0, resolve)
            fd = int(
                libc.syscall(
                    ctypes.c_long(_SYS_OPENAT2),
                    ctypes.c_int(dirfd),
                    ctypes.c_char_p(rel),
                    ctypes.byref(how),
                    ctypes.c_size_t(ctypes.sizeof(how)),
                )
            )
            if fd < 0:
                err = ctypes.get_errno()
                raise OSError(err, os.strerror(err))
            return fd

        try:
            os.close(openat2(-100, b".", os.O_PATH, _RESOLVE_BENEATH))  # AT_FDCWD
        except OSError as exc:
            if exc.errno in (errno.ENOSYS, errno.EPERM):
                return None
            raise
        return openat2


def openat2_available() -> bool:
    return _Openat2.get() is not None


def _open_nofollow(root_fd: int, rel: str, flags: int) -> int:
    """The fallback: one component at a time, never following a symlink."""
    parts = [p for p in rel.split("/") if p not in ("", ".")]
    fd = os.open(".", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=root_fd)
    try:
        for part in parts[:-1]:
            nxt = os.open(part, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            mode = os.fstat(nxt).st_mode
            os.close(fd)
            fd = nxt
            if stat.S_ISLNK(mode):
                raise OSError(errno.ELOOP, "a symlink on the way")
            if not stat.S_ISDIR(mode):
                raise OSError(errno.ENOTDIR, os.strerror(errno.ENOTDIR))
        last = parts[-1] if parts else "."
        try:
            return os.open(last, flags | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
        except NotADirectoryError:  # O_DIRECTORY | O_NOFOLLOW on a symlink: say it was a symlink
            if stat.S_ISLNK(os.stat(last, dir_fd=fd, follow_symlinks=False).st_mode):
                raise OSError(errno.ELOOP, "a symlink at the end") from None
            raise
    finally:
        os.close(fd)


def open_beneath(root_fd: int, rel: str, flags: int) -> int:
    """An fd for ``rel`` resolved by the kernel beneath ``root_fd``; OSError as the kernel says."""
    fn = _Openat2.get()
    if fn is None:
        return _open_nofollow(root_fd, rel, flags)
    for _ in range(8):  # EAGAIN: a concurrent rename raced a ".." inside a symlink; try again
        try:
            return int(fn(root_fd, os.fsencode(rel), flags, _RESOLVE_BENEATH | _RESOLVE_NO_MAGICLINKS))
        except OSError as exc:
            if exc.errno != errno.EAGAIN:
                raise
    raise OSError(errno.EAGAIN, "the path kept changing while it was opened")


def translate(exc: OSError, loc: Located) -> Exception:
    """The tool error for an OSError met while opening ``loc`` (one place, one wording)."""
    p = loc.given
    code = exc.errno
    if code == errno.ENOENT:
        return ToolError(f"no such file or directory: {p!r}", {"path": p})
    if code in (errno.EXDEV, errno.ELOOP):
        return PathEscape(
            f"path {p!r} leads out of {loc.root} through a symlink (or runs into one that cannot be followed safely)",
            {"path": p, "allowed": [loc.root]},
        )
    if code in (errno.EACCES, errno.EPERM):
        return ToolError(f"permission denied: {p!r} is not readable by the sandbox user", {"path": p})
    if code == errno.ENOTDIR:
        return ToolError(f"not a directory: {p!r}", {"path": p})
    if code == errno.ENAMETOOLONG:
        return _params_error(p, "is too long")
    return ToolError(f"cannot open {p!r}: {exc.strerror}", {"path": p})


@contextmanager
def root_fd(root: str) -> Iterator[int]:
    """A directory fd of a root (a trusted path: /workspace, /scratch, or --sandbox none's temp dirs)."""
    try:
        fd = os.open(root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        raise ToolError(f"{root} is not available in this sandbox: {exc.strerror}", {"root": root}) from None
    try:
        yield fd
    finally:
        os.close(fd)


@contextmanager
def opened(loc: Located, flags: int) -> Iterator[int]:
    """Open ``loc`` beneath its root with ``flags``; tool errors for every failure."""
    with root_fd(loc.root) as rfd:
        try:
            fd = open_beneath(rfd, loc.rel, flags)
        except OSError as exc:
            raise translate(exc, loc) from None
        try:
            yield fd
        finally:
            os.close(fd)
