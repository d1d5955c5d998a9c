"""`toolcage rm RUN` and gc after `docker rm` / `docker rmi`, on the real engine (issue 35): a kept run goes
with everything of it (container, egress proxy, volumes); a live run is refused; an image's shared-files
volumes and the overlays of a run of it go in one gc pass once the image is gone."""

from __future__ import annotations

import io
import json
import secrets
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from toolcage import Sandbox
from toolcage.engine import sharedfiles
from toolcage.image.build import record_built

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [
    pytest.mark.usefixtures("no_leaks"),
    pytest.mark.runc_only("toolcage rm and gc: the engine's containers, networks and volumes, host-side"),
]


def toolcage(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "toolcage.cli", *args], capture_output=True, text=True, cwd=ROOT, timeout=300
    )


def of_run(engine: Any, run_id: str) -> set[str]:
    """Names of everything the engine holds labelled with ``run_id``."""
    label = f"toolcage.run_id={run_id}"
    return (
        {c["Names"][0].lstrip("/") for c in engine.containers(label)}
        | {n["Name"] for n in engine.networks(label)}
        | {v["Name"] for v in engine.volumes(label)}
    )


def test_rm_removes_a_kept_run_that_docker_rm_left_half_of(engine: Any, internal_net: str) -> None:
    """--keep with an egress proxy, then `docker rm` of the sandbox as the docs say: its proxy and volumes
    stay. `toolcage rm RUN` removes them all; the engine has nothing of the run left."""
    out = toolcage(
        "run", "run_shell", "--params", '{"command": "echo hi"}', "--keep",
        "--allow-host", "example.com", "--egress-network", internal_net,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    run_id = json.loads(out.stdout)["run_id"]
    left = of_run(engine, run_id)
    assert f"toolcage-proxy-{run_id}" in left and any(n.startswith("toolcage-files-run-") for n in left), left
    engine.remove(json.loads(out.stdout)["name"])  # docker rm, as the docs say
    dry = toolcage("rm", "--dry-run", "--json", run_id)
    assert dry.returncode == 0, dry.stderr
    assert {o["name"] for o in json.loads(dry.stdout)["would_remove"]} == of_run(engine, run_id) != set()
    gone = toolcage("rm", run_id)
    assert gone.returncode == 0, gone.stderr
    assert of_run(engine, run_id) == set()


def test_rm_refuses_a_run_whose_owner_lives(engine: Any) -> None:
    """This process owns an open sandbox: `toolcage rm` from another process says so in one line, exit 2,
    and the sandbox keeps working."""
    with Sandbox() as sb:
        out = toolcage("rm", sb.run_id)
        assert out.returncode == 2 and out.stdout == "", out
        assert len(out.stderr.strip().splitlines()) == 1 and "still owned by process" in out.stderr
        assert sb.call("run_shell", {"command": "echo ok"}).result["stdout"] == "ok\n"


def test_one_gc_pass_removes_a_gone_images_shared_files_and_a_kept_runs_overlays(engine: Any) -> None:
    """An image of its own (the worker image plus a label), a kept run of it, `docker rm`, `docker rmi`: one
    gc pass lists the run's overlays and the image's shared-files volumes (the overlays no longer hold them).
    Only this test's objects are removed here (gc is machine-wide). With a driver that shares the image's
    files itself (overlay2), the image has only its marker volume and the run no overlays: that goes too."""
    from toolcage import DEFAULT_IMAGE
    from toolcage.lifecycle import reaper

    tag = f"toolcage-test-rm-{secrets.token_hex(4)}:1"
    dockerfile = f"FROM {DEFAULT_IMAGE}\nLABEL toolcage.test={tag}\n".encode()
    list(engine.api.build(fileobj=io.BytesIO(dockerfile), tag=tag, rm=True, network_mode="none", decode=True))
    image_id = engine.image(tag)["Id"]
    record_built(image_id)  # as `toolcage image build` does: an image of this installation runs its own worker
    try:  # a kept run of it, by a command that has ended (the run's owner is gone, as after `toolcage run`)
        out = toolcage("run", "run_shell", "--params", '{"command": "true"}', "--keep", "--image", tag)
        assert out.returncode == 0, out.stderr[-2000:]
        run_id = json.loads(out.stdout)["run_id"]
        engine.remove(json.loads(out.stdout)["name"])  # docker rm
    finally:
        engine.api.remove_image(tag)  # docker rmi
    shared = {v["Name"] for v in engine.volumes(f"{sharedfiles.LABEL}={image_id}")}
    overlays = {v["Name"] for v in engine.volumes(f"toolcage.run_id={run_id}")}
    # (overlays only where the storage driver does not share the image's files itself: fuse-overlayfs, vfs)
    assert sharedfiles.marker_name(image_id) in shared or not sharedfiles.enabled() or not engine.flavor().shared_files
    found = reaper.find_orphans(engine) + reaper.shared_files_orphans(engine)
    mine = [o for o in found if o.name in shared | overlays]
    assert {o.name for o in mine} == shared | overlays and not any(o.kept for o in mine)
    reaper.remove(engine, mine)
    assert not engine.volumes(f"{sharedfiles.LABEL}={image_id}") and of_run(engine, run_id) == set()
