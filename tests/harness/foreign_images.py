"""The foreign images of issue 36, built here, with no registry: ``ensure(kind)`` gives the tag.

Six kinds, each tagged ``toolcage-test-img-<kind>:1`` and built only if that tag is missing, so a
rerun costs one ``docker image inspect``. A build holds a lock file under /tmp (one per kind), so two
pytest processes do not build the same image at once; every step has a timeout and a failure raises
:class:`BuildError` with one line saying which step failed and why (the fixtures turn it into a
test FAILURE, never a skip).

==============  ======================================================================  =========
kind            what it is, and how it is made                                          build (s)
==============  ======================================================================  =========
busybox         Debian's busybox-static (``apt-get download``, ``dpkg-deb -x``), its     1.4
                applets as /bin symlinks made on the host, ``tar | docker import``;
                no libc, no Python; ENV PATH=/bin, WORKDIR /tmp, root; 2.0 MB
musl            Alpine-like: Debian's musl (/lib/ld-musl-x86_64.so.1) + busybox as        1.8
                /bin/*, /usr/local/bin/hello-musl (compiled here by gcc with musl-dev's
                specs, musl-linked), USER app (1000), HOME /home/app, an ENTRYPOINT
                that writes /tmp/ENTRYPOINT_RAN; 2.7 MB
distroless      no shell: one static /app (gcc -static: prints its argv and $PATH),       0.2
                /etc/passwd with nonroot 65532, USER nonroot, ENTRYPOINT ["/app"]
debian-nopy     ``docker build --network none`` FROM toolcage-base:bookworm, Python        12.8
                removed; /testbed a git-less repository with a bug (src/calc.py) and a
                failing tests/test_calc.sh; USER root, ENV HOME MYVAR, ENTRYPOINT
py313           ``debootstrap --variant=minbase --include=python3 trixie`` (Python 3.13)  53.7
                from the machine's apt mirror, tar kept in ~/.cache/toolcage-test/,       (2.9 from
                ``docker import``; WORKDIR /app; 212 MB                                   the tar)
hostile         ``docker build`` FROM toolcage-base:bookworm (CPython 3.11, glibc 2.36):   12.2
                /etc/ld.so.preload, LD_*/PYTHON*/GLIBC_TUNABLES in ENV, planted
                python3/sh/node first on PATH, libnss_evil.so.2 in nsswitch.conf,
                sitecustomize/usercustomize, a fake libffi.so.8, a setuid cat, USER 0,
                an ENTRYPOINT; each leaves a ``PWNED <what> pid= exe=`` marker
==============  ======================================================================  =========

Times: a cold build on the project machine (2 cores, other suites running beside), the .deb
downloads included (they are cached in ~/.cache/toolcage-test/debs); a rerun with the tags present
costs one ``docker image inspect`` each. The two ``docker build`` kinds are slow for what they do
(the legacy builder commits each step through fuse-overlayfs). The hostile image's
``PYTHONHOME=/evil`` still lets its own python3 start (/evil/lib/python3.11 is a link to the real
stdlib), so that its sitecustomize and usercustomize do run for the image's own code.

``describe(kind)`` says what each image offers (shell, Python, Node, user, workdir, ENV,
entrypoint) for tests to assert against; the fixtures are in tests/foreign_conftest_plugin.py.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shlex
import shutil
import signal
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

KINDS: tuple[str, ...] = ("busybox", "musl", "distroless", "debian-nopy", "py313", "hostile")
BASE_IMAGE = "toolcage-base:bookworm"
CACHE = Path(os.environ.get("TOOLCAGE_TEST_CACHE", str(Path.home() / ".cache" / "toolcage-test")))
LOCK_DIR = Path("/tmp")
LOCK_WAIT_S = 1800  # a build by another process: py313's debootstrap is the longest (minutes)

# Seconds each image took to build in this process (absent: it was there already).
BUILD_TIMES: dict[str, float] = {}

# What the hostile image plants, for the security tests.
MARKER = "PWNED"
MARKER_FILES: tuple[str, ...] = ("/scratch/PWNED", "/tmp/PWNED", "/workspace/PWNED")
EVIL_PATHS: tuple[str, ...] = ("/evil", "libnss_evil", "evil.so")
HOSTILE_ENV: dict[str, str] = {
    "LD_PRELOAD": "/evil/evil.so",
    "LD_LIBRARY_PATH": "/evil/lib",
    "LD_AUDIT": "/evil/evil.so",
    "GLIBC_TUNABLES": "glibc.malloc.check=3",
    "PYTHONSTARTUP": "/evil/startup.py",
    "PYTHONPATH": "/evil/py",
    "PYTHONHOME": "/evil",
    "PATH": "/evil/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
}

_DEBIAN_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_SMALL_PATH = "/usr/local/bin:/usr/bin:/bin"


class BuildError(Exception):
    """A foreign image could not be built on this machine; the message says which step and why."""


def tag(kind: str) -> str:
    """The tag of a kind's image."""
    _check_kind(kind)
    return f"toolcage-test-img-{kind}:1"


