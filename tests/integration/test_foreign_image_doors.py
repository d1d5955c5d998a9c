"""Every door takes a user's own image (issue 36), on the real engine: the CLI's `run`, `serve`, `mcp serve`
and `mcp wrap --image`, `Sandbox`/`AsyncSandbox(image=...)`, and the OpenAI Agents SDK, Deep Agents and
LangChain adapters' image options. Each runs a program of a foreign image (tests/harness/foreign_images.py:
musl, with its own `hello-musl`, USER app, HOME and WORKDIR /home/app) through that door; `mcp wrap` runs a
stdio MCP server baked into an image of this module's own (a Python one on a Debian image, a busybox sh one
on an image with no Python), started with that image's ENV, PATH and WORKDIR."""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.harness import foreign_images
from tests.helpers import ROOT, run_cli, wrap_session
from toolcage.lifecycle import audit

pytestmark = pytest.mark.runc_only(
    "each door's plumbing for a user's image (CLI, MCP, adapters, ps, the audit record), host-side; "
    "a foreign image under gVisor: test_foreign_image_attacks and test_writable_image_paths"
)

MUSL = "musl"
FIXTURES = ROOT / "tests" / "fixtures" / "foreign_doors"
MISSING = "toolcage-test-doors-no-such-image:0"
INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 0,
    "method": "initialize",
    "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}},
}


def _musl_params() -> Any:
    return pytest.mark.parametrize("foreign_image", [MUSL], indirect=True)


def _started(log: Path, run_id: str) -> dict[str, Any]:
    return next(r for r in audit.read(log) if r["event"] == "run.started" and r["run_id"] == run_id)


def _image_id(ref: str) -> str:
    out = subprocess.run(["docker", "image", "inspect", "-f", "{{.Id}}", ref], capture_output=True, text=True)
    return out.stdout.strip()


# the CLI --------------------------------------------------------------------------------------------------


@_musl_params()
def test_cli_run_takes_a_foreign_image_and_the_audit_names_it(foreign_image: str, tmp_path: Path) -> None:
    """`toolcage run exec --image IMG` runs the image's own program, as the sandbox user, in its WORKDIR; the
    audit record's run.started names the image and its id."""
    log = tmp_path / "audit.jsonl"
    params = {"argv": ["sh", "-c", "hello-musl; pwd; id -u"]}
    out = run_cli("run", "exec", "--image", foreign_image, "--audit-log", str(log), "--params", json.dumps(params))
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["result"]["stdout"] == "hello from musl\n/home/app\n65532\n"
    started = _started(log, doc["run_id"])
    assert started["image"] == foreign_image and started["image_id"] == _image_id(foreign_image)


def test_cli_run_with_a_missing_image_is_one_line_and_starts_nothing(engine: Any) -> None:
    """A tag the engine does not have: exit 3, status image_missing, one stderr line naming `docker images` and
    that nothing is pulled; no container made from it."""
    out = run_cli("run", "exec", "--image", MISSING, "--params", '{"argv": ["true"]}')
    assert out.returncode == 3 and json.loads(out.stdout)["status"] == "image_missing"
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "`docker images`" in lines[0] and "nothing is pulled" in lines[0], out.stderr
    assert "Traceback" not in out.stderr
    assert [c for c in engine.containers("toolcage.run_id") if c.get("Image") == MISSING] == []


@_musl_params()
def test_cli_serve_takes_a_foreign_image(foreign_image: str) -> None:
    """`toolcage serve --image IMG`: JSON-RPC exec on stdin runs the image's program."""
    req = {"jsonrpc": "2.0", "id": 1, "method": "exec", "params": {"argv": ["hello-musl"]}}
    out = run_cli("serve", "--image", foreign_image, stdin=json.dumps(req) + "\n")
    assert out.returncode == 0, out.stderr
    answer = json.loads(out.stdout.splitlines()[0])
    assert answer["id"] == 1 and answer["result"]["stdout"] == "hello from musl\n", out.stdout


@_musl_params()
def test_cli_mcp_serve_takes_a_foreign_image(foreign_image: str) -> None:
    """`toolcage mcp serve --image IMG`: an MCP tools/call of exec runs the image's program."""
    call = {"name": "exec", "arguments": {"argv": ["hello-musl"]}}
    msgs = (
        INITIALIZE,
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": call},
    )
    with (
        tempfile.TemporaryFile() as err,
        subprocess.Popen(
            [sys.executable, "-m", "toolcage.cli", "mcp", "serve", "--image", foreign_image],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
            cwd=ROOT,
        ) as proc,
    ):
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write("".join(json.dumps(m) + "\n" for m in msgs))
        proc.stdin.flush()
        answers = [json.loads(proc.stdout.readline()) for _ in range(2)]  # the call answers before stdin closes
        proc.stdin.close()
        proc.wait(timeout=60)
    result = answers[1]["result"]
    assert result["isError"] is False and result["structuredContent"]["stdout"] == "hello from musl\n", answers


