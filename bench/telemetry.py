"""A warm call with OpenTelemetry tracing on against off, in the same run on one sandbox (issue 39: <= 5% more).

    python -m bench.telemetry [--calls 200] [--rounds 6] [--no-metrics] [--image IMAGE] [--sandbox gvisor] [--json PATH]

One open sandbox, started with telemetry on (so its run span exists). Then, interleaved ``--rounds`` times, a
block of ``--calls`` warm calls with
telemetry off (no provider: the hooks' None check) and a block with it on (the SDK's TracerProvider with a
SimpleSpanProcessor into an exporter that drops the spans, and a MeterProvider with an in-memory reader: each
call makes its ``execute_tool`` span and its metric points, only the export is left out), for ``ping`` and for
``run_python`` ``pass`` (which starts a child). Each call is timed on the host around ``Sandbox.call``. Printed as
JSON: p50 and mean of each in ms and the ratios on/off, and the ratio of whole blocks, an on block timed until its
spans are made (the telemetry thread makes them in batches, off the calls' path: a call's own time would miss
that work). A figure, not a test.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Sequence
from typing import Any

from opentelemetry.metrics import NoOpMeterProvider
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

from toolcage import Sandbox, telemetry

GOAL = 1.05
CALLS = {"ping": ("ping", None), "run_python_pass": ("run_python", {"code": "pass"})}


class Drop(SpanExporter):
    """Takes every span and keeps none: the cost of making and ending spans, not of shipping them."""

    def __init__(self) -> None:
        self.spans = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.spans += len(spans)
        return SpanExportResult.SUCCESS


def _block(sb: Sandbox, tool: str, params: Any, n: int) -> list[float]:
    out = []
    for _ in range(n):
        t = time.perf_counter()
        r = sb.call(tool, params)
        out.append((time.perf_counter() - t) * 1000)
        if not r.ok:
            raise SystemExit(f"{tool} failed: {r.error}")
    return out


def _stats(ms: list[float]) -> dict[str, float]:
    return {"p50": round(statistics.median(ms), 4), "mean": round(statistics.fmean(ms), 4)}


def measure(
    calls: int = 200, rounds: int = 6, image: str | None = None, sandbox: str | None = None, metrics: bool = True
) -> dict[str, Any]:
    drop = Drop()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(drop))
    meter_provider = MeterProvider(metric_readers=[InMemoryMetricReader()]) if metrics else NoOpMeterProvider()
    telemetry._install(tracer_provider, meter_provider)
    on = telemetry._otel
    times: dict[str, dict[str, list[float]]] = {name: {"off": [], "on": []} for name in CALLS}
    blocks: dict[str, dict[str, float]] = {name: {"off": 0.0, "on": 0.0} for name in CALLS}
    try:
        with Sandbox(image=image, sandbox=sandbox) as sb:
            for tool, params in CALLS.values():
                _block(sb, tool, params, 100)  # warm: the zygote, the caches
            for i in range(rounds):
                for name, (tool, params) in CALLS.items():
                    # alternate which goes first, so neither always follows the other
                    for state in ("off", "on") if i % 2 == 0 else ("on", "off"):
                        telemetry._otel = on if state == "on" else None  # the run's span stays open meanwhile
                        t = time.perf_counter()
                        times[name][state] += _block(sb, tool, params, calls)
                        if state == "on":
                            telemetry._drain()  # the block's spans made before the next block: counted in this one
                        blocks[name][state] += (time.perf_counter() - t) * 1000
            telemetry._otel = on
    finally:
        telemetry._reset()
        tracer_provider.shutdown()
    out: dict[str, Any] = {"calls_per_block": calls, "rounds": rounds, "metrics": metrics, "spans_made": drop.spans}
    for name, by in times.items():
        off, on_ = _stats(by["off"]), _stats(by["on"])
        out[name] = {
            "off_ms": off,
            "on_ms": on_,
            "ratio_p50": round(on_["p50"] / off["p50"], 3),
            "ratio_mean": round(on_["mean"] / off["mean"], 3),
            "added_us_p50": round((on_["p50"] - off["p50"]) * 1000, 1),
            # whole blocks, the on blocks' spans made by their end: the cost wherever the telemetry thread paid it
            "ratio_blocks": round(blocks[name]["on"] / blocks[name]["off"], 3),
            "added_us_per_call_blocks": round((blocks[name]["on"] - blocks[name]["off"]) * 1000 / len(by["on"]), 1),
        }
    out["goal"] = GOAL
    out["meets_goal"] = all(max(out[name]["ratio_p50"], out[name]["ratio_blocks"]) <= GOAL for name in CALLS)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.telemetry", description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--image", default=None, help="worker image (default $TOOLCAGE_IMAGE, else the release tag)")
    ap.add_argument("--sandbox", default=None, help="sandbox kind, e.g. gvisor")
    ap.add_argument("--no-metrics", action="store_true", help="spans only (a no-op meter provider)")
    ap.add_argument("--json", default=None, help="also write the result here")
    args = ap.parse_args(argv)
    out = measure(args.calls, args.rounds, args.image, args.sandbox, metrics=not args.no_metrics)
    text = json.dumps(out, indent=2)
    print(text)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
