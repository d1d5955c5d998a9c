"""The OpenAI Agents SDK's real agent loop (``Runner.run`` with a ``SandboxAgent``), driven by the SDK's own
scripted model (``agents.testing.ScriptedModel``), against a real toolcage container through
``ToolcageSandboxClient``. No model, no network.

The SDK ships no sandbox-client conformance suite in its package (``agents.testing`` holds the scripted
model and a scripted sandbox session, both test doubles); what a conformance suite would check is checked
here against the real container: exec, read/write, the manifest, apply_patch, persist/hydrate, snapshot and
resume, the unsupported features, and a sandbox that dies.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import subprocess
import tarfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from agents import RunConfig, Runner
from agents.exceptions import AgentsException
from agents.sandbox import SandboxAgent, SandboxRunConfig
from agents.sandbox.capabilities import Filesystem, Shell
from agents.sandbox.entries import Dir, File
from agents.sandbox.errors import (
    ConfigurationError,
    ExecTransportError,
    ExposedPortUnavailableError,
    InvalidManifestPathError,
    WorkspaceArchiveReadError,
)
from agents.sandbox.manifest import Manifest
from agents.sandbox.snapshot import LocalSnapshotSpec
from agents.sandbox.workspace_paths import SandboxPathGrant
from agents.testing import ModelCall, ModelStep, ScriptedModel, assistant_message, function_call
from openai.types.responses import ResponseCustomToolCall
from pydantic import ValidationError

from toolcage.engine import ownership
from toolcage.errors import UsageError
from toolcage.integrations.openai_agents import (
    ToolcageSandboxClient,
    ToolcageSandboxClientOptions,
    ToolcageSandboxError,
    ToolcageSnapshotSpec,
    toolcage_session,
)

pytestmark = [
    pytest.mark.usefixtures("no_leaks"),
    pytest.mark.runc_only(
        "a framework's adapter: its translation of the same calls, host-side (test_exec, test_files_* and "
        "test_workspace_copy run those calls under gVisor)"
    ),
]


def _sh(cmd: str, call_id: str) -> Any:
    return function_call("exec_command", {"cmd": cmd}, call_id=call_id)


def _patch(patch: str, call_id: str) -> Any:
    return ResponseCustomToolCall(type="custom_tool_call", call_id=call_id, id=call_id, name="apply_patch", input=patch)


def _agent(model: ScriptedModel) -> SandboxAgent[Any]:
    return SandboxAgent(name="worker", instructions="Do the task.", model=model, capabilities=[Filesystem(), Shell()])


def _run(agent: SandboxAgent[Any], sandbox: SandboxRunConfig) -> Any:
    return Runner.run(agent, "go", run_config=RunConfig(sandbox=sandbox, tracing_disabled=True), max_turns=12)


def _outputs(model: ScriptedModel) -> dict[str, str]:
    """The tool outputs the model was shown, by call id (from the input of its last call)."""
    last = model.last_call
    assert last is not None
    out = {}
    for item in last.input if isinstance(last.input, list) else ():
        if isinstance(item, dict) and item.get("type") in ("function_call_output", "custom_tool_call_output"):
            out[str(item["call_id"])] = str(item.get("output"))
    return out


def _mine(tool: str = "openai-agents") -> list[dict[str, Any]]:
    """This process's live toolcage containers of the client, as docker inspect shows them."""
    host_pid, _ = ownership.owner()
    filters = ["--filter", f"label=toolcage.tool={tool}", "--filter", f"label=toolcage.owner={host_pid}"]
    ids = subprocess.run(["docker", "ps", "-q", *filters], capture_output=True, text=True, check=True).stdout.split()
    if not ids:
        return []
    # one removed between the two commands (a used slot, removed off its session's path) is left out: inspect
    # still prints the others, and exits 1
    out = subprocess.run(["docker", "inspect", *ids], capture_output=True, text=True, check=False).stdout
    got: list[dict[str, Any]] = json.loads(out) if out.strip() else []
    return got


