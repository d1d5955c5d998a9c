"""toolcage.telemetry with the OpenTelemetry SDK's in-memory exporters (no Docker): spans, metrics, bounds, escaping,
and nothing imported or emitted until the application sets a provider."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.metrics import MeterProvider

from tests.otel_capture import Otel, installed
from toolcage import telemetry
from toolcage.results import CallResult, RunSummary

HOSTILE = "\x1b[2K\r\u202eevil\x9b31m\u2028" + "x" * 10_000
OPTIONS = SimpleNamespace(
    kind="container", tool="demo", image="toolcage-worker:test",
    policy=SimpleNamespace(name="default", network=SimpleNamespace(mode="proxy")),
)  # fmt: skip


@pytest.fixture
def otel() -> Iterator[Otel]:
    yield from installed()


def _call(tool: str = "run_python", status: str = "ok", wall_ms: float = 12.5, **kw: Any) -> CallResult:
    return CallResult(status, tool, "r1", wall_ms=wall_ms, **kw)


def _summary(status: str = "ok", calls: int = 1) -> RunSummary:
    return RunSummary("r1", "toolcage-demo-r1", status, 100.0, 5.0, 64 << 20, calls)


def _none(_r: CallResult) -> list[dict[str, Any]]:
    return []


def _run_in_a_fresh_interpreter(code: str) -> str:
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout.strip()


def test_import_toolcage_imports_no_opentelemetry() -> None:
    """``import toolcage`` and its run, sandbox, pool and telemetry modules import no opentelemetry, and the hooks,
    called while the application has not imported it, import nothing either."""
    out = _run_in_a_fresh_interpreter(
        "import sys, types, toolcage, toolcage.sandbox, toolcage.pool, toolcage.telemetry as t\n"
        "from toolcage.results import CallResult, RunSummary\n"
        "o = types.SimpleNamespace(kind='container', tool='x', image='i', policy=types.SimpleNamespace(name='p',"
        " network=types.SimpleNamespace(mode='none')))\n"
        "t.run_began('r', o)\n"
        "with t.starting('r'): pass\n"
        "t.call_ended('r', CallResult('ok', 'ping', 'r'), lambda r: [])\n"
        "t.egress_decisions('r', None)({'event': 'egress.denied', 'target': 'x'})\n"
        "t.run_finished(RunSummary('r', 'n', 'ok', 1.0, None, None, 1))\n"
        "print(sorted(m for m in sys.modules if m.startswith('opentelemetry')), t._otel)\n"
    )
    assert out == "[] None"


def test_an_api_without_a_provider_emits_nothing() -> None:
    """opentelemetry imported (by another library) but no provider set: the hooks stay off, and turn on once the
    application sets one (the global tracer provider, looked at when the next run begins)."""
    out = _run_in_a_fresh_interpreter(
        "import types, opentelemetry.trace, opentelemetry.metrics\n"
        "import toolcage.telemetry as t\n"
        "from toolcage.results import CallResult\n"
        "o = types.SimpleNamespace(kind='container', tool='x', image='i', policy=types.SimpleNamespace(name='p',"
        " network=types.SimpleNamespace(mode='none')))\n"
        "t.run_began('r', o)\n"
        "t.call_ended('r', CallResult('ok', 'ping', 'r'), lambda r: [])\n"
        "print(t._otel)\n"
        "from opentelemetry.sdk.trace import TracerProvider\n"
        "from opentelemetry.sdk.trace.export import SimpleSpanProcessor\n"
        "from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter\n"
        "spans = InMemorySpanExporter(); p = TracerProvider(); p.add_span_processor(SimpleSpanProcessor(spans))\n"
        "opentelemetry.trace.set_tracer_provider(p)\n"
        "t.call_ended('r', CallResult('ok', 'ping', 'r'), lambda r: [])\n"
        "t.run_began('r2', o)\n"
        "t.call_ended('r2', CallResult('ok', 'ping', 'r2'), lambda r: [])\n"
        "t._drain()\n"
        "print([s.name for s in spans.get_finished_spans()])\n"
    )
    assert out.splitlines() == ["None", "['execute_tool ping']"]


def test_a_run_is_a_span_under_the_callers_with_its_start(otel: Otel) -> None:
    """The run span's parent is the caller's span at begin; the container start is its child; it ends with the
    run's status, calls, CPU time and peak memory; runs, starts and memory are measured."""
    with otel.tracer.start_as_current_span("agent") as agent:
        telemetry.run_began("r1", OPTIONS)
        with telemetry.starting("r1"):
            pass
    telemetry.run_finished(_summary())
    (run,) = otel.finished("toolcage.run")
    (start,) = otel.finished("toolcage.start")
    assert run.parent is not None and run.parent.span_id == agent.get_span_context().span_id
    assert start.parent is not None and start.parent.span_id == run.context.span_id
    assert run.kind == trace.SpanKind.INTERNAL
    assert run.attributes is not None
    assert run.attributes["toolcage.run_id"] == "r1" and run.attributes["toolcage.sandbox"] == "container"
    assert run.attributes["toolcage.run.status"] == "ok" and run.attributes["toolcage.run.calls"] == 1
    assert run.attributes["toolcage.run.memory.peak"] == 64 << 20
    assert [p.value for p in otel.points("toolcage.runs.started")] == [1]
    assert [(p.value, p.attributes["toolcage.run.status"]) for p in otel.points("toolcage.runs.finished")] == [
        (1, "ok")
    ]
    assert [(p.value, p.attributes["toolcage.pooled"]) for p in otel.points("toolcage.starts")] == [(1, False)]
    assert [p.count for p in otel.points("toolcage.start.duration")] == [1]
    assert [p.sum for p in otel.points("toolcage.run.memory.peak")] == [64 << 20]


