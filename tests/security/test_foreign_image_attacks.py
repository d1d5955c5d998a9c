"""Issue 36, the image is hostile too: attacks from inside a user's own image against toolcage's worker.

The worker of a foreign image runs from toolcage's read-only runtime (``/opt/toolcage/rt``); the image's
files are data to it. Each test plants what a hostile eval image could (tests/harness/foreign_images.py's
``hostile`` kind, and images of this module named ``toolcage-test-sec36-*``) and shows three things: the
planted code works (the image's own programs load it: the premise), a naive setup runs it (the attack
succeeding), and the worker never does (no marker from a process whose executable is toolcage's, no
mapping outside the runtime). Markers: every planted library, wrapper and startup file appends a
``PWNED <what> pid=<pid> exe=<exe>`` line to /scratch/PWNED; the test reads it with the worker's own file
tool (no image code runs for that).

1. /etc/ld.so.preload: not in the worker (PID 1), the namespace launcher, nor a connector's handler.
2. LD_*/GLIBC_TUNABLES/PYTHON* in the image's ENV: none acts on the worker; the loader's value-free ones
   (LD_SHOW_AUXV: the auxiliary vector printed on the channel) refuse the image before it starts.
3. nsswitch.conf + libnss_evil, libffi/libc planted in the image's library directories: the worker's maps
   (read from the host under runc; markers under gVisor) name nothing outside the runtime.
4. python3/sh planted first on the image's PATH: never run by the worker; run by the tools (image code).
5. a symlink, file or device node at /opt/toolcage, /opt/toolcage/rt, /opt/toolcage/lib: toolcage's runtime
   runs or the start is refused by the engine; the planted one never runs.
6. the channel attacks and doctor's escape probes as code inside each image kind.
7. a setuid-root binary stays powerless (no-new-privileges).
8. the image's ENTRYPOINT and CMD never run.
9. egress: the image's code reaches only the allowlist through the proxy; without a policy, nothing.
10. 200,000 files, a FIFO and device nodes under /testbed do not slow the start.
11. a module planted in /scratch (the worker's working directory) is never imported by the worker.
"""

from __future__ import annotations

import gc
import io
import json
import os
import subprocess
import textwrap
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.harness import foreign_images
from toolcage import Sandbox, ToolcageError, UsageError
from toolcage.engine.runtime import ENTRYPOINT
from toolcage.ops.probes import CODE_CASES, check, expected_for, run_code_probe

pytestmark = pytest.mark.usefixtures("no_leaks")

RT = "/opt/toolcage/"  # toolcage's runtime (rt) and its packages (lib): the only executables of the worker side
DEBIAN = "toolcage-base:bookworm"  # Debian with CPython 3.11, no worker label: a foreign image with Python
PREFIX = "toolcage-test-sec36-"


# ---------------------------------------------------------------------------------------------- images


def _build(tag: str, dockerfile: str, files: dict[str, str] | None = None) -> str:
    """Build ``tag`` from a Dockerfile text (once: a present tag is reused), offline."""
    if subprocess.run(["docker", "image", "inspect", tag], capture_output=True).returncode == 0:
        return tag
    import tempfile

    with tempfile.TemporaryDirectory(prefix=PREFIX) as tmp:
        Path(tmp, "Dockerfile").write_text(dockerfile)
        for name, text in (files or {}).items():
            Path(tmp, name).parent.mkdir(parents=True, exist_ok=True)
            Path(tmp, name).write_text(text)
            Path(tmp, name).chmod(0o755)
        r = subprocess.run(
            ["docker", "build", "--network", "none", "-q", "-t", tag, tmp], capture_output=True, text=True, timeout=2400
        )
    if r.returncode != 0:
        pytest.fail(f"cannot build {tag}: {r.stderr.strip()[-400:]}", pytrace=False)
    return tag


def _kind(kind: str) -> str:
    try:
        return foreign_images.ensure(kind)
    except foreign_images.BuildError as exc:
        pytest.fail(f"foreign image {kind!r} cannot be built here: {exc}", pytrace=False)


# the harness's hostile image, plus: more of the loader's and Python's variables, modules on its PYTHONPATH that
# the worker imports lazily (tarfile on an upload, secrets on a download), and a fake libffi and libc in the
# image's library directories (the ones a loader searches by default)
_PYPATH_MODULE = (
    "import os\\n"
    'open("/scratch/PWNED","a").write("PWNED pypath:%s pid=%d exe=%s\\\\n"'
    ' %% (__name__, os.getpid(), os.readlink("/proc/self/exe")))\\n'
)
HOSTILE_MORE = (
    "FROM {base}\n"
    "USER 0\n"
    "RUN for m in tarfile secrets structlog pydantic json shutil; do"
    f" printf '{_PYPATH_MODULE}' > /evil/py/$m.py; done"
    " && cp /evil/evil.so /usr/lib/libffi.so.8 && cp /evil/evil.so /usr/lib/libc.so.6"
    " && cp /evil/evil.so /usr/local/lib/libffi.so.8 && rm -f /scratch/PWNED /tmp/PWNED\n"
    "ENV PYTHONINSPECT=1 PYTHONWARNINGS=error PYTHONDEVMODE=1 PYTHONMALLOC=debug PYTHONSAFEPATH="
    " LD_DEBUG=all LD_DEBUG_OUTPUT=/scratch/PWNED-lddebug LD_BIND_NOW=1 MALLOC_CHECK_=3"
    " GCONV_PATH=/evil LOCPATH=/evil LANG=evil LC_ALL=evil TZ=:/evil/tz\n"
)