def ensure(kind: str) -> str:
    """The tag of ``kind``'s image, built first if the engine does not have it (BuildError if it cannot be)."""
    ref = tag(kind)
    _docker_reachable()
    if _have(ref):
        return ref
    with _lock(kind):
        if _have(ref):  # built by another process while this one waited
            return ref
        start = time.monotonic()
        with tempfile.TemporaryDirectory(prefix=f"toolcage-test-img-{kind}-") as tmp:
            _BUILDERS[kind](Path(tmp), ref)
        BUILD_TIMES[kind] = round(time.monotonic() - start, 2)
        if not _have(ref):
            raise BuildError(f"{kind}: the build ended but the engine has no {ref}")
    return ref


def describe(kind: str) -> dict[str, Any]:
    """What ``kind``'s image offers, as built here: shell, python (major.minor or None), node, user,
    workdir, env (the ENV the image declares), entrypoint, plus notes per kind."""
    _check_kind(kind)
    return dict(_DESCRIPTIONS[kind])


def markers_in(text: str) -> list[str]:
    """The ``PWNED ...`` marker lines in ``text`` (output, a marker file, a log): each names what ran."""
    return [line.strip() for line in text.splitlines() if MARKER in line]


def evil_mappings(maps: str) -> list[str]:
    """The lines of a /proc/<pid>/maps text that map something the hostile image planted."""
    return [line for line in maps.splitlines() if any(p in line for p in EVIL_PATHS)]


# ---------------------------------------------------------------------------------------------- what each is

_DESCRIPTIONS: dict[str, dict[str, Any]] = {
    "busybox": {
        "shell": "/bin/sh",
        "python": None,
        "node": None,
        "libc": None,
        "user": "",
        "uid": 0,
        "workdir": "/tmp",
        "env": {"PATH": "/bin"},
        "entrypoint": None,
        "binaries": ["/bin/busybox", "/bin/sh", "/bin/echo"],
    },
    "musl": {
        "shell": "/bin/sh",
        "python": None,
        "node": None,
        "libc": "musl",
        "user": "app",
        "uid": 1000,
        "workdir": "/home/app",
        "env": {"PATH": _SMALL_PATH, "HOME": "/home/app"},
        "entrypoint": ["/bin/sh", "-c", "echo image entrypoint ran > /tmp/ENTRYPOINT_RAN"],
        "entrypoint_marker": "/tmp/ENTRYPOINT_RAN",
        "binaries": ["/usr/local/bin/hello-musl", "/bin/busybox"],
        "hello_output": "hello from musl",
    },
    "distroless": {
        "shell": None,
        "python": None,
        "node": None,
        "libc": None,
        "user": "nonroot",
        "uid": 65532,
        "workdir": "",
        "env": {"PATH": _SMALL_PATH},
        "entrypoint": ["/app"],
        "binaries": ["/app"],
        "hello_output": "hello from distroless",
    },
    "debian-nopy": {
        "shell": "/bin/sh",
        "bash": "/bin/bash",
        "python": None,
        "node": None,
        "libc": "glibc",
        "user": "root",
        "uid": 0,
        "workdir": "/testbed",
        "env": {"HOME": "/root", "MYVAR": "from-image"},
        "entrypoint": ["/bin/bash", "-c", "touch /ENTRYPOINT_RAN"],
        "entrypoint_marker": "/ENTRYPOINT_RAN",
        "repo": {
            "path": "/testbed",
            "test": "tests/test_calc.sh",
            "buggy_file": "src/calc.py",
            "bug": "    return a - b\n",
            "fix": "    return a + b\n",
        },
    },
    "py313": {
        "shell": "/bin/sh",
        "python": "3.13",
        "node": None,
        "libc": "glibc",
        "user": "",
        "uid": 0,
        "workdir": "/app",
        "env": {"PATH": _DEBIAN_PATH},
        "entrypoint": None,
    },
    "hostile": {
        "shell": "/bin/sh",
        "planted_shell": "/evil/bin/sh",
        "python": "3.11",
        "node": None,
        "libc": "glibc",
        "user": "0",
        "uid": 0,
        "workdir": "",
        "env": dict(HOSTILE_ENV),
        "entrypoint": ["/evil/bin/sh", "-c", "echo entrypoint > /tmp/PWNED"],
        "marker_files": list(MARKER_FILES),
        "evil_paths": list(EVIL_PATHS),
        "planted": {
            "preload": "/etc/ld.so.preload",
            "evil_so": "/evil/evil.so",
            "nss": "/lib/x86_64-linux-gnu/libnss_evil.so.2",
            "fake_libffi": "/evil/lib/libffi.so.8",
            "path_binaries": ["/evil/bin/python3", "/evil/bin/sh", "/evil/bin/node"],
            "sitecustomize": "/evil/py/sitecustomize.py",
            "usercustomize": "/evil/py/usercustomize.py",
            "startup": "/evil/startup.py",
            "setuid": "/evil/bin/suid-cat",
        },
    },
}


