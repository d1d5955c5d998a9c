"""Fixtures for the foreign images of issue 36 (tests/harness/foreign_images.py), loaded by
tests/conftest.py's ``pytest_plugins``.

``foreign_image``: the tag of one kind's image, built if missing; parametrize it by kind::

    @pytest.mark.parametrize("foreign_image", ["busybox", "musl"], indirect=True)
    def test_x(foreign_image: str) -> None: ...

``foreign_images_all``: every kind, kind -> tag. A kind that cannot be built here FAILS its tests
with the reason; nothing is skipped.
"""

from __future__ import annotations

import pytest

from tests.harness import foreign_images


def _ensure_or_fail(kind: str) -> str:
    try:
        return foreign_images.ensure(kind)
    except foreign_images.BuildError as exc:
        pytest.fail(f"foreign image {kind!r} cannot be built on this machine: {exc}", pytrace=False)
    except ValueError as exc:
        pytest.fail(str(exc), pytrace=False)


@pytest.fixture(scope="session")
def foreign_image(request: pytest.FixtureRequest) -> str:
    """The tag of the foreign image of the kind this fixture is parametrized with (indirect=True)."""
    kind = getattr(request, "param", None)
    if not isinstance(kind, str):
        pytest.fail(
            'foreign_image needs a kind: @pytest.mark.parametrize("foreign_image", ["busybox"], indirect=True)',
            pytrace=False,
        )
    return _ensure_or_fail(kind)


@pytest.fixture(scope="session")
def foreign_images_all() -> dict[str, str]:
    """Every foreign image, kind -> tag; fails with the reason of each kind that cannot be built."""
    tags: dict[str, str] = {}
    failed: list[str] = []
    for kind in foreign_images.KINDS:
        try:
            tags[kind] = foreign_images.ensure(kind)
        except foreign_images.BuildError as exc:
            failed.append(f"{kind}: {exc}")
    if failed:
        pytest.fail("foreign images that cannot be built on this machine: " + "; ".join(failed), pytrace=False)
    return tags
