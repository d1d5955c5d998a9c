"""The file tools resolve paths beneath a root's fd: swapped symlinks, long paths, FIFOs (no Docker)."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from toolcage.policies import validate_policy
from toolcage.worker.errors import BadParams, PathEscape, ToolError
from toolcage.worker.settings import Settings
from toolcage.worker.tools import Catalog
from toolcage.worker.tools import paths as paths_mod

SECRET = "outside-secret-4f1c"


@pytest.fixture(params=["openat2", "nofollow"])
def mode(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Each test runs with openat2 and with the per-component O_NOFOLLOW fallback."""
    if request.param == "openat2":
        if not paths_mod.openat2_available():
            pytest.fail("openat2 should be available on the test host's kernel (Linux 5.6+)")
    else:
        monkeypatch.setattr(paths_mod._Openat2, "_probed", True)
        monkeypatch.setattr(paths_mod._Openat2, "_fn", None)
    return str(request.param)


@pytest.fixture
def roots(tmp_path: Path) -> tuple[Path, Path, Path]:
    ws, scratch, outside = tmp_path / "ws", tmp_path / "scratch", tmp_path / "outside"
    for d in (ws, scratch, outside):
        d.mkdir()
    (outside / "secret").write_text(SECRET + "\n")
    (outside / "passwd").write_text(SECRET + "\n")
    (ws / "README").write_text("inside\n")
    return ws, scratch, outside


def settings(ws: Path, scratch: Path) -> Settings:
    policy = validate_policy({"timeouts": {"call_s": 5, "run_s": 20}})
    return Settings(policy.canonical_json(), str(ws), str(scratch), "test")


def call(s: Settings, name: str, **params: object) -> dict:  # type: ignore[type-arg]
    tool = Catalog().get(name)
    return tool.handler(s, tool.validate(params))


@pytest.fixture
def swapper(roots: tuple[Path, Path, Path]) -> Iterator[None]:
    """A thread swapping scratch/d/x between a file and a symlink out, and scratch/d/sub between a
    directory and a symlink out, as fast as it can."""
    _, scratch, outside = roots
    d = scratch / "d"
    (d / "sub").mkdir(parents=True)
    stop = threading.Event()

    def run() -> None:
        while not stop.is_set():
            (scratch / "t_reg").write_text("inside\n")
            os.rename(scratch / "t_reg", d / "x")
            os.symlink(outside / "secret", scratch / "t_lnk")
            os.rename(scratch / "t_lnk", d / "x")
            try:
                os.rmdir(d / "sub")
                os.symlink(outside, d / "sub")
                os.unlink(d / "sub")
            except OSError:
                pass
            os.makedirs(d / "sub", exist_ok=True)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    yield
    stop.set()
    t.join(5)


@pytest.mark.usefixtures("swapper")
def test_swapped_symlinks_never_leak(roots: tuple[Path, Path, Path], mode: str) -> None:
    """While symlinks out of the root are swapped in and out, grep, read_file and list_files
    never return the outside file's content or name (they answer, or refuse with -32001/-32002)."""
    ws, scratch, _ = roots
    s = settings(ws, scratch)
    seen_ok = 0
    for _ in range(400):
        g = call(s, "grep", pattern=".", path=str(scratch / "d"))
        assert all(SECRET not in m["text"] for m in g["matches"]), g
        try:
            r = call(s, "read_file", path=str(scratch / "d" / "x"))
            assert r["content"] == "inside\n", r
            seen_ok += 1
        except ToolError as exc:
            assert exc.code in (-32001, -32002)
        ls = call(s, "list_files", path=str(scratch / "d"), recursive=True)
        assert not {os.path.basename(e["path"]) for e in ls["entries"]} & {"secret", "passwd"}, ls
    assert seen_ok > 0  # the race really ran both ways


