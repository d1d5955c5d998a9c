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

import contextlib
import errno
import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from toolcage.policies import contract
from toolcage.worker.errors import BadParams, PathEscape, ToolError
from toolcage.worker.tools.names import from_wire, to_wire

SCRATCH, WORKSPACE = contract.SCRATCH, contract.WORKSPACE  # (worker.settings sets the roots from here)

MAX_PATH = 4096  # PATH_MAX: longer is a params error, never an OSError deep inside a tool
NAME_MAX = 255  # bytes per component, as every Linux file system limits it

# writable paths of the image (writable=: /testbed, /usr/local), each a root of its own, named as it is
# mounted (a tmpfs the runner filled): set once at start from TOOLCAGE_WRITABLE (worker.settings)
_image_roots: tuple[str, ...] = ()


def set_image_roots(roots: tuple[str, ...]) -> None:
    """The run's writable image paths, as roots the tools place paths under (worker.settings)."""
    global _image_roots
    _image_roots = tuple(os.path.normpath(r) for r in roots if os.path.isabs(r) and os.path.normpath(r) != "/")


def image_roots() -> tuple[str, ...]:
    return _image_roots


_RESOLVE_NO_MAGICLINKS = 0x02
_RESOLVE_BENEATH = 0x08
_SYS_OPENAT2 = 437  # the same number on every Linux architecture but alpha


@dataclass(frozen=True)
class Located:
    """A path placed lexically under one root. ``name`` is the root as every tool shows it
    (/workspace or /scratch), ``real`` where it is on this machine (the same in a container;
    None when the run has no workspace), ``rel`` the rest (``"."`` for the root itself)."""

    given: str  # as the tool was given it (a quoted name, worker.tools.names, stays quoted)
    name: str
    real: str | None
    rel: str
    hint: str = ""  # said after "no such file": how a relative path was resolved

    @property
    def shown(self) -> str:
        """The resolved path, as errors and results name it: absolute, usable in any tool."""
        return self.show()

    def show(self, *parts: str) -> str:
        """A path under this one as results name it: quoted if it is not UTF-8 (worker.tools.names)."""
        return to_wire(os.path.normpath(os.path.join(self.name, self.rel, *parts)))


def _params_error(path: str, problem: str) -> BadParams:
    return BadParams(f"invalid params: path {problem}", [{"field": "path", "error": problem}])


def _beneath(path: str, root: str) -> str | None:
    """``path`` relative to ``root`` if it is ``root`` or beneath it (both normalised), else None."""
    if path == root:
        return "."
    if root == "/" or not path.startswith(root + "/"):
        return None
    return path[len(root) + 1 :]


