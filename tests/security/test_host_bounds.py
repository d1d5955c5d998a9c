"""The sandbox cannot grow the host: the runner's memory, the audit log's disk, the audit chain under
faults, and a request over the worker's line limit (issue 21, point 2).

Each test was written first and failed on the code before the fix (what it observed then is in
the commit that added it and in docs/security.md).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import secrets
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.helpers import ROOT, run_cli
from toolcage import Sandbox, wait_removed
from toolcage.errors import BadToolCall
from toolcage.lifecycle import audit
from toolcage.worker.protocol import MAX_REQUEST_BYTES

# --- a request over the worker's line limit ---------------------------------------------------------


def test_a_request_over_the_line_limit_is_refused_on_the_host(engine: Any, no_leaks: None) -> None:
    """A ``code`` parameter over the worker's 16 MiB line limit is a params error before anything is
    sent, and the same sandbox answers the next call."""
    big = "#" * (MAX_REQUEST_BYTES + (1 << 20))  # 17 MiB
    with Sandbox("default") as sb:
        assert sb.call("run_python", {"code": "print(1)"}).result["stdout"] == "1\n"
        with pytest.raises(BadToolCall) as info:
            sb.call("run_python", {"code": big})
        assert info.value.exit_code == 2
        assert "16 MiB" in info.value.message and "request" in info.value.message
        r = sb.call("run_python", {"code": "print(2)"})
        assert r.status == "ok" and r.result["stdout"] == "2\n"
        assert sb.dead is None


def test_a_request_just_under_the_line_limit_still_goes_through(engine: Any, no_leaks: None) -> None:
    """The host's limit is the worker's (one constant): a line just under it is sent and answered."""
    # the rest of the line (method, id, other params, framing) fits in the 4 KiB left
    code = "#" * (MAX_REQUEST_BYTES - 4096) + "\nprint('under')"
    with Sandbox("default") as sb:
        r = sb.call("run_python", {"code": code})
        assert r.status == "ok" and r.result["stdout"] == "under\n", r.error


def test_cli_refuses_an_oversized_request_with_exit_2(engine: Any, tmp_path: Path) -> None:
    """`toolcage run` with a 17 MiB ``code`` exits 2 with one clear line and no traceback."""
    params = json.dumps({"code": "#" * (MAX_REQUEST_BYTES + (1 << 20))})
    proc = run_cli("run", "run_python", "--params", "-", stdin=params, timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    assert "16 MiB" in proc.stderr


# --- the audit log on a small, full filesystem ------------------------------------------------------


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    """A 64 KiB tmpfs mounted for this test (root only), unmounted afterwards."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mnt)], capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.fail(f"this test mounts a tmpfs and needs root: {proc.stderr.strip()}", pytrace=False)
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def _fill(fs: Path, leave: int) -> Path:
    """Fill ``fs`` with one file until about ``leave`` bytes are free; the file, to free it later."""
    filler = fs / "filler"
    with open(filler, "wb") as f:
        while True:
            st = os.statvfs(fs)
            free = st.f_bavail * st.f_frsize
            if free <= leave:
                break
            try:
                f.write(b"\0" * min(4096, free - leave))
                f.flush()
            except OSError as exc:
                assert exc.errno == errno.ENOSPC
                break
    return filler


def _other_run(log: Path, run_id: str, n: int) -> None:
    """Another runner process's records, written through its own Audit (its own writer)."""
    code = (
        "import sys; from toolcage.lifecycle.audit import Audit; a = Audit(sys.argv[1]);\n"
        "[a.event('run.call', run_id=sys.argv[2], i=i) for i in range(int(sys.argv[3]))]"
    )
    subprocess.run([sys.executable, "-c", code, str(log), run_id, str(n)], check=True, cwd=ROOT)


def test_a_failed_audit_write_loses_no_other_runs_records(small_fs: Path) -> None:
    """Disk full: a run's batch that does not fit leaves no torn line; another runner's records written
    meanwhile and later are all on disk, the failed run's own records follow once there is room, and
    the chain verifies."""
    from toolcage.lifecycle.audit import Audit, AuditError

    log = small_fs / "audit.jsonl"
    _other_run(log, "run-b", 3)
    filler = _fill(small_fs, leave=6 * 1024)
    a = Audit(log)
    for i in range(60):  # about 12 KiB: more than is left
        a.event_later("egress.decision", run_id="run-a", allowed=False, i=i, target="x" * 100)
    with pytest.raises(AuditError):
        a.event("run.finished", run_id="run-a")  # writes what is queued, then this: does not fit
    raw = log.read_bytes()
    assert raw.endswith(b"\n"), "a failed write left a torn line"
    assert audit.verify(log) == []
    _other_run(log, "run-b", 2)  # another runner, while run-a's records wait
    filler.unlink()  # the operator makes room
    a.drain()
    recs = list(audit.read(log))
    assert [r["i"] for r in recs if r["run_id"] == "run-b"] == [0, 1, 2, 0, 1]
    assert [r["i"] for r in recs if r["run_id"] == "run-a" and "i" in r] == list(range(60))
    assert audit.verify(log) == []


