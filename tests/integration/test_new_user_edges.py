"""Rough edges a new user hit (issue 23), on the real engine: each failed before its fix."""

from __future__ import annotations

import io
import json
import secrets
import subprocess
import tarfile
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.helpers import run_cli


@pytest.fixture
def not_a_worker_image() -> Iterator[str]:
    """An image this test makes (one file, no toolcage labels, no command) and removes."""
    ref = f"toolcage-test-notworker:{secrets.token_hex(4)}"
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        data = b"not a worker\n"
        info = tarfile.TarInfo("README")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    subprocess.run(["docker", "import", "-", ref], input=buf.getvalue(), check=True, capture_output=True)
    try:
        yield ref
    finally:
        subprocess.run(["docker", "image", "rm", "-f", ref], check=False, capture_output=True)


def test_run_with_an_image_that_is_not_a_worker_image_runs_it_unchanged(engine: Any, not_a_worker_image: str) -> None:
    """It was Docker's raw "No command specified", status crashed, exit 3; then a refusal (exit 2) naming
    `toolcage image build --pip`; now (issue 36) any image runs, the worker from toolcage's runtime mount: an
    image of one file, with no command and no shell, answers ping."""
    out = run_cli("run", "ping", "--image", not_a_worker_image)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["status"] == "ok" and "No command specified" not in out.stderr


def test_run_with_an_image_the_engine_does_not_have_is_refused_before_anything_starts(engine: Any) -> None:
    """A tag with no image behind it: exit 3 (image_missing), one line naming `docker images` and that nothing
    is pulled, and no container is made."""
    missing = f"toolcage-test-notworker:missing-{secrets.token_hex(4)}"
    out = run_cli("run", "ping", "--image", missing)
    assert out.returncode == 3 and json.loads(out.stdout)["status"] == "image_missing", out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "`docker images`" in lines[0] and "nothing is pulled" in lines[0], out.stderr
    assert [c for c in engine.containers("toolcage.run_id") if c.get("Image") == missing] == []


def _run_objects(engine: Any, run_id: str) -> tuple[list[dict[str, Any]], list[Any], list[Any]]:
    label = f"toolcage.run_id={run_id}"
    return engine.containers(label), engine.volumes(label), engine.networks(label)


def test_keep_leaves_the_egress_proxy_stopped_not_live(engine: Any) -> None:
    """--keep keeps the run's objects for inspection; its egress proxy ran on until the run's deadline.
    Now the kept proxy is stopped, like the kept sandbox."""
    out = run_cli("run", "ping", "--policy", "connector-http", "--keep")
    assert out.returncode == 0, out.stderr
    run_id = json.loads(out.stdout)["run_id"]
    try:
        deadline = time.monotonic() + 15
        while True:
            containers, _, _ = _run_objects(engine, run_id)
            roles = {c["Labels"].get("toolcage.role"): c for c in containers}
            running = [r for r, c in roles.items() if engine.inspect(c["Id"])["State"]["Running"]]
            if not running or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert set(roles) == {"sandbox", "egress-proxy"}, roles.keys()
        assert running == [], f"still running after the run: {running}"
    finally:  # everything of this run, which this test made
        containers, volumes, networks = _run_objects(engine, run_id)
        for c in containers:
            engine.remove(c["Id"])
        for v in volumes:
            engine.remove_volume(v["Name"])
        for n in networks:
            engine.remove_network(n["Name"])


def test_stream_and_ctrl_c_through_docker(engine: Any) -> None:
    """Issue 35: `run --stream` shows the call's output on stderr while it runs (stdout keeps the one JSON
    result), and Ctrl-C's `interrupted` result keeps what the call printed, as a timeout does."""
    from tests.unit.test_cli_edges import stream_then_interrupt

    seen, code, doc, err = stream_then_interrupt()
    # (the run's reaper may say what it removed of dead runners' runs: other tests', with several test processes)
    shown = [line for line in seen if not line.startswith("toolcage: warning: gc.removed ")]
    assert shown[-2:] == ["first line\n", "to stderr\n"], seen
    assert code == 130 and doc["status"] == "interrupted", (doc, err)
    assert doc["output"] == "first line\nto stderr\n" and doc["run_id"]
    assert "Traceback" not in err


def test_the_library_names_the_closest_tools_for_a_typo(engine: Any) -> None:
    """Issue 35: a call of a mistyped tool got a bare "Method not found": the worker's answer names the closest."""
    from toolcage import Sandbox

    with Sandbox() as sb:
        res = sb.call("run_pythn", {"code": "1"})
    assert res.error is not None and res.error["code"] == -32601
    assert res.error["message"] == "Method not found: 'run_pythn'; did you mean 'run_python'?"
