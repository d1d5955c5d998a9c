"""toolcage's own seccomp profile: Docker's default allowlist minus what tool code never needs.

Docker's default profile (moby ``profiles/seccomp/default.json``) is an allowlist; this one
starts from the same unconditional allowlist, keeps only the native architectures (no
32-bit compat entry points), and takes away the calls that let sandboxed code reach
another process (``ptrace``, ``process_vm_*``, ``pidfd_getfd``, ``kcmp``; ``prlimit64``,
``setpriority``, ``ioprio_set`` and ``sched_set*`` are kept for the caller itself only), the kernel's
riskiest surfaces for a local attacker (``io_uring_*``, ``userfaultfd``, ``bpf``,
``perf_event_open``, the keyring calls) and exotic socket families and personas.
Capability-gated entries of Docker's profile are left out: the sandbox drops every
capability, so they could never apply.

``python -m toolcage.engine.seccomp`` prints the profile; ``runner/engine/seccomp.json`` is that output,
shipped for operators (``docker run --security-opt seccomp=runner/engine/seccomp.json``), and a
unit test keeps the two identical.
"""

from __future__ import annotations

import hashlib
import json
import os
from functools import cache
from typing import Any

EPERM = 1
ENOSYS = 38

# Allowed unconditionally (Docker's default set, native x86_64/aarch64 names only).
ALLOWED: tuple[str, ...] = (
    # files and directories
    "access", "chdir", "chmod", "chown", "close", "close_range", "copy_file_range", "creat", "dup", "dup2",
    "dup3", "faccessat", "faccessat2", "fadvise64", "fallocate", "fchdir", "fchmod", "fchmodat", "fchown",
    "fchownat", "fcntl", "fdatasync", "fgetxattr", "flistxattr", "flock", "fremovexattr", "fsetxattr",
    "fstat", "fstatfs", "fsync", "ftruncate", "futimesat", "getcwd", "getdents", "getdents64", "getxattr",
    "inotify_add_watch", "inotify_init", "inotify_init1", "inotify_rm_watch", "lchown", "lgetxattr",
    "link", "linkat", "listxattr", "llistxattr", "lremovexattr", "lseek", "lsetxattr", "lstat", "mkdir",
    "mkdirat", "mknod", "mknodat", "newfstatat", "open", "openat", "openat2", "pread64", "preadv",
    "preadv2", "pwrite64", "pwritev", "pwritev2", "read", "readahead", "readlink", "readlinkat", "readv",
    "removexattr", "rename", "renameat", "renameat2", "rmdir", "sendfile", "setxattr", "splice", "stat",
    "statfs", "statx", "symlink", "symlinkat", "sync", "sync_file_range", "syncfs", "tee", "truncate",
    "umask", "unlink", "unlinkat", "utime", "utimensat", "utimes", "vmsplice", "write", "writev",
    # asynchronous I/O (the classic kind; io_uring is denied below)
    "io_cancel", "io_destroy", "io_getevents", "io_pgetevents", "io_setup", "io_submit",
    # polling, events, timers, clocks
    "epoll_create", "epoll_create1", "epoll_ctl", "epoll_ctl_old", "epoll_pwait", "epoll_pwait2",
    "epoll_wait", "epoll_wait_old", "eventfd", "eventfd2", "poll", "ppoll", "pselect6", "select",
    "alarm", "clock_getres", "clock_gettime", "clock_nanosleep", "getitimer", "gettimeofday", "nanosleep",
    "setitimer", "time", "timer_create", "timer_delete", "timer_getoverrun", "timer_gettime",
    "timer_settime", "timerfd_create", "timerfd_gettime", "timerfd_settime", "times", "adjtimex",
    "clock_adjtime",
    # memory
    "brk", "madvise", "membarrier", "memfd_create", "mincore", "mlock", "mlock2", "mlockall", "mmap",
    "mprotect", "mremap", "msync", "munlock", "munlockall", "munmap", "pkey_alloc", "pkey_free",
    "pkey_mprotect", "remap_file_pages",
    # processes, threads, signals (clone is allowed below without namespace flags)
    "capget", "capset", "execve", "execveat", "exit", "exit_group", "fork", "vfork", "futex", "futex_waitv",
    "get_robust_list", "set_robust_list", "get_thread_area", "set_thread_area", "set_tid_address",
    "getcpu", "getegid", "geteuid", "getgid", "getgroups", "getpgid", "getpgrp", "getpid", "getppid",
    "getpriority", "getrandom", "getresgid", "getresuid", "getrlimit", "getrusage", "getsid", "gettid",
    "getuid", "ioprio_get", "kill", "tgkill", "tkill", "pause", "pidfd_open",
    "pidfd_send_signal", "prctl", "process_mrelease", "restart_syscall", "rseq",
    "rt_sigaction", "rt_sigpending", "rt_sigprocmask", "rt_sigqueueinfo", "rt_sigreturn", "rt_sigsuspend",
    "rt_sigtimedwait", "rt_tgsigqueueinfo", "sched_get_priority_max", "sched_get_priority_min",
    "sched_getaffinity", "sched_getattr", "sched_getparam", "sched_getscheduler", "sched_rr_get_interval",
    "sched_yield", "seccomp",
    "setfsgid", "setfsuid", "setgid", "setgroups", "setpgid", "setregid", "setresgid",
    "setresuid", "setreuid", "setrlimit", "setsid", "setuid", "sigaltstack", "signalfd", "signalfd4",
    "sysinfo", "uname", "wait4", "waitid", "landlock_add_rule", "landlock_create_ruleset",
    "landlock_restrict_self",
    # pipes, sockets (socket() itself is allowed below for a few families only)
    "pipe", "pipe2", "accept", "accept4", "bind", "connect", "getpeername", "getsockname", "getsockopt",
    "listen", "recvfrom", "recvmmsg", "recvmsg", "sendmmsg", "sendmsg", "sendto", "setsockopt", "shutdown",
    "socketpair", "ioctl",
    # System V IPC and POSIX message queues (private IPC namespace; the worker clears them per call)
    "mq_getsetattr", "mq_notify", "mq_open", "mq_timedreceive", "mq_timedsend", "mq_unlink", "msgctl",
    "msgget", "msgrcv", "msgsnd", "semctl", "semget", "semop", "semtimedop", "shmat", "shmctl", "shmdt",
    "shmget",
    # architecture specific
    "arch_prctl", "modify_ldt",
)  # fmt: skip

