"""Files into a sandbox: ``Sandbox.upload`` writes a local file or directory as a tar, in bounded chunks.

The tar is made entry by entry from a generator (a header, then the file read 1 MiB at a time) and
sent 1 MiB at a time to the worker's ``upload`` tool (toolcage.worker.tools.upload), which checks
and extracts it: the runner holds one chunk whatever the size. Symlinks are sent as symlinks and
never followed, so nothing outside the local tree is read; FIFOs, sockets and devices are refused
before anything is sent. A directory's contents go into ``remote_dir``; a file goes there by its name.

The run's workspace copy (``base``) takes only what the sandbox user could read through the read-only
mount (toolcage.files.mountview): the runner reads with its own rights, often root's. A file uid/gid 65532
could not read is left out; a directory it could not list is there, empty; each is reported (``withheld``).
The workspace directory itself is the caller's grant (its mode keeps other local users out: mkdtemp and
pytest make 0700 ones); the rule applies to everything beneath it.
"""

from __future__ import annotations

import base64
import hashlib
import os
import queue
import stat
import tarfile
import threading
import zlib
from array import array
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from toolcage.errors import UploadError, UploadUsage, UsageError
from toolcage.files import mountview
from toolcage.files.download import refused_param
from toolcage.policies import codes
from toolcage.policies.gitignore import Rules, ignored, with_own
from toolcage.textsafe import escape
from toolcage.worker.protocol import NAMES_MAX
from toolcage.worker.tarheader import header
from toolcage.worker.tools.paths import Parents

if TYPE_CHECKING:
    from toolcage.results import CallResult

_MAX_WITHHELD = 100  # withheld names kept for the report (all are counted)
CHUNK = 2 << 20  # raw bytes per call, each sent as the call's data frame (toolcage.worker.protocol), not in its JSON
_PIECE = 1 << 20
DEFLATE_GAIN = 0.7  # a native copy's chunk is sent deflated when that makes it at most this much of its size
ZEROS_TO_DEFLATE = 0.5  # ... and only tried when at least this share of it is zeros (the tar's padding)

Call = Callable[[dict[str, Any]], "CallResult"]  # one ``upload`` call


@dataclass
class UploadResult:
    """What an upload wrote under ``remote_dir``: entries and bytes of file content."""

    remote_dir: str
    files: int = 0
    dirs: int = 0
    symlinks: int = 0
    bytes: int = 0
    withheld: list[str] = field(default_factory=list)  # left out of a workspace copy: the sandbox could not read them
    withheld_count: int = 0


class _Withheld(list[str]):
    """What a workspace copy left out (the first _MAX_WITHHELD names; ``total`` counts all)."""

    total = 0

    def add(self, name: str) -> None:
        self.total += 1
        if len(self) < _MAX_WITHHELD:
            self.append(name)


def _show(path: str) -> str:
    return escape(os.fsencode(path).decode("utf-8", "backslashreplace"))


def _kind(mode: int) -> str | None:
    """What an upload refuses, by name (None: a file, directory or symlink)."""
    if stat.S_ISREG(mode) or stat.S_ISDIR(mode) or stat.S_ISLNK(mode):
        return None
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "a device node"


def _refuse(path: str, kind: str) -> UploadUsage:
    return UploadUsage(f"upload: '{_show(path)}' is {kind}; an upload takes files, directories and symlinks")