# mcp wrap --image ------------------------------------------------------------------------------------------


def _build(parent: str, server: str, path: str) -> str:
    """A user's own image: ``parent`` plus the server at /srv/bin/wrapped-server, its own PATH, ENV and
    WORKDIR and an ENTRYPOINT that must never run; built offline (no RUN step: the parent may have no shell)."""
    tag = f"toolcage-test-doors-wrap:{secrets.token_hex(4)}"
    with tempfile.TemporaryDirectory(prefix="toolcage-test-doors-") as ctx:
        shutil.copy(FIXTURES / server, Path(ctx) / "server")
        os.chmod(Path(ctx) / "server", 0o755)
        (Path(ctx) / "Dockerfile").write_text(
            f"FROM {parent}\n"
            "COPY server /srv/bin/wrapped-server\n"
            f"ENV PATH=/srv/bin:{path} MYVAR=from-the-image\n"
            "WORKDIR /srv/app\n"
            'ENTRYPOINT ["/bin/false"]\n'
        )
        out = subprocess.run(
            ["docker", "build", "-q", "--network", "none", "-t", tag, ctx], capture_output=True, text=True, timeout=300
        )
    assert out.returncode == 0, out.stderr
    return tag


@pytest.fixture(scope="module")
def wrap_images(engine: Any) -> Iterator[dict[str, str]]:
    """Two images of a user's own with a stdio MCP server on their PATH: a Python one on Debian, a busybox sh one
    (no Python at all); removed at the end."""
    made: list[str] = []
    try:
        made.append(_build(foreign_images.BASE_IMAGE, "image_server.py", "/usr/local/bin:/usr/bin:/bin"))
        made.append(_build(foreign_images.ensure("busybox"), "sh_server", "/bin"))
        yield {"python": made[0], "sh": made[1]}
    finally:
        for tag in made:
            subprocess.run(["docker", "image", "rm", "-f", tag], capture_output=True, check=False)


def _where(args: list[str], log: Path) -> tuple[str, Any]:
    seen: dict[str, str] = {}

    async def body(session: Any) -> None:
        await session.initialize()
        assert [t.name for t in (await session.list_tools()).tools] == ["where"]
        res = await session.call_tool("where", {})
        seen["text"] = res.content[0].text

    run = wrap_session(["--audit-log", str(log), *args], body)
    assert run.exit_code == 0, run.stderr
    return seen["text"], run


@pytest.mark.usefixtures("no_wrap_leaks")  # one wrap test at a time across processes (tests/conftest.py)
def test_mcp_wrap_runs_a_python_server_of_a_foreign_image_with_its_env(
    wrap_images: dict[str, str], tmp_path: Path
) -> None:
    """`mcp wrap --image IMG -- wrapped-server`: the command is found on the image's PATH and runs with the image's
    ENV and WORKDIR, the image's python3, as the sandbox user; none of the worker's variables reach it, and the
    image's ENTRYPOINT (/bin/false) never runs. The audit names the image."""
    log = tmp_path / "audit.jsonl"
    image = wrap_images["python"]
    text, _ = _where(["--image", image, "--", "wrapped-server"], log)
    seen = json.loads(text)
    assert seen["cwd"] == "/srv/app" and seen["uid"] == 65532 and seen["python"] == "/usr/bin/python3", seen
    env = seen["env"]
    assert env["PATH"] == "/srv/bin:/usr/local/bin:/usr/bin:/bin" and env["MYVAR"] == "from-the-image", env
    assert env["HOME"] == "/scratch"  # the image names none
    assert env["TOOLCAGE_IMAGE_CONFIG"] is None and env["TOOLCAGE_POLICY"] is None and env["LC_ALL"] is None, env
    started = next(r for r in audit.read(log) if r["event"] == "run.started")
    assert started["image"] == image and started["image_id"] == _image_id(image) and started["tool"] == "mcp-wrap"


@pytest.mark.usefixtures("no_wrap_leaks")  # one wrap test at a time across processes (tests/conftest.py)
def test_mcp_wrap_runs_a_shell_server_in_an_image_without_python(wrap_images: dict[str, str], tmp_path: Path) -> None:
    """A busybox image (no Python, no libc): the launcher comes from the worker's runtime, the server is the
    image's own sh script, with the image's PATH and WORKDIR."""
    text, _ = _where(["--image", wrap_images["sh"], "--", "wrapped-server"], tmp_path / "audit.jsonl")
    assert text == "cwd=/srv/app path=/srv/bin:/bin myvar=from-the-image uid=65532", text


