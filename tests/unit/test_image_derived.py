"""`image build --requirements` on the host, without Docker: hashes and the cache key, the tag and
the file checks, the build context, pip's failures as one paragraph, and the CLI's exit codes."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shlex
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from toolcage.cli.main import cli
from toolcage.errors import BuildError, ImageMissing, RequirementsError, UsageError
from toolcage.image import derived, wheels
from toolcage.image.build import CONTEXT_LABEL, SOURCE_LABEL, BuildResult, source_sha256
from toolcage.sandbox import DEFAULT_IMAGE

SIX = b"six==1.16.0\n"


# hashes and the cache key ---------------------------------------------------------------------


def test_cache_key_is_the_files_bytes_and_the_arch() -> None:
    """The wheel cache is keyed by the requirements' bytes and the arch, as the worker's always was."""
    key = wheels.cache_key(SIX, "x86_64")
    assert key == hashlib.sha256(SIX + b"x86_64").hexdigest()[:16]  # existing caches stay valid
    assert wheels.cache_key(SIX, "x86_64") == key
    assert wheels.cache_key(b"six==1.16.1\n", "x86_64") != key
    assert wheels.cache_key(SIX, "aarch64") != key


def test_recipe_changes_with_the_parent_the_file_and_the_dockerfile() -> None:
    """The derived image's hash covers the parent's id, the requirements and Dockerfile.deps, each alone."""
    base = derived.recipe_sha256("sha256:a", SIX, b"FROM x")
    assert derived.recipe_sha256("sha256:a", SIX, b"FROM x") == base
    assert derived.recipe_sha256("sha256:b", SIX, b"FROM x") != base
    assert derived.recipe_sha256("sha256:a", b"six==1.16.1\n", b"FROM x") != base
    assert derived.recipe_sha256("sha256:a", SIX, b"FROM y") != base
    assert derived.requirements_sha256(SIX) == hashlib.sha256(SIX).hexdigest()


# the tag --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("tag", "worker"),
    [
        ("toolcage-worker:0.1.0", "toolcage-worker:0.1.0"),
        ("docker.io/library/toolcage-worker:0.1.0", "toolcage-worker:0.1.0"),
        ("my-worker", "my-worker:latest"),
    ],
)
def test_tag_may_not_be_the_worker_images(tag: str, worker: str) -> None:
    """The worker image's own tag, however it is spelt, is refused: the worker image stays as it is."""
    with pytest.raises(UsageError, match="the worker image's own tag") as info:
        derived.check_tag(tag, (worker,))
    assert info.value.exit_code == 2


@pytest.mark.parametrize("tag", ["My-Tools:1", "my tools", "my-tools:", "-x:1", "my-tools:1@sha256:ab"])
def test_tag_must_be_an_image_name(tag: str) -> None:
    """A tag Docker would refuse is refused before anything is downloaded."""
    with pytest.raises(UsageError, match="is not an image name"):
        derived.check_tag(tag, (DEFAULT_IMAGE,))


@pytest.mark.parametrize("tag", ["my-tools:1", "registry.local:5000/team/my_tools:2024.1", "toolcage-worker:deps"])
def test_other_tags_pass(tag: str) -> None:
    """Any other valid name passes, including another tag of the worker's repository."""
    derived.check_tag(tag, (DEFAULT_IMAGE,))


# the requirements file ------------------------------------------------------------------------


