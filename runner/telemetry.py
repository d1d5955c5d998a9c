"""OpenTelemetry spans and metrics for runs, calls, container starts, egress decisions and pools (``toolcage[otel]``).

The only module that imports ``opentelemetry``, and only once the application has imported it and set a tracer or
meter provider: the library never configures an SDK or an exporter. Until then a call's hooks are a module-level
None check; a run's start (or a container's) also looks for ``opentelemetry`` in ``sys.modules`` and, if it is
there, at its global providers: a provider set later is used from the next run on. What is emitted, and why each
span has the parent it has: docs/telemetry.md.

Threat: attributes are read by the operator's tools. What comes from inside the sandbox (tool names a worker
reports, egress targets, methods and reasons) is escaped to printable ASCII and cut to ATTR_CHARS; a target
keeps only its origin (no path, query or credentials); metric attributes take values from closed sets or
bounded ones (TOOL_NAMES), so a hostile sandbox cannot grow the application's series without bound. No
params, results, file contents, code or secret values are ever attributes.
"""

from __future__ import annotations

import contextlib
import os
import queue
import sys
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import Any, TypeVar
from urllib.parse import urlsplit

from toolcage import __version__
from toolcage.results import CallResult, RunSummary
from toolcage.textsafe import escape

T = TypeVar("T")
ATTR_CHARS = 256  # the longest attribute value taken from inside a sandbox
EGRESS_SPANS = 32  # egress decisions per run recorded as spans; every decision is counted
TOOL_NAMES = 256  # distinct tool names the metrics keep apart (then "other"); spans keep every name
BATCH_S = 0.05  # how long the telemetry thread lets calls' spans gather before it makes them
OPEN_RUNS = 4096  # run spans kept open at once (a run never finished is ended, as "abandoned", past this)
# a refusal's reason, as the metric's closed set (the full reason, escaped, is on the span)
_REASONS = (
    ("network access is disabled", "network_disabled"),
    ("bad URL", "bad_url"),
    ("cannot resolve", "unresolved"),
    ("scheme ", "scheme"),
    ("port ", "port"),
    ("method ", "method"),
    ("allowed by rule", "allowlisted"),
)

_otel: _Otel | None = None  # set once the application has set a provider (or by _install)
_lock = threading.Lock()
_runs: OrderedDict[str, _RunTrace] = OrderedDict()  # run id -> its open span
_pools: weakref.WeakSet[Any] = weakref.WeakSet()  # live pools, for the depth gauge
_tools: dict[str, str] = {}  # a tool's name as called -> as an attribute (the first TOOL_NAMES names)


def safe(value: object, limit: int = ATTR_CHARS) -> str:
    """``value`` as printable ASCII (controls, bidi marks and non-ASCII as visible escapes), at most ``limit``."""
    text = escape(str(value)[:limit]).encode("ascii", "backslashreplace").decode("ascii")
    return text if len(text) <= limit else text[: limit - 3] + "..."


def origin(target: object) -> str:
    """Where a request went, without path, query or credentials: ``https://host:port`` or ``host:port``."""
    text = str(target)[: ATTR_CHARS * 4].strip()
    if "://" not in text:
        text = "//" + text.split()[-1] if text.split() else ""  # CONNECT's "host:port", a method before it
    try:
        parts = urlsplit(text)
        host, port = parts.hostname or "", parts.port
    except ValueError:
        return "invalid"
    where = f"[{host}]" if ":" in host else host
    where += f":{port}" if port is not None else ""
    return safe(f"{parts.scheme}://{where}" if parts.scheme else where)


def reason_class(reason: object) -> str:
    """A decision's reason as one of a closed set (metric attributes): never text the sandbox chose."""
    text = str(reason)
    if text.endswith("is not in the allowlist"):
        return "not_allowlisted"
    if " resolves to " in text or "not an address" in text:
        return "forbidden_address"
    return next((name for prefix, name in _REASONS if text.startswith(prefix)), "other")