# ---------------------------------------------------------------------------------------------- machinery


def _check_kind(kind: str) -> None:
    if kind not in KINDS:
        raise ValueError(f"unknown foreign image kind {kind!r}: one of {', '.join(KINDS)}")


def _run(
    argv: Sequence[str],
    *,
    what: str,
    timeout: float,
    cwd: Path | None = None,
    stdin: Any = None,
    env: dict[str, str] | None = None,
) -> str:
    """Run one build step; its stdout, or BuildError naming the step, the command and the end of stderr."""
    cmd = shlex.join(argv)
    try:
        # A session of its own, so a step that times out is ended with all its children (debootstrap's dpkg).
        proc = subprocess.Popen(
            list(argv),
            cwd=cwd,
            stdin=stdin,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            start_new_session=True,
        )
    except FileNotFoundError:
        raise BuildError(f"{what}: `{argv[0]}` is not installed on this machine") from None
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise BuildError(f"{what}: `{cmd}` did not finish within {timeout:.0f} s") from None
    if proc.returncode != 0:
        tail = " | ".join((err or out).strip().splitlines()[-3:]) or "(no output)"
        raise BuildError(f"{what}: `{cmd}` exited {proc.returncode}: {tail}")
    return out


def _docker_reachable() -> None:
    if shutil.which("docker") is None:
        raise BuildError("docker is not installed: the foreign images are built with the docker CLI")
    _run(["docker", "version", "--format", "{{.Server.Version}}"], what="docker engine", timeout=30)


def _have(ref: str) -> bool:
    try:
        proc = subprocess.run(["docker", "image", "inspect", ref], capture_output=True, timeout=30, check=False)
    except subprocess.TimeoutExpired:
        raise BuildError(f"`docker image inspect {ref}` did not answer within 30 s") from None
    return proc.returncode == 0


@contextmanager
def _lock(kind: str) -> Iterator[None]:
    path = LOCK_DIR / f"toolcage-test-img-{kind}.lock"
    with open(path, "a") as fh:
        deadline = time.monotonic() + LOCK_WAIT_S
        while True:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise BuildError(f"{kind}: another process held {path} for {LOCK_WAIT_S} s") from None
                time.sleep(0.5)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _debs(*packages: str) -> dict[str, Path]:
    """Debian packages of the host's release, downloaded once into the cache: name -> .deb path."""
    where = CACHE / "debs"
    where.mkdir(parents=True, exist_ok=True)
    found: dict[str, Path] = {}
    missing = []
    for pkg in packages:
        hits = sorted(where.glob(f"{pkg}_*.deb"))
        if hits:
            found[pkg] = hits[-1]
        else:
            missing.append(pkg)
    if missing:
        _run(
            ["apt-get", "download", "-o", "APT::Sandbox::User=root", *missing],
            what=f"downloading {', '.join(missing)} (apt-get)",
            timeout=300,
            cwd=where,
        )
        for pkg in missing:
            hits = sorted(where.glob(f"{pkg}_*.deb"))
            if not hits:
                raise BuildError(f"apt-get download {pkg} left no {pkg}_*.deb in {where}")
            found[pkg] = hits[-1]
    return found


