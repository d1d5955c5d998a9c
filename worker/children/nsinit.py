"""``python3 -I -S nsinit.py [--keep] -- ARGV``: start ARGV in user, PID and mount namespaces of its own (gVisor).

Used by ``worker.children.namespaces`` (read its docstring for why). Stand-alone on purpose: it runs
with ``-I`` (no PYTHONPATH, no user site, no script directory from scratch), imports only the
standard library, and keeps nothing of the worker's.

Steps, each fatal if it fails (exit 126 with the reason on stderr, and ARGV never runs):
1. ``unshare(CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWPID)``, then the identity map of the
   caller's uid and gid (the tool keeps its uid; scratch's files keep their owner).
2. fork: the child is PID 1 of the new PID namespace. This process waits for it and ends as it
   ended (its exit status, or killed by the same signal), so the worker sees the tool's own end.
3. in the child: every mount private, a new /proc (it shows this namespace only), the capability
   bounding set emptied, and a seccomp filter stacked on the container's that refuses mount,
   umount2, unshare, setns and the rest of the mount API. Threat: tool code, root in a user
   namespace it makes itself, remounting the read-only workspace or unmounting the /proc it was
   given. gVisor does not lock a read-only mount inherited into a new user namespace, so only
   refusing the calls holds (tests/security/test_tool_namespaces.py). Every capability is dropped
   (capset), then ARGV is exec'd.
"""

from __future__ import annotations

import ctypes
import os
import signal
import struct
import sys

CLONE_NEWNS, CLONE_NEWUSER, CLONE_NEWPID = 0x00020000, 0x10000000, 0x20000000
MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REC, MS_PRIVATE = 0x2, 0x4, 0x8, 0x4000, 0x40000
PR_SET_PDEATHSIG, PR_CAPBSET_DROP, PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 1, 24, 22, 2
EXIT_NOT_ISOLATED = 126
_LINUX_CAPABILITY_VERSION_3 = 0x20080522

# (audit arch, {syscall: number}) per machine; what the stacked filter refuses with EPERM
_MOUNT_API = ("open_tree", "move_mount", "fsopen", "fsconfig", "fsmount", "fspick", "mount_setattr")
ARCHES = {
    "x86_64": (
        0xC000003E,
        {"mount": 165, "umount2": 166, "unshare": 272, "setns": 308, "pivot_root": 155, "chroot": 161}
        | dict(zip(_MOUNT_API, (428, 429, 430, 431, 432, 433, 442), strict=True)),
    ),
    "aarch64": (
        0xC00000B7,
        {"mount": 40, "umount2": 39, "unshare": 97, "setns": 268, "pivot_root": 41, "chroot": 51}
        | dict(zip(_MOUNT_API, (428, 429, 430, 431, 432, 433, 442), strict=True)),
    ),
}
# clone3 answers ENOSYS, so glibc falls back to clone, whose namespace flags the container's profile
# refuses: with clone3 a call made a user namespace of its own, and gVisor honours the capabilities
# held there beyond it (CAP_NET_ADMIN over the sandbox's network namespace: loopback deleted for later
# calls; RLIMIT_NPROC not applied: enough processes crashed the sandbox). The container's profile
# cannot refuse clone3 (runsc's OCI seccomp answers EPERM whatever errno it asks for, and no thread
# could start); a filter a process installs itself gets the errno it asks for.
CLONE3 = 435  # the same on x86_64 and aarch64
# calls a caller may also have answered ENOSYS (worker.copyfs: mincore, an exact oracle of the page cache of files
# the caller owns, which a cached workspace copy's runs share)
MORE_ENOSYS = {"x86_64": {"mincore": 27}, "aarch64": {"mincore": 232}}
_X32_BIT = 0x40000000
_RET_ALLOW, _RET_ERRNO_EPERM, _RET_ERRNO_ENOSYS = 0x7FFF0000, 0x00050000 | 1, 0x00050000 | 38
_LD_ABS_W, _JEQ_K, _JGE_K, _RET_K = 0x20, 0x15, 0x35, 0x06


def filter_program(machine: str, enosys: tuple[str, ...] = ()) -> list[tuple[int, int, int, int]]:
    """The stacked seccomp filter, as classic BPF (code, jt, jf, k): refuse ``ARCHES[machine]``'s
    calls, any other architecture and the x32 numbers (EPERM), answer clone3 ENOSYS (and ``enosys``, names of
    ``MORE_ENOSYS``); allow the rest (the container's own profile still decides everything else)."""
    arch, numbers = ARCHES[machine]
    nrs = sorted(numbers.values())
    more = sorted(MORE_ENOSYS[machine][name] for name in enosys)
    n, m = len(nrs), len(more)
    # layout: 0 ld arch; 1 jeq arch; 2 ld nr; 3 jge x32; 4 jeq clone3; 5.. jeq each (EPERM), jeq each (ENOSYS);
    # allow; deny; enosys
    allow = 5 + n + m
    deny, enosys_at = allow + 1, allow + 2
    prog = [
        (_LD_ABS_W, 0, 0, 4),
        (_JEQ_K, 0, deny - 2, arch),
        (_LD_ABS_W, 0, 0, 0),
        (_JGE_K, deny - 4, 0, _X32_BIT),
        (_JEQ_K, enosys_at - 5, 0, CLONE3),
    ]
    for i, nr in enumerate(nrs):
        here = 5 + i
        prog.append((_JEQ_K, deny - here - 1, 0, nr))
    for i, nr in enumerate(more):
        here = 5 + n + i
        prog.append((_JEQ_K, enosys_at - here - 1, 0, nr))
    prog += [(_RET_K, 0, 0, _RET_ALLOW), (_RET_K, 0, 0, _RET_ERRNO_EPERM), (_RET_K, 0, 0, _RET_ERRNO_ENOSYS)]
    return prog


