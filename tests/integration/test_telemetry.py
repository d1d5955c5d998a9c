"""OpenTelemetry on the real engine: a run under the caller's span is one trace (run, start, calls, egress decisions),
its metrics add up, what the sandbox chose is escaped, and the spans reach an OTLP/HTTP receiver on 127.0.0.1."""

from __future__ import annotations

import http.server
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from tests.otel_capture import Otel, installed
from toolcage import Sandbox, telemetry, wait_removed

pytestmark = [
    pytest.mark.usefixtures("no_leaks"),
    pytest.mark.runc_only("spans and metrics are made in the runner, alike whatever kernel the sandbox has"),
]

DENIED = 40  # more than telemetry.EGRESS_SPANS
HOSTILE_TOOL = "evil\x1b]0;owned\x07\u202etool"
# raw requests to the egress proxy, each refused (nothing is allowed but a name that does not exist): the targets
# carry a path and a query with a token, and one a host name with a terminal escape
RAW = f"""
import os, socket
h, p = os.environ["TOOLCAGE_PROXY"].split(":")
def ask(line):
    s = socket.create_connection((h, int(p)), timeout=5)
    s.sendall(line)
    s.recv(4096)
    s.close()
for i in range({DENIED - 1}):
    host = b"denied-%d.test:8080" % i
    ask(b"GET http://" + host + b"/path?token=SECRET123 HTTP/1.1\\r\\nHost: " + host + b"\\r\\n\\r\\n")
ask(b"GET http://evil\\x1b[2K.test/ HTTP/1.1\\r\\nHost: evil\\x1b[2K.test\\r\\n\\r\\n")
print("asked")
"""


@pytest.fixture
def proxy_policy(tmp_path: Path) -> Path:
    p = tmp_path / "telemetry.yaml"
    network = {"mode": "proxy", "allow": [{"host": "nothing.invalid", "schemes": ["http"], "ports": [8080]}]}
    p.write_text(yaml.safe_dump({"name": "telemetry", "network": network, "timeouts": {"call_s": 20, "run_s": 60}}))
    return p


@pytest.fixture
def otel() -> Iterator[Otel]:
    yield from installed()