def _extract(deb: Path, into: Path) -> None:
    into.mkdir(parents=True, exist_ok=True)
    _run(["dpkg-deb", "-x", str(deb), str(into)], what=f"unpacking {deb.name}", timeout=120)


def _busybox_into(root: Path, tmp: Path) -> None:
    """busybox-static at /bin/busybox and every applet as a /bin symlink (``busybox --install -s /bin``)."""
    unpacked = tmp / "busybox-deb"
    _extract(_debs("busybox-static")["busybox-static"], unpacked)
    (root / "bin").mkdir(parents=True, exist_ok=True)
    shutil.copy2(unpacked / "bin" / "busybox", root / "bin" / "busybox")
    applets = _run([str(root / "bin" / "busybox"), "--list"], what="listing busybox applets", timeout=30).split()
    if "sh" not in applets:
        raise BuildError(f"busybox-static has no sh applet (applets: {len(applets)})")
    for applet in applets:
        link = root / "bin" / applet
        if applet != "busybox" and not link.exists():
            link.symlink_to("/bin/busybox")


def _base_dirs(root: Path) -> None:
    for d in ("tmp", "etc", "root", "usr/bin", "usr/local/bin"):
        (root / d).mkdir(parents=True, exist_ok=True)
    (root / "tmp").chmod(0o1777)


def _gcc(argv: Sequence[str], what: str) -> None:
    _run(["gcc", *argv], what=what, timeout=180)


def _import(root: Path, ref: str, changes: Sequence[str], owners: dict[str, tuple[int, int]], tmp: Path) -> None:
    """``tar | docker import``: every file root-owned except ``owners`` (path in the image -> uid, gid)."""

    def owned(info: tarfile.TarInfo) -> tarfile.TarInfo:
        name = "/" + info.name.removeprefix("./").lstrip("/")
        info.uid, info.gid = owners.get(name, (0, 0))
        info.uname = info.gname = ""
        return info

    archive = tmp / "rootfs.tar"
    with tarfile.open(archive, "w") as tar:
        tar.add(root, arcname=".", filter=owned)
    _docker_import(archive, ref, changes)


def _docker_import(archive: Path, ref: str, changes: Sequence[str]) -> None:
    argv = ["docker", "import"]
    for change in changes:
        argv += ["-c", change]
    with open(archive, "rb") as fh:
        _run([*argv, "-", ref], what=f"importing {ref}", timeout=600, stdin=fh)


# ---------------------------------------------------------------------------------------------- the kinds


def _build_busybox(tmp: Path, ref: str) -> None:
    root = tmp / "root"
    _busybox_into(root, tmp)
    (root / "tmp").mkdir()
    (root / "tmp").chmod(0o1777)
    _import(root, ref, ["ENV PATH=/bin", "WORKDIR /tmp"], {}, tmp)


_HELLO_MUSL = r"""
#include <stdio.h>
int main(int argc, char **argv) {
    printf("hello from musl");
    for (int i = 1; i < argc; i++) printf(" %s", argv[i]);
    printf("\n");
    return 0;
}
"""

_HELLO_STATIC = r"""
#include <stdio.h>
#include <stdlib.h>
int main(int argc, char **argv) {
    const char *path = getenv("PATH");
    printf("hello from distroless\n");
    for (int i = 0; i < argc; i++) printf("argv[%d]=%s\n", i, argv[i]);
    printf("PATH=%s\n", path ? path : "(unset)");
    return 0;
}
"""


