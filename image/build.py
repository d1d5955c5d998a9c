"""``toolcage image build``: the worker image, built offline and only when something changed.

The base is a Python 3.11 image: ``python:3.11-slim-bookworm`` where a registry answers,
otherwise ``toolcage-base:bookworm`` bootstrapped here with debootstrap from the Debian
mirror the host's apt already uses, then ``docker import``-ed. Wheels are downloaded on
the host and installed in the build with ``--no-index``; the build itself has no network.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from toolcage.errors import BuildError
from toolcage.image.debs import WORKER_PACKAGES, NoApt, copy_debs, download_debs
from toolcage.image.wheels import Report, copy_wheels, download_wheels
from toolcage.policies import contract

if TYPE_CHECKING:
    from toolcage.engine.api import EngineAPI

REGISTRY_BASE = "python:3.11-slim-bookworm"
LOCAL_BASE = "toolcage-base:bookworm"
SUITE = "bookworm"  # python3.11, matching the cp311 wheels
DEFAULT_MIRROR = "http://deb.debian.org/debian"
CONTEXT_LABEL = "toolcage.context_sha256"
_SLIM = ("usr/share/doc", "usr/share/man", "usr/share/info", "usr/share/locale", "var/cache/apt", "var/lib/apt/lists")


@dataclass(frozen=True)
class BuildResult:
    tag: str
    base: str
    context_sha256: str
    built: bool  # False: the image was already up to date
    seconds: float


def debian_mirror() -> str:
    """The Debian mirror the host's apt uses (so an offline-but-mirrored machine still works)."""
    if os.environ.get(contract.ENV_DEBIAN_MIRROR):
        return os.environ[contract.ENV_DEBIAN_MIRROR]
    files = [Path("/etc/apt/sources.list"), *sorted(Path("/etc/apt/sources.list.d").glob("*"))]
    for f in files:
        try:
            text = f.read_text(errors="replace")
        except OSError:
            continue
        for m in re.finditer(r"(?m)^\s*(?:deb\s+(?:\[[^\]]*\]\s+)?|URIs:\s*)(\S+)", text):
            uri = m.group(1).rstrip("/")
            if "debian" in uri and "security" not in uri and uri.startswith(("http://", "https://", "file:/")):
                return uri
    return DEFAULT_MIRROR


def _install_debootstrap(report: Report) -> None:
    """As root on a Debian-family host, install debootstrap (a fresh machine's first run needs
    no manual step); otherwise say in one sentence what to run."""
    apt = shutil.which("apt-get")
    if os.geteuid() != 0 or apt is None:
        raise BuildError(
            "No registry is reachable and debootstrap is not installed: run `sudo apt-get install debootstrap` "
            "(or your distribution's equivalent) and then `toolcage image build` again, or set "
            "TOOLCAGE_BASE_IMAGE to a local Python 3.11 image."
        )
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    report("installing debootstrap (apt-get)")
    install = [apt, "install", "-y", "-qq", "debootstrap"]
    if subprocess.run(install, env=env, capture_output=True, text=True).returncode != 0:
        report("apt-get update")
        subprocess.run([apt, "update", "-qq"], env=env, capture_output=True, text=True)
        proc = subprocess.run(install, env=env, capture_output=True, text=True)
        if proc.returncode != 0:
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
            raise BuildError("could not install debootstrap with apt-get: " + " / ".join(tail))
    if shutil.which("debootstrap") is None:
        raise BuildError("apt-get installed debootstrap, but it is not on PATH (is /usr/sbin in PATH?)")