def test_a_removal_is_a_child_of_the_run_even_when_it_ends_later(otel: Otel) -> None:
    """A removal wrapped while the run is open is a ``toolcage.remove`` child of the run span, even when it runs
    after the run's span ended (in the background); with no open run it is the function itself."""
    telemetry.run_began("r1", OPTIONS)
    later = telemetry.removal("r1", lambda: "removed")
    telemetry.run_finished(_summary())
    assert later() == "removed"
    (run,) = otel.finished("toolcage.run")
    (remove,) = otel.finished("toolcage.remove")
    assert remove.parent is not None and remove.parent.span_id == run.context.span_id

    def gone() -> None:
        return None

    assert telemetry.removal("r1", gone) is gone


def test_a_pools_start_is_counted_without_a_span(otel: Otel) -> None:
    """A pool's slot starting before any run adopts it: counted as pooled, no span (its run does not exist yet)."""
    with telemetry.starting("slot1"):
        pass
    assert otel.finished() == []
    assert [(p.value, p.attributes["toolcage.pooled"]) for p in otel.points("toolcage.starts")] == [(1, True)]


def test_a_failed_run_and_start_are_errors(otel: Otel) -> None:
    """A start that raises and a run that ends badly carry error.type and an error status."""
    telemetry.run_began("r1", OPTIONS)
    with pytest.raises(RuntimeError), telemetry.starting("r1"):
        raise RuntimeError("engine gone")
    telemetry.run_finished(_summary("crashed", 0))
    (start,) = otel.finished("toolcage.start")
    (run,) = otel.finished("toolcage.run")
    assert start.attributes is not None and start.attributes["error.type"] == "RuntimeError"
    assert run.attributes is not None and run.attributes["error.type"] == "crashed"
    assert run.status.status_code == trace.StatusCode.ERROR