def locate(path: str, workspace: str | None, scratch: str) -> Located:
    """Place ``path`` under /workspace or /scratch (or a writable path of the image: set_image_roots),
    lexically, by one rule for every tool: a relative path is relative to /scratch (run_python's working
    directory, where write_file writes), an absolute one names its root. With ``--sandbox none`` the local directories
    (``workspace``, ``scratch``) are accepted too, and stand for those names.

    ``..`` is resolved on the text, before any file system lookup, so it can never climb
    out through a symlink; symlinks are then left to :func:`opened`. A quoted name (one that
    is not UTF-8, as results show it: worker.tools.names) is unquoted first.
    """
    given = path
    path = from_wire(path)
    if "\x00" in path:
        raise PathEscape("path contains a NUL byte", {"path": to_wire(given)})
    try:
        raw = os.fsencode(path)
    except UnicodeEncodeError:
        raise _params_error(path, "is not valid text (a lone surrogate)") from None
    if len(raw) > MAX_PATH:
        raise _params_error(path, f"is longer than {MAX_PATH} bytes")
    if any(len(part) > NAME_MAX for part in raw.split(b"/")):
        raise _params_error(path, f"has a component longer than {NAME_MAX} bytes")
    joined = os.path.normpath(os.path.join(SCRATCH, path))  # an absolute path replaces /scratch
    if joined.startswith("//"):
        joined = "/" + joined.lstrip("/")
    hint = ""
    if not os.path.isabs(path):
        hint = f"; a relative path is relative to {SCRATCH}, the working directory of run_python and run_shell"
        alt = os.path.normpath(os.path.join(WORKSPACE, path))
        if workspace is not None and _beneath(alt, WORKSPACE) not in (None, "."):
            hint += f"; for the workspace's, pass {to_wire(alt)!r}"
    # the names first, then (--sandbox none) the local directories they stand for
    for candidates in ((WORKSPACE, SCRATCH), (workspace, scratch)):
        for name, prefix in zip((WORKSPACE, SCRATCH), candidates, strict=True):
            if prefix is None:
                continue
            rel = _beneath(joined, os.path.normpath(prefix))
            if rel is not None:
                return Located(given, name, workspace if name == WORKSPACE else scratch, rel, hint)
        for root in _image_roots if candidates[0] == WORKSPACE else ():  # by their names, in a container
            rel = _beneath(joined, root)
            if rel is not None:
                return Located(given, root, root, rel, hint)
    allowed = ([WORKSPACE, SCRATCH] if workspace is not None else [SCRATCH]) + list(_image_roots)
    shown = to_wire(joined)
    raise PathEscape(
        f"path {shown!r} lies outside the allowed directories ({', '.join(allowed)})",
        {"path": to_wire(given), "resolved": shown, "allowed": allowed},
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


def dir_beneath(root: int, parts: list[str], create: bool, mode: int = 0o700) -> int:
    """An fd (``O_PATH``) of the directory ``parts`` beneath ``root`` (each made with ``mode`` when ``create``),
    opened component by component with ``O_NOFOLLOW``: never through a symlink (OSError: ELOOP or ENOTDIR on
    the way, ENOENT when missing). Both ends of a file transfer use it (the runner's toolcage.files too)."""
    fd = os.open(".", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=root)
    try:
        for part in parts:
            if create:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, mode, dir_fd=fd)
            nxt = os.open(part, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            os.close(fd)
            fd = nxt
    except BaseException:
        os.close(fd)
        raise
    return fd


class Parents:
    """:func:`dir_beneath` of an entry's parent (made when missing, with ``create``), the last one's fd kept
    and reused: a tar lists a directory's entries together, so 10,000 files cost one open each, not one per
    path component. The fds are ours (:meth:`close`); ``root`` stays the caller's. Both ends of a file
    transfer use it: the worker's upload, and the runner's download and workspace copy."""

    def __init__(self, root: int, create: bool) -> None:
        self.root, self._create = root, create
        self._last: tuple[list[str], int] | None = None

    def fd(self, parts: list[str]) -> int:
        if not parts:
            return self.root
        if self._last is not None and self._last[0] == parts:
            return self._last[1]
        fd = dir_beneath(self.root, parts, create=self._create)
        if self._last is not None:
            os.close(self._last[1])
        self._last = (parts, fd)
        return fd

    def close(self) -> None:
        if self._last is not None:
            os.close(self._last[1])
            self._last = None


def path_data(loc: Located, **extra: Any) -> dict[str, Any]:
    """``data`` of every path error: the path as given and as resolved."""
    return {"path": to_wire(loc.given), "resolved": loc.shown, **extra}


def translate(exc: OSError, loc: Located) -> Exception:
    """The tool error for an OSError met while opening ``loc`` (one place, one wording, naming
    the resolved path: "no such file" for ``s.txt`` says it looked at /scratch/s.txt)."""
    p = loc.shown
    code = exc.errno
    if code == errno.ENOENT:
        return ToolError(f"no such file or directory: {p!r}{loc.hint}", path_data(loc))
    if code in (errno.EXDEV, errno.ELOOP):
        return PathEscape(
            f"path {p!r} leads out of {loc.name} through a symlink (or runs into one that cannot be followed safely)",
            path_data(loc, allowed=[loc.name]),
        )
    if code in (errno.EACCES, errno.EPERM):
        return ToolError(f"permission denied: {p!r} is not readable by the sandbox user", path_data(loc))
    if code == errno.ENOTDIR:
        return ToolError(f"not a directory: {p!r}{loc.hint}", path_data(loc))
    if code == errno.ENAMETOOLONG:
        return _params_error(loc.given, "is too long")
    return ToolError(f"cannot open {p!r}: {exc.strerror}", path_data(loc))


def no_workspace(loc: Located) -> ToolError:
    """Asked for /workspace in a run without one: say so, rather than list an empty directory."""
    return ToolError(
        f"no workspace in this run, so there is no {loc.shown!r}: start the run with --workspace DIR "
        f"(Sandbox(workspace=DIR)); files written by the tools are under {SCRATCH}",
        path_data(loc, workspace=None),
    )


@contextmanager
def root_fd(root: str) -> Iterator[int]:
    """A directory fd of a root (a trusted path: /workspace, /scratch, or --sandbox none's local dirs)."""
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
    if loc.real is None:
        raise no_workspace(loc)
    with root_fd(loc.real) as rfd:
        try:
            fd = open_beneath(rfd, loc.rel, flags)
        except OSError as exc:
            raise translate(exc, loc) from None
        try:
            yield fd
        finally:
            os.close(fd)
