"""Fuzz the worker's framing and dispatch: arbitrary bytes and JSON never crash it or break framing."""

from __future__ import annotations

import json
import os
import tempfile
import threading
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from toolcage.worker.dispatch import Dispatcher
from toolcage.worker.protocol import Channel
from toolcage.worker.settings import Settings
from toolcage.worker.tools import Catalog

_TMP = tempfile.mkdtemp(prefix="toolcage-fuzz-")
# only side-effect-free tools: fuzzing must not run shell commands
DISPATCHER = Dispatcher(
    Settings(None, _TMP, _TMP, "fuzz"),
    Catalog({"list_files": "toolcage.worker.tools.files", "read_file": "toolcage.worker.tools.files"}),
)

JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=10,
)
REQUESTS = st.fixed_dictionaries(
    {
        "jsonrpc": st.sampled_from(["2.0", "1.0", 2.0]),
        "method": st.sampled_from(["ping", "tools.list", "list_files", "read_file", "nope", "sandbox.usage", ""])
        | st.text(max_size=10),
    },
    optional={"id": st.none() | st.integers() | st.text(max_size=5) | st.booleans(), "params": JSONISH},
)
LINES = st.lists(
    st.one_of(
        st.binary(max_size=200).map(lambda b: b.replace(b"\n", b" ")),
        REQUESTS.map(lambda r: json.dumps(r).encode()),
        st.lists(REQUESTS, max_size=3).map(lambda rs: json.dumps(rs).encode()),
        JSONISH.map(lambda j: json.dumps(j).encode()),
    ),
    max_size=12,
)


def run_channel(data: bytes, max_line: int = 4096) -> list[str]:
    r_in, w_in = os.pipe()
    r_out, w_out = os.pipe()
    ch = Channel(r_in, w_out, max_line=max_line)

    def feed() -> None:
        view = memoryview(data)
        while view:
            view = view[os.write(w_in, view) :]
        os.close(w_in)

    t = threading.Thread(target=feed)
    t.start()
    out: list[str] = []
    for line in ch.lines():
        resp = DISPATCHER.handle(line)
        if resp:
            out.append(resp)
    t.join()
    for fd in (r_in, r_out, w_out):
        os.close(fd)
    return out


@settings(max_examples=300, deadline=None)
@given(LINES, st.booleans())
def test_framing_and_dispatch_never_break(lines: list[bytes], trailing_newline: bool) -> None:
    """Each input line yields at most one response, each response is one valid JSON-RPC message."""
    data = b"\n".join(lines) + (b"\n" if trailing_newline else b"")
    responses = run_channel(data)
    assert len(responses) <= max(len(lines), 1)
    for resp in responses:
        assert "\n" not in resp
        msg: Any = json.loads(resp)
        for m in msg if isinstance(msg, list) else [msg]:
            assert m["jsonrpc"] == "2.0" and ("result" in m) != ("error" in m)
            if "error" in m:
                assert m["error"]["code"] in (-32700, -32600, -32601, -32602, -32603, -32001, -32002, -32003)
                assert m["error"]["code"] != -32603, m  # no internal errors from any input


@settings(max_examples=50, deadline=None)
@given(st.integers(4097, 50000), st.binary(min_size=1, max_size=50))
def test_oversized_lines_are_refused_not_buffered(size: int, seed: bytes) -> None:
    """A line over the cap becomes one -32600 and the stream goes on."""
    blob = (seed * (size // len(seed) + 1))[:size]
    data = blob.replace(b"\n", b"x") + b"\n" + b'{"jsonrpc": "2.0", "method": "ping", "id": 1}\n'
    responses = [json.loads(r) for r in run_channel(data, max_line=4096)]
    assert responses[0]["error"]["code"] == -32600
    assert responses[-1] == {"jsonrpc": "2.0", "result": "pong", "id": 1}