def _git_repo(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "app.py").write_text("def greet():\n    return 'hi'\n")
    (repo / "README.md").write_text("demo\n")
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    subprocess.run(["git", "add", "."], cwd=repo, check=True)
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t"}
    subprocess.run(["git", "commit", "-qm", "init"], cwd=repo, check=True, env={**env, "GIT_COMMITTER_EMAIL": "t@t"})
    return repo


NET = "python3 -c \"import urllib.request as u; u.urlopen('http://example.com', timeout=5)\""
PATCH = """*** Begin Patch
*** Update File: app.py
@@ def greet():
-    return 'hi'
+    return 'hello from the agent'
*** Add File: notes/todo.txt
+written by apply_patch
*** End Patch"""


def test_agent_loop_runs_in_the_hardened_container(tmp_path: Path) -> None:
    """Commands run in the toolcage container (its labels, a read-only root, no network); the files the agent
    wrote come back through the SDK's read; its edits (shell and apply_patch) arrive as a diff git applies."""
    repo = _git_repo(tmp_path)
    seen: dict[str, Any] = {}

    def inspect(call: ModelCall) -> Any:  # the second model turn: the sandbox is live
        seen["containers"] = _mine()
        return [_sh(f"touch /etc/x; echo rootfs=$?; {NET}; echo net=$?", "c2"), _patch(PATCH, "c3")]

    model = ScriptedModel(
        [
            [_sh("id -un; pwd; ls; echo made > out.txt; printf '\\000\\377' > out.bin", "c1")],
            ModelStep.respond(inspect),
            [assistant_message("done")],
        ]
    )
    client = ToolcageSandboxClient()
    options = ToolcageSandboxClientOptions(workspace=str(repo), workspace_gitignore=True)
    manifest = Manifest(entries={"task.md": File(content=b"fix greet\n"), "build": Dir()})

    async def main() -> None:
        session = await client.create(manifest=manifest, options=options)
        async with session:
            result = await _run(_agent(model), SandboxRunConfig(session=session))
            assert result.final_output == "done"
            out = _outputs(model)
            assert "Process exited with code 0" in out["c1"]
            assert "sandbox\n/workspace\n" in out["c1"] and "app.py" in out["c1"] and "task.md" in out["c1"]
            assert "rootfs=1" in out["c2"] and "cannot touch" in out["c2"]  # (runc: read-only; gVisor: denied)
            assert "net=1" in out["c2"] and "URLError" in out["c2"]
            # the files the agent wrote, through the SDK's own API
            assert (await session.read(Path("out.txt"))).read() == b"made\n"
            assert (await session.read(Path("out.bin"))).read() == b"\x00\xff"
            assert (await session.read(Path("notes/todo.txt"))).read() == b"written by apply_patch"
            ch = await toolcage_session(session).changes()
        await client.delete(session)
        (c,) = seen["containers"]
        labels = c["Config"]["Labels"]
        assert labels["toolcage.tool"] == "openai-agents"
        assert labels["toolcage.run_id"] == toolcage_session(session).state.run_id
        assert c["HostConfig"]["ReadonlyRootfs"] is True and c["HostConfig"]["NetworkMode"] == "none"
        assert c["Id"] == toolcage_session(session).state.container_id
        assert "app.py" in ch.changed and {"out.txt", "out.bin", "notes/todo.txt", "task.md"} <= set(ch.added)
        subprocess.run(["git", "apply", "--index", "-"], cwd=repo, input=ch.diff.encode(), check=True)
        assert "hello from the agent" in (repo / "app.py").read_text()
        assert (repo / "out.bin").read_bytes() == b"\x00\xff"

    asyncio.run(main())