def test_symlink_out_refused_and_skipped(roots: tuple[Path, Path, Path], mode: str) -> None:
    """A symlink out of the root is refused by read_file (-32002), skipped by grep, listed as a symlink."""
    ws, scratch, outside = roots
    (ws / "out").symlink_to(outside / "secret")
    (ws / "outdir").symlink_to(outside)
    s = settings(ws, scratch)
    for path in ("/workspace/out", "/workspace/outdir/secret", str(ws / "out")):
        with pytest.raises(PathEscape):
            call(s, "read_file", path=path)
    with pytest.raises(PathEscape):
        call(s, "list_files", path="/workspace/outdir")
    assert [m["path"] for m in call(s, "grep", pattern=".")["matches"]] == ["/workspace/README"]
    types = {e["path"]: e["type"] for e in call(s, "list_files")["entries"]}
    assert types == {"/workspace/README": "file", "/workspace/out": "symlink", "/workspace/outdir": "symlink"}


def test_relative_symlink_inside_root(roots: tuple[Path, Path, Path]) -> None:
    """With openat2 a relative symlink that stays beneath the root is followed."""
    ws, scratch, _ = roots
    (ws / "docs").mkdir()
    (ws / "docs" / "link").symlink_to("../README")
    assert call(settings(ws, scratch), "read_file", path="/workspace/docs/link")["content"] == "inside\n"


@pytest.mark.parametrize(
    ("path", "field_error"),
    [
        ("a" * 6000, "at most 4096"),
        ("b" * 300, "longer than 255"),
        ("ok/" + "c" * 256 + "/x", "longer than 255"),
        ("\ud800", "lone surrogate"),
    ],
    ids=["6000_chars", "component_300", "inner_component_256", "lone_surrogate"],
)
@pytest.mark.parametrize("tool", ["read_file", "list_files", "grep", "write_file"])
def test_unusable_paths_are_params_errors(
    roots: tuple[Path, Path, Path], tool: str, path: str, field_error: str
) -> None:
    """Paths too long, with a component over NAME_MAX, or not encodable are BadParams naming path."""
    ws, scratch, _ = roots
    extra: dict[str, object] = {"pattern": "x"} if tool == "grep" else {"content": "x"} if tool == "write_file" else {}
    tool_ = Catalog().get(tool)
    with pytest.raises(BadParams) as info:
        tool_.handler(settings(ws, scratch), tool_.validate({"path": path, **extra}))
    assert "path" in str(info.value.data) and field_error in str(info.value.data)


def test_fifo_does_not_hang(roots: tuple[Path, Path, Path], mode: str) -> None:
    """A FIFO under a root is refused by read_file and skipped by grep, without blocking the call."""
    ws, scratch, _ = roots
    os.mkfifo(scratch / "pipe")
    s = settings(ws, scratch)
    with pytest.raises(ToolError, match="not a regular file"):
        call(s, "read_file", path=str(scratch / "pipe"))
    assert call(s, "grep", pattern=".", path=str(scratch))["matches"] == []
    with pytest.raises(ToolError):
        call(s, "write_file", path="pipe", content="x")


def test_write_through_symlinked_dir_refused(roots: tuple[Path, Path, Path], mode: str) -> None:
    """write_file never creates or writes through a symlinked directory, even one swapped in."""
    ws, scratch, outside = roots
    (scratch / "d").symlink_to(outside)
    with pytest.raises(ToolError, match="symlink"):
        call(settings(ws, scratch), "write_file", path="d/new", content="x")
    assert not (outside / "new").exists()


def test_dotdot_is_lexical(roots: tuple[Path, Path, Path], mode: str) -> None:
    """'..' is resolved on the text first: out of the roots is -32002 whatever the symlinks say."""
    ws, scratch, _ = roots
    (ws / "sub").mkdir()
    s = settings(ws, scratch)
    assert call(s, "read_file", path="/workspace/sub/../README")["content"] == "inside\n"
    for path in ("sub/../../outside/secret", "/workspace/sub/../../outside/secret"):
        with pytest.raises(PathEscape):
            call(s, "read_file", path=path)