# Denied on purpose, with the threat each stops. Docker's default allows the first group.
DENIED: dict[str, str] = {
    "ptrace": "reading or steering another process of the sandbox user (the worker, a connector)",
    "process_vm_readv": "reading another process's memory",
    "process_vm_writev": "writing another process's memory",
    "pidfd_getfd": "stealing another process's file descriptors (the protocol stream)",
    "kcmp": "probing another process's file descriptors and memory",
    "process_madvise": "acting on another process's memory",
    "io_uring_setup": "io_uring: a large, often-exploited kernel surface that also bypasses seccomp per operation",
    "io_uring_enter": "io_uring",
    "io_uring_register": "io_uring",
    "userfaultfd": "stalling the kernel mid-copy, a building block of use-after-free exploits",
    "perf_event_open": "kernel performance counters: side channels and a history of local exploits",
    "bpf": "loading programs into the kernel",
    "keyctl": "the kernel keyring, not namespaced",
    "add_key": "the kernel keyring, not namespaced",
    "request_key": "the kernel keyring, not namespaced",
    "name_to_handle_at": "file handles that can name files outside the mount (with open_by_handle_at)",
    "open_by_handle_at": "opening files by handle, outside the mount namespace",
    "fanotify_init": "watching the file system wholesale",
    "fanotify_mark": "watching the file system wholesale",
    "memfd_secret": "memory hidden from the kernel's own inspection",
    "unshare": "new namespaces (user namespaces open large kernel surfaces)",
    "setns": "joining other namespaces",
    "mount": "changing mounts",
    "umount2": "changing mounts",
    "pivot_root": "changing the root",
    "chroot": "changing the root",
    "clone3": "namespace flags are hidden in a struct seccomp cannot inspect (ENOSYS: libc falls back to clone)",
}

# Same-uid process controls, allowed only on the caller itself: the kernel lets any process of the
# sandbox user set these on any other (the worker, the zygote, a connector), and a lowered limit or
# priority there breaks or starves every later call of the run. Each entry is (syscall, conditions);
# a call is allowed when every condition of one of its entries holds: (argument index, value).
SELF_ONLY: dict[str, list[list[tuple[int, int]]]] = {
    # prlimit64(pid, resource, new, old): any process's own (pid 0); others' only read (new == NULL)
    "prlimit64": [[(0, 0)], [(2, 0)]],
    # setpriority(which, who, prio): PRIO_PROCESS or PRIO_PGRP of the caller (who 0); never PRIO_USER
    "setpriority": [[(0, 0), (1, 0)], [(0, 1), (1, 0)]],
    # ioprio_set(which, who, prio): IOPRIO_WHO_PROCESS or _PGRP of the caller; never _USER
    "ioprio_set": [[(0, 1), (1, 0)], [(0, 2), (1, 0)]],
    # sched_set*(pid, ...): the calling thread (pid 0); pthread_setaffinity_np on another thread
    # of the caller is refused too, which code treats as the hint it is
    "sched_setaffinity": [[(0, 0)]],
    "sched_setattr": [[(0, 0)]],
    "sched_setparam": [[(0, 0)]],
    "sched_setscheduler": [[(0, 0)]],
}