def test_a_run_is_one_trace_with_its_calls_and_egress(
    engine: Any, internal_net: str, proxy_policy: Path, otel: Otel
) -> None:
    """Three calls under the agent's span: one trace with the run span (the agent's child), its start, the three
    execute_tool spans (the agent's children, linked to the run), at most EGRESS_SPANS egress spans of the
    proxy's refusals (all counted), the hostile tool name and target escaped, runs/calls/memory measured."""
    tracer = otel.tracer_provider.get_tracer("agent")
    with tracer.start_as_current_span("agent") as agent, Sandbox(proxy_policy, egress_network=internal_net) as sb:
        assert sb.call("ping").ok
        r = sb.call("run_python", {"code": textwrap.dedent(RAW), "timeout_s": 15})
        assert r.ok and r.result["stdout"].strip() == "asked", r.result
        assert sb.call(HOSTILE_TOOL).status == "error"
        until = time.monotonic() + 10  # the proxy's decisions reach the runner on their own stream
        while sum(p.value for p in otel.points("toolcage.egress.decisions")) < DENIED and time.monotonic() < until:
            time.sleep(0.05)
    assert wait_removed(30)
    spans = otel.spans.get_finished_spans()
    trace_id = agent.get_span_context().trace_id
    assert {s.context.trace_id for s in spans} == {trace_id}
    (run,) = [s for s in spans if s.name == "toolcage.run"]
    assert run.parent is not None and run.parent.span_id == agent.get_span_context().span_id
    assert run.attributes is not None and run.attributes["toolcage.run_id"] == sb.run_id
    assert run.attributes["toolcage.run.status"] == "ok" and run.attributes["toolcage.run.calls"] == 3
    (start,) = [s for s in spans if s.name == "toolcage.start"]
    assert start.parent is not None and start.parent.span_id == run.context.span_id
    (removed,) = [s for s in spans if s.name == "toolcage.remove"]
    assert removed.parent is not None and removed.parent.span_id == run.context.span_id
    calls = [s for s in spans if s.attributes and s.attributes.get("gen_ai.operation.name") == "execute_tool"]
    assert [s.attributes["gen_ai.tool.name"] for s in calls if s.attributes] == [
        "ping",
        "run_python",
        "evil\\x1b]0;owned\\x07\\u202etool",
    ]
    for s in calls:
        assert s.parent is not None and s.parent.span_id == agent.get_span_context().span_id
        assert [link.context.span_id for link in s.links] == [run.context.span_id]
        assert s.attributes is not None and s.attributes["toolcage.run_id"] == sb.run_id
        assert s.name.isascii() and "\x1b" not in s.name
        assert isinstance(s.attributes.get("gen_ai.tool.call.id"), str)  # the JSON-RPC id the runner gave it
    assert calls[2].attributes is not None and calls[2].attributes["error.type"] == "error"
    egress = [s for s in spans if s.name == "toolcage.egress"]
    assert len(egress) == telemetry.EGRESS_SPANS
    targets = {str(s.attributes["toolcage.egress.target"]) for s in egress if s.attributes}
    assert "http://denied-0.test:8080" in targets
    values = " ".join(str(v) for s in spans for v in (s.attributes or {}).values())
    assert "SECRET123" not in values and "/path" not in values and "\x1b" not in values
    assert all(v.isascii() for v in values.split())
    denied = [
        p for p in otel.points("toolcage.egress.decisions") if p.attributes["toolcage.egress.decision"] == "denied"
    ]
    assert sum(p.value for p in denied) == DENIED
    assert {p.attributes["toolcage.egress.source"] for p in denied} == {"proxy"}
    assert sum(p.value for p in otel.points("toolcage.runs.finished")) == 1
    by_call = {
        (p.attributes["gen_ai.tool.name"], p.attributes["toolcage.call.status"]): p.count
        for p in otel.points("gen_ai.execute_tool.duration")
    }
    assert by_call == {("ping", "ok"): 1, ("run_python", "ok"): 1, ("evil\\x1b]0;owned\\x07\\u202etool", "error"): 1}
    assert sum(p.count for p in otel.points("toolcage.start.duration")) == 1
    (memory,) = otel.points("toolcage.run.memory.peak")
    assert memory.count == 1 and memory.sum > 1 << 20


class _Receiver(http.server.BaseHTTPRequestHandler):
    """An OTLP/HTTP receiver: stores each protobuf export request it gets and answers 200."""

    got: list[tuple[str, bytes]] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        _Receiver.got.append((self.path, body))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


def test_spans_reach_an_otlp_http_receiver(engine: Any) -> None:
    """With the SDK's OTLP/HTTP exporter pointed at a receiver on 127.0.0.1, a run's spans arrive as OTLP protobuf
    (decoded with opentelemetry-proto): the run span and its execute_tool span, with their attributes."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Receiver)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    _Receiver.got = []
    provider = TracerProvider()
    exporter = OTLPSpanExporter(endpoint=f"http://127.0.0.1:{server.server_address[1]}/v1/traces", timeout=5)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    telemetry._install(provider, MeterProvider())
    try:
        with Sandbox() as sb:
            assert sb.call("ping").ok
        provider.force_flush()
    finally:
        telemetry._reset()
        provider.shutdown()
        server.shutdown()
        server.server_close()
    assert _Receiver.got and {path for path, _ in _Receiver.got} == {"/v1/traces"}
    names: dict[str, dict[str, Any]] = {}
    for _, body in _Receiver.got:
        request = ExportTraceServiceRequest.FromString(body)
        for rs in request.resource_spans:
            for ss in rs.scope_spans:
                assert ss.scope.name == "toolcage"
                for span in ss.spans:
                    names[span.name] = {a.key: a.value for a in span.attributes}
    assert {"toolcage.run", "toolcage.start", "execute_tool ping"} <= set(names)
    assert names["execute_tool ping"]["gen_ai.tool.name"].string_value == "ping"
    assert names["toolcage.run"]["toolcage.run_id"].string_value == sb.run_id