def _build_musl(tmp: Path, ref: str) -> None:
    root = tmp / "root"
    _busybox_into(root, tmp)
    _base_dirs(root)
    debs = _debs("musl", "musl-dev")
    musl = tmp / "musl-deb"
    _extract(debs["musl"], musl)
    dev = tmp / "musl-dev-deb"
    _extract(debs["musl-dev"], dev)
    # The loader and libc: /lib/ld-musl-x86_64.so.1 -> x86_64-linux-musl/libc.so, as Debian's musl lays them.
    shutil.copytree(musl / "lib", root / "lib", symlinks=True)
    shutil.copytree(musl / "etc", root / "etc", symlinks=True, dirs_exist_ok=True)
    # musl-gcc is a wrapper around gcc with a specs file of absolute paths: the same specs, pointed at
    # the unpacked musl-dev (so nothing is installed on the host).
    lib_dev, inc_dev = dev / "usr/lib/x86_64-linux-musl", dev / "usr/include/x86_64-linux-musl"
    specs = (lib_dev / "musl-gcc.specs").read_text()
    specs = specs.replace("/usr/lib/x86_64-linux-musl", str(lib_dev)).replace(
        "/usr/include/x86_64-linux-musl", str(inc_dev)
    )
    (tmp / "musl.specs").write_text(specs)
    (tmp / "hello.c").write_text(_HELLO_MUSL)
    out = root / "usr/local/bin/hello-musl"
    _gcc(
        [
            "-specs",
            str(tmp / "musl.specs"),
            "-O2",
            "-s",
            "-o",
            str(out),
            str(tmp / "hello.c"),
            f"-L{musl}/lib/x86_64-linux-musl",
        ],
        "compiling hello-musl against musl (musl-dev's specs)",
    )
    interp = _run(["readelf", "-l", str(out)], what="checking hello-musl's loader", timeout=30)
    if "/lib/ld-musl-x86_64.so.1" not in interp:
        raise BuildError("hello-musl was not linked against musl's loader")
    (root / "etc/passwd").write_text("root:x:0:0:root:/root:/bin/sh\napp:x:1000:1000:app:/home/app:/bin/sh\n")
    (root / "etc/group").write_text("root:x:0:\napp:x:1000:\n")
    (root / "home/app").mkdir(parents=True)
    _import(
        root,
        ref,
        [
            "USER app",
            f"ENV PATH={_SMALL_PATH} HOME=/home/app",
            "WORKDIR /home/app",
            'ENTRYPOINT ["/bin/sh","-c","echo image entrypoint ran > /tmp/ENTRYPOINT_RAN"]',
        ],
        {"/home/app": (1000, 1000)},
        tmp,
    )


def _build_distroless(tmp: Path, ref: str) -> None:
    root = tmp / "root"
    (root / "etc").mkdir(parents=True)
    (root / "tmp").mkdir()
    (root / "tmp").chmod(0o1777)
    (root / "home/nonroot").mkdir(parents=True)
    (tmp / "hello.c").write_text(_HELLO_STATIC)
    _gcc(["-static", "-O2", "-s", "-o", str(root / "app"), str(tmp / "hello.c")], "compiling the static /app")
    (root / "etc/passwd").write_text(
        "root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n"
    )
    (root / "etc/group").write_text("root:x:0:\nnonroot:x:65532:\n")
    _import(
        root,
        ref,
        ["USER nonroot", f"ENV PATH={_SMALL_PATH}", 'ENTRYPOINT ["/app"]'],
        {"/home/nonroot": (65532, 65532)},
        tmp,
    )


def _need_base() -> None:
    if not _have(BASE_IMAGE):
        raise BuildError(f"{BASE_IMAGE} is missing: run `toolcage image build` first")


def _docker_build(ctx: Path, ref: str) -> None:
    _run(
        ["docker", "build", "--network", "none", "--pull=false", "-q", "-t", ref, str(ctx)],
        what=f"docker build of {ref}",
        timeout=600,
        env={**os.environ, "DOCKER_BUILDKIT": "0"},
    )


_CALC = '''"""A calculator with a bug for an agent to fix."""


def add(a, b):
    """The sum of a and b."""
    return a - b
'''

_TEST_CALC = """#!/bin/bash
# The task's test. The image has no Python, so it checks the source: add() must return a + b.
cd "$(dirname "$0")/.." || exit 2
if grep -q 'return a + b' src/calc.py; then
    echo "PASS: add(2, 3) == 5"
    exit 0
fi
echo "FAIL: add(2, 3) should be 5"
exit 1
"""


