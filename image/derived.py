"""``toolcage image build --requirements FILE --tag NAME``: the worker image plus third-party
packages in /opt/toolcage/deps, for tool code and connector handlers; with ``--apt PKG``, Debian
packages too (``git``, ``curl``), installed as in any Debian.

Offline like the worker build (wheels and .deb files from the host, ``image/Dockerfile.deps``),
FROM the worker image by id, and only when the requirements, the Debian package names, the parent
or the Dockerfile changed.
"""

from __future__ import annotations

import hashlib
import re
import shutil
import tempfile
import time
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

from toolcage.errors import ImageMissing, RequirementsError, UsageError
from toolcage.image.build import (
    CONTEXT_LABEL,
    INSTALL_DEBS,
    SOURCE_LABEL,
    build_image,
    check_worker_image,
    image_labels,
    is_current,
    record_built,
    run_build,
    source_sha256,
)
from toolcage.image.debs import check_names, copy_debs, download_debs
from toolcage.image.wheels import Report, copy_wheels, download_wheels
from toolcage.policies import contract

if TYPE_CHECKING:
    from toolcage.engine.api import EngineAPI

DEPS_DIR = contract.DEPS_DIR  # tool code finds its packages here
REQUIREMENTS_LABEL = "toolcage.requirements_sha256"
APT_LABEL = "toolcage.apt"  # the Debian packages named with --apt, space-separated
PARENT_LABEL = "toolcage.parent_id"

# a Docker image reference: [host[:port]/]path[:tag], lowercase path components
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_REFERENCE = re.compile(
    rf"(?:[A-Za-z0-9.-]+(?::[0-9]+)?/)?{_COMPONENT}(?:/{_COMPONENT})*(?::\w[\w.-]{{0,127}})?", re.ASCII
)


@dataclass(frozen=True)
class DerivedSpec:
    """What to build, checked on the host before Docker is asked anything."""

    requirements: bytes  # empty: Debian packages only (--apt)
    tag: str
    parent: str
    refresh_parent: bool  # the parent is the default worker image: build or refresh it first
    apt: tuple[str, ...] = ()  # Debian package names (--apt), sorted


@dataclass(frozen=True)
class DerivedResult:
    tag: str
    parent: str
    parent_id: str
    requirements_sha256: str
    context_sha256: str
    built: bool  # False: the image was already up to date
    worker_built: bool | None  # the parent was (re)built first; None: --from, used as it is
    seconds: float


def _normal(ref: str) -> str:
    """``ref`` as the engine names it: with a tag (``latest``), without Docker Hub's prefixes."""
    name, tag = ref, "latest"
    if "@" not in ref and ":" in ref.rsplit("/", 1)[-1]:
        name, tag = ref.rsplit(":", 1)
    for prefix in ("docker.io/library/", "index.docker.io/library/", "docker.io/", "library/"):
        if name.startswith(prefix):
            name = name[len(prefix) :]
            break
    return f"{name}:{tag}"


def check_tag(tag: str, worker_tags: tuple[str, ...]) -> None:
    """The derived image's tag is a valid reference and not the worker image's own."""
    if not _REFERENCE.fullmatch(tag):
        raise UsageError(f"--tag {tag!r} is not an image name: use NAME[:TAG], lowercase, e.g. my-tools:1")
    if _normal(tag) in {_normal(t) for t in worker_tags}:
        raise UsageError(
            f"--tag {tag} is the worker image's own tag: the derived image needs a name of its own "
            "(e.g. --tag my-tools:1), so the worker image stays as it is."
        )


def read_requirements(path: str) -> bytes:
    """The file's bytes, once it is known to list packages (and only packages) from the index."""
    try:
        data = Path(path).read_bytes()
    except IsADirectoryError:
        raise RequirementsError(f"--requirements {path}: a directory, not a requirements file") from None
    except OSError as exc:
        raise RequirementsError(f"--requirements {path}: cannot read it ({exc.strerror or exc})") from None
    return check_requirements(data, f"--requirements {path}")


