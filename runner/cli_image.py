"""``toolcage image build``: the worker image, or with ``--requirements`` an image derived from it
with third-party packages for tool code (``toolcage.image.derived``).

Split from ``toolcage.cli`` to keep each module to one purpose; like every command, it prints one
JSON document on stdout and its progress on stderr (``toolcage.progress``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from toolcage.errors import UsageError
from toolcage.output import emit, say, use_json

if TYPE_CHECKING:
    from toolcage.docker_adapter import Engine
    from toolcage.image.derived import DerivedSpec


@click.group()
def image() -> None:
    """Build the worker image, or an image derived from it with more packages."""


@image.command("build")
@click.option(
    "--tag", default=None, help="Image tag (default toolcage-worker:<version>; required with --requirements)."
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
    "--from",
    "parent",
    metavar="REF",
    default=None,
    help="With --requirements: the worker image to derive from, used as it is "
    "(default toolcage-worker:<version>, built or refreshed first).",
)
def image_build(tag: str | None, base: str | None, force: bool, requirements: str | None, parent: str | None) -> None:
    """Build the worker image (idempotent: nothing happens when nothing changed).

    With --requirements FILE --tag NAME: build NAME from the worker image, with the packages of
    FILE installed in /opt/toolcage/deps (wheels downloaded on this host; the build is offline).
    """
    from toolcage.sandbox import DEFAULT_IMAGE

    use_json(True)
    if requirements is None:
        if parent is not None:
            raise UsageError("--from applies only with --requirements FILE")
        _build_worker(tag or DEFAULT_IMAGE, base, force)
        return
    if parent is not None and base is not None:
        raise UsageError("--base applies to the worker image; --from REF is used as it is")
    from toolcage.image.derived import prepare

    spec = prepare(requirements, tag, parent, DEFAULT_IMAGE)  # exit 2 before Docker is asked anything
    _build_derived(spec, base, force)


def _engine() -> Engine:
    from toolcage.docker_adapter import Engine

    engine = Engine(timeout=600)
    engine.ping()
    return engine


def _build_worker(tag: str, base: str | None, force: bool) -> None:
    from toolcage.image.build import build_image
    from toolcage.progress import StepReporter

    engine = _engine()
    with StepReporter("toolcage image build") as reporter:
        result = build_image(engine, tag, reporter.step, base=base, force=force)
    verb = "built" if result.built else "up to date"
    say(f"{result.tag}: {verb} in {result.seconds:.1f}s (base {result.base})")
    emit(
        {
            "tag": result.tag,
            "built": result.built,
            "base": result.base,
            "context_sha256": result.context_sha256,
            "seconds": round(result.seconds, 1),
        }
    )


def _build_derived(spec: DerivedSpec, base: str | None, force: bool) -> None:
    from toolcage.image.derived import DEPS_DIR, build_derived
    from toolcage.progress import StepReporter

    engine = _engine()
    with StepReporter("toolcage image build --requirements") as reporter:
        result = build_derived(engine, spec, reporter.step, base=base, force=force)
    verb = "built" if result.built else "up to date"
    say(f"{result.tag}: {verb} in {result.seconds:.1f}s (from {result.parent}; packages in {DEPS_DIR})")
    emit(
        {
            "tag": result.tag,
            "built": result.built,
            "from": result.parent,
            "parent_id": result.parent_id,
            "worker_built": result.worker_built,
            "requirements_sha256": result.requirements_sha256,
            "context_sha256": result.context_sha256,
            "deps_dir": DEPS_DIR,
            "seconds": round(result.seconds, 1),
        }
    )


def register(group: click.Group) -> None:
    group.add_command(image)


__all__ = ["register"]
