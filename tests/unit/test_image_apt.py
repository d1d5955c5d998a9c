"""`toolcage image build --apt PKG`: Debian packages in a derived image, checked before Docker is asked
anything, downloaded on the host (toolcage.image.debs, replaced here), installed offline by Dockerfile.deps."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from tests.unit.test_image_derived import SIX, WORKER, FakeEngine, _usage, no_engine  # noqa: F401
from toolcage.cli import image as cli_image
from toolcage.cli.main import cli
from toolcage.image import derived
from toolcage.image.build import CONTEXT_LABEL


@pytest.fixture
def apt_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, ...]]:
    """download_debs and download_wheels replaced by caches; the list records each download_debs call."""
    calls: list[tuple[str, ...]] = []
    debs = tmp_path / "debs"
    debs.mkdir()
    (debs / "git_2.39_amd64.deb").write_bytes(b"deb")
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    (wheels / "pip-26.0-py3-none-any.whl").write_text("pip")

    def fake_debs(report: Any, packages: tuple[str, ...]) -> tuple[Path, list[str]]:
        calls.append(packages)
        return debs, ["git_2.39_amd64.deb"]

    def fake_wheels(report: Any, requirements: Path) -> Path:
        calls.append(("pip", requirements.read_text()))
        return wheels

    monkeypatch.setattr(derived, "download_debs", fake_debs)
    monkeypatch.setattr(derived, "download_wheels", fake_wheels)
    return calls


def _apt_spec(*names: str, requirements: bytes = b"") -> derived.DerivedSpec:
    base = derived.DerivedSpec(requirements, "my-tools:1", "toolcage-worker:test", False) if requirements else None
    return derived.with_apt(base, names, "my-tools:1", "toolcage-worker:test", "toolcage-worker:test")


def test_apt_alone_builds_with_the_debs_and_no_wheels(apt_cache: list[tuple[str, ...]]) -> None:
    """--apt git alone: the .deb files are fetched, no wheels; the labels name the packages."""
    engine = FakeEngine({"toolcage-worker:test": WORKER})
    res = derived.build_derived(engine, _apt_spec("git"), lambda _m: None)
    assert res.built and apt_cache == [("git",)]
    [(_, _, labels)] = engine.builds
    assert labels[derived.APT_LABEL] == "git"
    assert labels[CONTEXT_LABEL] == derived.recipe_sha256("sha256:parent", b"", derived.dockerfile(), ("git",))
    assert not derived.build_derived(engine, _apt_spec("git"), lambda _m: None).built  # up to date: no download
    assert len(apt_cache) == 1
    assert derived.build_derived(engine, _apt_spec("git", "curl"), lambda _m: None).built  # another package: stale


def test_apt_with_pip(apt_cache: list[tuple[str, ...]]) -> None:
    """--apt git --pip six: both downloads, one image."""
    engine = FakeEngine({"toolcage-worker:test": WORKER})
    derived.build_derived(engine, _apt_spec("git", requirements=SIX), lambda _m: None)
    assert apt_cache == [("pip", SIX.decode()), ("git",)]


def test_recipe_changes_with_the_packages() -> None:
    plain = derived.recipe_sha256("sha256:a", SIX, b"FROM x")
    assert derived.recipe_sha256("sha256:a", SIX, b"FROM x", ()) == plain
    assert derived.recipe_sha256("sha256:a", SIX, b"FROM x", ("git",)) != plain


def test_context_and_dockerfile(tmp_path: Path) -> None:
    """The context holds install-debs.sh and debs/; Dockerfile.deps installs them before the wheels, and runs
    pip only when there are requirements."""
    debs = tmp_path / "cache"
    debs.mkdir()
    (debs / "git_1_amd64.deb").write_bytes(b"deb")
    ctx = tmp_path / "ctx"
    ctx.mkdir()
    derived.assemble_context(None, b"", ctx, (debs, ["git_1_amd64.deb"]))
    assert [p.name for p in (ctx / "debs").iterdir()] == ["git_1_amd64.deb"]
    assert (ctx / "install-debs.sh").is_file() and list((ctx / "wheels").iterdir()) == []
    text = (ctx / "Dockerfile").read_text()
    assert text.index("install-debs.sh /tmp/debs") < text.index('/pip" install')
    assert "if grep -q '[^[:space:]]' /tmp/wheels/requirements.txt" in text


def test_cli_apt_checks_before_docker(no_engine: None) -> None:  # noqa: F811
    """--apt without --tag, or with what is not a package name: exit 2, one line, before Docker is asked."""
    _usage(["--apt", "git"], "--apt needs --tag NAME")
    _usage(["--apt", "git=1:2.39", "--tag", "t:1"], "is not a Debian package name")
    _usage(["--apt", "git", "--tag", "toolcage-worker:0.1.0"], "the worker image's own tag")


def test_cli_apt_reaches_the_build(monkeypatch: pytest.MonkeyPatch) -> None:
    """--apt git --apt curl --pip six --tag t:1: one derived spec with both; the JSON names the packages."""
    specs: list[derived.DerivedSpec] = []
    monkeypatch.setattr(cli_image, "build_derived_image", lambda spec, *a, **k: specs.append(spec))
    out = CliRunner().invoke(cli, ["image", "build", "--apt", "git", "--apt", "curl", "--pip", "six", "--tag", "t:1"])
    assert out.exit_code == 0, out.output
    [spec] = specs
    assert spec.apt == ("curl", "git") and spec.requirements == b"six\n" and spec.tag == "t:1"
    out = CliRunner().invoke(cli, ["image", "build", "--apt", "git", "--tag", "t:1"])
    assert out.exit_code == 0 and specs[-1].requirements == b"" and specs[-1].apt == ("git",)
