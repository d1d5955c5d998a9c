"""Build the images to run Harbor (Python 3.12+) with toolcage's environment on a machine whose Debian has
Python 3.11, with no registry: prints the runner image's tag.

    sudo .venv/bin/python examples/harbor/build_runner.py      # -> toolcage-harbor-runner:<digest>

1. ``debootstrap --variant=minbase --include=python3,python3-venv trixie`` (Python 3.13) from this machine's
   apt mirror, plus the directories Harbor uses (/logs /tests /solution /app);
2. that root, as it is, is the toy tasks' image ``toolcage-harbor-task:1`` (``docker import``; WORKDIR /app);
3. a venv at /opt/harbor in the root (``chroot``) with ``harbor`` from PyPI and toolcage as a wheel built from
   this checkout, then the root is ``docker import``-ed as ``toolcage-harbor-runner:<digest>``.

The digest covers this file, Harbor's version and toolcage's sources (pyproject.toml, runner/, worker/,
policies/, image/): an image with that tag is reused, so a second run costs one ``docker image inspect``.
Needs root (debootstrap, chroot), the debootstrap package, and pip's index on the host (the ``chroot``
shares the host's network; ``docker build`` and ``docker import`` need none).
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HARBOR = "harbor==0.25.0"
CHECKOUT = Path(__file__).resolve().parents[2]
SOURCES = ("pyproject.toml", "README.md", "runner", "worker", "policies", "image")
RUNNER = "toolcage-harbor-runner"
TASK_IMAGE = "toolcage-harbor-task:1"
HARBOR_DIRS = ("logs", "tests", "solution", "app")
PATH = "/opt/harbor/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# Harbor's own telemetry off, and litellm's price table from its wheel: the runner has no network
RUNNER_ENV = ("HARBOR_TELEMETRY=0", "LITELLM_LOCAL_MODEL_COST_MAP=True", "HOME=/tmp", f"PATH={PATH}")


def digest() -> str:
    """The runner's content key: this file, Harbor's pin and every source file of toolcage."""
    h = hashlib.sha256(Path(__file__).read_bytes() + HARBOR.encode())
    for name in SOURCES:
        top = CHECKOUT / name
        files = [top] if top.is_file() else sorted(p for p in top.rglob("*") if p.is_file())
        for f in files:
            if "__pycache__" in f.parts or f.suffix == ".pyc":
                continue
            h.update(str(f.relative_to(CHECKOUT)).encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()[:12]


def _have(ref: str) -> bool:
    return subprocess.run(["docker", "image", "inspect", ref], capture_output=True).returncode == 0


def _run(argv: list[str], what: str, **kw: object) -> None:
    proc = subprocess.run(argv, capture_output=True, text=True, **kw)  # type: ignore[call-overload]
    if proc.returncode != 0:
        tail = "\n".join((proc.stderr or proc.stdout or "").splitlines()[-15:])
        raise SystemExit(f"{what} failed (exit {proc.returncode}):\n{tail}")


def _mirror() -> str:
    """The Debian mirror this machine's apt uses, else deb.debian.org."""
    texts = [p.read_text(errors="replace") for p in Path("/etc/apt").rglob("*") if p.suffix in (".list", ".sources")]
    for text in texts:
        for m in re.finditer(r"^\s*(?:URIs:\s*|deb\s+(?:\[[^\]]*\]\s+)?)(\S+)", text, re.M):
            uri = m.group(1).rstrip("/")
            if "debian" in uri and "security" not in uri:
                return uri
    return "http://deb.debian.org/debian"


def _import(root: Path, ref: str, changes: list[str]) -> subprocess.Popen[bytes]:
    """``tar`` of ``root`` into ``docker import``, started: the caller waits."""
    argv = ["docker", "import", *(a for c in changes for a in ("-c", c)), "-", ref]
    tar = subprocess.Popen(["tar", "-C", str(root), "--numeric-owner", "-cf", "-", "."], stdout=subprocess.PIPE)
    imp = subprocess.Popen(argv, stdin=tar.stdout, stdout=subprocess.DEVNULL)
    assert tar.stdout is not None
    tar.stdout.close()
    imp.tar = tar  # type: ignore[attr-defined]
    return imp


def _wait(imp: subprocess.Popen[bytes], ref: str) -> None:
    if imp.wait() != 0 or imp.tar.wait() != 0 or not _have(ref):  # type: ignore[attr-defined]
        raise SystemExit(f"docker import of {ref} failed")