def test_call_spans_follow_the_genai_conventions(otel: Otel) -> None:
    """A call is ``execute_tool {tool}`` with the GenAI attributes and its own duration; with no span of the
    caller's its parent is the run span; gen_ai.execute_tool.duration is measured, by tool and status (its count is
    the calls by tool and status)."""
    telemetry.run_began("r1", OPTIONS)
    telemetry.call_ended("r1", _call(wall_ms=250.0), _none, 7)
    telemetry.run_finished(_summary())
    (call,) = otel.finished("execute_tool run_python")
    (run,) = otel.finished("toolcage.run")
    assert call.attributes == {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": "run_python",
        "gen_ai.tool.type": "function",
        "gen_ai.tool.call.id": "7",
        "toolcage.run_id": "r1",
        "toolcage.call.status": "ok",
    }
    assert call.parent is not None and call.parent.span_id == run.context.span_id
    assert call.start_time is not None and call.end_time is not None
    assert abs((call.end_time - call.start_time) - 250_000_000) < 1_000
    (duration,) = otel.points("gen_ai.execute_tool.duration")
    assert duration.count == 1 and duration.sum == pytest.approx(0.25)
    assert duration.attributes == {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": "run_python",
        "toolcage.call.status": "ok",
    }


def test_a_call_under_the_callers_span_links_the_run(otel: Otel) -> None:
    """A call made inside the caller's span is that span's child, with a link to the run span."""
    telemetry.run_began("r1", OPTIONS)
    with otel.tracer.start_as_current_span("agent tool") as caller:
        telemetry.call_ended("r1", _call(), _none)
    telemetry.run_finished(_summary())
    (call,) = otel.finished("execute_tool run_python")
    (run,) = otel.finished("toolcage.run")
    assert call.parent is not None and call.parent.span_id == caller.get_span_context().span_id
    assert [link.context.span_id for link in call.links] == [run.context.span_id]
    assert call.attributes is not None and "gen_ai.tool.call.id" not in call.attributes


def test_a_failed_call_has_its_error_type(otel: Otel) -> None:
    """A call that did not succeed: error.type is its status, the JSON-RPC code an attribute, the span an error;
    the error's message (text from the sandbox) is not."""
    error = {"code": -32001, "message": "secret-ish message " + HOSTILE}
    telemetry.call_ended("r1", _call(status="timeout", error=error), _none)
    (call,) = otel.finished()
    assert call.attributes is not None
    assert call.attributes["error.type"] == "timeout" and call.attributes["rpc.jsonrpc.error_code"] == -32001
    assert call.status.status_code == trace.StatusCode.ERROR
    assert not any("secret-ish" in str(v) for v in call.attributes.values())
    (duration,) = otel.points("gen_ai.execute_tool.duration")
    assert duration.attributes["error.type"] == "timeout"


def test_no_params_results_or_secrets_in_attributes(otel: Otel) -> None:
    """A call's result and its worker-reported meta (secret names, origins) are never attributes."""
    result = {"stdout": "SECRET_VALUE_123", "files": {"a.txt": "contents"}}
    meta = {"secrets_sent": [{"secret": "TOKEN", "origin": "https://api.example"}]}
    telemetry.call_ended("r1", _call(result=result, meta=meta), _none)
    values = " ".join(str(v) for s in otel.finished() for v in (s.attributes or {}).values())
    assert "SECRET_VALUE_123" not in values and "contents" not in values and "TOKEN" not in values


def test_hostile_tool_names_are_escaped_bounded_and_not_a_series_each(otel: Otel) -> None:
    """A tool name with terminal controls, bidi marks and 10,000 characters becomes printable ASCII of at most 256
    characters; past TOOL_NAMES distinct names, the metrics say "other"."""
    telemetry.call_ended("r1", _call(tool=HOSTILE), _none)
    (call,) = otel.finished()
    name = call.attributes["gen_ai.tool.name"] if call.attributes else ""
    assert isinstance(name, str) and len(name) <= telemetry.ATTR_CHARS and len(call.name) <= 13 + 256
    assert all(0x20 <= ord(c) < 0x7F for c in name + call.name), name[:80]
    assert name.startswith("\\x1b[2K\\x0d\\u202eevil\\x9b31m\\u2028xxx")
    for i in range(telemetry.TOOL_NAMES + 50):
        telemetry.call_ended("r1", _call(tool=f"t{i}"), _none)
    names = {p.attributes["gen_ai.tool.name"] for p in otel.points("gen_ai.execute_tool.duration")}
    assert len(names) == telemetry.TOOL_NAMES + 1 and "other" in names