@pytest.mark.parametrize("kind", ["toolcage", "sdk-local"])
def test_a_snapshot_taken_in_one_run_resumes_in_a_new_container(tmp_path: Path, kind: str) -> None:
    """Run 1 writes files and ends (its stop() takes the snapshot); run 2 resumes the session state through
    the client, in a fresh container, and the agent finds the files, links too (an absolute one into the
    workspace as well: issue 34 found the SDK's snapshot of ``ln -s /workspace/a.txt b`` refused on resume).
    ``toolcage``: toolcage's signed snapshots; ``sdk-local``: the SDK's LocalSnapshot, through
    persist_workspace/hydrate_workspace."""
    spec = (
        ToolcageSnapshotSpec(base_path=tmp_path / "snaps")
        if kind == "toolcage"
        else LocalSnapshotSpec(base_path=tmp_path / "snaps")
    )
    client = ToolcageSandboxClient()
    first = ScriptedModel(
        [
            [_sh("mkdir -p keep && echo step-1 > keep/state.txt && ln -s keep/state.txt last", "a1")],
            [_sh("ln -s /workspace/keep/state.txt abs", "a2")],
            [assistant_message("saved")],
        ]
    )
    live: list[str] = []

    def look(call: ModelCall) -> Any:
        live.extend(c["Id"] for c in _mine())
        return [_sh("cat last; cat abs; cat keep/state.txt", "b1")]

    second = ScriptedModel([ModelStep.respond(look), [assistant_message("resumed")]])

    async def main() -> None:
        session = await client.create(snapshot=spec, options=ToolcageSandboxClientOptions())
        async with session:
            assert (await _run(_agent(first), SandboxRunConfig(session=session))).final_output == "saved"
        await client.delete(session)  # the end of async with ran stop(): the snapshot is written
        state = toolcage_session(session).state
        before = state.container_id
        assert any((tmp_path / "snaps").iterdir())
        payload = client.serialize_session_state(state)  # the state survives a process as JSON
        again = client.deserialize_session_state(json.loads(json.dumps(payload)))
        result = await _run(_agent(second), SandboxRunConfig(client=client, session_state=again))
        assert result.final_output == "resumed"
        assert "Process exited with code 0" in _outputs(second)["b1"]
        assert "step-1\nstep-1\nstep-1" in _outputs(second)["b1"]
        assert len(live) == 1 and before is not None and live[0] != before  # a fresh container

    asyncio.run(main())


def test_a_pooled_client_fills_a_warm_slot_and_resumes_into_another(tmp_path: Path) -> None:
    """pool_size: a session with the client's own options adopts a slot started ahead (its pool label) and finds
    its workspace copy there; its snapshot resumes into another slot of the pool; a session with other options
    starts cold."""
    repo = _git_repo(tmp_path)
    options = ToolcageSandboxClientOptions(workspace=str(repo))
    for bad in (-1, True, 1.5):
        with pytest.raises(UsageError, match="pool_size must be a non-negative integer"):
            ToolcageSandboxClient(options, pool_size=bad)  # type: ignore[arg-type]
    client = ToolcageSandboxClient(options, pool_size=1)
    assert client.pool is not None
    spec = ToolcageSnapshotSpec(base_path=tmp_path / "snaps")
    # this process's client containers while each session ran: the one serving it, and slots waiting
    seen: list[dict[str, dict[str, str]]] = []

    def look(call: ModelCall) -> Any:
        seen.append({c["Id"]: c["Config"]["Labels"] for c in _mine()})
        return [_sh("cat app.py; echo kept > note.txt", "p1")]

    def again(call: ModelCall) -> Any:
        seen.append({c["Id"]: c["Config"]["Labels"] for c in _mine()})
        return [_sh("cat note.txt", "p2")]

    first = ScriptedModel([ModelStep.respond(look), [assistant_message("one")]])
    second = ScriptedModel([ModelStep.respond(again), [assistant_message("two")]])

    async def main() -> None:
        assert client.pool is not None and await client.pool.wait_ready(timeout=60)
        session = await client.create(snapshot=spec)
        async with session:
            assert (await _run(_agent(first), SandboxRunConfig(session=session))).final_output == "one"
        await client.delete(session)
        first_container = toolcage_session(session).state.container_id
        # its removal runs off the caller's path: on a loaded host the used slot still ran while the next session
        # looked (a fresh clone's full pass). Gone before the next session starts, or the pool kept it: a failure
        deadline = time.monotonic() + 30
        while any(c["Id"] == first_container for c in _mine()) and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
        assert all(c["Id"] != first_container for c in _mine()), "the used slot still runs 30 s after its session"
        assert "return 'hi'" in _outputs(first)["p1"]
        assert await client.pool.wait_ready(timeout=60)
        state = client.deserialize_session_state(client.serialize_session_state(toolcage_session(session).state))
        assert (await _run(_agent(second), SandboxRunConfig(client=client, session_state=state))).final_output == "two"
        assert "kept" in _outputs(second)["p2"]
        other = await client.create(options=ToolcageSandboxClientOptions(workspace=str(repo), run_s=600))
        async with other:
            cid = toolcage_session(other).state.container_id
            cold = [c["Config"]["Labels"] for c in _mine() if c["Id"] == cid]
        await client.delete(other)
        await client.close()
        # every container serving a session was one of the pool's slots (no cold one was started for them)
        assert len(seen) == 2 and first_container in seen[0] and first_container not in seen[1], seen
        assert all(lb.get("toolcage.pool") == client.pool.id for step in seen for lb in step.values()), seen
        assert [lb.get("toolcage.pool") for lb in cold] == [None], cold

    asyncio.run(main())