def bootstrap_base(engine: object, report: Report) -> str:
    """debootstrap a minimal Debian with python3 and import it as LOCAL_BASE."""
    if shutil.which("debootstrap") is None:
        _install_debootstrap(report)
    if os.geteuid() != 0:
        raise BuildError(
            "Bootstrapping the base image with debootstrap needs root: run `sudo toolcage image build` once, "
            "or set TOOLCAGE_BASE_IMAGE to a local Python 3.11 image."
        )
    mirror = debian_mirror()
    work = Path(tempfile.mkdtemp(prefix="toolcage-base-", dir="/var/tmp"))
    root = work / "root"
    try:
        report(f"debootstrap {SUITE} (minbase + python3) from {mirror}")
        cmd = ["debootstrap", "--variant=minbase", "--include=python3", SUITE, str(root), mirror]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        assert proc.stdout is not None
        tail: list[str] = []
        phase = ""
        for line in proc.stdout:
            line = line.rstrip()
            tail = [*tail[-20:], line]
            if not line.startswith("I: "):
                continue
            word = line[3:].split(" ", 1)[0]
            if word != phase:  # one progress line per debootstrap phase, not per package
                phase = word
                report(line[3:])
        if proc.wait() != 0:
            raise BuildError("debootstrap failed:\n" + "\n".join(tail))
        for rel in _SLIM:
            target = root / rel
            if target.is_dir():
                shutil.rmtree(target, ignore_errors=True)
                target.mkdir(parents=True, exist_ok=True)
        tarball = work / "base.tar"
        report("packing the root file system")
        subprocess.run(["tar", "-C", str(root), "--numeric-owner", "-cf", str(tarball), "."], check=True)
        report(f"docker import → {LOCAL_BASE}")
        repo, tag = LOCAL_BASE.split(":")
        engine.import_tarball(str(tarball), repo, tag)  # type: ignore[attr-defined]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return LOCAL_BASE


def choose_base(engine: object, report: Report, requested: str | None = None) -> str:
    """An explicit base, else the registry's Python image, else the local bootstrap."""
    requested = requested or os.environ.get(contract.ENV_BASE_IMAGE)
    if requested:
        if engine.image(requested) is None and not engine.pull(requested):  # type: ignore[attr-defined]
            raise BuildError(f"base image {requested} is neither present nor pullable")
        return requested
    for ref in (REGISTRY_BASE, LOCAL_BASE):
        if engine.image(ref) is not None:  # type: ignore[attr-defined]
            return ref
    report(f"trying to pull {REGISTRY_BASE}")
    if engine.pull(REGISTRY_BASE):  # type: ignore[attr-defined]
        return REGISTRY_BASE
    report("no registry reachable: bootstrapping a Debian base locally")
    return bootstrap_base(engine, report)


def _requirements() -> Path:
    return Path(str(resources.files("toolcage.image") / "requirements-worker.txt"))


def _kernel_requirements() -> Path:
    """IPython for the Python contexts (code_run), installed apart in /opt/toolcage/lib/kernel."""
    return Path(str(resources.files("toolcage.image") / "requirements-kernel.txt"))


# What the image gets of the toolcage package: the worker and the policy model, under the same
# names as on the host (toolcage.worker, toolcage.policies), with a package __init__ of its own
# (the host's pulls in the runner's API, which the image neither has nor needs).
_IMAGE_PACKAGES = ("toolcage.worker", "toolcage.policies")
_IMAGE_INIT = '"""toolcage inside the sandbox image: the worker and the policy model only."""\n'
_IMAGE_MODULES = ("sdk.py",)  # top-level modules the handlers import (toolcage.sdk), copied as they are


def _copy_package(name: str, dest: Path) -> None:
    src = Path(str(resources.files(name)))
    target = dest.joinpath(*name.split("."))
    shutil.copytree(src, target, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "schemas.json"))


def assemble_context(
    wheels: Path, into: Path, debs: tuple[Path, list[str]] | None = None, kernel: Path | None = None
) -> None:
    img = Path(str(resources.files("toolcage.image")))
    shutil.copy(img / "Dockerfile", into / "Dockerfile")
    shutil.copy(img / INSTALL_DEBS, into / INSTALL_DEBS)
    shutil.copy(img / RT_SCRIPT, into / RT_SCRIPT)
    debs_dir, names = debs or (into, [])
    copy_debs(debs_dir, names, into / "debs")  # an empty debs/ when there are none (the Dockerfile copies it)
    copy_wheels(wheels, into / "wheels")
    if kernel is not None:
        copy_wheels(kernel, into / "wheels")
    shutil.copy(_requirements(), into / "wheels" / "requirements-worker.txt")
    shutil.copy(_kernel_requirements(), into / "wheels" / "requirements-kernel.txt")
    (into / "toolcage").mkdir()
    (into / "toolcage" / "__init__.py").write_text(_IMAGE_INIT)
    for pkg in _IMAGE_PACKAGES:
        _copy_package(pkg, into)
    for mod in _IMAGE_MODULES:
        shutil.copy(_toplevel(mod), into / "toolcage" / mod)