# socket(2) families tool code may open: no raw, packet, crypto (AF_ALG), vsock, bluetooth, ...
SOCKET_FAMILIES = {"AF_UNIX": 1, "AF_INET": 2, "AF_INET6": 10, "AF_NETLINK": 16}
# and of the IP families only streams and datagrams (ICMP "ping" sockets are datagrams): never SOCK_RAW.
# Threat: a raw socket forging packets on the sandbox's loopback (its egress relay). With no
# CAP_NET_RAW the kernel refuses one; under gVisor a process that makes a user namespace with
# clone3 (allowed there, see profile()) holds CAP_NET_RAW in it, and gVisor granted the socket.
IP_FAMILIES = ("AF_INET", "AF_INET6")
IP_SOCKET_TYPES = {"SOCK_STREAM": 1, "SOCK_DGRAM": 2}
SOCK_TYPE_MASK = 0xF  # SOCK_NONBLOCK and SOCK_CLOEXEC are flags above it
# personality(2): only the default Linux persona, and the query form
PERSONAS = {"PER_LINUX": 0, "query": 0xFFFFFFFF}
# clone(2) flags that create namespaces: CLONE_NEWNS|NEWCGROUP|NEWUTS|NEWIPC|NEWUSER|NEWPID|NEWNET
CLONE_NAMESPACE_FLAGS = 0x7E020000


# Refused under gVisor only: System V IPC objects and POSIX message queues, which gVisor gives no way
# to list (no /proc/sysvipc, no /dev/mqueue; SHM_INFO/MSG_INFO and *_STAT by index do not work there),
# so the sweep after a call could not clear them and a call could leave data for the next one.
GVISOR_UNLISTABLE_IPC = ("mq_open", "msgget", "semget", "shmget")
# Allowed under gVisor only: the worker starts tool code in user, PID and mount namespaces of its own
# (toolcage.worker.children.namespaces, through worker/children/nsinit.py), since gVisor's procfs would show it the
# worker's descriptors. These namespaces are the sentry's; the host kernel's surface does not grow.
# nsinit takes both calls (and clone3's namespaces) away from tool code again with a filter of its own.
GVISOR_NAMESPACES = ("mount", "unshare")


# Allowed in a run with a cached workspace copy only (runc): the worker lays the copy's overlay at boot in a user
# and mount namespace of its own (toolcage.worker.copyfs), then stacks a filter that refuses them again (and the
# rest of the mount API) before anything of the run executes; every process of the run descends from it.
COPY_BOOT = ("mount", "unshare")