def test_egress_off_the_allowlist_is_a_failed_tool_call(tmp_path: Path) -> None:
    """A host off the options' allowlist is refused by the egress proxy; the agent sees a failed command
    and the loop goes on to its answer. The client is the only thing the user changed."""
    model = ScriptedModel([[_sh(f"{NET}; echo code=$?", "e1")], [assistant_message("blocked, as expected")]])
    options = ToolcageSandboxClientOptions(allow_hosts=("pypi.org",))

    async def main() -> None:
        result = await _run(_agent(model), SandboxRunConfig(client=ToolcageSandboxClient(), options=options))
        assert result.final_output == "blocked, as expected"
        out = _outputs(model)["e1"]
        assert "code=1" in out and ("403" in out or "Forbidden" in out), out

    asyncio.run(main())


def test_a_killed_sandbox_is_the_sdks_error_with_toolcages_status() -> None:
    """``docker kill`` of the container mid-run: the next command's error is ToolcageSandboxError (an
    ExecTransportError) with toolcage's status; a new session afterwards works."""
    killed: list[str] = []

    def kill(call: ModelCall) -> Any:
        (c,) = _mine()
        subprocess.run(["docker", "kill", c["Id"]], capture_output=True, check=True)
        killed.append(c["Id"])
        return [_sh("echo still-here", "k2")]

    model = ScriptedModel([[_sh("echo alive", "k1")], ModelStep.respond(kill), [assistant_message("unreachable")]])

    async def main() -> BaseException:
        try:
            await _run(_agent(model), SandboxRunConfig(client=ToolcageSandboxClient()))
        except (AgentsException, ToolcageSandboxError) as exc:
            return exc
        raise AssertionError("the run went on after its sandbox was killed")

    exc = asyncio.run(main())
    assert killed
    chain: list[BaseException] = []
    cur: BaseException | None = exc
    while cur is not None and cur not in chain:
        chain.append(cur)
        cur = cur.__cause__
    died = next(e for e in chain if isinstance(e, ToolcageSandboxError))
    assert died.status in ("crashed", "interrupted", "oom_killed", "timeout") and died.reason
    assert died.context["status"] == died.status and died.retryable is False
    # the next session works
    model2 = ScriptedModel([[_sh("echo fresh", "n1")], [assistant_message("ok")]])
    assert asyncio.run(_run(_agent(model2), SandboxRunConfig(client=ToolcageSandboxClient()))).final_output == "ok"
    assert "fresh" in _outputs(model2)["n1"]