def _active() -> _Otel | None:
    """The live instruments, or None: the application imported no OpenTelemetry, or set no provider yet."""
    if _otel is not None or "opentelemetry" not in sys.modules:
        return _otel
    return _probe()


def _probe() -> _Otel | None:
    global _otel
    from opentelemetry import metrics, trace

    traced = not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider | trace.NoOpTracerProvider)
    provider = metrics.get_meter_provider()
    measured = type(provider).__name__ not in ("_ProxyMeterProvider", "NoOpMeterProvider")
    if not (traced or measured):
        return None
    with _lock:
        if _otel is None:
            _otel = _Otel(trace.get_tracer_provider(), provider)
    return _otel


def _install(tracer_provider: Any, meter_provider: Any) -> None:
    """(Tests and benchmarks.) Emit to these providers rather than the global ones."""
    global _otel
    with _lock:
        _otel = _Otel(tracer_provider, meter_provider)


def _drain() -> None:
    """(Tests.) Every call's span made and ended (they are made on the telemetry thread)."""
    if _otel is not None:
        _otel.drain()


def _reset() -> None:
    """(Tests.) Forget the providers and every open run (once the queued calls' spans are made)."""
    global _otel
    _drain()
    with _lock:
        _otel = None
        _runs.clear()
        _tools.clear()


class _RunTrace:
    __slots__ = ("context", "egress_spans", "span")

    def __init__(self, span: Any, context: Any) -> None:
        self.span, self.context, self.egress_spans = span, context, 0


