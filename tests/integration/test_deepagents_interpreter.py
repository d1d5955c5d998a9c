"""Deep Agents with toolcage's Python contexts (issue 38, point 5): ``backend.interpreter_tools()``."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
from deepagents import create_deep_agent
from langchain_core.messages import AIMessage, ToolMessage

from tests.integration.test_deepagents import Scripted, _calls
from toolcage.integrations.deepagents import ToolcageSandbox
from toolcage.integrations.langchain import INTERPRETER_TOOLS

pytestmark = [
    pytest.mark.usefixtures("no_leaks"),
    pytest.mark.runc_only(
        "a framework's adapter: its translation of the same calls, host-side (the interpreter's own tests run "
        "the cells under gVisor)"
    ),
]

# a 2x2 PNG drawn in the cell (the worker image has no matplotlib)
PNG_CELL = r"""
import struct, zlib
from IPython.display import Image, display
def chunk(t, d):
    return struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d) & 0xFFFFFFFF)
raw = b"".join(b"\x00" + b"\x00\x80\xff" * 2 for _ in range(2))
display(Image(data=b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 2, 2, 8, 2, 0, 0, 0))
              + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b"")))
"""


def test_a_deep_agent_keeps_python_state_and_gets_images_in_the_artifact(engine: Any) -> None:
    """``create_deep_agent(backend=backend, tools=backend.interpreter_tools())``: the agent writes a CSV with
    ``write_file``, loads it in a context with ``code_run``, uses the variable in a later call, and a chart
    comes back as the artifact's image, not as base64 in what the model reads."""
    with ToolcageSandbox() as backend:
        tools = backend.interpreter_tools()
        assert [t.name for t in tools] == list(INTERPRETER_TOOLS)
        steps = (
            ("write_file", {"file_path": "/scratch/data.csv", "content": "city,n\nOslo,3\nLima,5\n"}),
            ("code_run", {"code": "import csv\nrows = list(csv.DictReader(open('/scratch/data.csv')))"}),
            ("code_run", {"code": "sum(int(r['n']) for r in rows)"}),
            ("code_run", {"code": PNG_CELL}),
        )
        agent = create_deep_agent(model=Scripted(messages=_calls(*steps)), backend=backend, tools=tools)
        messages = agent.invoke({"messages": [{"role": "user", "content": "go"}]})["messages"]
        assert isinstance(messages[-1], AIMessage) and messages[-1].content == "done"
        got = {m.tool_call_id: m for m in messages if isinstance(m, ToolMessage)}
    assert json.loads(got["call_1"].content)["status"] == "ok", got["call_1"].content
    assert json.loads(got["call_2"].content)["results"][0]["data"]["text/plain"] == "8"
    chart = got["call_3"]
    (image,) = chart.artifact["images"]
    assert image["mime"] == "image/png" and base64.b64decode(image["data"]).startswith(b"\x89PNG")
    assert image["data"] not in chart.content and "image 1, in the tool message's artifact" in chart.content