def test_unsupported_features_are_declared_as_the_sdk_expects() -> None:
    """Other users refused the SDK's way; a port not in ``exposed_ports`` is the SDK's "not_configured"."""

    async def main() -> None:
        client = ToolcageSandboxClient()
        session = await client.create(manifest=None, options=None)
        async with session:
            with pytest.raises(ExposedPortUnavailableError) as undeclared:
                await session.resolve_exposed_port(8080)
            assert undeclared.value.context["reason"] == "not_configured"
            with pytest.raises(ConfigurationError, match="unprivileged user"):
                await session.exec("id", user="root")
            r = await session.exec("nosuchprogram-x", shell=False)
            assert r.exit_code == 127 and b"no such program" in r.stderr
            await session.write(Path("big.bin"), io.BytesIO(os.urandom(5 << 20)))  # past one write_file call
            assert len((await session.read(Path("big.bin"))).read()) == 5 << 20
        await client.delete(session)

    asyncio.run(main())


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"policy": "no-such-policy"}, "no-such-policy"),
        ({"sandbox": "none"}, "sandbox must be one of"),
        ({"allow_hosts": ("http://x.example/",)}, "not a host name"),
        ({"secrets": {"TOKEN": "x"}}, "binds no secret named TOKEN"),
        ({"workspace": "/no/such/dir"}, "does not exist"),
        ({"workspace_gitignore": True}, "give workspace="),
        ({"run_s": -1}, "positive"),
        ({"bogus": 1}, "bogus"),
        ({"image": "toolcage-no-such-image:1"}, "'toolcage-no-such-image:1' is not in the container engine"),
    ],
)
def test_invalid_options_fail_at_construction(kwargs: dict[str, Any], match: str) -> None:
    """Each bad option is a ValidationError naming it when the options are built (a missing image included)."""
    with pytest.raises(ValidationError, match=match):
        ToolcageSandboxClientOptions(**kwargs)


def test_a_sandbox_that_never_started_says_so_not_that_it_ended() -> None:
    """An image gone between the options and the session's start: the SDK's error says the sandbox did not
    start and why (toolcage's image_missing), not that it "ended"."""
    options = ToolcageSandboxClientOptions.model_construct(image="toolcage-no-such-image:1")  # unchecked

    async def main() -> None:
        session = await ToolcageSandboxClient().create(manifest=Manifest(), options=options)
        with pytest.raises(ToolcageSandboxError) as info:
            await session.start()
        assert info.value.status == "image_missing" and info.value.op == "start"
        assert "did not start (image_missing" in str(info.value) and "ended" not in str(info.value)

    asyncio.run(main())


def test_the_session_policy_is_the_shared_overlay() -> None:
    """The options' policy is policies.overlay's: hosts added to a policy's own rules, an hour for a policy
    that keeps the default 60 s, a policy's own timeouts kept."""
    from toolcage.policies.overlay import overlay

    o = ToolcageSandboxClientOptions(policy="connector-http", allow_hosts=("pypi.org",))
    assert [r.host for r in o.resolved_policy().network.allow] == ["api.github.com", "pypi.org"]
    assert o.resolved_policy() == overlay("connector-http", allow_hosts=["pypi.org"], agent_session=True)
    t = ToolcageSandboxClientOptions(policy={"extends": "default", "limits": {"memory": "1g"}}).resolved_policy()
    assert (t.timeouts.run_s, t.timeouts.idle_s) == (3600.0, 600.0)
    own = ToolcageSandboxClientOptions(policy={"extends": "default", "timeouts": {"run_s": 90}}).resolved_policy()
    assert (own.timeouts.run_s, own.timeouts.idle_s) == (90.0, 60.0)


@pytest.mark.parametrize(
    ("manifest", "match"),
    [
        (Manifest(root="/opt/app"), "manifest root"),
        (lambda: Manifest(users=[__import__("agents.sandbox.types", fromlist=["User"]).User(name="bob")]), "users"),
    ],
)
def test_manifests_toolcage_cannot_honour_fail_at_create(manifest: Any, match: str) -> None:
    m = manifest() if isinstance(manifest, Callable) else manifest  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match=match):
        asyncio.run(ToolcageSandboxClient().create(manifest=m, options=None))