@pytest.fixture(scope="module")
def hostile() -> str:
    """The hostile image: everything of the harness's, and the plants above."""
    return _build(f"{PREFIX}hostile:2", HOSTILE_MORE.format(base=_kind("hostile")))


CONNECTOR = '''
from toolcage.sdk import Context, tool


@tool
def probe(ctx: Context) -> dict:
    """What a connector's handler maps after ctypes, a user lookup and a compression module."""
    import ctypes, os, pwd, lzma, hashlib
    try:
        pwd.getpwuid(0)
    except KeyError:
        pass
    paths = set()
    for line in open("/proc/self/maps"):
        parts = line.split(None, 5)
        if len(parts) == 6:
            paths.add(parts[5].strip())
    return {"exe": os.readlink("/proc/self/exe"), "paths": sorted(paths), "path0": __import__("sys").path[:2]}
'''


def markers(sb: Sandbox) -> list[str]:
    """The marker lines planted code left so far, read by the worker's own file tool (no image code runs)."""
    got = sb.read_files(["/scratch/PWNED"], missing_ok=True).get("/scratch/PWNED", b"")
    return foreign_images.markers_in(got.decode(errors="replace"))


def worker_side(lines: list[str]) -> list[str]:
    """Markers left by a process of toolcage's own: the worker (PID 1 under runc), its launchers and connector
    hosts all run rt's python3 (under gVisor a call's own program is PID 1 of its namespace: not a sign)."""
    return [m for m in lines if f"exe={RT}" in m]


def foreign_paths(maps: str) -> list[str]:
    """The mapped files of a /proc/<pid>/maps text outside toolcage's runtime (anonymous, [vdso], memfd: fine)."""
    out = []
    for line in maps.splitlines():
        parts = line.split(None, 5)
        if len(parts) < 6:
            continue
        path = parts[5].strip()
        if path.startswith("[") or path.startswith("/memfd:") or path.startswith(RT):
            continue
        out.append(path)
    return out


def host_pid(sb: Sandbox) -> int:
    out = subprocess.run(
        ["docker", "inspect", "-f", "{{.State.Pid}}", str(sb.container_id)], capture_output=True, text=True, check=True
    )
    return int(out.stdout.strip())