def _walk(top: str) -> Iterator[tuple[str, str, list[str], list[str], dict[str, os.DirEntry[str]]]]:
    """``os.walk(top)`` (top-down; the ``dirnames`` the caller leaves in are walked in that order, never
    through a symlink: as ``os.walk``, an ``lstat`` asks right before each is entered, not when its parent
    was listed, so one swapped for a link while an earlier sibling was walked is left out; an unreadable
    directory is skipped) as ``(dirpath, rel, dirnames, filenames, entries)``: ``rel`` its path beneath
    ``top`` ("" for ``top``) and ``entries`` its ``os.DirEntry`` by name, whose ``path`` (joined in C) and
    ``stat`` spare a walk by path two joins a name: a fifth of a 100,000-file scan."""
    stack = [(top, "")]
    while stack:
        dirpath, rel = stack.pop()
        if rel and os.path.islink(dirpath):  # asked when it is entered, after its earlier siblings' walks
            continue
        try:
            with os.scandir(dirpath) as it:
                entries = {e.name: e for e in it}
        except OSError:
            continue
        dirnames: list[str] = []
        filenames: list[str] = []
        for name, e in entries.items():
            try:
                is_dir = e.is_dir()  # a symlink to a directory is listed with the directories, as os.walk does
            except OSError:
                is_dir = False
            (dirnames if is_dir else filenames).append(name)
        yield dirpath, rel, dirnames, filenames, entries
        prefix = f"{rel}/" if rel else ""
        for name in reversed(dirnames):
            got = entries.get(name)  # (a name the caller added: joined here)
            stack.append((got.path if got is not None else os.path.join(dirpath, name), prefix + name))


def _entries(
    local: str, gitignore: bool = False, withheld: _Withheld | None = None
) -> Iterator[tuple[str, str, os.stat_result | None]]:
    """(path on disk, name in the tar, its lstat if the walk took one) for each entry, never following a
    symlink; ``gitignore``: without what the tree's .gitignore files ignore (an ignored directory is not
    entered), nor ``.git``; ``withheld``: only what the sandbox user could read through the mount, the rest
    named there."""
    st = os.lstat(local)
    if not stat.S_ISDIR(st.st_mode):
        yield local, os.path.basename(local), st
        return
    stacks: dict[str, tuple[Rules, ...]] = {"": ()}
    for dirpath, rel, dirnames, filenames, found in _walk(local):
        prefix = f"{rel}/" if rel else ""
        if gitignore:
            stack = _rules_of(stacks.pop(rel, ()), dirpath, rel)
            keep = [d for d in dirnames if d != ".git" and not (stack and ignored(stack, prefix + d, True))]
            dirnames[:] = keep
            for d in keep:
                stacks[prefix + d] = stack
            filenames = [f for f in filenames if f != ".git" and not (stack and ignored(stack, prefix + f, False))]
        shut: list[str] = []  # directories copied empty: the sandbox could not list them
        seen: dict[str, os.stat_result] = {}
        if withheld is not None:
            dirnames[:], shut, filenames = _as_mounted(found, prefix, dirnames, filenames, withheld, seen)
        dirnames.sort()
        for base in sorted(dirnames + shut + filenames):
            yield found[base].path, prefix + base, seen.get(base)


def _as_mounted(
    found: dict[str, os.DirEntry[str]],
    prefix: str,
    dirnames: list[str],
    filenames: list[str],
    withheld: _Withheld,
    seen: dict[str, os.stat_result],
) -> tuple[list[str], list[str], list[str]]:
    """A directory's entries (``found``: by name) as the sandbox user would find them through the mount
    (toolcage.files.mountview): the directories to enter, those to copy empty, the files it could read
    (``seen``: the lstat of each)."""
    enter: list[str] = []
    shut: list[str] = []
    for d in dirnames:
        e = found[d]
        st = seen[d] = e.stat(follow_symlinks=False)
        if not stat.S_ISDIR(st.st_mode) or mountview.may(e.path, st, mountview.LIST):
            enter.append(d)  # a symlink is listed among the directories and never entered
        else:
            shut.append(d)
            withheld.add(f"{prefix}{d}/")
    files: list[str] = []
    for f in filenames:
        e = found[f]
        st = seen[f] = e.stat(follow_symlinks=False)
        if stat.S_ISREG(st.st_mode) and not mountview.may(e.path, st, mountview.READ):
            withheld.add(prefix + f)
        else:
            files.append(f)
    return enter, shut, files