def stack_filter(libc: ctypes.CDLL, enosys: tuple[str, ...] = ()) -> bool:
    """Stack :func:`filter_program` on the caller's filters (its no_new_privs is set: the container's
    no-new-privileges); False if the kernel refused. Also the cached copy's worker (worker.copyfs) and the port
    relay the engine execs in such a run (toolcage.lifecycle.ports) take it."""
    prog = filter_program(os.uname().machine, enosys)  # not platform: it imports re, ~10 ms here
    raw = b"".join(struct.pack("HBBI", *ins) for ins in prog)
    buf = ctypes.create_string_buffer(raw, len(raw))

    class SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    fprog = SockFprog(len(prog), ctypes.addressof(buf))
    return bool(libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0) == 0)


def _fail(libc: ctypes.CDLL, step: str) -> None:
    err = ctypes.get_errno()
    os.write(2, f"toolcage: the call could not be isolated ({step}: {os.strerror(err)})\n".encode())
    os._exit(EXIT_NOT_ISOLATED)


def enter(libc: ctypes.CDLL, keep: bool = False, bg: int = -1) -> None:
    """Steps 1 to 3 in this process: returns in PID 1 of the new namespaces, ready to run the tool;
    the process that called it stays outside, waits, and ends as the tool ends (never returns).

    ``keep`` (the policy's ``unsafe_background_processes``): what the tool leaves running in the
    background must outlive its call, which a PID namespace's end would not allow. PID 1 then stays
    (``_keeper``) and the tool returns from here as PID 2; the call ends when the tool does.

    ``bg`` (a background process, ``worker.children.background``: a descriptor, else -1): as ``keep``, and
    the keeper's pid is written there (the worker finds the namespace by it), and the keeper kills nothing
    when the tool ends: what it started lives in the namespace until the worker kills the keeper."""
    unshare(libc)
    keep = keep or bg >= 0
    told_r, told_w = os.pipe() if keep else (-1, -1)
    pid = os.fork()
    if pid != 0:
        if bg >= 0:
            os.write(bg, str(pid).encode())
            os.close(bg)
        if keep:
            os.close(told_w)
            _relay(pid, _read_status(told_r))
        _relay(pid)
    if bg >= 0:
        os.close(bg)
    # the worker's kill of the call's group ends the outside process; this one dies with it, and
    # everything in the namespace with this one
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        _fail(libc, "prctl(PR_SET_PDEATHSIG)")
    become_init(libc)
    if keep:
        os.close(told_r)
        _keeper(libc, told_w)


def unshare(libc: ctypes.CDLL) -> None:
    """Step 1: new user, mount and PID namespaces (the next child of this process is PID 1 of the
    new one) and the identity map of the caller's uid and gid. The zygote's middle process calls it
    before it forks the call's process, which so becomes PID 1 with no process of ours in between."""
    uid, gid = os.getuid(), os.getgid()
    if libc.unshare(CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWPID) != 0:
        _fail(libc, "unshare")
    for name, line in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
        try:
            fd = os.open(f"/proc/self/{name}", os.O_WRONLY)
            try:
                os.write(fd, line.encode())
            finally:
                os.close(fd)
        except OSError as exc:
            if name != "setgroups":  # gVisor refuses it, and needs it not
                ctypes.set_errno(exc.errno or 0)
                _fail(libc, f"writing {name}")


def become_init(libc: ctypes.CDLL) -> None:
    """Step 3, in PID 1 of the new namespaces: its own session, /proc, no capability, the filter."""
    if os.getsid(0) != os.getpid():
        os.setsid()  # a session and process group of its own, as a subprocess child has
    if libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None) != 0:
        _fail(libc, "mount --make-rprivate /")
    if libc.mount(b"proc", b"/proc", b"proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None) != 0:
        _fail(libc, "mount proc")
    cap = 0
    while libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) == 0:
        cap += 1
    if cap == 0:
        _fail(libc, "prctl(PR_CAPBSET_DROP)")
    if not stack_filter(libc):
        _fail(libc, "seccomp")
    # and no capability left in the namespace: an exec would drop them (the uid is not 0 there), but
    # the zygote's fork runs the call without one; gVisor granted a raw socket on such a capability
    header = (ctypes.c_uint32 * 2)(_LINUX_CAPABILITY_VERSION_3, 0)
    data = (ctypes.c_uint32 * 6)()  # effective, permitted, inheritable: twice (64 bits), all zero
    if libc.capset(header, data) != 0:
        _fail(libc, "capset")