def host_tree(pid: int) -> list[int]:
    """``pid`` and its descendants, as the host's procfs sees them."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    todo.extend(int(c) for c in f.read().split())
        except OSError:
            continue
    return out


def sh(sb: Sandbox, command: str, timeout_s: float = 20) -> dict[str, Any]:
    r = sb.call("exec", {"argv": ["/bin/sh", "-c", command], "timeout_s": timeout_s})
    assert r.status == "ok", (command, r.error, (r.result or {}).get("stderr", "")[-600:])
    return dict(r.result)


def exercise(sb: Sandbox, tmp: Path) -> None:
    """Everything the worker does on its own: file tools, upload, download (tarfile, pwd), snapshot, diff."""
    sb.write_files({"/scratch/d/a.txt": "a", "/scratch/d/b/c.txt": "c"})
    assert sb.read_files(["/scratch/d/a.txt"]) == {"/scratch/d/a.txt": b"a"}
    sb.download("/scratch/d", tmp / "dl")
    sb.snapshot(io.BytesIO())


# ------------------------------------------------------------------------------ 1, 3, 4: no image code in the worker


def test_the_planted_library_runs_in_image_programs_and_under_a_naive_loader(hostile: str) -> None:
    """Premise and attack: the image's own programs load its /etc/ld.so.preload, LD_PRELOAD, nss module and
    PATH wrappers (the library works); rt's python3 started by the image's loader (the naive setup) loads
    the preload too; started as toolcage starts it (its own loader), it does not."""
    with Sandbox(image=hostile) as sb:
        assert sh(sb, "id -un >/dev/null 2>&1; true")["exit_code"] == 0
        got = markers(sb)
        assert any("PWNED lib:/evil/evil.so" in m and "exe=/usr/bin/" in m for m in got), got
        assert any("PWNED nss:" in m for m in got), got  # `id -un` went through nsswitch.conf to libnss_evil
        before = len(got)
        naive = "env -i /lib64/ld-linux-x86-64.so.2 --library-path /opt/toolcage/rt/lib /opt/toolcage/rt/bin/python3"
        naive += " -S -c pass"
        assert sh(sb, naive)["exit_code"] == 0
        new = markers(sb)[before:]
        assert any("ld-linux" in m for m in new), new  # the image's loader ran the preload into rt's python
        before = len(markers(sb))
        r = sh(sb, "env -i /opt/toolcage/rt/bin/python3 -S -c 'import ctypes, pwd; pwd.getpwuid(0)'")
        assert r["exit_code"] == 0, r
        assert worker_side(markers(sb)[before:]) == []


def test_nothing_of_the_image_runs_in_the_worker_its_launcher_or_a_connector(hostile: str, tmp_path: Path) -> None:
    """The image's preload, ENV (LD_*, PYTHON*), PYTHONPATH modules, nss module, libffi/libc and PATH
    wrappers never run in a worker-side process: PID 1 through every tool of its own, the namespace launcher
    of each call (gVisor), a connector's handler (ctypes, pwd, lzma); the tools' image programs do."""
    conn = tmp_path / "probe_conn.py"
    conn.write_text(CONNECTOR)
    with Sandbox(image=hostile, tools=[conn]) as sb:
        exercise(sb, tmp_path)
        r = sb.call("probe", {})
        assert r.status == "ok", r
        handler = r.result
        assert handler["exe"].startswith(RT), handler
        assert [p for p in handler["paths"] if not p.startswith(("[", "/memfd:", RT))] == [], handler["paths"]
        assert worker_side(markers(sb)) == [], markers(sb)
        assert not any("path:" in m for m in markers(sb)), markers(sb)  # no PATH lookup by the worker
        # the tools run the image's programs, which load what the image plants (it is their image)
        assert sb.call("run_python", {"code": "print('ran')"}).result["stdout"].strip().endswith("ran")
        sh(sb, "true")
        got = markers(sb)
        assert any("path:python3" in m for m in got), got  # run_python took the image's PATH: expected
        assert any("pypath:" in m or "sitecustomize" in m for m in got), got
        assert worker_side(got) == [], got
        # the loader's debug files (LD_DEBUG_OUTPUT): one per image program, none for a program of the runtime
        names = [f"/scratch/{n}" for n in sh(sb, "ls /scratch")["stdout"].split() if n.startswith("PWNED-lddebug.")]
        debug = sb.read_files(names)
        assert debug, "LD_DEBUG wrote nothing for the image's programs: the premise does not hold"
        ran = [p for p, text in debug.items() if b"transferring control: /opt/toolcage" in text]
        assert ran == [], ran
        assert sb.call("run_python", {"code": "print(1 + 1)"}).status == "ok"


@pytest.mark.runc_only("the host sees a gVisor sandbox's processes as the Sentry's, not the worker's own maps")
def test_the_worker_maps_nothing_of_the_image(hostile: str, tmp_path: Path) -> None:
    """/proc/<pid>/maps of the worker and of every worker-side process under it, read from the host while a
    connector call runs, lists no file outside /opt/toolcage (the image's nss module, libffi and libc planted)."""
    conn = tmp_path / "slow_conn.py"
    conn.write_text(CONNECTOR + "\n\n@tool\ndef slow(ctx: Context) -> str:\n    \"\"\"Sleeps.\"\"\"\n"
                    "    import time, ctypes, pwd\n    time.sleep(3)\n    return 'done'\n")  # fmt: skip
    with Sandbox(image=hostile, tools=[conn]) as sb:
        exercise(sb, tmp_path)
        assert sb.call("probe", {}).status == "ok"
        pid = host_pid(sb)
        import threading

        answers: list[Any] = []
        t = threading.Thread(target=lambda: answers.append(sb.call("slow", {})))
        t.start()
        seen: dict[int, list[str]] = {}
        deadline = time.monotonic() + 2.5
        while time.monotonic() < deadline:
            for p in host_tree(pid):
                try:
                    exe = os.readlink(f"/proc/{p}/exe")
                    maps = Path(f"/proc/{p}/maps").read_text()
                except OSError:
                    continue
                if exe.startswith(RT):  # the worker's side; the image's programs map the image, as they should
                    seen[p] = foreign_paths(maps)
            time.sleep(0.2)
        t.join()
        assert answers and answers[0].status == "ok", answers
        assert pid in seen and len(seen) >= 2, seen  # the worker and at least the connector's host/handler
        assert all(v == [] for v in seen.values()), seen


def test_no_markers_from_the_worker_under_any_runtime(hostile: str, tmp_path: Path) -> None:
    """Attack 3 by markers (what gVisor lets a test see): after every worker tool, a run_python, a connector
    call and a download (tarfile asks pwd: nsswitch), no marker names a worker-side process."""
    conn = tmp_path / "probe_conn.py"
    conn.write_text(CONNECTOR)
    with Sandbox(image=hostile, tools=[conn]) as sb:
        exercise(sb, tmp_path)
        assert sb.call("probe", {}).status == "ok"
        sb.call("run_shell", {"command": "true"})
        got = markers(sb)
        assert got, "the image's programs left no marker: the plants do not work"
        assert worker_side(got) == [], got
        assert not any("nss:" in m and f"exe={RT}" in m for m in got), got


# ---------------------------------------------------------------------------------------------- 2: its ENV


LOADER_ANY_VALUE = ["LD_SHOW_AUXV", "LD_TRACE_LOADED_OBJECTS"]


@pytest.mark.parametrize("var", LOADER_ANY_VALUE)
def test_a_loader_variable_that_acts_whatever_its_value_refuses_the_image(var: str) -> None:
    """The attack: an image ENV LD_SHOW_AUXV / LD_TRACE_LOADED_OBJECTS, blanked to "" (Docker cannot unset it),
    still made the loader write onto the worker's stdout, the channel (before: "the worker sent a line that is
    not JSON"). Now the image is refused before anything starts, saying which variable."""
    tag = _build(f"{PREFIX}env-{var.lower().replace('_', '-')}:1", f"FROM {_kind('busybox')}\nENV {var}=1\n")
    rt = subprocess.run(
        ["docker", "volume", "ls", "-q", "--filter", "label=toolcage.rt"], capture_output=True, text=True
    ).stdout.split()
    vol = next((v for v in rt if v.endswith("-rt") and "-run-" not in v), None)
    if vol is not None:  # the premise: rt's python3, the variable blanked, in a plain container of the image
        r = subprocess.run(
            ["docker", "run", "--rm", "--read-only", "-u", "65532", "--network", "none", "-e", f"{var}=",
             "-v", f"{vol}:/opt/toolcage/rt:ro", "--entrypoint", "/opt/toolcage/rt/bin/python3", tag,
             "-P", "-S", "-c", "print('worker')"],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert r.stdout.splitlines()[:1] != ["worker"], r.stdout  # the loader wrote first, or instead
    with pytest.raises(UsageError, match=var):
        Sandbox(image=tag).start()


# ------------------------------------------------------------------------------ 11: its working directory


def test_a_module_planted_in_scratch_is_never_imported_by_the_worker(tmp_path: Path) -> None:
    """The attack: tool code writes tarfile.py and secrets.py into /scratch, the worker's working directory,
    which `python3 -m` put first on sys.path; the worker's next upload or download imported them in PID 1
    (it did: `tarfile 1`, `secrets 1`). Now neither the foreign image's worker nor the worker image's does."""
    plant = " && ".join(
        f"echo \"open('/scratch/HIJACK','a').write('{n} %d\\\\n' % __import__('os').getpid())\" > /scratch/{n}.py"
        for n in ("tarfile", "secrets", "shutil", "hashlib", "zipfile", "difflib", "structlog", "pydantic")
    )
    for image in (_kind("busybox"), None):
        with Sandbox(image=image) as sb:
            assert sb.call("run_shell", {"command": plant}).result["exit_code"] == 0
            exercise(sb, tmp_path / str(image))
            assert sb.read_files(["/scratch/HIJACK"], missing_ok=True) == {}, image


# ------------------------------------------------------------------------------ 5: /opt/toolcage planted

PLANTED_RT = '#!/bin/sh\necho "PWNED planted-rt pid=$$" >&2\necho "PWNED planted-rt pid=$$" >> /scratch/PWNED\nexit 3\n'
OPT_PLANTS = {
    "opt-symlink": "mkdir -p /opt /evil/rt && cp -r /evil/bin /evil/rt/ && ln -s /evil /opt/toolcage",
    "rt-symlink": "mkdir -p /opt/toolcage && ln -s /evil /opt/toolcage/rt",
    "rt-file": "mkdir -p /opt/toolcage && cp /evil/bin/python3 /opt/toolcage/rt",
    "rt-device": "mkdir -p /opt/toolcage && mknod /opt/toolcage/rt c 1 3",
    "lib-file": "mkdir -p /opt/toolcage/rt/bin && cp /evil/bin/python3 /opt/toolcage/rt/bin/"
    " && echo x > /opt/toolcage/lib",
    "lib-symlink": "mkdir -p /opt/toolcage/rt/bin && cp /evil/bin/python3 /opt/toolcage/rt/bin/"
    " && ln -s /evil /opt/toolcage/lib",
    "opt-file": "mkdir -p /opt && echo x > /opt/toolcage",
}


@pytest.mark.parametrize("plant", sorted(OPT_PLANTS))
def test_a_runtime_path_planted_in_the_image_never_runs(plant: str) -> None:
    """A symlink, file or device node the image puts at /opt/toolcage(/rt, /lib): the run works with
    toolcage's runtime (rt's own nsswitch file is there, no marker), or the engine refuses the start (a
    SandboxError, before any process of the container runs); the planted python3 never runs (it would end
    the worker with exit 3 and leave a marker)."""
    tag = _build(
        f"{PREFIX}opt-{plant}:1",
        f"FROM {_kind('busybox')}\nCOPY evil /evil\nRUN {OPT_PLANTS[plant]}\n",
        {"evil/bin/python3": PLANTED_RT},
    )
    try:
        with Sandbox(image=tag) as sb:
            r = sh(sb, "cat /opt/toolcage/rt/n; echo; cat /scratch/PWNED 2>/dev/null; true")
            assert r["stdout"].startswith("passwd: files"), r  # toolcage's runtime, not the planted tree
            assert "PWNED" not in r["stdout"], r
    except ToolcageError as exc:
        msg = str(exc)
        assert "Docker refused the request" in msg and "PWNED" not in msg, msg
        assert "exit code 3" not in msg, msg
    # (a start the engine refuses leaves the attached socket unclosed, backends.container._start_sandbox: a
    # runner leak, reported; collected here so its ResourceWarning is not charged to a later test)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        gc.collect()


# ---------------------------------------------------------------------------------------------- 6: channel and probes

SHELL_CASES: list[tuple[str, str]] = [
    # (name, a shell command whose output must satisfy the check of the same name below)
    ("write_root_fs", "echo x > /etc/pwned 2>&1 || echo DENIED; echo x > /tmp/pwned 2>&1 || echo DENIED"),
    ("uid_not_root", "id -u; id -g"),
    ("capabilities_all_zero", "grep -E '^Cap(Inh|Prm|Eff|Bnd|Amb):' /proc/self/status"),
    ("no_new_privs_and_seccomp", "grep -E '^(NoNewPrivs|Seccomp):' /proc/self/status"),
    ("only_loopback_interface", "tail -n +3 /proc/net/dev | cut -d: -f1"),
    ("mount_denied", "mkdir -p /scratch/m; mount -t tmpfs none /scratch/m 2>&1 && echo MOUNTED || echo DENIED"),
    # runc: EPERM (no CAP_MKNOD); gVisor makes the node but opens only its own virtual devices (ENXIO)
    ("device_nodes_useless", "for d in 'mem c 1 1' 'kmsg c 1 11' 'sda b 8 0'; do set -- $d; mknod /scratch/$1 $2 $3 $4 "
                             "2>/dev/null; head -c 1 /scratch/$1 >/dev/null 2>&1 && echo READ $1 || echo DENIED; done"),
    ("init_fds_not_writable", "for f in 0 1 2; do echo '{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{}}' "
                              "> /proc/1/fd/$f 2>/dev/null && echo W$f; done; echo END"),
    ("init_environ_not_readable", "cat /proc/1/environ 2>/dev/null | tr '\\0' '\\n' | grep -c TOOLCAGE_POLICY || true"),
    ("signals_to_worker_refused", "kill -9 1 2>/dev/null; kill -STOP 1 2>/dev/null; kill -TERM 1 2>/dev/null; echo x"),
    ("forged_answers_on_stdout", "for i in 1 2 3 4 5 6 7 8 9 10; do "
                                 "printf '{\"jsonrpc\":\"2.0\",\"id\":%d,"
                                 "\"result\":{\"stdout\":\"FORGED\"}}\\n' $i; done"),
]  # fmt: skip


def _shell_case_holds(name: str, out: str, kind: str) -> bool:
    lines = out.split()
    if name == "write_root_fs":
        return out.count("DENIED") == 2
    if name == "uid_not_root":
        return lines == ["65532", "65532"]
    if name == "capabilities_all_zero":  # (gVisor shows no CapAmb line)
        return len(lines) >= 8 and all(v == "0000000000000000" for v in lines[1::2])
    if name == "no_new_privs_and_seccomp":  # gVisor's status has no NoNewPrivs line (the setuid test shows it)
        return lines == ["NoNewPrivs:", "1", "Seccomp:", "2"] or (kind == "gvisor" and lines == ["Seccomp:", "2"])
    if name == "only_loopback_interface":
        return lines in (["lo"], [])
    if name == "mount_denied":
        return out.strip().endswith("DENIED")
    if name == "device_nodes_useless":
        return lines == ["DENIED"] * 3
    if name == "init_fds_not_writable":  # gVisor: /proc/1 is the call itself (a PID namespace of its own)
        return lines == ["END"] or (kind == "gvisor" and lines[-1:] == ["END"])
    if name == "init_environ_not_readable":
        return lines == ["0"]
    return True


SHELL_IMAGES = ["busybox", "musl", "debian-nopy", "hostile"]


@pytest.mark.parametrize("kind", SHELL_IMAGES)
def test_channel_and_escape_checks_as_shell_code_inside(kind: str, hostile: str) -> None:
    """doctor's escape checks and the channel attacks, as shell code of each image kind (busybox, musl,
    Debian without Python, the hostile image): all hold, and after forged answers, writes to PID 1's fds and
    signals to it the runner still gets the real answers."""
    image = hostile if kind == "hostile" else _kind(kind)
    with Sandbox(image=image) as sb:
        failed = {}
        for name, command in SHELL_CASES:
            if name == "signals_to_worker_refused" and sb.kind == "gvisor":
                # the call is PID 1 of a PID namespace of its own there: `kill -9 1` ends the call, not the worker
                r = sb.call("exec", {"argv": ["/bin/sh", "-c", command]})
                assert r.status in ("ok", "signal"), r
                continue
            r = sh(sb, command)
            if not _shell_case_holds(name, r["stdout"], sb.kind):
                failed[name] = r["stdout"][-400:]
            if name == "forged_answers_on_stdout":
                assert r["stdout"].count("FORGED") == 10  # the tool's own output, inside the real answer
        assert failed == {}, failed
        r = sh(sb, "echo real")
        assert r["stdout"] == "real\n" and r["exit_code"] == 0
        assert sb.usage()["cpu_ms"] is not None


# the worker image's property, not a user's: a foreign image may ship setuid binaries (they stay powerless,
# test_a_setuid_root_binary_stays_powerless)
NOT_FOR_FOREIGN = {"no_setuid_binaries"}
# PID 1 is the same worker, started from the runtime by absolute path (toolcage.engine.runtime.ENTRYPOINT)
FOREIGN_EXPECTED = {"worker_is_init": {"init": [ENTRYPOINT[0], "-S", "-m", "toolcage.worker"]}}
PY_CASES = [(n, c, FOREIGN_EXPECTED.get(n, e)) for n, _w, c, e in CODE_CASES if n not in NOT_FOR_FOREIGN]


@pytest.fixture(scope="module")
def debian_sandbox(engine: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sandbox]:
    ws = tmp_path_factory.mktemp("ws")
    ws.chmod(0o777)
    with Sandbox(image=DEBIAN, workspace=ws, tool="security") as sb:
        yield sb


@pytest.mark.parametrize(("name", "code", "expected"), PY_CASES, ids=[c[0] for c in PY_CASES])
def test_doctor_probe_cases_with_the_images_python(
    debian_sandbox: Sandbox, name: str, code: str, expected: Any
) -> None:
    """Each of doctor --probe's escape checks, run by the image's own python3 (Debian's, not the worker's)."""
    observed = run_code_probe(debian_sandbox, code)
    want, _why = expected_for(name, expected, debian_sandbox.kind)
    assert check(observed, want), observed


def test_the_probes_ran_with_the_images_python(debian_sandbox: Sandbox) -> None:
    """The premise of the table above: run_python there is /usr/bin/python3 of the image, not the runtime's."""
    r = debian_sandbox.call("run_python", {"code": "import sys, os; print(os.path.realpath(sys.executable))"})
    assert r.result["stdout"].strip().startswith("/usr/bin/python3"), r.result


# ---------------------------------------------------------------------------------------------- 7, 8


def test_a_setuid_root_binary_stays_powerless(hostile: str) -> None:
    """The hostile image's setuid-root cat: in a plain container as a non-root user (no no-new-privileges) it
    reads /etc/shadow (the attack); in the sandbox it runs as 65532 and cannot."""
    plain = subprocess.run(
        ["docker", "run", "--rm", "--network", "none", "-u", "65532", "--entrypoint", "/evil/bin/suid-cat", hostile,
         "/etc/shadow"], capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert plain.returncode == 0 and "root:" in plain.stdout, plain.stderr  # the premise: setuid works there
    with Sandbox(image=hostile) as sb:
        r = sh(sb, "ls -l /evil/bin/suid-cat; /evil/bin/suid-cat /etc/shadow; echo rc=$?")
        assert "rws" in r["stdout"] and "rc=1" in r["stdout"] and "root:" not in r["stdout"], r
        assert "Permission denied" in r["stderr"], r


ENTRY = """\
FROM {base}
ENTRYPOINT ["/bin/sh", "-c", "echo entrypoint >> /scratch/PWNED-entry; exec \\"$@\\"", "--"]
CMD ["/bin/sh", "-c", "echo cmd >> /scratch/PWNED-cmd; sleep 1"]
"""


def test_the_images_entrypoint_and_cmd_never_run() -> None:
    """An image whose ENTRYPOINT and CMD each leave a marker in /scratch: a plain `docker run` of it leaves
    both (the premise); a sandbox of it, none, and its tools work."""
    tag = _build(f"{PREFIX}entry:1", ENTRY.format(base=_kind("busybox")))
    plain = subprocess.run(
        ["docker", "run", "--rm", "--network", "none", "--tmpfs", "/scratch", tag, "/bin/sh", "-c",
         "cat /scratch/PWNED-entry"], capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert plain.stdout.strip() == "entrypoint", plain
    with Sandbox(image=tag) as sb:
        assert sh(sb, "echo ok")["stdout"] == "ok\n"
        time.sleep(1)
        got = sb.read_files(["/scratch/PWNED-entry", "/scratch/PWNED-cmd"], missing_ok=True)
        assert got == {}, got


# ---------------------------------------------------------------------------------------------- 9: egress

EGRESS_CODE = """
import json, os, socket, urllib.request
out = {}
proxy = os.environ.get("HTTP_PROXY") or os.environ.get("http_proxy")
out["proxy"] = bool(proxy)
def get(url, direct=False):
    handler = urllib.request.ProxyHandler({} if direct else {"http": proxy} if proxy else {})
    try:
        with urllib.request.build_opener(handler).open(url, timeout=5) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except Exception as e:
        return type(e).__name__
out["allowed"] = get("http://api.allowed.test:8080/ok")
out["other"] = get("http://other.test:8080/")
out["direct"] = get("http://%s:8080/ok" % UPSTREAM_IP, direct=True)
print(json.dumps(out))
"""


def test_egress_from_a_foreign_image_reaches_only_the_allowlist(engine: Any, tmp_path: Path) -> None:
    """Debian's own python3 in a foreign image under a proxy policy: the allowed host answers through the
    proxy, another host is refused by it, the upstream's address directly is unreachable; with the default
    policy (no network) none of them."""
    import secrets as _s

    from tests.helpers import start_upstream
    from tests.integration.test_egress import UPSTREAM, policy_file

    tag = _s.token_hex(3)
    net = f"toolcage-test-sec36-egress-{tag}"
    labels = {"toolcage.test": tag}
    engine.create_network(net, internal=True, labels=labels)
    cid = None
    try:
        cid = start_upstream(engine, f"toolcage-test-sec36-up-{tag}", net, UPSTREAM,
                             ["api.allowed.test", "other.test"], labels, {})  # fmt: skip
        ip = engine.inspect(cid)["NetworkSettings"]["Networks"][net]["IPAddress"]
        subnet = engine.network(net)["IPAM"]["Config"][0]["Subnet"]
        allow = policy_file(tmp_path, {
            "mode": "proxy",
            "allow": [{"host": "api.allowed.test", "schemes": ["http"], "ports": [8080], "methods": ["GET"]}],
            "allow_private_cidrs": [subnet],
        })  # fmt: skip
        code = textwrap.dedent(EGRESS_CODE).replace("UPSTREAM_IP", repr(ip))
        with Sandbox(allow, image=DEBIAN, egress_network=net) as sb:
            r = sb.call("run_python", {"code": code, "timeout_s": 30})
            got = json.loads(r.result["stdout"].strip().splitlines()[-1])
            assert got["proxy"] and got["allowed"] == 200, got
            assert got["other"] != 200 and got["direct"] != 200, got
        with Sandbox(image=DEBIAN) as sb:
            r = sb.call("run_python", {"code": code, "timeout_s": 30})
            got = json.loads(r.result["stdout"].strip().splitlines()[-1])
            assert not got["proxy"] and 200 not in (got["allowed"], got["other"], got["direct"]), got
    finally:
        if cid is not None:
            engine.remove(cid)
        from toolcage import wait_removed

        wait_removed(60)
        engine.remove_network(net)


# ---------------------------------------------------------------------------------------------- 10: its files

# Made as one tar on the host and `docker import`ed: one layer, no builder diffing the tree (a Dockerfile RUN that
# made a million files took about 15 minutes on fuse-overlayfs, which CI cannot pay). 200,000 files are enough:
# a `find` over them in the sandbox takes seconds, several times a start, so a worker that walked the image
# would fail the bound below.
N_DIRS, N_FILES = 200, 1000


def _files_image(base: str) -> str:
    """busybox's root (docker export) plus /testbed: N_DIRS x N_FILES empty files, a FIFO named like a module,
    device nodes, a link to / and a loop. (A huge sparse file is the download and snapshot doors' case:
    tests/security/test_snapshot_bounds.py; nothing reads the image's files at start.)"""
    import tarfile
    import tempfile

    tag = f"{PREFIX}files:2"
    if subprocess.run(["docker", "image", "inspect", tag], capture_output=True).returncode == 0:
        return tag
    cid = subprocess.run(["docker", "create", base, "true"], capture_output=True, text=True, check=True).stdout.strip()
    try:
        with tempfile.TemporaryDirectory(prefix=PREFIX) as tmp:
            root = Path(tmp) / "root.tar"
            with root.open("wb") as f:
                subprocess.run(["docker", "export", cid], stdout=f, check=True, timeout=300)
            out = Path(tmp) / "image.tar"
            with tarfile.open(root) as src, tarfile.open(out, "w", format=tarfile.GNU_FORMAT) as tar:
                for m in src.getmembers():
                    tar.addfile(m, src.extractfile(m) if m.isfile() else None)

                def entry(name: str, kind: bytes, **kw: Any) -> None:
                    t = tarfile.TarInfo(name)
                    t.type, t.mode = kind, kw.pop("mode", 0o755 if kind == tarfile.DIRTYPE else 0o644)
                    for k, v in kw.items():
                        setattr(t, k, v)
                    tar.addfile(t)

                entry("testbed", tarfile.DIRTYPE)
                entry("testbed/many", tarfile.DIRTYPE)
                for d in range(N_DIRS):
                    entry(f"testbed/many/d{d}", tarfile.DIRTYPE)
                    for n in range(1, N_FILES + 1):
                        entry(f"testbed/many/d{d}/{n}", tarfile.REGTYPE)
                entry("testbed/fifo.py", tarfile.FIFOTYPE)
                entry("testbed/null", tarfile.CHRTYPE, devmajor=1, devminor=3)
                entry("testbed/sda", tarfile.BLKTYPE, devmajor=8, devminor=0)
                entry("testbed/root-link", tarfile.SYMTYPE, linkname="/")
                entry("testbed/loop", tarfile.SYMTYPE, linkname="/testbed")
            subprocess.run(
                ["docker", "import", "-c", "WORKDIR /testbed", "-c", "ENV PATH=/bin", str(out), tag],
                check=True, capture_output=True, timeout=900,
            )  # fmt: skip
    finally:
        subprocess.run(["docker", "rm", "-f", cid], capture_output=True, check=False)
    return tag


def _start_s(image: str) -> float:
    t = time.monotonic()
    with Sandbox(image=image) as sb:
        assert sh(sb, "echo ok")["stdout"] == "ok\n"
        took = time.monotonic() - t
        return took


@pytest.mark.runc_only("nothing walks the image at start: the same runner and worker code either way (28 s)")
def test_many_files_a_fifo_and_device_nodes_do_not_stall_the_start() -> None:
    """An image with 200,000 files, a FIFO named like a module, device nodes and symlink loops under /testbed (its
    WORKDIR) starts and answers as fast as plain busybox (within 3x + 3 s): nothing walks the image, nothing
    opens the FIFO. (Imported from one tar made here: about a minute, once.)"""
    base = _kind("busybox")
    tag = _files_image(base)
    _start_s(base)  # warm: the runtime volumes
    plain = min(_start_s(base) for _ in range(2))
    heavy = min(_start_s(tag) for _ in range(2))
    assert heavy < 3 * plain + 3, (heavy, plain)
    with Sandbox(image=tag) as sb:
        last = f"/testbed/many/d{N_DIRS - 1}/{N_FILES}"
        r = sh(sb, f"ls {last}; ls -l /testbed/fifo.py; ls -l /testbed/null", timeout_s=60)
        out = r["stdout"].split("\n")
        assert out[0] == last and out[1].startswith("p"), r
        assert out[2].startswith("c"), r


# ---------------------------------------------------------------------------------------------- 12: its tar

# The hostile image with its own tar replaced: a wrapper first on PATH, /usr/bin/tar itself a marker that runs
# the real one, and TAR_OPTIONS in its ENV that makes a real GNU tar run a program of the image's at its
# first checkpoint. The workspace copy is extracted by a tar (worker.tools.untar): never this one.
_TAR_PWN = (
    "#!/bin/sh\n"
    'line="PWNED tar-options pid=$$ exe=/evil/bin/tar-pwn"\n'
    'for f in /scratch/PWNED /tmp/PWNED /workspace/PWNED; do echo "$line" 2>/dev/null >>"$f"; done\n'
)
_TAR_IMAGE = (
    "FROM {base}\n"
    "USER 0\n"
    "COPY tar-pwn /evil/bin/tar-pwn\n"
    "COPY tar-wrapper /evil/bin/tar\n"
    "RUN mv /usr/bin/tar /usr/bin/tar.real && cp /evil/bin/tar /usr/bin/tar"
    " && rm -f /scratch/PWNED /tmp/PWNED /workspace/PWNED\n"
    "ENV TAR_OPTIONS=--checkpoint=1\\ --checkpoint-action=exec=/evil/bin/tar-pwn\n"
)


def test_the_workspace_copy_is_never_extracted_by_the_images_tar(hostile: str, tmp_path: Path) -> None:
    """Premise: the image's tar is the planted one (its wrapper leaves a marker) and a real GNU tar in the image
    runs the image's program from TAR_OPTIONS. The attack: a workspace copy, which the worker extracts with a
    GNU tar. The copy is whole and was extracted natively, and no marker exists: the runtime's own tar ran,
    with an environment of its own."""
    tag = _build(
        f"{PREFIX}tar:1",
        _TAR_IMAGE.format(base=hostile),
        {"tar-pwn": _TAR_PWN, "tar-wrapper": foreign_images._wrapper("tar", "/usr/bin/tar.real")},
    )
    repo = tmp_path / "repo"
    (repo / "src").mkdir(parents=True)
    (repo / "src" / "m.py").write_text("print(1)\n")
    (repo / "a.txt").write_text("a\n")
    answers: list[Any] = []

    class Spy(Sandbox):
        def call(self, tool: str, params: Any = None, **kw: Any) -> Any:
            r = super().call(tool, params, **kw)
            if tool == "upload":
                answers.append(r.result)
            return r

    with Spy(image=tag, workspace=repo, workspace_mode="copy") as sb:
        assert markers(sb) == [], markers(sb)  # nothing of the image ran during the start and the copy
        assert answers and answers[-1].get("native") is True, answers
        got = sb.read_files(["/workspace/src/m.py", "/workspace/a.txt", "/workspace/PWNED"], missing_ok=True)
        assert got == {"/workspace/src/m.py": b"print(1)\n", "/workspace/a.txt": b"a\n"}, got
        # the premise, after: the image's own tar is the planted one, and TAR_OPTIONS acts on a real GNU tar
        sh(sb, "cd /scratch && echo x > f && tar -cf t.tar f && tar.real -tf t.tar >/dev/null")
        got_markers = markers(sb)
        assert any("path:tar" in m for m in got_markers), got_markers
        assert any("tar-options" in m for m in got_markers), got_markers
        assert worker_side(got_markers) == [], got_markers