def _rules_of(stack: tuple[Rules, ...], dirpath: str, rel: str) -> tuple[Rules, ...]:
    """``stack`` with the directory's own .gitignore (toolcage.policies.gitignore.with_own)."""
    try:
        dfd = os.open(dirpath, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return stack
    try:
        return with_own(stack, dfd, rel)
    finally:
        os.close(dfd)


_PAGE = 4096  # a tmpfs keeps each file's data in whole pages


SCAN_KEEP = 200_000  # names a scan keeps for the copy that follows it (beyond, the copy walks the tree again)


@dataclass
class Scan:
    """One walk of a workspace as its copy sends it (:func:`scan`): its size, and the names in the order sent,
    so that the copy (:func:`upload` with ``scanned=``) need not walk the tree again."""

    local: str
    gitignore: bool
    entries: int = 0
    size: int = 0  # the tmpfs space the files take, in whole pages
    names: list[str] | None = field(default_factory=list)  # None: more than SCAN_KEEP (bounded host memory)
    files: bytearray = field(default_factory=bytearray)  # per name: 1 if it was a regular file
    # per name, a regular file's inode and ctime as the walk saw them: the copy that finds the same two need not
    # read its ACL again (a chmod, chown or ACL change sets the ctime; a file replaced is another inode)
    inodes: array[int] = field(default_factory=lambda: array("Q"))
    ctimes: array[int] = field(default_factory=lambda: array("q"))
    withheld: _Withheld = field(default_factory=_Withheld)


def scan(local: str | os.PathLike[str], gitignore: bool = False) -> Scan:
    """Walk ``local`` once, as the workspace copy sends it: entries, size, names (up to SCAN_KEEP)."""
    got = Scan(os.path.abspath(os.fspath(local)), gitignore)
    for path, name, known in _entries(got.local, gitignore, got.withheld):
        got.entries += 1
        st = known or os.lstat(path)
        regular = stat.S_ISREG(st.st_mode)
        if got.names is not None:
            got.names.append(name)
            got.files.append(regular)
            got.inodes.append(st.st_ino if regular else 0)
            got.ctimes.append(st.st_ctime_ns if regular else 0)
            if len(got.names) > SCAN_KEEP:
                got.names, got.files, got.inodes, got.ctimes = None, bytearray(), array("Q"), array("q")
        if regular:
            got.size += -(-st.st_size // _PAGE) * _PAGE
    return got


def measure(local: str | os.PathLike[str], gitignore: bool = False) -> tuple[int, int]:
    """Entries under ``local`` as the workspace copy sends them, and the tmpfs space their files take (whole pages)."""
    got = scan(local, gitignore)
    return got.entries, got.size


def _listed(local: str, names: list[str]) -> Iterator[tuple[str, str, None]]:
    """A scan's entries again, without a walk (``_tar`` leaves out one gone since, as a walk now would)."""
    prefix = local.rstrip("/") + "/"  # local is absolute and normal, each name relative: no join needed
    for name in names:
        yield prefix + name, name, None


def _header(name: str, kind: bytes, st: os.stat_result, size: int = 0, linkname: str = "") -> bytes:
    return header(name, kind, st.st_mode, st.st_mtime, size, linkname)


@dataclass
class Sent:
    """What a tar of a walk held (``_tar`` counts as it writes): a native extraction's counts
    (toolcage.worker.tools.untar tells directories from the rest only)."""

    files: int = 0
    dirs: int = 0
    symlinks: int = 0
    bytes: int = 0
    # the files' and symlinks' names, as the tar holds them: kept only for a tar of a kept scan's names whose
    # names fit the worker's bound (``listing``); None: not kept (GNU tar in the sandbox names them)
    listed: list[str] | None = None


class _Beneath:
    """Each entry's parent directory opened beneath the root a component at a time, never through a symlink
    (``Parents``, the last one kept): the entries are opened, stat'ed and read by name relative to
    it. Threat: a directory swapped for a symlink after the scan listed what was under it; opened by path
    (``O_NOFOLLOW`` guards the last component only), the copy read the file of that name behind the link and
    sent it into the sandbox."""

    def __init__(self, root: str) -> None:
        self.root = os.open(root, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        self._parents = Parents(self.root, create=False)

    def parent(self, name: str) -> tuple[int, str]:
        """(the directory fd, the base name) of ``name`` (relative to the root); OSError when a component is
        gone, or is a symlink or a file now."""
        head, _, base = name.rpartition("/")
        return self._parents.fd(head.split("/") if head else []), base

    def close(self) -> None:
        self._parents.close()
        os.close(self.root)


def _tar(
    local: str,
    gitignore: bool,
    withheld: _Withheld | None = None,
    names: list[str] | None = None,
    counts: Sent | None = None,
    files: bytearray | None = None,
    scanned: Scan | None = None,
) -> Iterator[bytes]:
    """The tar of the walk of ``local``. With ``counts`` (a workspace copy, which the worker may hand to GNU
    tar, which keeps modes as they are): the modes as the worker's own extraction makes them, setuid, setgid
    and sticky cleared and directories owner-writable, and what it wrote counted. ``files``: which of the
    scan's ``names`` were regular files then (one byte each): those are opened at once, without an lstat
    first (one that is no longer a file is taken as what it is now). Beneath a directory ``local``, every
    entry is reached through its parent's descriptor (:class:`_Beneath`), never through a symlink."""
    beneath = _Beneath(local) if stat.S_ISDIR(os.lstat(local).st_mode) else None
    try:
        yield from _tar_entries(local, gitignore, withheld, names, counts, files, beneath, scanned)
    finally:
        if beneath is not None:
            beneath.close()
    yield bytes(2 * tarfile.BLOCKSIZE)


def _tar_entries(
    local: str,
    gitignore: bool,
    withheld: _Withheld | None,
    names: list[str] | None,
    counts: Sent | None,
    files: bytearray | None,
    beneath: _Beneath | None,
    scanned: Scan | None = None,
) -> Iterator[bytes]:
    listed = _listed(local, names) if names is not None else None
    for k, (path, name, _) in enumerate(_entries(local, gitignore, withheld) if listed is None else listed):
        if beneath is None:
            dfd, base = None, path  # an upload of one file: its own path
        else:
            try:
                dfd, base = beneath.parent(name)
            except OSError:
                if names is None:
                    raise
                continue  # gone since the scan, or beneath what is a link or a file now: left out
        if files is not None and files[k]:
            try:
                fd = os.open(base, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, dir_fd=dfd)
            except FileNotFoundError:
                continue  # gone since the scan: left out, as a walk now would
            except OSError:
                fd = -1  # a symlink now (ELOOP), or unreadable: the lstat below says what it is
            if fd >= 0:
                try:
                    fst = os.fstat(fd)
                    if stat.S_ISREG(fst.st_mode):
                        seen = (
                            scanned is not None
                            and fst.st_ino == scanned.inodes[k]
                            and fst.st_ctime_ns == scanned.ctimes[k]
                        )  # the file the walk checked, unchanged since: its verdict stands
                        yield from _file(path, name, fd, fst, withheld, counts, seen)
                        continue
                finally:
                    os.close(fd)
        try:
            st = os.stat(base, dir_fd=dfd, follow_symlinks=False)  # fresh: the walk's may be a moment old
        except FileNotFoundError:
            if names is None:
                raise
            continue  # gone since the scan: left out, as a walk now would
        if stat.S_ISDIR(st.st_mode):
            if counts is not None:
                counts.dirs += 1
                yield header(name, tarfile.DIRTYPE, (st.st_mode & 0o777) | 0o700, st.st_mtime)
                continue
            yield _header(name, tarfile.DIRTYPE, st)
        elif stat.S_ISLNK(st.st_mode):
            if counts is not None:
                counts.symlinks += 1
                if counts.listed is not None:
                    counts.listed.append(name)
            yield _header(name, tarfile.SYMTYPE, st, linkname=os.readlink(base, dir_fd=dfd))
        elif stat.S_ISREG(st.st_mode):
            # swapped for a link: refused, not followed
            fd = os.open(base, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dfd)
            try:
                fst = os.fstat(fd)
                if not stat.S_ISREG(fst.st_mode):
                    raise _refuse(path, _kind(fst.st_mode) or "no longer a file")
                yield from _file(path, name, fd, fst, withheld, counts)
            finally:
                os.close(fd)
        else:
            raise _refuse(path, _kind(st.st_mode) or "?")


_SMALL = 1 << 16  # a file up to this size is one piece: its header, its bytes and its padding
_ZEROS = bytes(tarfile.BLOCKSIZE)


def _file(
    path: str,
    name: str,
    fd: int,
    fst: os.stat_result,
    withheld: _Withheld | None,
    counts: Sent | None,
    seen: bool = False,
) -> Iterator[bytes]:
    """One regular file's entry (``fd`` open on it, ``fst`` its fstat): exactly the size it had then. ``seen``:
    the walk checked this very inode and nothing of its mode, owner or ACL has changed since (its ctime)."""
    acl = None if seen else mountview.access_acl(fd)  # (an ACL read is 2.5 us a file, most of it the ENODATA)
    if withheld is not None and not mountview.allows(fst, mountview.READ, acl):
        withheld.add(name)  # its mode changed since the walk: what is sent is what was checked
        return
    size = fst.st_size
    if counts is not None:
        counts.files += 1
        counts.bytes += size
        if counts.listed is not None:
            counts.listed.append(name)
        head = header(name, tarfile.REGTYPE, fst.st_mode & 0o777, fst.st_mtime, size)
    else:
        head = _header(name, tarfile.REGTYPE, fst, size)
    pad = _ZEROS[: -size % tarfile.BLOCKSIZE]
    if size <= _SMALL:
        data = os.pread(fd, size, 0) if size else b""
        if len(data) != size:
            raise UploadUsage(f"upload: '{_show(path)}' shrank while it was read; nothing was kept")
        yield b"".join((head, data, pad))
        return
    yield head
    sent = 0
    while sent < size:
        piece = os.pread(fd, min(_PIECE, size - sent), sent)
        if not piece:
            raise UploadUsage(f"upload: '{_show(path)}' shrank while it was read; nothing was kept")
        sent += len(piece)
        yield piece
    if pad:
        yield pad


def _chunks(pieces: Iterator[bytes]) -> Iterator[bytes]:
    """The tar in pieces of at most CHUNK bytes (one held at a time, plus the piece being cut)."""
    buf = bytearray()
    for piece in pieces:
        buf += piece
        while len(buf) >= CHUNK:
            yield bytes(memoryview(buf)[:CHUNK])  # one copy (a bytearray slice would make two)
            del buf[:CHUNK]
    yield bytes(buf)


def _answer(res: CallResult, first: bool) -> dict[str, Any]:
    if res.ok and isinstance(res.result, dict):
        return res.result
    err = res.error or {}
    msg = escape(str(err.get("message", res.status)))
    if err.get("code") == codes.METHOD_NOT_FOUND:
        raise UploadError("upload: this worker image has no upload tool; rebuild it (toolcage image build)")
    if first and res.status == "error":
        raise UploadUsage(f"upload: {msg}")
    raise UploadError(f"upload failed ({res.status}): {msg}")


def upload(
    call: Call,
    local_path: str | os.PathLike[str],
    remote_dir: str,
    *,
    gitignore: bool = False,
    base: bool = False,
    checked: bool = False,
    scanned: Scan | None = None,
) -> UploadResult:
    """Send ``local_path`` (a file or directory) into ``remote_dir`` in the sandbox (module doc).
    ``gitignore``: leave out what the tree's .gitignore files ignore, and .git; ``base``: this is the
    run's workspace copy (into /workspace, whose changes the worker then tracks); ``checked``: the tree was
    already checked for FIFOs, sockets and devices (a workspace is, by toolcage.workspace), so it is walked
    once, as it is sent (one found then still stops the upload). A ``base`` copy takes only what the sandbox
    user could read through the mount (module doc): ``withheld`` names what it left out. ``scanned``: the
    :func:`scan` of this very tree (a base copy's size check): its names are sent without a second walk."""
    local = source(local_path, gitignore=gitignore, walk=not checked)
    withheld = _Withheld() if base else None
    names, files = None, None
    same_tree = scanned is not None and scanned.local == local and scanned.gitignore == gitignore
    if base and same_tree and scanned is not None and scanned.names is not None:
        withheld, names, files = scanned.withheld, scanned.names, scanned.files  # what the walk withheld and found
    sent = Sent(listed=[] if names is not None and _fits(names) else None) if base else None
    tar = _tar(local, gitignore, withheld, names, counts=sent, files=files, scanned=scanned if names else None)
    got = send(call, tar, remote_dir, base=base, shown=local, sent=sent)
    if withheld is not None:
        got.withheld, got.withheld_count = list(withheld), withheld.total
    return got


def source(local_path: str | os.PathLike[str], *, gitignore: bool = False, walk: bool = True) -> str:
    """``local_path`` as an upload takes it (its absolute path), checked before anything is sent, since a
    problem here is the caller's mistake: UploadUsage for a path that is missing or a symlink, and (``walk``)
    for a FIFO, socket or device anywhere in the tree."""
    local = os.path.abspath(os.fspath(local_path))
    try:
        st = os.lstat(local)
    except OSError as exc:
        raise UploadUsage(f"upload: cannot read '{_show(local)}': {exc.strerror}") from None
    if stat.S_ISLNK(st.st_mode):
        raise UploadUsage(f"upload: '{_show(local)}' is a symlink; upload what it points to, or its directory")
    for path, _, _ in _entries(local, gitignore) if walk else ():
        kind = _kind(os.lstat(path).st_mode)
        if kind is not None:
            raise _refuse(path, kind)
    return local


def send(
    call: Call,
    tar: Iterator[bytes],
    remote_dir: str,
    *,
    base: bool = False,
    shown: str = "",
    sent: Sent | None = None,
) -> UploadResult:
    """Send the tar ``tar`` yields into ``remote_dir``, in chunks (an OSError or UploadUsage while it is
    made aborts the stream: the worker keeps nothing). ``sent``: the tar is ``_tar``'s walk of a workspace
    copy, counted there: the worker may extract it with its runtime's GNU tar (``native``)."""
    opening = {"path": remote_dir, **({"base": True} if base else {})}
    native = base and sent is not None
    offer = {"native": True, **({"listed": True} if sent is not None and sent.listed is not None else {})}
    res = call({**opening, **offer} if native else opening)
    if native and "listed" in offer and refused_param(res, "listed"):  # a worker from before it
        res = call({**opening, "native": True})
    if native and refused_param(res, "native"):  # a worker from before that
        res = call(opening)
    ans = _answer(res, True)
    stream = str(ans.get("stream", ""))
    # a worker that says it takes data frames gets them; one from before them (an image derived from an older
    # worker image) gets base64 with a sha256, as it always did
    framed = ans.get("frames") is True
    deflate = _Deflate() if framed and sent is not None and ans.get("deflate") is True else None
    # the worker takes our names of the entries
    listed = framed and sent is not None and sent.listed is not None and ans.get("listed") is True
    ahead = _Ahead(_chunks(tar))  # the next chunk is made while the worker takes this one
    try:
        item = ahead.next()
        while item is not None:
            nxt = ahead.next()
            chunk = (deflate.chunk(item) if deflate is not None else {"frame": item}) if framed else _base64(item)
            ans = _answer(call({"stream": stream, **chunk, "done": nxt is None and not listed}), False)
            item = nxt
        if listed:
            assert sent is not None and sent.listed is not None
            ans = _send_names(call, stream, sent.listed, deflate)
    except OSError as exc:  # the local tree changed under the walk
        call({"stream": stream, "abort": True})  # the worker drops what it extracted
        raise UploadUsage(f"upload: reading '{_show(shown)}' failed: {exc.strerror}; nothing was kept") from None
    except (UploadUsage, UsageError):
        call({"stream": stream, "abort": True})
        raise
    finally:
        ahead.stop()
    if ans.get("native") is True and sent is not None:  # GNU tar told the worker names, not kinds: ours
        return UploadResult(str(ans.get("path", remote_dir)), sent.files, sent.dirs, sent.symlinks, sent.bytes)
    files, dirs, symlinks, size = (int(ans.get(k, 0)) for k in ("files", "dirs", "symlinks", "bytes"))
    return UploadResult(str(ans.get("path", remote_dir)), files, dirs, symlinks, size)


def _fits(names: list[str]) -> bool:
    """Whether the names of a scan (its directories too: a bound) fit what the worker takes after a tar
    (NAMES_MAX, "\0"-separated): by their characters first, as UTF-8 takes at most 4 bytes for one, then exactly."""
    chars = sum(map(len, names)) + len(names)
    if 4 * chars <= NAMES_MAX:
        return True
    return sum(len(n.encode("utf-8", "surrogateescape")) for n in names) + len(names) <= NAMES_MAX


def _send_names(call: Call, stream: str, names: list[str], deflate: _Deflate | None) -> dict[str, Any]:
    """After a listed stream's tar: the names of its files and symlinks, "\0"-separated, in chunks (the last one
    done). GNU tar in the sandbox need not name each entry as it makes it, nor the worker read those lines."""
    data = "\0".join(names).encode("utf-8", "surrogateescape")  # the names as the tar holds them (os.fsencode's)
    pieces = [data[i : i + CHUNK] for i in range(0, len(data), CHUNK)] or [b""]
    ans: dict[str, Any] = {}
    for k, piece in enumerate(pieces):
        chunk = deflate.chunk(piece, names=True) if deflate is not None else {"frame": piece}
        ans = _answer(call({"stream": stream, **chunk, "names": True, "done": k == len(pieces) - 1}), False)
    return ans


class _Deflate:
    """A native copy's chunks, zlib-compressed where that pays (worker.tools.untar): the tar of a tree of small
    files is mostly headers and padding, zeros (100,000 files of 100 B: 97 MiB of tar, 1.4 MiB deflated), and
    each byte saved is one the engine's attach stream and the worker's hand-off need not copy. Only a chunk
    at least ZEROS_TO_DEFLATE zeros is tried (a count at memory speed): a repository of source files (few
    zeros) or of compressed files would pay the level-1 compressor for little or nothing (a 4.6 MiB
    repository's copy started 45 ms later when every chunk was deflated)."""

    def chunk(self, item: bytes, names: bool = False) -> dict[str, Any]:
        if not names and item.count(0) < len(item) * ZEROS_TO_DEFLATE:  # (names: paths, which repeat a lot)
            return {"frame": item}
        packed = zlib.compress(item, 1)
        if len(packed) <= len(item) * DEFLATE_GAIN:
            return {"frame": packed, "deflated": True}
        return {"frame": item}


def _base64(data: bytes) -> dict[str, str]:
    return {"data": base64.b64encode(data).decode("ascii"), "sha256": hashlib.sha256(data).hexdigest()}


class _Ahead:
    """``items`` made on a thread of their own, at most two ahead of the caller (bounded memory): reading
    and packing the next chunk overlaps the worker extracting this one. Errors come out of ``next``."""

    _END = object()

    def __init__(self, items: Iterator[Any]) -> None:
        self._q: queue.Queue[Any] = queue.Queue(maxsize=2)
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(items,), name="toolcage-upload-ahead", daemon=True)
        self._thread.start()

    def _put(self, item: Any) -> bool:
        while not self._stopped.is_set():
            try:
                self._q.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _run(self, items: Iterator[Any]) -> None:
        try:
            for item in items:
                if not self._put(item):
                    return
            self._put(self._END)
        except BaseException as exc:  # handed to the caller
            self._put(exc)

    def next(self) -> Any:
        """The next item, None at the end; the producer's error, raised here."""
        item = self._q.get()
        if item is self._END:
            return None
        if isinstance(item, BaseException):
            raise item
        return item

    def stop(self) -> None:
        self._stopped.set()
        self._thread.join()


__all__ = ["Scan", "Sent", "UploadError", "UploadResult", "UploadUsage", "measure", "scan", "send", "source", "upload"]