def test_a_torn_last_line_is_repaired_in_the_open_not_restarted(small_fs: Path) -> None:
    """A torn last line (a writer that died mid-append on a full disk) is closed by an explicit
    ``audit.repaired`` record chained to the last whole record: seq goes on, the chain verifies, and the
    torn bytes stay in the file with their size and digest recorded."""
    from toolcage.lifecycle.audit import Audit

    log = small_fs / "audit.jsonl"
    _other_run(log, "run-b", 3)
    last = json.loads(log.read_bytes().splitlines()[-1])
    filler = _fill(small_fs, leave=2 * 1024)
    # an old writer on a full disk: one write(2) of a batch, cut short by ENOSPC
    fd = os.open(log, os.O_WRONLY | os.O_APPEND)
    try:
        torn = 0
        with contextlib.suppress(OSError):
            torn = os.write(fd, json.dumps({"event": "run.call", "pad": "y" * 8192}).encode() + b"\n")
    finally:
        os.close(fd)
    assert 0 < torn < 8192, "the premise: the write was cut short"
    filler.unlink()
    Audit(log).event("run.finished", run_id="run-c")
    lines = log.read_bytes().splitlines()
    repaired, finished = json.loads(lines[-2]), json.loads(lines[-1])
    assert repaired["event"] == "audit.repaired"
    assert repaired["prev"] == last["hash"] and repaired["seq"] == last["seq"] + 1
    assert repaired["torn_bytes"] == torn
    assert finished["run_id"] == "run-c" and finished["seq"] == last["seq"] + 2
    assert audit.verify(log) == []


# --- a sandbox flooding its egress proxy with refused requests --------------------------------------

FLOOD_S = 20  # the issue measured 30 s; 20 s shows the slope as clearly
# refused requests as fast as the proxy answers them, on 8 connections at a time, each a new target
REFUSAL_FLOOD = r"""
import json, os, socket, sys, threading, time
h, p = os.environ["TOOLCAGE_PROXY"].split(":")
end = time.monotonic() + float(sys.stdin.read())
counts = []
def flood(k):
    n = 0
    while time.monotonic() < end:
        try:
            s = socket.create_connection((h, int(p)), timeout=5)
            t = b"other%d.test:8080" % (n % 50)
            s.sendall(b"GET http://%s/%d HTTP/1.1\r\nHost: %s\r\n\r\n" % (t, n, t))
            if s.recv(64).startswith(b"HTTP/1.1 403"):
                n += 1
            s.close()
        except OSError:
            time.sleep(0.01)
    counts.append(n)
ts = [threading.Thread(target=flood, args=(k,)) for k in range(8)]
[t.start() for t in ts]
[t.join() for t in ts]
print(json.dumps({"refused": sum(counts)}))
"""

# the runner as its own process, so its RSS is its own: samples every second while the flood runs
FLOOD_RUNNER = r"""
import json, sys, threading, time
from toolcage import Sandbox
policy, net, log, flood_s, code = sys.argv[1:6]
def rss():
    return int([l for l in open("/proc/self/status") if l.startswith("VmRSS")][0].split()[1])
samples = []
with Sandbox(policy, egress_network=net, audit=log) as sb:
    sb.call("ping")
    stop = threading.Event()
    def sample():
        t0 = time.monotonic()
        while not stop.wait(1.0):
            samples.append([round(time.monotonic() - t0, 1), rss()])
    t = threading.Thread(target=sample, daemon=True)
    t.start()
    r = sb.call("run_python", {"code": code, "stdin": flood_s, "timeout_s": float(flood_s) + 20})
    stop.set()
    out = r.result["stdout"].strip().splitlines()[-1] if r.result else r.error
    kept = len(getattr(sb._run.backend._egress, "decisions", ()))
    run_id = sb.run_id
print(json.dumps({"run_id": run_id, "flood": json.loads(out), "samples": samples, "decisions_kept": kept}))
"""