def test_packages_comments_markers_and_continuations_pass(tmp_path: Path) -> None:
    """Packages with extras, markers, comments and continued lines are read as they are (bytes unchanged)."""
    text = (
        "# for the connector\n\nsix==1.16.0  # pinned\n"
        'requests[socks]>=2.31 ; python_version >= "3.11"\nattrs==23.2.0 \\\n    --hash=sha256:ab\n'
    )
    f = tmp_path / "r.txt"
    f.write_text(text)
    assert derived.read_requirements(str(f)) == text.encode()


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("-r other.txt\n", "'-r' is not supported"),
        ("six\n-e .\n", "line 2: '-e' is not supported"),
        ("--index-url https://example.org/simple\n", "'--index-url' is not supported"),
        ("https://example.org/six.whl\n", "not a package from the index"),
        ("./vendor/six\n", "not a package from the index"),
        ("six @ https://example.org/six.whl\n", "not a package from the index"),
        ("# nothing\n\n", "lists no packages"),
    ],
)
def test_what_is_not_a_package_is_refused(tmp_path: Path, text: str, says: str) -> None:
    """Options, URLs, paths and empty files are refused naming the file (and line), exit 2."""
    f = tmp_path / "r.txt"
    f.write_text(text)
    with pytest.raises(RequirementsError, match=says) as info:
        derived.read_requirements(str(f))
    assert info.value.exit_code == 2 and str(f) in info.value.message and "\n" not in info.value.message


def test_missing_directory_and_binary_files_are_refused(tmp_path: Path) -> None:
    """A missing file, a directory and non-UTF-8 bytes each get one sentence, exit 2."""
    binary = tmp_path / "b.txt"
    binary.write_bytes(b"\xff\xfe\x00")
    for path, says in ((tmp_path / "none.txt", "cannot read it"), (tmp_path, "a directory"), (binary, "not UTF-8")):
        with pytest.raises(RequirementsError, match=says) as info:
            derived.read_requirements(str(path))
        assert info.value.exit_code == 2


# the build context ----------------------------------------------------------------------------


def test_context_has_the_dockerfile_the_requirements_and_the_wheels(tmp_path: Path) -> None:
    """The context is Dockerfile.deps as Dockerfile, requirements.txt as given, and the cached wheels only."""
    cache = tmp_path / "cache"
    cache.mkdir()
    for name in ("six-1.16.0-py2.py3-none-any.whl", "pip-26.0-py3-none-any.whl", ".complete", "notes.txt"):
        (cache / name).write_text(name)
    ctx = tmp_path / "ctx"
    ctx.mkdir()
    derived.assemble_context(cache, SIX, ctx)
    assert (ctx / "Dockerfile").read_bytes() == derived.dockerfile()
    assert (ctx / "requirements.txt").read_bytes() == SIX
    assert sorted(p.name for p in (ctx / "wheels").iterdir()) == [
        "pip-26.0-py3-none-any.whl",
        "six-1.16.0-py2.py3-none-any.whl",
    ]


def test_dockerfile_keeps_the_workers_contract() -> None:
    """Dockerfile.deps installs offline into /opt/toolcage/deps only; the worker's user, entrypoint, env stay."""
    text = derived.dockerfile().decode()
    assert "--no-index" in text and "--target /opt/toolcage/deps" in text
    assert "compileall" in text and "chmod a-s" in text and "go-w /opt/toolcage/deps" in text
    users = [ln.split()[1] for ln in text.splitlines() if ln.startswith("USER ")]
    assert users[-1] == "65532:65532"
    assert not any(ln.startswith(("ENTRYPOINT", "ENV", "CMD", "WORKDIR")) for ln in text.splitlines())


# the build, with a fake engine ----------------------------------------------------------------


class FakeEngine:
    """Images by reference; build() records its arguments and tags a new image with its labels."""

    def __init__(self, images: dict[str, dict[str, Any]]) -> None:
        self.images = images
        self.builds: list[tuple[str, dict[str, str], dict[str, str]]] = []

    def image(self, ref: str) -> dict[str, Any] | None:
        return self.images.get(ref)

    def build(self, context: str, tag: str, buildargs: dict[str, str], labels: dict[str, str]) -> Iterator[Any]:
        assert not labels, "labels go in the Dockerfile's one LABEL line, not the build API (one step per label)"
        last = (Path(context) / "Dockerfile").read_text().splitlines()[-1]
        labels = dict(w.split("=", 1) for w in shlex.split(last.removeprefix("LABEL ")))
        self.builds.append((tag, buildargs, labels))
        yield {"stream": "Step 1/1 : FROM x\n"}
        self.images[tag] = {"Id": "sha256:new", "Config": {"Labels": labels}}


