"""``toolcage image build``: the worker image, or with ``--requirements`` an image derived from it
with third-party packages for tool code (``toolcage.image.derived``).

Split from ``toolcage.cli.main`` to keep each module to one purpose; like every command, it prints one
JSON document on stdout and its progress on stderr (``toolcage.cli.progress``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click

from toolcage.cli.output import emit, say, use_json
from toolcage.errors import UsageError

if TYPE_CHECKING:
    from toolcage.image.derived import DerivedSpec


@click.group()
def image() -> None:
    """Build the worker image, or an image derived from it with more packages."""


@image.command("build")
@click.option(
    "--tag",
    default=None,
    help="Image tag (default $TOOLCAGE_IMAGE, else toolcage-worker:<version>; required with --requirements).",
)
@click.option(
    "--base",
    default=None,
    help="Base image with Python 3.11 (default: registry python image, else a local debootstrap).",
)
@click.option("--force", is_flag=True, help="Rebuild even if the image is up to date.")
@click.option(
    "--requirements",
    metavar="FILE",
    default=None,
    help="Build an image derived from the worker image with FILE's packages in /opt/toolcage/deps (needs --tag).",
)
@click.option(
    "--pip",
    "pip",
    metavar="PKG",
    multiple=True,
    help="Like --requirements, with the packages named here (repeatable), e.g. --pip mcp-server-time (needs --tag).",
)
@click.option(
    "--apt",
    "apt",
    metavar="PKG",
    multiple=True,
    help="A Debian package for the derived image (repeatable), e.g. --apt git; alone or with --pip/--requirements "
    "(needs --tag). Downloaded on this host by its apt, from the mirror it uses (a Debian bookworm host).",
)
@click.option(
    "--from",
    "parent",
    metavar="REF",
    default=None,
    help="With --requirements: the worker image to derive from, used as it is "
    "(default toolcage-worker:<version>, built or refreshed first).",
)
def image_build(
    tag: str | None,
    base: str | None,
    force: bool,
    requirements: str | None,
    pip: tuple[str, ...],
    apt: tuple[str, ...],
    parent: str | None,
) -> None:
    """Build the worker image (idempotent: nothing happens when nothing changed).

    With --requirements FILE --tag NAME (or --pip PKG ... --tag NAME): build NAME from the worker
    image, with the packages installed in /opt/toolcage/deps (wheels downloaded on this host; the
    build is offline). With --apt PKG (repeatable), Debian packages too, e.g. --apt git.
    """
    from toolcage.options import worker_image

    default = worker_image()  # $TOOLCAGE_IMAGE, as every run uses it, else toolcage-worker:<version>
    use_json(True)
    if requirements is None and not pip and not apt:
        if parent is not None:
            raise UsageError("--from applies only with --requirements FILE, --pip PKG or --apt PKG")
        _build_worker(tag or default, base, force)
        return
    if requirements is not None and pip:
        raise UsageError("give the packages either with --requirements FILE or with --pip PKG, not both")
    if parent is not None and base is not None:
        raise UsageError("--base applies to the worker image; --from REF is used as it is")
    from toolcage.image.derived import prepare, prepare_pip, with_apt

    # exit 2 before Docker is asked anything
    spec = None
    if requirements is not None:
        spec = prepare(requirements, tag, parent, default)
    elif not tag:
        raise UsageError(
            f"{'--pip' if pip else '--apt'} needs --tag NAME: the derived image gets a name of its own, "
            "the worker image keeps its."
        )
    elif pip:
        spec = prepare_pip(pip, tag, parent, default)
    if apt:
        spec = with_apt(spec, apt, tag or "", parent, default)
    assert spec is not None
    build_derived_image(spec, base, force)


def _done(tag: str, built: bool, seconds: float, detail: str, result: dict[str, Any]) -> None:
    """One line for people on stderr, the result as JSON on stdout."""
    say(f"{tag}: {'built' if built else 'up to date'} in {seconds:.1f}s ({detail})")
    emit({"tag": tag, "built": built, **result, "seconds": round(seconds, 1)})


def _build_worker(tag: str, base: str | None, force: bool) -> None:
    from toolcage.cli.progress import StepReporter
    from toolcage.engine.docker_adapter import Engine
    from toolcage.image.build import build_image

    engine = Engine(timeout=600)
    engine.ping()
    before = (engine.image(tag) or {}).get("Id")
    with StepReporter("toolcage image build") as reporter:
        r = build_image(engine, tag, reporter.step, base=base, force=force)
        _share_files(engine, r.tag, reporter.step, before)
    _done(r.tag, r.built, r.seconds, f"base {r.base}", {"base": r.base, "context_sha256": r.context_sha256})


def _share_files(engine: Any, tag: str, step: Any, before: str | None) -> None:
    """Now rather than at the image's first run: its files in the volumes its sandboxes share, where the
    engine's storage driver does not share them itself (toolcage.engine.sharedfiles; a few seconds, once).
    The image this build replaced (``before``), once no tag names it, loses its volumes (~225 MiB)."""
    from toolcage.engine import runtime, sharedfiles

    image_id = (engine.image(tag) or {}).get("Id")
    if before and before != image_id and not (engine.image(before) or {}).get("RepoTags"):
        dropped = sharedfiles.drop(engine, before) + runtime.drop(engine, before)
        if dropped:
            step(f"removed the shared files of the image this build replaced ({len(dropped)} volumes)")
    if image_id and sharedfiles.enabled() and engine.flavor().shared_files:
        step("the image's program files, shared by its sandboxes (once per image)")
        sharedfiles.layers(engine, image_id)
    if image_id:
        # now rather than at the first run of a user's own image: the worker's runtime in two volumes
        step("the worker's runtime, for images that are not toolcage's (once per image)")
        runtime.find(engine, image_id)


def build_derived_image(
    spec: DerivedSpec, base: str | None, force: bool, *, emit_result: bool = True, title: str = "toolcage image build"
) -> None:
    """Build (or find up to date) a derived image, its progress on stderr; with ``emit_result``, its JSON on stdout."""
    from toolcage.cli.progress import StepReporter
    from toolcage.engine.docker_adapter import Engine
    from toolcage.image.derived import DEPS_DIR, build_derived

    engine = Engine(timeout=600)
    engine.ping()
    before = (engine.image(spec.tag) or {}).get("Id")
    with StepReporter(title) as reporter:
        r = build_derived(engine, spec, reporter.step, base=base, force=force)
        _share_files(engine, r.tag, reporter.step, before)
    result = {
        "from": r.parent,
        "parent_id": r.parent_id,
        "worker_built": r.worker_built,
        "requirements_sha256": r.requirements_sha256,
        "apt": list(spec.apt),
        "context_sha256": r.context_sha256,
        "deps_dir": DEPS_DIR,
    }
    if emit_result:
        _done(r.tag, r.built, r.seconds, f"from {r.parent}; packages in {DEPS_DIR}", result)
    else:
        say(f"{r.tag}: {'built' if r.built else 'up to date'} in {r.seconds:.1f}s (from {r.parent})")


def register(group: click.Group) -> None:
    group.add_command(image)


__all__ = ["build_derived_image", "register"]