def _build_debian_nopy(tmp: Path, ref: str) -> None:
    _need_base()
    ctx = tmp / "ctx"
    (ctx / "testbed/src").mkdir(parents=True)
    (ctx / "testbed/tests").mkdir()
    (ctx / "testbed/src/calc.py").write_text(_CALC)
    (ctx / "testbed/tests/test_calc.sh").write_text(_TEST_CALC)
    (ctx / "testbed/tests/test_calc.sh").chmod(0o755)
    (ctx / "testbed/README").write_text("A task: tests/test_calc.sh fails; fix src/calc.py.\n")
    (ctx / "Dockerfile").write_text(
        f"FROM {BASE_IMAGE}\n"
        "USER root\n"
        "RUN rm -rf /usr/bin/python3* /usr/bin/pydoc3* /usr/bin/pygettext3* /usr/lib/python3* "
        "/usr/local/lib/python3* && ! command -v python3\n"
        "COPY testbed/ /testbed/\n"
        "RUN chmod 755 /testbed/tests/test_calc.sh\n"
        "WORKDIR /testbed\n"
        "ENV HOME=/root MYVAR=from-image\n"
        'ENTRYPOINT ["/bin/bash","-c","touch /ENTRYPOINT_RAN"]\n'
    )
    _docker_build(ctx, ref)


def _mirror() -> str:
    """The Debian mirror this machine's apt uses (deb822 .sources or sources.list), else deb.debian.org."""
    texts = []
    for p in [Path("/etc/apt/sources.list"), *sorted(Path("/etc/apt/sources.list.d").glob("*"))]:
        if p.is_file() and p.suffix in (".list", ".sources"):
            texts.append(p.read_text(errors="replace"))
    for text in texts:
        for m in re.finditer(r"^\s*(?:URIs:\s*|deb\s+(?:\[[^\]]*\]\s+)?)(\S+)", text, re.M):
            uri = m.group(1).rstrip("/")
            if "debian" in uri and "security" not in uri and "debian-ports" not in uri:
                return uri
    return "http://deb.debian.org/debian"


def _build_py313(tmp: Path, ref: str) -> None:
    archive = CACHE / "py313-trixie-minbase.tar"
    if not archive.exists():
        if os.geteuid() != 0:
            raise BuildError("py313: debootstrap needs root (run the tests as root, or put the tar in the cache)")
        if shutil.which("debootstrap") is None:
            raise BuildError("py313: debootstrap is not installed (apt-get install debootstrap)")
        root = tmp / "root"
        _run(
            ["debootstrap", "--variant=minbase", "--include=python3", "trixie", str(root), _mirror()],
            what="py313: debootstrap of trixie",
            timeout=1500,
        )
        (root / "app").mkdir(exist_ok=True)
        shutil.rmtree(root / "var/cache/apt/archives", ignore_errors=True)
        (root / "var/cache/apt/archives/partial").mkdir(parents=True, exist_ok=True)
        CACHE.mkdir(parents=True, exist_ok=True)
        part = archive.with_suffix(".tar.part")
        _run(
            ["tar", "-C", str(root), "--numeric-owner", "-cf", str(part), "."],
            what="py313: tar of the root",
            timeout=600,
        )
        part.rename(archive)
    _docker_import(archive, ref, [f"ENV PATH={_DEBIAN_PATH}", "WORKDIR /app"])


_EVIL_C = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

/* A valid audit library too (LD_AUDIT=/evil/evil.so): glibc keeps it only if it answers la_version. */
unsigned int la_version(unsigned int v) { return v; }

__attribute__((constructor)) static void pwned(void) {
    char exe[512] = "?", line[1024];
    Dl_info info;
    const char *self = "?";
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) exe[n] = 0;
    if (dladdr((void *)pwned, &info) && info.dli_fname) self = info.dli_fname;
    int len = snprintf(line, sizeof line, "PWNED %s:%s pid=%d exe=%s\n", WHAT, self, (int)getpid(), exe);
    const char *files[] = {"/scratch/PWNED", "/tmp/PWNED", "/workspace/PWNED"};
    for (unsigned i = 0; i < sizeof files / sizeof *files; i++) {
        int fd = open(files[i], O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0666);
        if (fd >= 0) { (void)!write(fd, line, len); close(fd); }
    }
    (void)!write(2, line, len);
}
"""

_NSS_EXTRA = r"""
#include <nss.h>
#include <pwd.h>
#include <sys/types.h>
enum nss_status _nss_evil_getpwuid_r(uid_t u, struct passwd *p, char *b, size_t l, int *e) {
    return NSS_STATUS_NOTFOUND;
}
enum nss_status _nss_evil_getpwnam_r(const char *n, struct passwd *p, char *b, size_t l, int *e) {
    return NSS_STATUS_NOTFOUND;
}
"""


def _wrapper(name: str, real: str) -> str:
    return (
        "#!/bin/bash\n"
        f"# planted first on PATH: a marker, then the real {name}\n"
        f'line="PWNED path:{name} pid=$$ exe=/evil/bin/{name}"\n'
        'for f in /scratch/PWNED /tmp/PWNED /workspace/PWNED; do echo "$line" 2>/dev/null >>"$f"; done\n'
        'echo "$line" >&2\n'
        f'if [ -x {real} ]; then exec {real} "$@"; fi\n'
        f'echo "{name}: not found" >&2\nexit 127\n'
    )


_PY_MARKER = """import os, sys
_line = "PWNED {what} pid=%d exe=%s\\n" % (os.getpid(), sys.executable)
for _f in ("/scratch/PWNED", "/tmp/PWNED", "/workspace/PWNED"):
    try:
        with open(_f, "a") as _fh:
            _fh.write(_line)
    except OSError:
        pass