def _image(id_: str, **labels: str) -> dict[str, Any]:
    return {"Id": id_, "Config": {"Labels": labels}}


WORKER = _image("sha256:parent", **{SOURCE_LABEL: source_sha256()})


def _spec(parent: str = "toolcage-worker:test", refresh: bool = False) -> derived.DerivedSpec:
    return derived.DerivedSpec(SIX, "my-tools:1", parent, refresh_parent=refresh)


@pytest.fixture
def wheel_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """download_wheels replaced by a cache holding six and pip; the list records each call."""
    calls: list[str] = []
    cache = tmp_path / "wheels"
    cache.mkdir()
    for name in ("six-1.16.0-py2.py3-none-any.whl", "pip-26.0-py3-none-any.whl"):
        (cache / name).write_text(name)

    def fake(report: Any, requirements: Path) -> Path:
        calls.append(requirements.read_text())
        return cache

    monkeypatch.setattr(derived, "download_wheels", fake)
    return calls


def test_builds_from_the_parent_id_with_its_labels(wheel_cache: list[str]) -> None:
    """The build is FROM the parent's id and labelled with the recipe, the requirements' hash and the parent id."""
    engine = FakeEngine({"toolcage-worker:test": WORKER})
    res = derived.build_derived(engine, _spec(), lambda _m: None)
    assert res.built and res.worker_built is None and wheel_cache == [SIX.decode()]
    [(tag, args, labels)] = engine.builds
    assert tag == "my-tools:1" and args == {"PARENT": "sha256:parent"}
    assert labels == {
        CONTEXT_LABEL: derived.recipe_sha256("sha256:parent", SIX, derived.dockerfile()),
        derived.REQUIREMENTS_LABEL: hashlib.sha256(SIX).hexdigest(),
        derived.PARENT_LABEL: "sha256:parent",
    }


def test_second_build_is_up_to_date_and_downloads_nothing(wheel_cache: list[str]) -> None:
    """With the labels matching, nothing is downloaded or built; --force rebuilds."""
    engine = FakeEngine({"toolcage-worker:test": WORKER})
    steps: list[str] = []
    derived.build_derived(engine, _spec(), steps.append)
    again = derived.build_derived(engine, _spec(), steps.append)
    assert not again.built and len(engine.builds) == 1 and len(wheel_cache) == 1
    assert steps[-1] == "my-tools:1 is up to date"
    assert derived.build_derived(engine, _spec(), steps.append, force=True).built
    assert len(engine.builds) == 2


def test_a_new_parent_makes_it_stale(wheel_cache: list[str]) -> None:
    """A rebuilt worker image (a new id) makes the derived image out of date."""
    engine = FakeEngine({"toolcage-worker:test": WORKER})
    derived.build_derived(engine, _spec(), lambda _m: None)
    engine.images["toolcage-worker:test"] = _image("sha256:parent2", **{SOURCE_LABEL: source_sha256()})
    assert derived.build_derived(engine, _spec(), lambda _m: None).built