def build(report: bool = True) -> str:
    """The runner image's tag, built first if the engine lacks it (module docstring); one build at a time on a
    machine (a lock file), and the runner images of other digests removed after."""
    ref = f"{RUNNER}:{digest()}"
    if _have(ref) and _have(TASK_IMAGE):
        return ref
    with open("/tmp/toolcage-harbor-build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (_have(ref) and _have(TASK_IMAGE)):  # another process may have built it while this one waited
            _build(ref, report)
    old = subprocess.run(["docker", "images", "--filter", f"reference={RUNNER}:*", "--format",
                          "{{.Repository}}:{{.Tag}}"], capture_output=True, text=True).stdout.split()  # fmt: skip
    for other in old:
        if other != ref:
            subprocess.run(["docker", "rmi", other], capture_output=True)  # in use elsewhere: it stays
    return ref


def _build(ref: str, report: bool) -> None:
    if os.geteuid() != 0 or shutil.which("debootstrap") is None:
        raise SystemExit("building the Harbor runner needs root and debootstrap (apt-get install debootstrap)")
    began = time.monotonic()

    def say(msg: str) -> None:
        if report:
            print(f"[{time.monotonic() - began:5.1f}s] {msg}", file=sys.stderr, flush=True)

    with tempfile.TemporaryDirectory(prefix="toolcage-harbor-build-") as tmp:
        root, wheels, src = Path(tmp) / "root", Path(tmp) / "wheels", Path(tmp) / "src"
        # toolcage's wheel, from a copy of the sources (a build in the checkout would write into it), while
        # debootstrap runs
        ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
        src.mkdir()
        for name in SOURCES:
            if (CHECKOUT / name).is_dir():
                shutil.copytree(CHECKOUT / name, src / name, ignore=ignore)
            else:
                shutil.copy(CHECKOUT / name, src / name)
        wheel = subprocess.Popen(
            [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(wheels), str(src)],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        say(f"debootstrap trixie from {_mirror()}")
        boot = ["debootstrap", "--variant=minbase", "--include=python3,python3-venv", "trixie", str(root), _mirror()]
        _run(boot, "debootstrap")
        for d in HARBOR_DIRS:
            (root / d).mkdir(exist_ok=True)
        shutil.rmtree(root / "var/cache/apt/archives", ignore_errors=True)
        (root / "var/cache/apt/archives/partial").mkdir(parents=True)
        say(f"importing {TASK_IMAGE} (the toy tasks' image: this root as it is)")
        task_import = _import(root, TASK_IMAGE, ["WORKDIR /app", f"ENV PATH={PATH.partition(':')[2]}"])
        _, err = wheel.communicate()
        if wheel.returncode != 0:
            raise SystemExit(f"pip wheel of toolcage failed: {err[-2000:]}")
        _wait(task_import, TASK_IMAGE)  # the tar has read the root: the venv may go in now
        say(f"venv /opt/harbor with {HARBOR} and toolcage (pip in a chroot)")
        stage = root / "tmp/wheels"
        shutil.copytree(wheels, stage)
        shutil.copy("/etc/resolv.conf", root / "etc/resolv.conf")
        certs = Path("/etc/ssl/certs/ca-certificates.crt")  # the host's CA bundle (pip.conf may point at it)
        if certs.exists():
            (root / "etc/ssl/certs").mkdir(parents=True, exist_ok=True)
            shutil.copy(certs, root / "etc/ssl/certs/ca-certificates.crt")
        env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/root", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
        for key in ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_PROXY", "HTTPS_PROXY", "HTTP_PROXY", "NO_PROXY"):
            if key in os.environ:
                env[key] = os.environ[key]
        if certs.exists():
            env["PIP_CERT"] = str(certs)
        chroot = ["chroot", str(root)]
        _run([*chroot, "/usr/bin/python3", "-m", "venv", "/opt/harbor"], "python3 -m venv", env=env)
        toolcage_whl = f"/tmp/wheels/{next(wheels.glob('toolcage-*.whl')).name}"
        pip = [*chroot, "/opt/harbor/bin/pip", "install", "-q", "--no-cache-dir", HARBOR, toolcage_whl]
        _run(pip, "pip install of harbor and toolcage", env=env)
        shutil.rmtree(stage)
        (root / "etc/resolv.conf").unlink()
        say(f"importing {ref}")
        _wait(_import(root, ref, ["WORKDIR /jobs", *(f"ENV {e}" for e in RUNNER_ENV)]), ref)
        say("done")


if __name__ == "__main__":
    print(build())