sys.stderr.write(_line)
"""


def _build_hostile(tmp: Path, ref: str) -> None:
    _need_base()
    ctx = tmp / "ctx"
    evil = ctx / "evil"
    for d in ("bin", "lib", "py"):
        (evil / d).mkdir(parents=True)
    (tmp / "evil.c").write_text(_EVIL_C)
    (tmp / "nss.c").write_text(_EVIL_C + _NSS_EXTRA)
    _gcc(
        ["-shared", "-fPIC", "-O2", '-DWHAT="lib"', "-o", str(evil / "evil.so"), str(tmp / "evil.c")],
        "compiling evil.so",
    )
    _gcc(
        ["-shared", "-fPIC", "-O2", '-DWHAT="nss"', "-o", str(ctx / "libnss_evil.so.2"), str(tmp / "nss.c")],
        "compiling libnss_evil.so.2",
    )
    shutil.copy2(evil / "evil.so", evil / "lib" / "libffi.so.8")  # a planted libffi: evil.so under its name
    for name, real in (("python3", "/usr/bin/python3"), ("sh", "/bin/sh"), ("node", "/usr/bin/node")):
        (evil / "bin" / name).write_text(_wrapper(name, real))
        (evil / "bin" / name).chmod(0o755)
    (evil / "py/sitecustomize.py").write_text(_PY_MARKER.format(what="sitecustomize"))
    (evil / "py/usercustomize.py").write_text(_PY_MARKER.format(what="usercustomize"))
    (evil / "startup.py").write_text(_PY_MARKER.format(what="pythonstartup"))
    (ctx / "ld.so.preload").write_text("/evil/evil.so\n")
    (ctx / "nsswitch.conf").write_text("passwd: evil files\ngroup: evil files\nshadow: files\nhosts: files dns\n")
    env = " ".join(f"{k}={v}" for k, v in HOSTILE_ENV.items())
    # Every RUN comes before the preload, the nsswitch.conf and the ENV: after them each build step's
    # own processes would load evil.so and leave markers in the image.
    (ctx / "Dockerfile").write_text(
        f"FROM {BASE_IMAGE}\n"
        "USER 0\n"
        "COPY evil/ /evil/\n"
        "COPY libnss_evil.so.2 /lib/x86_64-linux-gnu/libnss_evil.so.2\n"
        "RUN cp /bin/cat /evil/bin/suid-cat && chmod 4755 /evil/bin/suid-cat"
        " && chmod 755 /evil/bin/python3 /evil/bin/sh /evil/bin/node"
        # PYTHONHOME=/evil: the image's own python3 still starts (its stdlib seen through /evil/lib),
        # so that its sitecustomize/usercustomize run: a hostile image that works for its own code.
        " && ln -s /usr/lib/python3.11 /evil/lib/python3.11"
        " && rm -f /tmp/PWNED /scratch/PWNED /workspace/PWNED\n"
        "COPY ld.so.preload nsswitch.conf /etc/\n"
        f"ENV {env}\n"
        "USER 0\n"
        'ENTRYPOINT ["/evil/bin/sh","-c","echo entrypoint > /tmp/PWNED"]\n'
    )
    _docker_build(ctx, ref)


_BUILDERS: dict[str, Callable[[Path, str], None]] = {
    "busybox": _build_busybox,
    "musl": _build_musl,
    "distroless": _build_distroless,
    "debian-nopy": _build_debian_nopy,
    "py313": _build_py313,
    "hostile": _build_hostile,
}