@pytest.mark.parametrize(
    ("target", "origin"),
    [
        ("https://user:pass@api.example.com/v1/keys?token=abc", "https://api.example.com"),
        ("http://10.0.0.1:8080/latest/meta-data/", "http://10.0.0.1:8080"),
        ("CONNECT pypi.org:443", "pypi.org:443"),
        ("pypi.org:443", "pypi.org:443"),
        ("http://[::1]:99/x", "http://[::1]:99"),
        ("http://h\u202eost\x1b]0;x\x07/", "invalid"),
        ("https://h\u202eost/", "https://h\\u202eost"),
        ("http://bad:port/", "invalid"),
    ],
)
def test_egress_targets_keep_their_origin_only(target: str, origin: str) -> None:
    """An egress target's attribute is its origin: no path, query or credentials, printable ASCII."""
    assert telemetry.origin(target) == origin


def test_egress_decisions_are_counted_and_bounded_spans(otel: Otel) -> None:
    """Every proxy decision is counted by decision and reason class; at most EGRESS_SPANS per run become spans, each
    a child of the run's, escaped and bounded; the audit's callback is called first, with the record unchanged."""
    seen: list[dict[str, Any]] = []
    record = telemetry.egress_decisions("r1", seen.append)
    telemetry.run_began("r1", OPTIONS)
    denied = {
        "event": "egress.denied",
        "target": "http://" + "h" * 300 + ".example/p?q=1",
        "method": "GET\x1b[2K",
        "reason": "host " + HOSTILE + " is not in the allowlist",
    }
    for _ in range(100):
        record(denied)
    record({"event": "egress.allowed", "target": "https://pypi.org/simple/", "reason": "allowed by rule pypi"})
    record({"event": "egress.dropped", "count": 3})  # not a decision: the audit's alone
    telemetry.run_finished(_summary())
    assert len(seen) == 102 and seen[0] is denied
    spans = otel.finished("toolcage.egress")
    (run,) = otel.finished("toolcage.run")
    assert len(spans) == telemetry.EGRESS_SPANS
    assert all(s.parent is not None and s.parent.span_id == run.context.span_id for s in spans)
    attrs = spans[0].attributes or {}
    assert attrs["toolcage.egress.decision"] == "denied" and attrs["toolcage.egress.reason_class"] == "not_allowlisted"
    assert all(isinstance(v, str | bool) and len(str(v)) <= 256 for v in attrs.values())
    assert all(str(v).isascii() and "\x1b" not in str(v) for v in attrs.values())
    assert "?" not in str(attrs["toolcage.egress.target"]) and attrs["http.request.method"] == "GET\\x1b[2K"
    counts = {
        (p.attributes["toolcage.egress.decision"], p.attributes["toolcage.egress.reason"]): p.value
        for p in otel.points("toolcage.egress.decisions")
    }
    assert counts == {("denied", "not_allowlisted"): 100, ("allowed", "allowlisted"): 1}


def test_safefetch_decisions_are_children_of_their_call(otel: Otel) -> None:
    """SafeFetch decisions a call reports are counted (source safefetch) and become spans under its call span."""
    decisions = [{"allowed": False, "url": "http://169.254.169.254/latest", "reason": "x resolves to y, which is z"}]
    telemetry.run_began("r1", OPTIONS)
    telemetry.call_ended("r1", _call(tool="http_fetch", status="error"), lambda r: decisions)
    (call,) = otel.finished("execute_tool http_fetch")
    (egress,) = otel.finished("toolcage.egress")
    assert egress.parent is not None and egress.parent.span_id == call.context.span_id
    (point,) = otel.points("toolcage.egress.decisions")
    assert point.attributes == {
        "toolcage.egress.source": "safefetch",
        "toolcage.egress.decision": "denied",
        "toolcage.egress.reason": "forbidden_address",
    }


