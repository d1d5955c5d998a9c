"""Attacks on a live network policy change (issue 39, point 2).

Threats: code that hammers a host while its policy is taken away, looking for a window in which the old policy
still lets a new request through; code that tries to change its own sandbox's policy (the proxy takes control
lines only on its stdin, which the runner alone holds: the sandbox reaches the proxy through its socket, where a
control line is one more bad request). The upstream is test_egress's, on an internal network the test makes.
"""

from __future__ import annotations

import json
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tests.integration.test_egress import fetch, policy_file, upstream  # noqa: F401 - the fixture
from toolcage import Sandbox

pytestmark = pytest.mark.usefixtures("no_leaks")


def _allow(subnet: str, *hosts: str) -> dict[str, Any]:
    return {
        "mode": "proxy",
        "allow": [{"host": h, "schemes": ["http"], "ports": [8080]} for h in hosts],
        "allow_private_cidrs": [subnet],
    }


HAMMER = textwrap.dedent(
    """
    import json, socket, sys, time
    end = time.time() + float(sys.argv[1])
    seen = []
    while time.time() < end:
        t0 = time.time()
        try:
            s = socket.create_connection(("127.0.0.1", 3128), timeout=5)
            s.sendall(b"GET http://api.allowed.test:8080/x HTTP/1.1\\r\\nHost: api.allowed.test:8080\\r\\n\\r\\n")
            head = s.recv(64)
            s.close()
            status = head.split(b" ")[1].decode() if head.count(b" ") >= 1 else "none"
        except OSError as exc:
            status = type(exc).__name__
        seen.append((t0, time.time(), status))
    print(json.dumps(seen))
    """
)


def test_no_request_started_after_a_change_gets_through(upstream: dict[str, Any], tmp_path: Path) -> None:  # noqa: F811
    """Code opens request after request to api.allowed.test while the host takes it away, gives it back and takes it
    away again: no request started after a change that refuses it returned gets through (no window), and requests
    went through while it was allowed (the probe works)."""
    pol = policy_file(tmp_path, _allow(upstream["subnet"], "api.allowed.test"))
    with Sandbox(pol, egress_network=upstream["network"]) as sb:
        sb.write_files({"/scratch/hammer.py": HAMMER})
        out: dict[str, Any] = {}
        t = threading.Thread(
            target=lambda: out.update(
                r=sb.call("exec", {"command": "python3 /scratch/hammer.py 4", "timeout_s": 20}, timeout=30)
            )
        )
        t.start()
        time.sleep(1)
        # (when the change was asked, when it returned, whether the host is allowed after it): a request started
        # in between may be decided either way
        marks: list[tuple[float, float, bool]] = []
        for allowed in (False, True, False):
            hosts = ("api.allowed.test",) if allowed else ("other.test",)
            asked = time.time()
            sb.update_network(_allow(upstream["subnet"], *hosts))
            marks.append((asked, time.time(), allowed))
            time.sleep(0.8)
        t.join(30)
    seen = json.loads(out["r"].result["stdout"])
    assert any(s == "200" for _, _, s in seen[:5]), seen[:5]  # allowed at first
    # the phases in which a refusing policy was in force for certain: from a refusing change's return to the
    # next change's asking (or the end). A request is decided somewhere between its start and its answer (on a
    # loaded machine that can be a second later), so one is wrong only if it started and was answered within
    # such a phase and got through
    ends = [asked for asked, _, _ in marks[1:]] + [float("inf")]
    refused = [(done, end) for (_, done, allowed), end in zip(marks, ends, strict=True) if not allowed]
    wrong = [
        (started, answered, status)
        for started, answered, status in seen
        if status == "200" and any(lo < started and answered < hi for lo, hi in refused)
    ]
    assert not wrong, f"requests let through by an old policy: {wrong[:5]}"
    print(f"{len(seen)} requests; the changes took {[round((d - a) * 1000, 1) for a, d, _ in marks]} ms")
    assert any(lo < started < hi for started, _, _ in seen for lo, hi in refused), "no request fell in a refused phase"
    later = [s for started, _, s in seen if marks[1][1] < started < marks[2][0]]
    assert "200" in later, "the host given back was never reached"


FORGE = textwrap.dedent(
    """
    import json, socket
    out = []
    forged = json.dumps({"seq": 1, "policy": {"network": {"mode": "proxy", "allow": [{"host": "*"}]}}}).encode()
    for payload in (forged + b"\\n", b"POLICY " + forged + b"\\r\\n\\r\\n"):
        s = socket.create_connection(("127.0.0.1", 3128), timeout=5)
        s.sendall(payload)
        out.append(s.recv(64).split(b"\\r\\n")[0].decode())
        s.close()
    s = socket.create_connection(("127.0.0.1", 3128), timeout=5)
    s.sendall(b"GET http://other.test:8080/ HTTP/1.1\\r\\nHost: other.test:8080\\r\\n\\r\\n")
    out.append(s.recv(64).split(b"\\r\\n")[0].decode())
    print(json.dumps(out))
    """
)


def test_the_sandbox_cannot_change_its_own_policy(upstream: dict[str, Any], tmp_path: Path) -> None:  # noqa: F811
    """A control line sent through the proxy's socket is a bad request there; the policy is unchanged (other.test
    still refused, by the proxy and by SafeFetch), and the runner's own change still works after it."""
    pol = policy_file(tmp_path, _allow(upstream["subnet"], "api.allowed.test"))
    with Sandbox(pol, egress_network=upstream["network"]) as sb:
        before = sb.policy.sha256()
        r = sb.call("exec", {"command": f"python3 -c '{FORGE}'"})
        got = json.loads(r.result["stdout"])
        assert got[0].startswith("HTTP/1.1 400") and got[1].startswith("HTTP/1.1 400"), got
        assert got[2].startswith("HTTP/1.1 403"), got
        assert fetch(sb, "http://other.test:8080/").status == "error"
        assert not [d for d in sb._run.backend._egress.decisions if d.get("event") == "egress.allowed"]
        change = sb.update_network(_allow(upstream["subnet"], "other.test"))
        assert change.old_sha256 == before
        assert fetch(sb, "http://other.test:8080/").status == "ok"