class _Otel:
    """The tracer, the meter and the instruments, made once the application has set a provider."""

    def __init__(self, tracer_provider: Any, meter_provider: Any) -> None:
        from opentelemetry import context, trace
        from opentelemetry.metrics import Observation

        self.trace, self.context, self.observation = trace, context, Observation
        # a call's span and metrics are made off the caller's path (see later): the jobs, how many are not done yet
        self._jobs: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._idle = threading.Condition()
        self._pending = 0
        self._wake = threading.Event()  # set when a job waits: the telemetry thread makes a batch BATCH_S later
        self._worker: tuple[int, threading.Thread] | None = None  # (pid, thread): a forked child starts its own
        self.tracer = tracer_provider.get_tracer("toolcage", __version__)
        meter = meter_provider.get_meter("toolcage", __version__)
        self.runs_started = meter.create_counter("toolcage.runs.started", "{run}", "Runs begun")
        self.runs_finished = meter.create_counter("toolcage.runs.finished", "{run}", "Runs ended, by status")
        # its count by tool and toolcage.call.status is the calls by tool and status (one instrument, not two)
        self.call_duration = meter.create_histogram("gen_ai.execute_tool.duration", "s", "Tool call duration")
        self.starts = meter.create_counter("toolcage.starts", "{container}", "Sandbox containers started")
        self.start_duration = meter.create_histogram("toolcage.start.duration", "s", "Sandbox start duration")
        self.memory_peak = meter.create_histogram("toolcage.run.memory.peak", "By", "A run's peak memory")
        self.egress = meter.create_counter("toolcage.egress.decisions", "{decision}", "Egress decisions")
        meter.create_observable_gauge("toolcage.pool.depth", [self.pool_depth], "{slot}", "Slots waiting ready")

    def pool_depth(self, _options: Any) -> Iterator[Any]:
        for pool in list(_pools):
            with contextlib.suppress(Exception):  # a pool closing meanwhile
                yield self.observation(pool.ready(), {"toolcage.pool.id": pool.id, "toolcage.image": safe(pool.image)})
                for image, ready in pool.images().items():
                    yield self.observation(ready, {"toolcage.pool.id": pool.id, "toolcage.image": safe(image)})

    def run_began(self, run_id: str, options: Any, pooled: bool) -> None:
        kind = str(options.kind)
        span = self.tracer.start_span(
            "toolcage.run",
            kind=self.trace.SpanKind.INTERNAL,
            attributes={
                "toolcage.run_id": run_id, "toolcage.sandbox": kind, "toolcage.pooled": pooled,
                "toolcage.tool": safe(options.tool), "toolcage.image": safe(options.image),
                "toolcage.policy": safe(options.policy.name), "toolcage.network.mode": str(options.policy.network.mode),
            },
        )  # fmt: skip
        self.runs_started.add(1, {"toolcage.sandbox": kind, "toolcage.pooled": pooled})
        with _lock:
            _runs[run_id] = _RunTrace(span, self.trace.set_span_in_context(span))
            old = _runs.popitem(last=False)[1] if len(_runs) > OPEN_RUNS else None
        if old is not None:
            old.span.set_attribute("toolcage.run.status", "abandoned")
            old.span.end()

    def run_finished(self, summary: RunSummary) -> None:
        with _lock:
            run = _runs.pop(summary.run_id, None)
        if run is None:
            return  # begun before the application set a provider, or already ended
        status = str(summary.status)
        self.runs_finished.add(1, {"toolcage.run.status": status})
        if summary.peak_memory_bytes is not None:
            self.memory_peak.record(summary.peak_memory_bytes, {"toolcage.run.status": status})
        span = run.span
        span.set_attribute("toolcage.run.status", status)
        span.set_attribute("toolcage.run.calls", summary.calls)
        for key, value in (("cpu_ms", summary.cpu_ms), ("memory.peak", summary.peak_memory_bytes)):
            if value is not None:
                span.set_attribute(f"toolcage.run.{key}", value)
        if status != "ok":
            span.set_attribute("error.type", status)
            span.set_status(self.trace.StatusCode.ERROR)
        span.end()

    @contextlib.contextmanager
    def phase(self, name: str, run_id: str, count: bool, run: _RunTrace | None = None) -> Iterator[None]:
        """A child span of the run's (``run``: default its open span; none for a pool's slot, whose run does not
        exist yet); a start is counted."""
        run, span, t0 = run or _runs.get(run_id), None, time.monotonic()
        if run is not None:
            with contextlib.suppress(Exception):
                span = self.tracer.start_span(name, run.context, attributes={"toolcage.run_id": run_id})
        failed = None
        try:
            yield
        except BaseException as exc:
            failed = type(exc).__name__
            raise
        finally:
            _guarded(self.phase_ended, span, count and run is None, count, time.monotonic() - t0, failed)

    def phase_ended(self, span: Any, pooled: bool, count: bool, took: float, failed: str | None) -> None:
        if count:
            attrs = {"toolcage.pooled": pooled, **({"error.type": failed} if failed else {})}
            self.starts.add(1, attrs)
            self.start_duration.record(took, attrs)
        if span is not None:
            if failed:
                span.set_attribute("error.type", failed)
                span.set_status(self.trace.StatusCode.ERROR)
            span.end()

    def later(self, job: Callable[[], None]) -> None:
        """Run ``job`` on the telemetry thread, in its next batch. Threat to the caller's time: the SDK takes 30-90 us
        to make a span and record a histogram, 15% of a warm ``ping`` here (more right after a call, when the
        sandbox's own work competes for the cores); queued, a warm call waits 1-2% longer (bench/telemetry.py)."""
        with self._idle:
            self._pending += 1
            if self._worker is None or self._worker[0] != os.getpid():
                thread = threading.Thread(target=self._work, name="toolcage-telemetry", daemon=True)
                self._worker = (os.getpid(), thread)
                thread.start()
        self._jobs.put(job)
        if not self._wake.is_set():
            self._wake.set()

    def _work(self) -> None:
        while True:
            self._wake.wait()
            # the calls of the next BATCH_S come in first, and are made in one go: a span made among the caller's
            # round trips took 2-3x its time in a loop (the caches, a thread woken and the GIL handed over per call).
            # No job is held meanwhile: drain() takes them all from the queue at once
            time.sleep(BATCH_S)
            self._wake.clear()
            with contextlib.suppress(queue.Empty):
                while True:
                    self._done(self._jobs.get_nowait())

    def _done(self, job: Callable[[], None]) -> None:
        _guarded(job)
        with self._idle:
            self._pending -= 1
            if self._pending <= 0:
                self._idle.notify_all()

    def drain(self, timeout: float = 2.0) -> None:
        """Every queued job done (a run's end waits for its calls' spans): the waiting ones here, at once."""
        if not self._pending:
            return
        while True:
            try:
                job = self._jobs.get_nowait()
            except queue.Empty:
                break
            self._done(job)
        with self._idle:
            self._idle.wait_for(lambda: self._pending <= 0, timeout)

    def call_ended(
        self, run: _RunTrace | None, run_id: str, r: CallResult, decisions: list[dict[str, Any]], call_id: object,
        ctx: Any, end: int,
    ) -> None:  # fmt: skip
        """(On the telemetry thread.) ``run``, ``ctx`` and ``end``: the run's span, the caller's context and the
        time, as they were when the call was answered."""
        tool, status = _tools.get(r.tool) or safe(r.tool), str(r.status)
        links = None
        if run is not None:
            if self.trace.get_current_span(ctx).get_span_context().is_valid:
                links = [self.trace.Link(run.span.get_span_context())]  # the caller's child, linked to its run
            else:
                ctx = run.context  # no span of the caller's: the call is the run's child
        attrs: dict[str, Any] = {
            "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": tool, "gen_ai.tool.type": "function",
            "toolcage.run_id": run_id, "toolcage.call.status": status,
        }  # fmt: skip
        if isinstance(call_id, int | str) and not isinstance(call_id, bool):
            attrs["gen_ai.tool.call.id"] = safe(call_id)
        if status != "ok":
            attrs["error.type"] = status
        if r.error is not None and isinstance(r.error.get("code"), int):
            attrs["rpc.jsonrpc.error_code"] = r.error["code"]
        span = self.tracer.start_span(
            f"execute_tool {tool}",
            ctx,
            kind=self.trace.SpanKind.INTERNAL,
            attributes=attrs,
            links=links,
            start_time=end - int(max(r.wall_ms, 0.0) * 1e6),
        )
        if status != "ok":
            span.set_status(self.trace.StatusCode.ERROR)
        for d in decisions:
            self.egress_decision(run_id, "safefetch", d.get("allowed") is True, d, d.get("url"), span)
        span.end(end_time=end)
        labels = {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": _metric_tool(r.tool, tool),
                  "toolcage.call.status": status}  # fmt: skip
        if status != "ok":
            labels["error.type"] = status
        self.call_duration.record(r.wall_ms / 1e3, labels)

    def egress_decision(
        self, run_id: str, source: str, allowed: bool, rec: dict[str, Any], target: object, parent: Any = None
    ) -> None:
        reason = rec.get("reason")
        decision = "allowed" if allowed else "denied"
        why = reason_class(reason)
        self.egress.add(1, {"toolcage.egress.source": source, "toolcage.egress.decision": decision,
                            "toolcage.egress.reason": why})  # fmt: skip
        run = _runs.get(run_id)
        if run is None:
            return
        with _lock:
            if run.egress_spans >= EGRESS_SPANS:
                return  # counted above; spans are bounded per run
            run.egress_spans += 1
        ctx = self.trace.set_span_in_context(parent) if parent is not None else run.context
        attrs = {
            "toolcage.run_id": run_id, "toolcage.egress.source": source, "toolcage.egress.decision": decision,
            "toolcage.egress.reason_class": why, "toolcage.egress.target": origin(target),
        }  # fmt: skip
        if reason is not None:
            attrs["toolcage.egress.reason"] = safe(reason)
        if rec.get("method") is not None:
            attrs["http.request.method"] = safe(rec["method"], 16)
        self.tracer.start_span("toolcage.egress", ctx, attributes=attrs).end()


