"""The tools speak the image's language (issue 36, point 2), in each kind of image, under runc and gVisor.

exec and run_shell run the image's own programs with its ENV (PATH, HOME, its variables) in its WORKDIR, as
the sandbox user whatever its USER says; run_python uses the image's Python (3.13 in the trixie image, not
the worker's 3.11), and where the image has no Python, Node or shell the call says what is missing; the
worker's own tools (files, streaming) are the same in every image."""

from __future__ import annotations

from typing import Any

import pytest

from tests.harness import foreign_images
from toolcage import Sandbox

pytestmark = pytest.mark.usefixtures("no_leaks")


def _image(kind: str) -> str:
    try:
        return foreign_images.ensure(kind)
    except foreign_images.BuildError as exc:
        pytest.fail(f"foreign image {kind!r} cannot be built here: {exc}", pytrace=False)


def _ok(sb: Sandbox, tool: str, params: dict[str, Any]) -> dict[str, Any]:
    r = sb.call(tool, params)
    assert r.error is None, (tool, r.error)
    return dict(r.result)


def test_run_python_is_the_images_python_not_the_workers() -> None:
    with Sandbox(image=_image("py313")) as sb:
        out = _ok(sb, "run_python", {"code": "import sys; print(sys.version_info[:2], sys.executable)"})
        assert out["stdout"].startswith("(3, 13) /usr/bin/python3"), out
        assert _ok(sb, "exec", {"argv": ["pwd"]})["stdout"] == "/app\n"  # its WORKDIR
        # a Python context (issue 38) runs the image's Python too, with toolcage's IPython last on its path
        ex = sb.run_code("import sys, IPython\nx = 1\nsys.version_info[:2], sys.executable, IPython.__file__")
        assert ex.error is None and ex.text is not None, ex
        assert ex.text.startswith("((3, 13), '/usr/bin/python3', '/opt/toolcage/lib/kernel/IPython/"), ex.text
        assert sb.run_code("x + 1").text == "2"  # its state kept


@pytest.mark.parametrize("kind", ["busybox", "musl", "distroless", "debian-nopy"])
def test_a_missing_interpreter_is_named(kind: str) -> None:
    with Sandbox(image=_image(kind)) as sb:
        r = sb.call("run_python", {"code": "print(1)"})
        assert r.error is not None and "has no Python" in r.error["message"], r.error
        r = sb.call("run_node", {"code": "console.log(1)"})
        assert r.error is not None and "has no Node.js" in r.error["message"], r.error
        r = sb.call("code_run", {"code": "1"})  # a Python context (issue 38) says so too
        assert r.error is not None and "has no Python" in r.error["message"], r.error
        assert sb.call("ping").result == "pong"  # and the sandbox goes on


def test_distroless_has_no_shell_but_runs_its_binary() -> None:
    with Sandbox(image=_image("distroless")) as sb:
        r = sb.call("run_shell", {"command": "echo hi"})
        assert r.error is not None and "no /bin/sh" in r.error["message"], r.error
        out = _ok(sb, "exec", {"argv": ["/app", "one", "two"]})
        assert out["exit_code"] == 0 and "one" in out["stdout"] and "two" in out["stdout"], out
        # the worker's own tools need nothing of the image
        _ok(sb, "write_file", {"path": "/scratch/a.txt", "content": "x"})
        assert _ok(sb, "read_file", {"path": "/scratch/a.txt"})["content"] == "x"


def test_musl_runs_its_own_programs_as_the_sandbox_user_in_its_workdir() -> None:
    with Sandbox(image=_image("musl")) as sb:
        out = _ok(sb, "run_shell", {"command": "hello-musl a; id -u; pwd; echo $HOME"})
        assert out["stdout"].splitlines() == ["hello from musl a", "65532", "/home/app", "/home/app"], out


def test_root_image_env_and_workdir_reach_the_program_not_its_user() -> None:
    with Sandbox(image=_image("debian-nopy")) as sb:
        out = _ok(sb, "exec", {"argv": ["sh", "-c", "id -u; pwd; echo $MYVAR; ls"]})
        lines = out["stdout"].splitlines()
        assert lines[:3] == ["65532", "/testbed", "from-image"], out
        out = _ok(sb, "exec", {"command": "echo $MYVAR-$EXTRA", "env": {"EXTRA": "call"}})
        assert out["stdout"] == "from-image-call\n", out
        # the image's ENTRYPOINT never ran (it would have made /ENTRYPOINT_RAN on a writable root)
        assert _ok(sb, "exec", {"argv": ["sh", "-c", "test -e /ENTRYPOINT_RAN; echo $?"]})["stdout"] == "1\n"
