"""Red-team attacks on concurrent calls (74a7bd3, 556f793) and on what runs beside a connector's call.

Each attack runs as tool code (or as a caller of the library) on the real engine. A connector's
call must run alone: no process of the run's tool code alive beside it, since any same-uid
process may read its memory (and the exposed secret it holds) through /proc/<pid>/mem.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tests.security.test_connector_secrets import (
    EXPOSED,
    HOSTILE,
    SCAN_BESIDE,
    TOKEN,
    _found,
    _policy,
    egress_net,  # noqa: F401 - a fixture
)
from toolcage import AsyncSandbox, CallResult, Sandbox

pytestmark = pytest.mark.usefixtures("no_leaks")

SECRETS = {"TOKEN": TOKEN, "EXPOSED": EXPOSED}


def _conn_sandbox(tmp_path: Path, net: str, name: str) -> Sandbox:
    pol = _policy(tmp_path, name, exposed=True)
    return Sandbox(pol, tool=name, tools=[HOSTILE], secrets=SECRETS, egress_network=net)


def _py(sb: Sandbox, code: str, **kw: Any) -> CallResult:
    r = sb.call("run_python", {"code": code, **kw})
    assert r.result is not None, r
    return r


# --------------------------------------------------------------------------------------------------
# 1. A batch carrying a connector call is served on the main thread without waiting for the code
#    calls in flight: the connector's child (holding an exposed secret) runs beside tool code.


def test_a_batch_cannot_run_a_connector_call_beside_a_code_call(egress_net: str, tmp_path: Path) -> None:  # noqa: F811
    with _conn_sandbox(tmp_path, egress_net, "conc-batch") as sb:
        got: dict[str, CallResult] = {}
        scan = threading.Thread(
            target=lambda: got.update(scan=_py(sb, SCAN_BESIDE.replace("DURATION", "3.0"))), daemon=True
        )
        scan.start()
        time.sleep(1.0)  # the scan runs
        batch = [{"jsonrpc": "2.0", "id": "b1", "method": "expose_hold", "params": {"seconds": 1.0}}]
        sb.forward((json.dumps(batch) + "\n").encode())
        answer = sb.next_forwarded()
        scan.join(30)
        assert isinstance(answer, list) and "result" in answer[0], answer
        seen = json.loads(got["scan"].result["stdout"])
        assert seen["scanned"] >= 1, seen
        assert EXPOSED not in _found(seen), "the scan read the exposed secret beside a batched connector call"