@cache
def profile(gvisor: bool = False, copy: bool = False) -> dict[str, Any]:
    """The profile as Docker's seccomp JSON (``SecurityOpt: seccomp=<json>``).

    ``gvisor``: the variant for gVisor's runsc (run with ``--oci-seccomp``, which applies it inside
    gVisor's kernel). There ``clone3`` is allowed: runsc's seccomp (Debian's 2022 release) answers
    EPERM whatever ``errnoRet`` says, so glibc would not fall back to ``clone`` and no thread could
    start (tool code gets ENOSYS for it from nsinit's stacked filter, worker/children/nsinit.py). And
    ``GVISOR_UNLISTABLE_IPC`` is refused, ``GVISOR_NAMESPACES`` allowed.

    ``copy``: the variant for a run with a cached workspace copy (runc only): ``COPY_BOOT`` allowed."""
    assert not (gvisor and copy), "a cached copy is laid under runc only"
    overlap = (set(ALLOWED) & set(DENIED)) | (set(ALLOWED) & set(SELF_ONLY)) | (set(DENIED) & set(SELF_ONLY))
    assert not overlap, overlap
    allowed = (set(ALLOWED) - set(GVISOR_UNLISTABLE_IPC)) | set(GVISOR_NAMESPACES) if gvisor else set(ALLOWED)
    denied = (set(DENIED) | set(GVISOR_UNLISTABLE_IPC)) - set(GVISOR_NAMESPACES) if gvisor else set(DENIED)
    if copy:
        allowed, denied = allowed | set(COPY_BOOT), denied - set(COPY_BOOT)
    rules: list[dict[str, Any]] = [{"names": sorted(allowed), "action": "SCMP_ACT_ALLOW"}]
    for family, value in SOCKET_FAMILIES.items():
        if family not in IP_FAMILIES:
            rules.append({"names": ["socket"], "action": "SCMP_ACT_ALLOW", "args": [_arg(0, value, "SCMP_CMP_EQ")]})
            continue
        for sock_type in IP_SOCKET_TYPES.values():
            kind = {"index": 1, "value": SOCK_TYPE_MASK, "valueTwo": sock_type, "op": "SCMP_CMP_MASKED_EQ"}
            rules.append(
                {"names": ["socket"], "action": "SCMP_ACT_ALLOW", "args": [_arg(0, value, "SCMP_CMP_EQ"), kind]}
            )
    for value in PERSONAS.values():
        rules.append({"names": ["personality"], "action": "SCMP_ACT_ALLOW", "args": [_arg(0, value, "SCMP_CMP_EQ")]})
    for name, entries in SELF_ONLY.items():
        for conditions in entries:
            args = [_arg(i, v, "SCMP_CMP_EQ") for i, v in conditions]
            rules.append({"names": [name], "action": "SCMP_ACT_ALLOW", "args": args})
    rules.append(
        {
            "names": ["clone"],
            "action": "SCMP_ACT_ALLOW",
            "args": [{"index": 0, "value": CLONE_NAMESPACE_FLAGS, "valueTwo": 0, "op": "SCMP_CMP_MASKED_EQ"}],
        }
    )
    if gvisor:
        rules.append({"names": ["clone3"], "action": "SCMP_ACT_ALLOW"})
    else:
        rules.append({"names": ["clone3"], "action": "SCMP_ACT_ERRNO", "errnoRet": ENOSYS})
    # explicit, so the denial is visible in the profile and in `docker inspect`
    rules.append({"names": sorted(n for n in denied if n != "clone3"), "action": "SCMP_ACT_ERRNO", "errnoRet": EPERM})
    return {
        "defaultAction": "SCMP_ACT_ERRNO",
        "defaultErrnoRet": EPERM,
        # native architectures only: no 32-bit entry points (int 0x80) into the compat syscall table
        "architectures": ["SCMP_ARCH_X86_64", "SCMP_ARCH_AARCH64"],
        "syscalls": rules,
    }


def _arg(index: int, value: int, op: str) -> dict[str, Any]:
    return {"index": index, "value": value, "valueTwo": 0, "op": op}


SHIPPED = os.path.join(os.path.dirname(os.path.abspath(__file__)), "seccomp.json")  # profile_json(), as a file


@cache
def profile_json() -> str:
    """Canonical JSON of the profile: what the runner sends and what the shipped file holds."""
    return json.dumps(profile(), indent=1, sort_keys=True) + "\n"


@cache
def compact_json(gvisor: bool = False, copy: bool = False) -> str:
    return json.dumps(profile(gvisor, copy), sort_keys=True, separators=(",", ":"))


def sha256() -> str:
    return hashlib.sha256(compact_json().encode()).hexdigest()


def security_opt(gvisor: bool = False, copy: bool = False) -> str:
    """The ``SecurityOpt`` entry that applies the profile (the engine takes the JSON itself)."""
    return "seccomp=" + compact_json(gvisor, copy)


def is_ours(security_opts: list[str], gvisor: bool = False, copy: bool = False) -> bool:
    """Whether a container's ``HostConfig.SecurityOpt`` carries exactly this profile (its gVisor variant, or its
    cached copy's: ``copy``)."""
    for opt in security_opts:
        if opt.startswith(("seccomp=", "seccomp:")):
            value = opt[len("seccomp=") :]
            if value == SHIPPED and not gvisor and not copy:  # Podman takes the profile as a path (engine.knobs.PODMAN)
                try:
                    with open(SHIPPED, encoding="utf-8") as f:
                        return bool(json.load(f) == profile())
                except (OSError, ValueError):
                    return False
            try:
                return bool(json.loads(value) == profile(gvisor, copy))
            except ValueError:
                return False
    return False


if __name__ == "__main__":
    print(profile_json(), end="")