INSTALL_DEBS = "install-debs.sh"  # installs the context's debs/ in the build (worker and derived)
RT_SCRIPT = "rt.py"  # makes /opt/toolcage/rt in the build: the worker's runtime for a user's own image


def worker_debs(report: Report) -> tuple[Path, list[str]] | None:
    """The worker image's Debian packages (Node.js), or None where this host cannot fetch them: the
    image is then built without them, and run_node says that node is missing."""
    try:
        return download_debs(report, WORKER_PACKAGES, what="Node.js in the worker image")
    except NoApt as exc:
        report(f"note: {exc}; building without Node.js (run_node will not work)")
        return None


def _toplevel(module_file: str) -> Path:
    return Path(str(resources.files("toolcage"))) / module_file


def context_sha256(context: Path, base_id: str) -> str:
    h = hashlib.sha256(base_id.encode())
    for path in sorted(p for p in context.rglob("*") if p.is_file()):
        h.update(str(path.relative_to(context)).encode() + b"\0")
        h.update(hashlib.sha256(path.read_bytes()).digest())
    return h.hexdigest()


SOURCE_LABEL = "toolcage.source_sha256"


def source_sha256() -> str:
    """Hash of what the image is built from on this side (worker, policies, Dockerfile, pinned
    requirements): `toolcage doctor` compares it with the image's label to tell it is current."""
    h = hashlib.sha256()
    img = Path(str(resources.files("toolcage.image")))
    for f in (img / "Dockerfile", img / INSTALL_DEBS, img / RT_SCRIPT, _requirements(), _kernel_requirements()):
        h.update(f.read_bytes())
    h.update(_IMAGE_INIT.encode())
    for mod in _IMAGE_MODULES:
        h.update(mod.encode() + b"\0" + _toplevel(mod).read_bytes())
    for pkg in _IMAGE_PACKAGES:
        root = Path(str(resources.files(pkg)))
        for path in sorted(p for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
            h.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes())
    return h.hexdigest()


def image_labels(info: dict[str, Any] | None) -> dict[str, str]:
    """An image's labels (inherited ones included: a derived image carries its parent's)."""
    return dict(((info or {}).get("Config") or {}).get("Labels") or {})


# what check_worker_image says of an image: not on this engine; no worker in it; a worker image (or one built FROM it)
WorkerImage = Literal["missing", "foreign", "worker"]


def check_worker_image(info: dict[str, Any] | None) -> WorkerImage:
    """Is the image (its inspect data; None: not on this engine) a toolcage worker image, or one built FROM
    it? ``foreign``: no :data:`SOURCE_LABEL`, so no worker (nor ``mcp wrap``'s launcher) would answer in it.
    The one check: ``toolcage image build --from``, ``mcp wrap --image`` and every container run's start ask
    it, and each says what it means for its own flag. Cheap (no hashing): :func:`is_current` tells a stale one."""
    if info is None:
        return "missing"
    return "worker" if SOURCE_LABEL in image_labels(info) else "foreign"


def is_current(info: dict[str, Any] | None) -> bool:
    """Was the image built from these toolcage sources (:func:`source_sha256`, which reads them all)?"""
    return image_labels(info).get(SOURCE_LABEL) == source_sha256()


def _quoted(text: str) -> str:
    """``text`` as a double-quoted word of a Dockerfile (backslash, quote and ``$`` escaped)."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("$", "\\$") + '"'


def label_line(labels: dict[str, str]) -> str:
    """One Dockerfile ``LABEL`` instruction carrying every label. Why not the build API's ``labels``: the
    engine's classic builder adds one ``LABEL`` step per label and commits an image for each (2-10 s apiece
    on fuse-overlayfs, by the machine's load; four of them for a derived image); one line is one step."""
    words = []
    for key, value in sorted(labels.items()):
        if any(ord(c) < 0x20 or ord(c) == 0x7F for c in key + value):
            raise BuildError(f"image label {key!r}: a control character cannot be written in a Dockerfile")
        words.append(f"{_quoted(key)}={_quoted(value)}")
    return "LABEL " + " ".join(words) + "\n"


