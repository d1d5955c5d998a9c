"""toolcage.run: one place builds a run's RunSpec and its run.started/run.finished records, for every door."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

from toolcage.options import RunOptions
from toolcage.policies import load_policy
from toolcage.run import Run


class _Audit:
    def __init__(self) -> None:
        self.records: list[tuple[str, str, dict[str, Any]]] = []

    def event(self, event: str, /, **fields: Any) -> None:
        self.records.append(("now", event, fields))

    def event_later(self, event: str, /, **fields: Any) -> None:
        self.records.append(("later", event, fields))


def _options(audit: Any, tool: str = "session") -> RunOptions:
    return RunOptions(policy=load_policy("default"), kind="container", image="img:1", tool=tool, audit=audit)


def test_the_spec_is_the_runs() -> None:
    """The RunSpec carries the run's id, tool label, image, policy and deadline; a door adds only its own fields."""
    run = Run(_options(None, tool="mcp-wrap"))
    spec = run.spec(123.0, entrypoint=("x",))
    assert (spec.run_id, spec.tool, spec.image, spec.policy_name, spec.deadline) == (
        run.run_id,
        "mcp-wrap",
        "img:1",
        "default",
        123.0,
    )
    assert spec.entrypoint == ("x",) and run.name.endswith(run.run_id) and "mcp-wrap" in run.name


def test_every_door_records_the_same_fields() -> None:
    """run.started and run.finished have one field set; a door's extras come on top (pooled: queued, not fsynced)."""
    audit = _Audit()
    plain, pooled = Run(_options(audit)), Run(_options(audit), "abcd1234", pool="p1")
    plain.audit_started("sha256:x")
    pooled.audit_started("sha256:x", later=True, pool="p1")
    plain.audit_finished("ok", "cid", 1.0, 2)
    pooled.audit_finished("oom_killed", "cid", 1.0, 2, cpu_ms=3.0, later=True)
    (w1, s1, a), (w2, s2, b), (w3, f1, c), (w4, f2, d) = audit.records
    assert (w1, w2, w3, w4) == ("now", "later", "now", "later") and {s1, s2} == {"run.started"}
    assert set(b) - set(a) == {"pool"} and set(a) <= set(b) and b["run_id"] == "abcd1234"
    assert {"kind", "policy", "policy_sha256", "workspace", "image_id", "owner", "network"} <= set(a)
    assert {f1, f2} == {"run.finished"} and set(c) == set(d) and d["oom_killed"] and not c["oom_killed"]


def test_sandbox_and_pool_do_not_import_each_other() -> None:
    """Importing the Sandbox does not load the pool (the pool imports Sandbox only to make one): no cycle."""
    code = "import sys, toolcage.sandbox; assert 'toolcage.pool' not in sys.modules"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True).returncode == 0


def test_the_first_reason_a_run_ended_wins() -> None:
    """end() kills the backend and records the first reason; later reasons (an interrupt) do not replace it;
    an answer that timed out past the deadline is the run's deadline, before it a hung call."""
    from toolcage.errors import SandboxInterrupted, SandboxTimeout
    from toolcage.rpc.session import Ended

    class _Backend:
        container_id = None
        sandbox_user = True
        kills = 0

        def kill(self) -> None:
            self.kills += 1

    early, late = Run(_options(None)), Run(_options(None))
    for run in (early, late):
        run.backend = _Backend()  # type: ignore[assignment]
        run.start_clock()
    assert "call timeout" in early.explain_end(Ended("timeout")).message
    assert isinstance(early.interrupt(), SandboxTimeout) and early.backend.kills == 2  # type: ignore[attr-defined]
    late.deadline = 0.0
    assert isinstance(late.explain_end(Ended("timeout")), SandboxTimeout)
    late.interrupt()
    assert isinstance(late.dead, SandboxTimeout) and not isinstance(late.dead, SandboxInterrupted)
    assert "deadline" in late.dead.message and late.dead.details["run_id"] == late.run_id


class _Backend:
    """A backend that records what the run asked of it, in order."""

    sandbox_user = True
    container_id = "cid"

    def __init__(self, audit: _Audit) -> None:
        self.audit, self.steps = audit, []

    def image_id(self) -> str:
        return "sha256:x"

    def complete(self, spec: Any) -> Any:
        return spec

    def start(self, spec: Any, parser: Any) -> str:
        self.steps.append(("start", len(self.audit.records)))  # how many records were written before it
        return "transport"


def test_begin_and_finish_are_one_order_for_every_door() -> None:
    """begin: run.started on disk before the container starts, then run.started logged; finish: run.finished
    with the summary's figures; an adopted run's records are queued; both leave the live set as they found it."""
    from toolcage import run as run_mod

    audit = _Audit()
    cold = Run(_options(audit))
    backend = cold.backend = _Backend(audit)  # type: ignore[assignment]
    closed: list[str] = []
    assert cold.begin("parser", closer=lambda: closed.append("x"), command=["srv"]) == "transport"  # type: ignore[arg-type]
    assert backend.steps == [("start", 1)] and audit.records[0][:2] == ("now", "run.started")
    assert audit.records[0][2]["command"] == ["srv"] and cold in run_mod._LIVE and cold.started > 0
    summary = cold.finish("ok", 3, {"cpu_ms": 5.0})
    assert cold not in run_mod._LIVE and not closed
    assert (summary.status, summary.calls, summary.cpu_ms) == ("ok", 3, 5.0)
    kind, event, fields = audit.records[-1]
    assert (kind, event, fields["calls"], fields["cpu_ms"], fields["duration_ms"]) == (
        "now", "run.finished", 3, 5.0, summary.wall_ms,
    )  # fmt: skip

    pooled_audit = _Audit()
    pooled = Run(_options(pooled_audit)).adopt(_options(pooled_audit))
    pooled.backend = _Backend(pooled_audit)  # type: ignore[assignment]
    assert pooled.begin(None, image_id="sha256:slot", pool="p1") is None
    pooled.finish("timeout", 0)
    assert [(k, e) for k, e, _ in pooled_audit.records] == [("later", "run.started"), ("later", "run.finished")]
    assert pooled_audit.records[0][2]["image_id"] == "sha256:slot" and pooled_audit.records[0][2]["pool"] == "p1"


def test_a_run_never_begun_finishes_without_an_audit_record() -> None:
    """A run closed before it began (a pooled Sandbox never started) logs run.finished, audits nothing."""
    audit = _Audit()
    summary = Run(_options(audit)).finish("ok", 0)
    assert summary.wall_ms == 0.0 and audit.records == []