def test_mcp_wrap_with_a_missing_image_is_one_line_exit_2(engine: Any) -> None:
    """--image naming a tag the engine does not have: exit 2, one line naming `docker images`, nothing pulled."""
    proc = run_cli("mcp", "wrap", "--image", MISSING, "--", "srv", stdin="")
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and proc.stdout == "", proc.stderr
    assert "`docker images`" in lines[0] and "nothing is pulled" in lines[0]


def test_mcp_wrap_pip_with_an_image_says_it_adds_nothing_to_it() -> None:
    """--pip builds FROM the worker image: with --image it is refused, saying so (exit 2, before Docker)."""
    proc = run_cli("mcp", "wrap", "--image", "my-server:1", "--pip", "mcp-server-time", "--", "srv", stdin="")
    assert proc.returncode == 2 and "not both" in proc.stderr and "add nothing to" in proc.stderr, proc.stderr


# the library -----------------------------------------------------------------------------------------------


@_musl_params()
def test_sandbox_takes_a_foreign_image_and_ps_shows_it(foreign_image: str, tmp_path: Path) -> None:
    """Sandbox(image=IMG) runs the image's program; `toolcage ps --json` lists the live run with its image, and
    the audit's run.started names the image and its id."""
    from toolcage import Sandbox

    log = tmp_path / "audit.jsonl"
    with Sandbox(image=foreign_image, audit=log) as sb:
        res = sb.call("exec", {"argv": ["hello-musl"]})
        assert res.ok and res.result["stdout"] == "hello from musl\n"
        ps = run_cli("ps", "--json")
        assert ps.returncode == 0, ps.stderr
        rows = [r for r in json.loads(ps.stdout) if r["run_id"] == sb.run_id]
        assert [r["image"] for r in rows] == [foreign_image], ps.stdout
        run_id = sb.run_id
    started = _started(log, run_id)
    assert started["image"] == foreign_image and started["image_id"] == _image_id(foreign_image)


@_musl_params()
def test_async_sandbox_takes_a_foreign_image(foreign_image: str) -> None:
    """AsyncSandbox(image=IMG): the same, from asyncio."""
    from toolcage import AsyncSandbox

    async def go() -> Any:
        async with AsyncSandbox(image=foreign_image) as sb:
            return await sb.call("run_shell", {"command": "hello-musl; pwd; echo $HOME"})

    res = asyncio.run(go())
    assert res.ok and res.result["stdout"] == "hello from musl\n/home/app\n/home/app\n", res


# the framework adapters ------------------------------------------------------------------------------------


@_musl_params()
def test_openai_agents_client_takes_a_foreign_image(foreign_image: str) -> None:
    """ToolcageSandboxClientOptions(image=IMG): the session's exec runs the image's program, with its PATH."""
    from agents.sandbox.manifest import Manifest

    from toolcage.integrations.openai_agents import ToolcageSandboxClient, ToolcageSandboxClientOptions

    async def main() -> tuple[Any, Any]:
        client = ToolcageSandboxClient()
        options = ToolcageSandboxClientOptions(image=foreign_image)
        session = await client.create(manifest=Manifest(), options=options)
        async with session:
            plain = await session.exec("hello-musl", shell=False)
            shell = await session.exec("echo $PATH")
        await client.delete(session)
        return plain, shell

    plain, shell = asyncio.run(main())
    assert plain.exit_code == 0 and plain.stdout == b"hello from musl\n", plain
    assert shell.stdout == b"/usr/local/bin:/usr/bin:/bin\n", shell


def test_openai_agents_options_refuse_a_missing_image_naming_docker_images(engine: Any) -> None:
    """A missing image is still a ValidationError when the options are built, now naming `docker images`."""
    from pydantic import ValidationError

    from toolcage.integrations.openai_agents import ToolcageSandboxClientOptions

    with pytest.raises(ValidationError, match="`docker images`"):
        ToolcageSandboxClientOptions(image=MISSING)


@_musl_params()
def test_deepagents_backend_takes_a_foreign_image(foreign_image: str) -> None:
    """ToolcageSandbox(image=IMG): execute runs the image's program through its /bin/sh."""
    from toolcage.integrations.deepagents import ToolcageSandbox

    with ToolcageSandbox(image=foreign_image) as sb:
        res = sb.execute("hello-musl && id -u")
    assert res.exit_code == 0 and res.output == "hello from musl\n65532\n", res


@_musl_params()
def test_langchain_tools_on_a_foreign_image(foreign_image: str) -> None:
    """get_tools(Sandbox(image=IMG)): the exec tool runs the image's program."""
    from toolcage import Sandbox
    from toolcage.integrations.langchain import get_tools

    with Sandbox(image=foreign_image) as sb:
        tools = {t.name: t for t in get_tools(sb)}
        out = json.loads(tools["exec"].invoke({"argv": ["hello-musl"]}))
    assert out["stdout"] == "hello from musl\n" and out["exit_code"] == 0, out
