"""Podman's Docker-compatible service as the engine (issue 12): the same sandbox, its knobs translated.

Needs a Podman service (`podman system service`, rootful here) at $TOOLCAGE_TEST_PODMAN_SOCKET
(default /run/podman/podman.sock) with the worker image loaded into its storage; `.ci/start-podman`
does both. Without it these tests skip, saying so, unless TOOLCAGE_REQUIRE_PODMAN=1 (set by CI).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

import pytest

from toolcage import DEFAULT_IMAGE, Sandbox, wait_removed
from toolcage.ops.views import inspect_findings

SOCKET = os.environ.get("TOOLCAGE_TEST_PODMAN_SOCKET", "/run/podman/podman.sock")
IMAGE = f"localhost/{DEFAULT_IMAGE}"


@pytest.fixture(scope="module")
def podman() -> Iterator[Any]:
    from toolcage.engine.docker_adapter import Engine
    from toolcage.errors import ToolcageError

    reason = None
    eng = None
    if not os.path.exists(SOCKET):
        reason = f"no Podman service at {SOCKET} (.ci/start-podman starts one)"
    else:
        try:
            eng = Engine(base_url=f"unix://{SOCKET}")
            if eng.image(IMAGE) is None:
                reason = f"{IMAGE} is not in Podman's storage (docker save {DEFAULT_IMAGE} | podman load)"
        except ToolcageError as exc:
            reason = f"the Podman service does not answer: {exc.message}"
    if reason is not None:
        if os.environ.get("TOOLCAGE_REQUIRE_PODMAN") == "1":
            pytest.fail(reason)
        pytest.skip(reason)
    yield eng


PROBE = (
    "import errno, json, os, socket\n"
    "s = {l.split(':')[0]: l.split(':', 1)[1].strip() for l in open('/proc/self/status') if ':' in l}\n"
    "r = {'uid': os.getuid(), 'seccomp': s['Seccomp'], 'nnp': s['NoNewPrivs'], 'caps': s['CapEff'],\n"
    "     'ifaces': sorted(n for _, n in socket.if_nameindex())}\n"
    "try:\n    open('/x', 'w')\nexcept OSError as e:\n    r['root'] = errno.errorcode[e.errno]\n"
    "open('/scratch/ok', 'w').write('ok')\n"
    "print(json.dumps(r))"
)


def test_a_sandbox_through_podman_has_the_same_walls(podman: Any) -> None:
    """Through Podman: non-root, toolcage's seccomp filter, no_new_privs, no capabilities, only `lo`,
    a read-only root and a writable scratch; doctor finds the live container as locked down as its
    policy (the profile given by path, as Podman takes it); nothing is left behind."""
    assert podman.flavor().name == "podman"
    with Sandbox(image=IMAGE, engine=podman, tool="podman-check", audit=False) as sb:
        r = sb.call("run_python", {"code": PROBE})
        assert r.ok and r.result["exit_code"] == 0, r.result
        seen = json.loads(r.result["stdout"])
        assert seen == {
            "uid": 65532, "seccomp": "2", "nnp": "1", "caps": "0000000000000000", "ifaces": ["lo"], "root": "EROFS",
        }  # fmt: skip
        assert sb.call("run_shell", {"command": "cat /scratch/ok"}).result["stdout"] == "ok"
        assert sb.container_id is not None
        info = podman.inspect(sb.container_id)
        assert inspect_findings(info) == [], inspect_findings(info)
    wait_removed(60)
    assert [c for c in podman.containers("toolcage.run_id") if c["Labels"].get("toolcage.tool") == "podman-check"] == []