def check_requirements(data: bytes, what: str) -> bytes:
    """``data`` as given, once it is known to list packages (and only packages) from the index;
    ``what`` names its source in errors (``--requirements FILE``, ``--pip``)."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise RequirementsError(f"{what}: not UTF-8 text") from None
    found = 0
    for number, raw in enumerate(re.sub(r"\\\r?\n", " ", text).splitlines(), 1):
        line = re.sub(r"(^|\s)#.*", "", raw).strip()
        if not line:
            continue
        if line.startswith("-"):
            raise RequirementsError(
                f"{what}, line {number}: {line.split()[0]!r} is not supported here: list "
                "packages only (name==version, one a line); they come from the index pip uses on this host."
            )
        if "://" in line or "@" in line.split(";")[0] or not re.match(r"[A-Za-z0-9]", line):
            raise RequirementsError(
                f"{what}, line {number}: {line[:80]!r} is not a package from the index "
                "(no URLs, paths or `name @ url`): list packages only, as name==version."
            )
        found += 1
    if not found:
        raise RequirementsError(f"{what}: lists no packages")
    return data


def prepare(requirements: str, tag: str | None, parent: str | None, worker: str) -> DerivedSpec:
    """Everything checked before Docker is asked anything: --tag, then the file (each exit 2)."""
    if not tag:
        raise UsageError(
            "--requirements needs --tag NAME: the derived image gets a name of its own, the worker image keeps its."
        )
    check_tag(tag, (parent or worker, worker))
    return DerivedSpec(read_requirements(requirements), tag, parent or worker, refresh_parent=parent is None)


def pip_requirements(packages: tuple[str, ...]) -> bytes:
    """``--pip PKG`` (repeatable) as a requirements file's bytes, one package a line, checked like a file."""
    for pkg in packages:
        if not pkg.strip() or any(c in pkg for c in "\r\n"):
            raise RequirementsError(f"--pip {pkg!r}: give one package per --pip, e.g. --pip mcp-server-time==2025.9.25")
    return check_requirements("".join(f"{p.strip()}\n" for p in packages).encode(), "--pip")


def prepare_pip(packages: tuple[str, ...], tag: str, parent: str | None, worker: str) -> DerivedSpec:
    """As :func:`prepare`, for packages named on the command line."""
    check_tag(tag, (parent or worker, worker))
    return DerivedSpec(pip_requirements(packages), tag, parent or worker, refresh_parent=parent is None)


def with_apt(spec: DerivedSpec | None, apt: tuple[str, ...], tag: str, parent: str | None, worker: str) -> DerivedSpec:
    """``spec`` (from --requirements or --pip; None: Debian packages only) with ``--apt`` names added."""
    names = check_names(apt)
    if spec is None:
        check_tag(tag, (parent or worker, worker))
        return DerivedSpec(b"", tag, parent or worker, refresh_parent=parent is None, apt=names)
    return DerivedSpec(spec.requirements, spec.tag, spec.parent, spec.refresh_parent, apt=names)


def requirements_sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def dockerfile() -> bytes:
    return Path(str(resources.files("toolcage.image") / "Dockerfile.deps")).read_bytes()


def recipe_sha256(parent_id: str, requirements: bytes, dockerfile_text: bytes, apt: tuple[str, ...] = ()) -> str:
    """What the derived image is made of, known before any download: the parent, the file, the Dockerfile
    and the Debian package names (the versions are those apt on the host picks at the build, as pip picks
    an unpinned name's)."""
    h = hashlib.sha256()
    for part in (parent_id.encode(), requirements, dockerfile_text):
        h.update(hashlib.sha256(part).digest())
    if apt:
        h.update(hashlib.sha256(" ".join(apt).encode()).digest())
    return h.hexdigest()


def _wanted(parent_id: str, spec: DerivedSpec) -> dict[str, str]:
    """The labels an up-to-date derived image carries."""
    wanted = {
        CONTEXT_LABEL: recipe_sha256(parent_id, spec.requirements, dockerfile(), spec.apt),
        REQUIREMENTS_LABEL: requirements_sha256(spec.requirements),
        PARENT_LABEL: parent_id,
    }
    if spec.apt:
        wanted[APT_LABEL] = " ".join(spec.apt)
    return wanted


def assemble_context(
    wheels: Path | None, requirements: bytes, into: Path, debs: tuple[Path, list[str]] | None = None
) -> None:
    """Dockerfile (Dockerfile.deps), requirements.txt, wheels/ (pip's wheel among them; empty with no
    requirements), install-debs.sh and debs/ (the --apt packages and their dependencies; maybe empty)."""
    (into / "Dockerfile").write_bytes(dockerfile())
    (into / "requirements.txt").write_bytes(requirements)
    if wheels is None:
        (into / "wheels").mkdir(exist_ok=True)
    else:
        copy_wheels(wheels, into / "wheels")
    shutil.copy(Path(str(resources.files("toolcage.image") / INSTALL_DEBS)), into / INSTALL_DEBS)
    debs_dir, names = debs or (into, [])
    copy_debs(debs_dir, names, into / "debs")