@pytest.mark.parametrize(
    ("reason", "cls"),
    [
        ("network access is disabled by the policy (network.mode: none)", "network_disabled"),
        ("host evil.example is not in the allowlist", "not_allowlisted"),
        ("metadata.internal resolves to 169.254.169.254, which is link-local", "forbidden_address"),
        ("port 22 is not allowed for https://h (allowed: 443)", "port"),
        ("cannot resolve nowhere.example: no addresses", "unresolved"),
        (HOSTILE, "other"),
        (None, "other"),
    ],
)
def test_reasons_fall_into_a_closed_set(reason: object, cls: str) -> None:
    """A decision's reason, for a metric, is one of a closed set whatever text the sandbox put in it."""
    assert telemetry.reason_class(reason) == cls


def test_pool_depth_is_an_observable_gauge_over_live_pools(otel: Otel) -> None:
    """The depth gauge reports each live pool's ready slots (and its images'), and forgets a pool once it is gone."""

    class FakePool:
        id, image = "p1", "toolcage-worker:test"

        def ready(self) -> int:
            return 2

        def images(self) -> dict[str, int]:
            return {"python:3.12\u202e": 1}

    def mine() -> set[tuple[str, int]]:  # another test's pool may still be alive (a cycle not yet collected)
        points = otel.points("toolcage.pool.depth")
        return {(p.attributes["toolcage.image"], p.value) for p in points if p.attributes["toolcage.pool.id"] == "p1"}

    pool = FakePool()
    telemetry.watch_pool(pool)
    assert mine() == {("toolcage-worker:test", 2), ("python:3.12\\u202e", 1)}
    del pool
    assert mine() == set()
    closed = FakePool()
    telemetry.watch_pool(closed)
    telemetry.unwatch_pool(closed)  # what Pool.close does
    assert mine() == set()


def test_a_broken_provider_never_breaks_a_run() -> None:
    """A tracer that raises: every hook returns normally (telemetry is never why a run fails)."""

    class Broken:
        def get_tracer(self, *a: Any, **k: Any) -> Any:
            return self

        def get_meter(self, *a: Any, **k: Any) -> Any:
            return MeterProvider().get_meter("x")

        def start_span(self, *a: Any, **k: Any) -> Any:
            raise RuntimeError("exporter bug")

    telemetry._install(Broken(), MeterProvider())
    try:
        telemetry.run_began("r1", OPTIONS)
        with telemetry.starting("r1"):
            pass
        assert telemetry.removal("r1", lambda: 5)() == 5
        telemetry.call_ended("r1", _call(), _none)
        telemetry.egress_decisions("r1", None)({"event": "egress.denied", "target": "x"})
        telemetry.run_finished(_summary())
    finally:
        telemetry._reset()


def test_call_spans_are_made_off_the_callers_thread_and_a_run_waits_for_them(otel: Otel) -> None:
    """A call's span is made on the telemetry thread, with the caller's context and the answer's time taken at the
    call; the run's end waits for every queued one, so its calls' spans are ended when it is."""
    import threading

    threads: set[str] = set()
    real = telemetry._Otel.call_ended

    def spy(self: Any, *args: Any) -> None:
        threads.add(threading.current_thread().name)
        real(self, *args)

    telemetry.run_began("r1", OPTIONS)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(telemetry._Otel, "call_ended", spy)
        with otel.tracer.start_as_current_span("agent") as agent:
            for _ in range(100):
                telemetry.call_ended("r1", _call(), _none)
        until = time.monotonic() + 10
        while telemetry._otel is not None and telemetry._otel._pending and time.monotonic() < until:
            time.sleep(0.01)  # the caller waits (for its next answer): the telemetry thread makes the spans
        assert threads == {"toolcage-telemetry"}
        for _ in range(100):
            telemetry.call_ended("r1", _call(), _none)
        telemetry.run_finished(_summary(calls=200))
        calls = [s for s in otel.spans.get_finished_spans() if s.name == "execute_tool run_python"]
    assert len(calls) == 200
    (run,) = otel.finished("toolcage.run")
    parents = [s.parent.span_id for s in calls if s.parent]
    assert parents.count(agent.get_span_context().span_id) == 100 and parents.count(run.context.span_id) == 100