def test_default_parent_is_built_or_refreshed_first(wheel_cache: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """Without --from, the worker image goes through the (idempotent) worker build first, as a step."""
    engine = FakeEngine({})
    built: list[str] = []

    def build_image(eng: Any, tag: str, report: Any, base: str | None = None) -> BuildResult:
        built.append(tag)
        eng.images[tag] = WORKER
        return BuildResult(tag, "base", "digest", True, 1.0)

    monkeypatch.setattr(derived, "build_image", build_image)
    steps: list[str] = []
    res = derived.build_derived(engine, _spec(DEFAULT_IMAGE, refresh=True), steps.append)
    assert built == [DEFAULT_IMAGE] and res.worker_built is True
    assert steps[0].startswith(f"worker image {DEFAULT_IMAGE}")


@pytest.mark.parametrize(
    ("images", "error", "says"),
    [
        ({}, ImageMissing, "no such image"),
        ({"toolcage-worker:test": _image("sha256:d", **{derived.REQUIREMENTS_LABEL: "x"})}, UsageError, "derived"),
        ({"toolcage-worker:test": _image("sha256:py")}, UsageError, "not a toolcage worker image"),
        ({"toolcage-worker:test": WORKER, "my-tools:1": WORKER}, UsageError, "names a worker image"),
    ],
)
def test_parents_and_tags_that_do_not_fit(
    wheel_cache: list[str], images: dict[str, Any], error: type[Exception], says: str
) -> None:
    """A missing --from, a derived or foreign parent, a tag that names a worker image: refused, nothing built."""
    engine = FakeEngine(images)
    with pytest.raises(error, match=says):
        derived.build_derived(engine, _spec(), lambda _m: None)
    assert not engine.builds and not wheel_cache


# pip's failures -------------------------------------------------------------------------------

REFUSED = (
    "WARNING: Retrying (Retry(total=4, connect=None, read=None, redirect=None, status=None)) after connection "
    "broken by 'NewConnectionError('<pip._vendor.urllib3.connection.HTTPSConnection object at 0x7f>: Failed to "
    "establish a new connection: [Errno 111] Connection refused')': /simple/six/\n"
    "ERROR: Could not find a version that satisfies the requirement six==1.16.0 (from versions: none)\n"
    "ERROR: No matching distribution found for six==1.16.0\n"
)
NO_MATCH = "ERROR: No matching distribution found for {}\n"


def _fake_pip(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, answer: Any) -> list[list[str]]:
    """wheels._pip answered by ``answer(args) -> (rc, stderr)``; the cache under tmp_path."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    calls: list[list[str]] = []

    def pip(args: list[str]) -> subprocess.CompletedProcess[str]:
        calls.append(args)
        rc, err = answer(args)
        return subprocess.CompletedProcess(args, rc, "", err)

    monkeypatch.setattr(wheels, "_pip", pip)
    return calls


def _requirements(tmp_path: Path) -> Path:
    f = tmp_path / "r.txt"
    f.write_bytes(SIX)
    return f


def test_unreachable_index_is_one_paragraph(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """pip's connection retries become one paragraph naming the cause and what to do (exit 3)."""
    _fake_pip(monkeypatch, tmp_path, lambda args: (1, REFUSED))
    with pytest.raises(BuildError) as info:
        wheels.download_wheels(lambda _m: None, _requirements(tmp_path))
    msg = info.value.message
    assert "did not answer ([Errno 111] Connection refused)" in msg and "PIP_INDEX_URL" in msg
    assert "\n" not in msg and info.value.exit_code == 3


def test_no_wheel_and_no_sdist_names_the_package(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A package with neither a cp311 manylinux wheel nor an sdist is named, exit 2."""
    _fake_pip(monkeypatch, tmp_path, lambda args: (1, NO_MATCH.format("six==1.16.0")))
    with pytest.raises(RequirementsError, match=r"six==1\.16\.0 has no wheel for CPython 3\.11 .* no source") as info:
        wheels.download_wheels(lambda _m: None, _requirements(tmp_path))
    assert info.value.exit_code == 2


def _sdist_answer(wheel_name: str) -> Any:
    """pip with no wheel for six until one is built from its sdist (named ``wheel_name``)."""

    def answer(args: list[str]) -> tuple[int, str]:
        if args[0] == "download" and "--no-binary=:all:" in args:
            dest = Path(args[args.index("--dest") + 1])
            dest.mkdir(parents=True)
            (dest / "six-1.16.0.tar.gz").write_text("sdist")
            return 0, ""
        if args[0] == "wheel":
            out = Path(args[args.index("--wheel-dir") + 1])
            out.mkdir(parents=True)
            (out / wheel_name).write_text("wheel")
            return 0, ""
        dest = Path(args[args.index("--dest") + 1])
        if "-r" in args and not list(dest.glob("six-*.whl")):
            return 1, NO_MATCH.format("six==1.16.0")
        return 0, ""

    return answer


def test_compiled_sdist_is_refused(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """An sdist that builds into a platform wheel is refused (the build compiles nothing), nothing cached."""
    _fake_pip(monkeypatch, tmp_path, _sdist_answer("six-1.16.0-cp311-cp311-linux_x86_64.whl"))
    with pytest.raises(RequirementsError, match="not pure Python"):
        wheels.download_wheels(lambda _m: None, _requirements(tmp_path))
    assert not list((tmp_path / "cache").rglob("*.whl"))


def test_pure_sdist_becomes_a_wheel_and_is_cached(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A pure-Python sdist is built into a wheel, found on the next round; the next call uses the cache."""
    calls = _fake_pip(monkeypatch, tmp_path, _sdist_answer("six-1.16.0-py2.py3-none-any.whl"))
    steps: list[str] = []
    dest = wheels.download_wheels(steps.append, _requirements(tmp_path))
    assert (dest / "six-1.16.0-py2.py3-none-any.whl").exists() and (dest / ".complete").exists()
    assert "building a wheel from the sdist six-1.16.0.tar.gz" in steps
    assert any(a[-1] == "pip" for a in calls)  # pip's own wheel, for the offline install
    n = len(calls)
    assert wheels.download_wheels(steps.append, _requirements(tmp_path)) == dest and len(calls) == n


# the CLI --------------------------------------------------------------------------------------


@pytest.fixture
def no_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any attempt to reach Docker fails the test: these errors come before it."""
    import toolcage.engine.docker_adapter

    def boom(*a: Any, **k: Any) -> None:
        raise AssertionError("Docker was asked")

    monkeypatch.setattr(toolcage.engine.docker_adapter, "Engine", boom)


def _usage(args: list[str], says: str) -> None:
    out = CliRunner().invoke(cli, ["image", "build", *args])
    assert out.exit_code == 2, out.output
    doc = json.loads(out.stdout)
    assert doc["status"] == "error" and says in doc["error"]["message"]
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("toolcage: ") and "Traceback" not in out.stderr


def test_cli_missing_file_exits_2(no_engine: None, tmp_path: Path) -> None:
    """--requirements naming no file: exit 2, one line on stderr, the JSON error on stdout."""
    _usage(["--requirements", str(tmp_path / "nope.txt"), "--tag", "my-tools:1"], "cannot read it")


def test_cli_requirements_need_a_tag(no_engine: None, tmp_path: Path) -> None:
    """--requirements without --tag: exit 2, saying --tag is needed."""
    _usage(["--requirements", str(_requirements(tmp_path))], "needs --tag NAME")


def test_cli_tag_may_not_be_the_worker_tag(no_engine: None, tmp_path: Path) -> None:
    """--tag equal to the worker image (the default one, or --from's): exit 2."""
    req = str(_requirements(tmp_path))
    _usage(["--requirements", req, "--tag", DEFAULT_IMAGE], "the worker image's own tag")
    _usage(["--requirements", req, "--tag", "w:1", "--from", "w:1"], "the worker image's own tag")


def test_cli_from_and_base_only_where_they_apply(no_engine: None, tmp_path: Path) -> None:
    """--from without --requirements, and --base with --from, are usage errors."""
    _usage(["--from", "w:1"], "--from applies only with --requirements")
    req = str(_requirements(tmp_path))
    _usage(["--requirements", req, "--tag", "t:1", "--from", "w:1", "--base", "b:1"], "--base applies")


# mcp wrap --pip: quiet when nothing is built, a warning for a name that fixes no release ----------------


def test_unpinned_names_are_the_ones_that_fix_no_release() -> None:
    names = ("a", "b==1.2", "c>=1", "d==1.*", "e @ https://x/e.whl", "f===1", "g[x]==2", "h==1 ; python_version>'3'")
    assert derived.unpinned(names) == ["a", "c>=1", "d==1.*"]


def test_derived_current_after_a_build_and_not_before(wheel_cache: list[str]) -> None:
    """What `mcp wrap --pip` asks at each start: up to date means nothing is built and nothing printed."""
    engine = FakeEngine({"toolcage-worker:test": WORKER})
    spec = _spec()
    assert not derived.derived_current(engine, spec)  # type: ignore[arg-type]
    derived.build_derived(engine, spec, lambda _msg: None)  # type: ignore[arg-type]
    assert derived.derived_current(engine, spec)  # type: ignore[arg-type]
    stale = {**engine.images, "toolcage-worker:test": _image("sha256:parent", **{SOURCE_LABEL: "other sources"})}
    assert not derived.derived_current(FakeEngine(stale), spec)  # type: ignore[arg-type]


def test_wrap_pip_is_quiet_when_the_image_is_current_and_warns_on_an_unpinned_build(
    wheel_cache: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from toolcage.cli import image as cli_image
    from toolcage.cli import mcp as cli_mcp
    from toolcage.engine import docker_adapter

    engine = FakeEngine({"toolcage-worker:test": WORKER})
    engine.ping = lambda: {}  # type: ignore[attr-defined]
    monkeypatch.setenv("TOOLCAGE_IMAGE", "toolcage-worker:test")
    monkeypatch.setattr(docker_adapter.Engine, "default", classmethod(lambda cls: engine))
    builds: list[Any] = []
    monkeypatch.setattr(cli_image, "build_derived_image", lambda spec, *a, **k: builds.append(spec))
    warnings: list[str] = []
    # first start: nothing built yet, an unpinned name: built, with the warning
    cli_mcp._wrap_image(None, ("six",), warnings.append)
    assert len(builds) == 1 and len(warnings) == 1 and "not pinned" in warnings[0] and "six==VERSION" in warnings[0]
    built = dataclasses.replace(builds[0], refresh_parent=False)  # the worker image is current here
    derived.build_derived(engine, built, lambda _msg: None)  # type: ignore[arg-type]  # as the real one does
    # every later start: up to date, so no build, no warning and nothing on stderr
    warnings.clear()
    capsys.readouterr()
    cli_mcp._wrap_image(None, ("six",), warnings.append)
    assert len(builds) == 1 and warnings == [] and capsys.readouterr().err == ""


def test_wrap_apt_builds_one_image_named_by_its_packages(
    wheel_cache: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """mcp wrap --apt git (alone or with --pip): one derived image with the Debian packages, named by what it
    holds; without --apt the name is the one --pip alone always had (images built before are reused)."""
    from toolcage.cli import image as cli_image
    from toolcage.cli import mcp as cli_mcp
    from toolcage.engine import docker_adapter

    engine = FakeEngine({"toolcage-worker:test": WORKER})
    engine.ping = lambda: {}  # type: ignore[attr-defined]
    monkeypatch.setenv("TOOLCAGE_IMAGE", "toolcage-worker:test")
    monkeypatch.setattr(docker_adapter.Engine, "default", classmethod(lambda cls: engine))
    builds: list[Any] = []
    monkeypatch.setattr(cli_image, "build_derived_image", lambda spec, *a, **k: builds.append(spec))
    _, only_apt = cli_mcp._wrap_image(None, (), lambda _w: None, ("git",))
    _, both = cli_mcp._wrap_image(None, ("six==1.16.0",), lambda _w: None, ("git",))
    _, pip_only = cli_mcp._wrap_image(None, ("six==1.16.0",), lambda _w: None)
    assert [b.apt for b in builds] == [("git",), ("git",), ()]
    assert builds[0].requirements == b"" and builds[1].requirements == b"six==1.16.0\n"
    assert len({only_apt, both, pip_only}) == 3
    assert pip_only == cli_mcp.wrap_image_tag(b"six==1.16.0\n", "toolcage-worker:test")