def test_file_api_follows_links_in_the_workspace_and_refuses_links_out() -> None:
    """read/write through a link that stays in /workspace reach its target (relative or absolute, as the SDK's
    other clients do); read, write, ls, mkdir and rm through a link out of it (to /scratch) are refused with
    the SDK's InvalidManifestPathError and leave /scratch as it was (issue 34 found mkdir, rm and ls followed
    it out, and writes through an inside link refused)."""

    async def main() -> None:
        client = ToolcageSandboxClient()
        session = await client.create(manifest=None, options=None)
        async with session:
            setup = "echo old > a.txt && ln -s a.txt rel && ln -s /workspace/a.txt abs && mkdir -p /scratch/out"
            setup += " && echo secret > /scratch/out/s.txt && ln -s /scratch/out out"
            assert (await session.exec(setup)).ok()
            await session.write(Path("rel"), io.BytesIO(b"via rel\n"))
            assert (await session.read(Path("abs"))).read() == b"via rel\n"
            await session.write(Path("abs"), io.BytesIO(b"via abs\n"))
            assert (await session.read(Path("a.txt"))).read() == b"via abs\n"
            links = await session.exec("readlink rel abs")
            assert links.stdout == b"a.txt\n/workspace/a.txt\n"  # written through, not replaced
            for op in (
                lambda: session.read(Path("out/s.txt")),
                lambda: session.write(Path("out/s.txt"), io.BytesIO(b"overwritten")),
                lambda: session.ls("out"),
                lambda: session.mkdir("out/made", parents=True),
                lambda: session.rm("out/s.txt"),
            ):
                with pytest.raises(InvalidManifestPathError, match="must not escape root"):
                    await op()
            after = await session.exec("ls -A /scratch/out; cat /scratch/out/s.txt")
            assert after.stdout == b"s.txt\nsecret\n"
        await client.delete(session)

    asyncio.run(main())


def test_resume_asserts_path_grants_were_rebound() -> None:
    """A serialised state whose host path grant was dropped must be rebound before it resumes: resume
    refuses it with the SDK's ValueError before a container starts, as every SDK client does first."""

    async def main() -> None:
        client = ToolcageSandboxClient()
        grant = SandboxPathGrant(path="/scratch/data", host_path="/srv/data")
        session = await client.create(manifest=Manifest(extra_path_grants=(grant,)), options=None)
        payload = client.serialize_session_state(toolcage_session(session).state)
        again = client.deserialize_session_state(json.loads(json.dumps(payload)))
        before = len(_mine())
        with pytest.raises(ValueError, match="rebound"):
            await client.resume(again)
        assert len(_mine()) == before
        await client.delete(session)

    asyncio.run(main())


@pytest.mark.parametrize(
    "fill",
    [
        "truncate -s 256M big",  # no blocks at all
        "head -c 4M /dev/urandom > big && for i in 1 2 3 4 5 6 7 8 9; do ln big big$i; done",  # 4 MiB held, 40 sent
    ],
    ids=["sparse", "hardlinks"],
)
def test_persist_is_bounded_by_what_the_sandbox_may_hold(fill: str) -> None:
    """A 16 MiB workspace copy whose tree reads as far more (a 256 MiB sparse file; one 4 MiB file under 10
    names): persist_workspace carries at most the copy's size (issue 34: the cap was 4 GiB, so the host got
    268,441,600 bytes for the sparse file, 41,953,280 for the links). A file the worker leaves out (sparse)
    is left out; past the bound the persist stops, the sandbox alive."""
    options = ToolcageSandboxClientOptions(policy={"extends": "default", "limits": {"workspace_copy": "16m"}})

    async def main() -> None:
        client = ToolcageSandboxClient()
        session = await client.create(manifest=None, options=options)
        async with session:
            assert (await session.exec(f"echo kept > small.txt && {fill}")).ok()
            try:
                archive = await session.persist_workspace()
            except WorkspaceArchiveReadError as exc:
                assert "max_bytes" in str(exc.__cause__), exc.__cause__
                assert fill.startswith("head"), "a sparse file is skipped by the worker, not sent"
            else:
                with archive:
                    size = archive.seek(0, io.SEEK_END)
                    archive.seek(0)
                    with tarfile.open(fileobj=archive) as tf:
                        names = tf.getnames()
                assert size <= 16 << 20 and "small.txt" in names and "big" not in names, (size, names)
            assert (await session.exec("true")).ok()  # the sandbox lives on
        await client.delete(session)

    asyncio.run(main())


