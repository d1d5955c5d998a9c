"""The OpenTelemetry SDK's in-memory exporter and reader, installed as toolcage's providers for one test (each
file's ``otel`` fixture yields from :func:`installed`): the spans and metric points a test reads, the calls' spans
made first (they are made on toolcage's telemetry thread). Shared by tests/unit/test_telemetry.py and
tests/integration/test_telemetry.py."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from toolcage import telemetry


class Otel:
    def __init__(self) -> None:
        self.spans = InMemorySpanExporter()
        self.tracer_provider = TracerProvider()
        self.tracer_provider.add_span_processor(SimpleSpanProcessor(self.spans))
        self.reader = InMemoryMetricReader()
        self.meter_provider = MeterProvider(metric_readers=[self.reader])
        self.tracer = self.tracer_provider.get_tracer("test")

    def finished(self, name: str | None = None) -> list[ReadableSpan]:
        telemetry._drain()  # a call's span is made on the telemetry thread
        return [s for s in self.spans.get_finished_spans() if name is None or s.name == name]

    def points(self, name: str) -> list[Any]:
        telemetry._drain()
        data = self.reader.get_metrics_data()
        if data is None:  # nothing measured since the last read
            return []
        return [
            p
            for rm in data.resource_metrics
            for sm in rm.scope_metrics
            for m in sm.metrics
            if m.name == name
            for p in m.data.data_points
        ]


def installed() -> Iterator[Otel]:
    """An ``otel`` fixture's body: ``yield from installed()``."""
    o = Otel()
    telemetry._install(o.tracer_provider, o.meter_provider)
    try:
        yield o
    finally:
        telemetry._reset()