def _keeper(libc: ctypes.CDLL, told_w: int) -> None:
    """PID 1 that outlives the tool: fork it (returns there, as PID 2), wait for it, tell the outside
    how it ended, then stay, reaping, while anything it left runs: what the tool left in the background
    (`cmd &`, nohup, a daemon) lives on, as the worker leaves it under runc with
    ``unsafe_background_processes``, until the worker kills this keeper (a background process's end) or the
    run ends."""
    tool = os.fork()  # (become_init made this one a session of its own: the worker's kill at the call's end misses it)
    if tool == 0:
        os.close(told_w)
        os.setsid()  # the tool's own session and group, as a subprocess child has
        return
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):  # the call's pipes: the worker reads them until every holder has closed them
        os.dup2(devnull, fd)
    os.close(devnull)
    while True:
        pid, status = os.waitpid(-1, 0)
        if pid == tool:
            break
    libc.prctl(PR_SET_PDEATHSIG, 0, 0, 0, 0)  # the outside process ends now: this one stays
    os.write(told_w, status.to_bytes(4, "little"))
    os.close(told_w)
    while True:
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            os._exit(0)
        except InterruptedError:
            continue


def _read_status(fd: int) -> int | None:
    """The tool's wait status as its keeper tells it; None if the keeper died first."""
    data = b""
    while len(data) < 4:
        try:
            chunk = os.read(fd, 4 - len(data))
        except InterruptedError:
            continue
        if not chunk:
            return None
        data += chunk
    return int.from_bytes(data, "little")


def _relay(pid: int, status: int | None = None) -> None:
    """Wait for the tool (PID 1 inside) and end as it ended (``status``: as its keeper told it, which
    stays). Nothing else to do: the worker kills this process group at a timeout or cancel, and
    PID 1 inside dies with this process (PDEATHSIG), and with it the namespace."""
    while status is None:
        try:
            _, status = os.waitpid(pid, 0)
        except InterruptedError:
            continue
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        if sig not in (signal.SIGKILL, signal.SIGSTOP):
            signal.signal(sig, signal.SIG_DFL)  # Python ignores SIGPIPE, for one
        os.kill(os.getpid(), sig)
    os._exit(os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status))


def main(args: list[str]) -> None:
    keep = args[:1] == ["--keep"]
    args = args[1:] if keep else args
    bg, tty = -1, False
    if args[:1] == ["--bg"] and len(args) > 1:  # a background process: the descriptor to tell the keeper's pid
        bg, args = int(args[1]), args[2:]
    if args[:1] == ["--tty"]:  # on a terminal (its stdin): the tool's controlling terminal
        tty, args = True, args[1:]
    env = None
    if args[:1] == ["--env"] and len(args) > 1:  # a user's own image: the program's own environment
        import json

        env = json.loads(args[1])
        args = args[2:]
    if args[:1] != ["--"] or len(args) < 2:
        os.write(2, b"usage: nsinit.py [--keep] [--bg FD] [--tty] [--env JSON] -- ARGV\n")
        os._exit(2)
    enter(ctypes.CDLL(None, use_errno=True), keep, bg)
    if tty:
        controlling_tty()
    exec_tool(args[1:], env)


def controlling_tty() -> None:
    """Make the terminal on stdin this process's controlling terminal (a session of its own first), so
    that Ctrl-C typed on it is SIGINT to its foreground job. Also ``worker/children/ttyinit.py``'s."""
    import fcntl
    import termios

    try:
        os.setsid()
    except OSError:
        pass  # a session leader already
    try:
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)
    except OSError as exc:
        os.write(2, f"toolcage: the terminal could not be made the process's own ({exc.strerror})\n".encode())
        os._exit(126)


def exec_tool(argv: list[str], env: dict[str, str] | None = None) -> None:
    """Exec the call's program as ``subprocess`` would start it: every signal at its default (this
    interpreter ignores SIGPIPE and SIGXFSZ, and an ignored signal stays ignored across an exec:
    `yes | head -1` then saw EPIPE instead of dying of SIGPIPE). Also the zygote's. Never returns."""
    for s in signal.valid_signals():
        if s not in (signal.SIGKILL, signal.SIGSTOP):
            try:
                signal.signal(s, signal.SIG_DFL)
            except (OSError, ValueError):
                pass
    try:
        if env is None:
            os.execvp(argv[0], argv)  # noqa: S606 - the call's own program, as subprocess would start it
        else:
            os.execvpe(argv[0], argv, env)  # noqa: S606 - the same, in its image's environment
    except OSError as exc:
        # as subprocess reports it: the program could not be started
        os.write(2, f"toolcage: cannot run {argv[0]!r}: {exc.strerror}\n".encode())
        os._exit(127 if isinstance(exc, FileNotFoundError) else 126)


if __name__ == "__main__":  # (embedded in the zygote it has another name)
    main(sys.argv[1:])
