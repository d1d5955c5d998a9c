"""``toolcage image build``: the worker image, or with ``--requirements`` an image derived from it
with third-party packages for tool code (``toolcage.image.derived``).

Split from ``toolcage.cli`` to keep each module to one purpose; like every command, it prints one
JSON document on stdout and its progress on stderr (``toolcage.progress``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click

from toolcage.errors import UsageError
from toolcage.output import emit, say, use_json

if TYPE_CHECKING:
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


def _done(tag: str, built: bool, seconds: float, detail: str, result: dict[str, Any]) -> None:
    """One line for people on stderr, the result as JSON on stdout."""
    say(f"{tag}: {'built' if built else 'up to date'} in {seconds:.1f}s ({detail})")
    emit({"tag": tag, "built": built, **result, "seconds": round(seconds, 1)})


def _build_worker(tag: str, base: str | None, force: bool) -> None:
    from toolcage.docker_adapter import Engine
    from toolcage.image.build import build_image
    from toolcage.progress import StepReporter

    engine = Engine(timeout=600)
    engine.ping()
    with StepReporter("toolcage image build") as reporter:
        r = build_image(engine, tag, reporter.step, base=base, force=force)
    _done(r.tag, r.built, r.seconds, f"base {r.base}", {"base": r.base, "context_sha256": r.context_sha256})


def _build_derived(spec: DerivedSpec, base: str | None, force: bool) -> None:
    from toolcage.docker_adapter import Engine
    from toolcage.image.derived import DEPS_DIR, build_derived
    from toolcage.progress import StepReporter

    engine = Engine(timeout=600)
    engine.ping()
    with StepReporter("toolcage image build --requirements") as reporter:
        r = build_derived(engine, spec, reporter.step, base=base, force=force)
    result = {
        "from": r.parent,
        "parent_id": r.parent_id,
        "worker_built": r.worker_built,
        "requirements_sha256": r.requirements_sha256,
        "context_sha256": r.context_sha256,
        "deps_dir": DEPS_DIR,
    }
    _done(r.tag, r.built, r.seconds, f"from {r.parent}; packages in {DEPS_DIR}", result)


def register(group: click.Group) -> None:
    group.add_command(image)


__all__ = ["register"]