def _metric_tool(raw: str, tool: str) -> str:
    """The tool's name for a metric: the first TOOL_NAMES distinct names are kept apart, the rest are "other"."""
    if raw not in _tools:
        if len(_tools) >= TOOL_NAMES:
            return "other"
        _tools[raw] = tool
    return tool


# the hooks: each is a None check (and a sys.modules lookup) while no provider is set ----------------------
def _guarded(fn: Callable[..., None], *args: Any) -> None:
    """Telemetry never breaks a run: a failure in it (a provider's bug) is swallowed."""
    with contextlib.suppress(Exception):
        fn(*args)


def run_began(run_id: str, options: Any, *, pooled: bool = False) -> None:
    """Run.begin: the run's span starts, its parent the caller's current span."""
    o = _otel if _otel is not None else _active()
    if o is not None:
        _guarded(o.run_began, run_id, options, pooled)


def run_finished(summary: RunSummary) -> None:
    """Run.finish: the run's span ends with its status, calls, CPU time and peak memory, its calls' spans first."""
    o = _otel
    if o is not None:
        o.drain()
        _guarded(o.run_finished, summary)


def starting(run_id: str) -> contextlib.AbstractContextManager[None]:
    """Around a container's start: a ``toolcage.start`` span under the run's, and the start counted."""
    o = _otel if _otel is not None else _active()
    return o.phase("toolcage.start", run_id, True) if o is not None else contextlib.nullcontext()