def run_build(
    engine: EngineAPI, context: Path, tag: str, buildargs: dict[str, str], labels: dict[str, str], report: Report
) -> None:
    """docker build (no network, no pull), reporting each step; a failure is one paragraph. ``labels`` go
    on the image in one step: a ``LABEL`` line appended to the context's Dockerfile (:func:`label_line`)."""
    report(f"building {tag}")
    if labels:
        with open(context / "Dockerfile", "a", encoding="utf-8") as f:
            f.write("\n" + label_line(labels))
    error = None
    output: list[str] = []
    for msg in engine.build(str(context), tag, buildargs, {}):
        if "error" in msg:
            error = msg.get("error")
        stream = (msg.get("stream") or "").strip()
        if stream:
            output = [*output[-30:], stream]
        if stream.startswith("Step "):
            report(stream[:160])
    if error:
        raise BuildError(f"docker build of {tag} failed: {error} (last output: " + " / ".join(output[-8:]) + ")")
    built = engine.image(tag)
    if built is None:
        raise BuildError("docker build finished but the image is missing")
    record_built(str(built.get("Id") or ""))


# Images this installation built (worker and derived), by content id: only these run their own worker. The
# worker label alone proves nothing: any image can carry it, and an image that did would otherwise run its
# own code as the worker, which holds a connector's secrets and speaks for the sandbox on the channel.
BUILT_FILE = "built-images"
KEEP_BUILT = 2000  # ids kept (the oldest go first): a build adds one


def _built_path() -> Path:
    from toolcage.workspace import state_dir

    return state_dir() / BUILT_FILE


def built_here() -> frozenset[str]:
    try:
        return frozenset(_built_path().read_text(encoding="ascii", errors="replace").split())
    except OSError:
        return frozenset()


def record_built(image_id: str) -> None:
    """Remember an image this installation built (a failure to write only costs that image its own worker)."""
    if not image_id.startswith("sha256:"):
        return
    path = _built_path()
    try:
        old = [i for i in path.read_text(encoding="ascii", errors="replace").split() if i != image_id]
    except OSError:
        old = []
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        tmp = path.with_name(f".{BUILT_FILE}.{os.getpid()}")
        tmp.write_text("\n".join([*old[-(KEEP_BUILT - 1) :], image_id]) + "\n", encoding="ascii")
        os.replace(tmp, path)
    except OSError:
        pass


def runs_own_worker(info: dict[str, Any] | None, worker: dict[str, Any] | None) -> bool:
    """Does the image run its own worker: it is this installation's worker image (``worker``, the inspect data
    of the tag ``$TOOLCAGE_IMAGE`` or the default names), or an image built here from it. Every other image,
    the worker label or not, runs with the worker image's runtime mounted (toolcage.engine.runtime)."""
    if check_worker_image(info) != "worker":
        return False
    assert info is not None
    image_id = str(info.get("Id") or "")
    return bool(image_id) and (image_id == (worker or {}).get("Id") or image_id in built_here())


def build_image(
    engine: EngineAPI, tag: str, report: Report, base: str | None = None, force: bool = False
) -> BuildResult:
    """Build the worker image unless an image with the same context hash is already there."""
    started = time.monotonic()
    base_ref = choose_base(engine, report, base)
    base_info = engine.image(base_ref)
    if base_info is None:
        raise BuildError(f"base image {base_ref} disappeared")
    report(f"base image {base_ref}")
    wheels = download_wheels(report, _requirements())
    kernel = download_wheels(report, _kernel_requirements())
    debs = worker_debs(report)
    with tempfile.TemporaryDirectory(prefix="toolcage-ctx-") as tmp:
        ctx = Path(tmp)
        assemble_context(wheels, ctx, debs, kernel)
        digest = context_sha256(ctx, base_info["Id"])
        existing = engine.image(tag)
        labels = image_labels(existing)
        source = source_sha256()
        fresh = labels.get(CONTEXT_LABEL) == digest and labels.get(SOURCE_LABEL) == source
        if existing is not None and fresh and not force:
            report(f"{tag} is up to date")
            record_built(str(existing.get("Id") or ""))
            return BuildResult(tag, base_ref, digest, False, time.monotonic() - started)
        run_build(engine, ctx, tag, {"BASE": base_ref}, {CONTEXT_LABEL: digest, SOURCE_LABEL: source}, report)
    return BuildResult(tag, base_ref, digest, True, time.monotonic() - started)