@pytest.fixture(scope="module")
def refusal_flood(engine: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One run whose code floods its egress proxy with refused requests for FLOOD_S seconds (an internal
    network: nothing leaves the machine); the runner's RSS samples and the run's audit records."""
    tmp = tmp_path_factory.mktemp("flood")
    tag = secrets.token_hex(3)
    net = f"toolcage-test-bounds-{tag}"
    engine.create_network(net, internal=True, labels={"toolcage.test": tag})
    pol = tmp / "flood.yaml"
    pol.write_text(
        yaml.safe_dump(
            {
                "name": "flood",
                "network": {"mode": "proxy", "allow": [{"host": "api.allowed.test"}]},
                "timeouts": {"call_s": FLOOD_S + 30, "run_s": FLOOD_S + 90},
            }
        )
    )
    log = tmp / "audit.jsonl"
    try:
        proc = subprocess.run(
            [sys.executable, "-c", FLOOD_RUNNER, str(pol), net, str(log), str(FLOOD_S), REFUSAL_FLOOD],
            capture_output=True,
            text=True,
            cwd=ROOT,
            timeout=FLOOD_S + 120,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        out = json.loads(proc.stdout.strip().splitlines()[-1])
    finally:
        wait_removed(60)
        engine.remove_network(net)
    lines = [ln for ln in log.read_bytes().splitlines(keepends=True) if out["run_id"].encode() in ln]
    out["audit_bytes"] = sum(len(ln) for ln in lines)
    out["records"] = [json.loads(ln) for ln in lines]
    out["log"] = log
    return out


@pytest.mark.runc_only(
    "the runner's RSS under a flood of refused requests: host-side (the proxy and the runner), the "
    "same whatever the sandbox's kernel"
)
def test_runner_memory_stays_flat_under_a_refusal_flood(refusal_flood: dict[str, Any]) -> None:
    """The runner's RSS does not grow with the number of refused requests the sandbox makes: from the
    third second of the flood to its end it grows less than 4 MiB (it grew linearly before, ~0.6 MiB/s)."""
    samples = refusal_flood["samples"]
    assert refusal_flood["flood"]["refused"] > 2000, refusal_flood["flood"]  # the premise: a real flood
    assert len(samples) >= FLOOD_S - 2, samples
    start = next(kib for t, kib in samples if t >= 3)
    grew = max(kib for _, kib in samples) - start
    print(f"runner RSS {start // 1024} MiB -> {max(k for _, k in samples) // 1024} MiB; samples {samples}")
    assert grew < 4 * 1024, f"the runner grew {grew / 1024:.1f} MiB during the flood: {samples}"
    assert refusal_flood["decisions_kept"] <= 256


@pytest.mark.runc_only("the audit log's bytes under a flood of refused requests: host-side, as the runner's RSS")
def test_audit_bytes_per_run_are_bounded_under_a_refusal_flood(refusal_flood: dict[str, Any]) -> None:
    """A flood of refused requests writes the first REFUSALS_RECORDED as records, then counts per
    (reason, target); every refusal is accounted for, and the run's audit bytes stay small."""
    recs = refusal_flood["records"]
    refused = refusal_flood["flood"]["refused"]
    single = [r for r in recs if r["event"] == "egress.decision" and r["allowed"] is False]
    folded = [r for r in recs if r["event"] == "egress.refusals_folded"]
    print(f"{refused} refusals in {FLOOD_S} s: {refusal_flood['audit_bytes']} audit bytes, {len(single)} single")
    from toolcage.lifecycle.records import REFUSALS_RECORDED

    # decisions the proxy could not report (its queue full) are counted as such, never silently gone
    unseen = sum(r["count"] for r in recs if r["event"] == "egress.dropped") + sum(f["proxy_dropped"] for f in folded)
    assert len(single) == REFUSALS_RECORDED
    assert len(folded) >= 2, "counts are written while the flood lasts, not only at the end"
    assert len(single) + sum(f["folded"] for f in folded) + unseen == refused
    assert sum(c["count"] for f in folded for c in f["counts"]) + sum(f["other"] for f in folded) == sum(
        f["folded"] for f in folded
    )
    assert folded[-1]["folded_total"] == sum(f["folded"] for f in folded)
    assert refusal_flood["audit_bytes"] < 200 * 1024, refusal_flood["audit_bytes"]
    assert audit.verify(refusal_flood["log"]) == []