def removal(run_id: str, remove: Callable[[], T]) -> Callable[[], T]:
    """A run's removal, done now or scheduled (Sandbox.close): ``remove`` run in a ``toolcage.remove`` span under the
    run's, taken now (a removal in the background may end after the run's span, which ends at ``run.finished``)."""
    o = _otel
    run = _runs.get(run_id) if o is not None else None
    if o is None or run is None:
        return remove

    def traced() -> T:
        with o.phase("toolcage.remove", run_id, False, run):
            return remove()

    return traced


def call_ended(
    run_id: str, r: CallResult, decisions: Callable[[CallResult], list[dict[str, Any]]], call_id: object = None
) -> None:
    """A call answered (``decisions``: how to read its SafeFetch decisions): its ``execute_tool`` span and metrics.
    Only a None check while off: a provider set later is found at the next run's start (``run_began``)."""
    o = _otel
    if o is not None:
        run, ctx, end = _runs.get(run_id), o.context.get_current(), time.time_ns()
        o.later(lambda: o.call_ended(run, run_id, r, decisions(r), call_id, ctx, end))


def egress_decisions(run_id: str, inner: Callable[[dict[str, Any]], None] | None) -> Callable[[dict[str, Any]], None]:
    """The egress proxy's decision callback (``inner``: the audit's, called first), each decision counted too."""

    def record(rec: dict[str, Any]) -> None:
        if inner is not None:
            inner(rec)
        o = _otel
        event = rec.get("event")
        if o is not None and event in ("egress.allowed", "egress.denied"):
            _guarded(o.egress_decision, run_id, "proxy", event == "egress.allowed", rec, rec.get("target"))

    return record


def watch_pool(pool: Any) -> None:
    """A pool (``ready()``, ``images()``, ``id``, ``image``) for the depth gauge, held weakly."""
    _pools.add(pool)


def unwatch_pool(pool: Any) -> None:
    """A pool that closed: the gauge forgets it at once (not when the garbage collector gets to it)."""
    _pools.discard(pool)


__all__ = [
    "call_ended", "egress_decisions", "origin", "reason_class", "removal", "run_began", "run_finished", "safe",
    "starting", "unwatch_pool", "watch_pool",
]  # fmt: skip