def test_pty_and_exposed_port_through_the_shell_tools() -> None:
    """Issue 37: the SDK's own agent loop (its ``Shell`` capability, scripted model) starts a web server on a
    terminal with ``exec_command(tty=true)``; the host reaches it at ``resolve_exposed_port``; the model stops
    it with Ctrl-C over ``write_stdin``. Then the SDK's limit: 64 processes at once, a 65th prunes the least
    recently used (its id is gone, its process killed in the sandbox); ``stop`` killing the rest is the
    SDK's own test_stop_terminates_active_pty_sessions (test_openai_agents_sdk_suite)."""
    import re
    import urllib.request

    from agents.sandbox.errors import PtySessionNotFoundError

    got: dict[str, Any] = {}

    async def main() -> None:
        client = ToolcageSandboxClient()
        opts = ToolcageSandboxClientOptions(
            exposed_ports=(8000,), policy={"extends": "default", "limits": {"pids": 256, "memory": "1g"}}
        )
        session = await client.create(manifest=None, options=opts)
        async with session:
            assert session.supports_pty() is True
            shell = Shell()
            shell.bind(session)
            assert [t.name for t in shell.tools()] == ["exec_command", "write_stdin"]

            async def fetch_then_interrupt(call: ModelCall) -> Any:
                started = _outputs(model)["s1"]
                sid = int(re.search(r"session ID (\d+)", started).group(1))  # type: ignore[union-attr]
                endpoint = await session.resolve_exposed_port(8000)
                got["url"] = endpoint.url_for("http")
                got["body"] = await asyncio.to_thread(lambda: urllib.request.urlopen(got["url"], timeout=10).read())
                return [
                    function_call(
                        "write_stdin", {"session_id": sid, "chars": "\u0003", "yield_time_ms": 3000}, call_id="s2"
                    )
                ]

            serve = "python3 -u -m http.server 8000 --bind 127.0.0.1"
            model = ScriptedModel(
                [
                    [function_call("exec_command", {"cmd": serve, "tty": True, "yield_time_ms": 3000}, call_id="s1")],
                    ModelStep.respond(fetch_then_interrupt),
                    [assistant_message("done")],
                ]
            )
            sandbox = SandboxRunConfig(session=session)
            assert (
                await _run(SandboxAgent(name="w", model=model, capabilities=[Shell()]), sandbox)
            ).final_output == "done"
            out = _outputs(model)
            assert "Serving HTTP" in out["s1"] and "Process running with session ID" in out["s1"]
            assert got["url"].startswith("http://127.0.0.1:") and not got["url"].endswith(":8000/")
            assert b"Directory listing" in got["body"]
            assert "Keyboard interrupt received" in out["s2"] and "Process exited with code" in out["s2"], out["s2"]

            with pytest.raises(ExecTransportError) as refused:  # the worker's own refusal: the session goes on
                await session.pty_exec_start("/no/such/program", shell=False, yield_time_s=0.25)
            assert not isinstance(refused.value, ToolcageSandboxError)
            # the SDK's limit: 64 at once, then the least recently used goes
            first = await session.pty_exec_start("sleep", "300", shell=False, yield_time_s=0.25)
            rest = await asyncio.gather(
                *(session.pty_exec_start("sleep", "300", shell=False, yield_time_s=0.25) for _ in range(63))
            )
            ids = {first.process_id, *(u.process_id for u in rest)}
            assert len(ids) == 64 and all(i is not None and 1000 <= i < 100_000 for i in ids)
            extra = await session.pty_exec_start("sleep", "300", shell=False, yield_time_s=0.25)
            assert extra.process_id is not None and extra.process_id not in ids
            with pytest.raises(PtySessionNotFoundError):
                await session.pty_write_stdin(session_id=first.process_id or 0, chars="")
            sb = toolcage_session(session).sandbox
            running = [p for p in await sb.processes() if p["state"] == "running"]
            assert len(running) == 64
        # stop (the end of ``async with``) killed them all
        await client.delete(session)

    asyncio.run(main())