def _parent(engine: EngineAPI, spec: DerivedSpec, report: Report, base: str | None) -> tuple[str, bool | None]:
    """The parent's image id (the default worker image is built or refreshed first)."""
    worker_built = None
    if spec.refresh_parent:
        report(f"worker image {spec.parent}: building it if it is missing or out of date")
        worker_built = build_image(engine, spec.parent, report, base=base).built
    info = engine.image(spec.parent)
    found = check_worker_image(info)
    if info is None:  # found == "missing"
        raise ImageMissing(
            f"--from {spec.parent}: no such image; build it with `toolcage image build --tag {spec.parent}`",
            image=spec.parent,
        )
    labels = image_labels(info)
    if REQUIREMENTS_LABEL in labels:
        raise UsageError(
            f"--from {spec.parent} is itself a derived image: derive from the worker image, "
            "with every package in one requirements file."
        )
    if found == "foreign":
        raise UsageError(
            f"--from {spec.parent} is not a toolcage worker image (no {SOURCE_LABEL} label): "
            "build one with `toolcage image build --tag NAME`."
        )
    if not is_current(info):
        report(f"note: {spec.parent} was built from other toolcage sources; `toolcage image build` refreshes it")
    return str(info["Id"]), worker_built


def unpinned(packages: tuple[str, ...]) -> list[str]:
    """The ``--pip`` names that do not fix one release (``==X``, ``===X`` or ``name @ URL``): an image built
    for such a name is reused as long as the text is the same, whatever the index holds later."""
    out = []
    for pkg in packages:
        spec = pkg.split(";", 1)[0]
        exact = re.search(r"===?\s*[^\s,*]+\s*$", spec) is not None and "," not in spec
        if not exact and " @ " not in spec and "@" not in spec.split("[", 1)[0]:
            out.append(pkg.strip())
    return out


def derived_current(engine: EngineAPI, spec: DerivedSpec) -> bool:
    """Whether ``spec.tag`` is there and up to date, and its parent (the worker image) current too, asked
    without building or printing anything (``mcp wrap --pip`` stays quiet at every start when nothing is
    built)."""
    parent = engine.image(spec.parent)
    labels = image_labels(parent)
    if parent is None or labels.get(SOURCE_LABEL) != source_sha256() or REQUIREMENTS_LABEL in labels:
        return False
    wanted = _wanted(str(parent["Id"]), spec)
    have = image_labels(engine.image(spec.tag))
    return all(have.get(k) == v for k, v in wanted.items())


def build_derived(
    engine: EngineAPI, spec: DerivedSpec, report: Report, base: str | None = None, force: bool = False
) -> DerivedResult:
    """Build ``spec.tag`` FROM the worker image with the packages in DEPS_DIR, unless it is up to date."""
    started = time.monotonic()
    parent_id, worker_built = _parent(engine, spec, report, base)
    wanted = _wanted(parent_id, spec)
    req_sha, recipe = wanted[REQUIREMENTS_LABEL], wanted[CONTEXT_LABEL]
    existing = engine.image(spec.tag)
    labels = image_labels(existing)
    if existing is not None and SOURCE_LABEL in labels and REQUIREMENTS_LABEL not in labels:
        raise UsageError(
            f"--tag {spec.tag} names a worker image built by `toolcage image build`: "
            "give the derived image a name of its own."
        )

    def result(built: bool) -> DerivedResult:
        seconds = time.monotonic() - started
        return DerivedResult(spec.tag, spec.parent, parent_id, req_sha, recipe, built, worker_built, seconds)

    if existing is not None and not force and all(labels.get(k) == v for k, v in wanted.items()):
        report(f"{spec.tag} is up to date")
        record_built(str(existing.get("Id") or ""))
        return result(False)
    with tempfile.TemporaryDirectory(prefix="toolcage-deps-") as tmp:
        ctx = Path(tmp)
        (ctx / "requirements.txt").write_bytes(spec.requirements)
        wheels = download_wheels(report, ctx / "requirements.txt") if spec.requirements else None
        debs = download_debs(report, spec.apt) if spec.apt else None
        assemble_context(wheels, spec.requirements, ctx, debs)
        names = sorted(w.name for w in (ctx / "wheels").glob("*.whl") if not w.name.startswith("pip-"))
        if names:
            report(f"wheels for {DEPS_DIR}: {', '.join(names)}")
        if debs:
            report(f"Debian packages: {', '.join(spec.apt)} ({len(debs[1])} files with their dependencies)")
        run_build(engine, ctx, spec.tag, {"PARENT": parent_id}, wanted, report)
    return result(True)


__all__ = [
    "APT_LABEL",
    "DEPS_DIR",
    "PARENT_LABEL",
    "REQUIREMENTS_LABEL",
    "DerivedResult",
    "DerivedSpec",
    "build_derived",
    "check_requirements",
    "check_tag",
    "derived_current",
    "pip_requirements",
    "prepare",
    "prepare_pip",
    "read_requirements",
    "unpinned",
    "with_apt",
]
