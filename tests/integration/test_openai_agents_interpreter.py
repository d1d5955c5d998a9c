"""The OpenAI Agents SDK with toolcage's Python interpreter (issue 38, point 5): ``ToolcageCodeInterpreter``, a
``SandboxAgent`` capability whose ``code_run`` shows a cell's images to the model as the SDK's own ``view_image``
does (``ToolOutputImage``), driven by the SDK's scripted model (``agents.testing``): no model, no network."""

from __future__ import annotations

import asyncio
import base64
import json
from typing import Any

import pytest
from agents import RunConfig, Runner
from agents.sandbox import SandboxAgent, SandboxRunConfig
from agents.sandbox.capabilities import Shell
from agents.testing import ScriptedModel, assistant_message, function_call

from toolcage.integrations.openai_agents import ToolcageCodeInterpreter, ToolcageSandboxClient

pytestmark = [
    pytest.mark.usefixtures("no_leaks"),
    pytest.mark.runc_only(
        "a framework's adapter: its translation of the same calls, host-side (the interpreter's own tests run "
        "the cells under gVisor)"
    ),
]

# a 2x2 PNG drawn in the cell (the worker image has no matplotlib), and a forged one
CELL = r"""
import base64, struct, zlib
from IPython.display import Image, display
def chunk(t, d):
    return struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d) & 0xFFFFFFFF)
raw = b"".join(b"\x00" + b"\x00\x80\xff" * 2 for _ in range(2))
display(Image(data=b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 2, 2, 8, 2, 0, 0, 0))
              + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b"")))
display({"image/png": base64.b64encode(b"GIF89a not a png").decode()}, raw=True)
total * 2
"""


def _outputs(model: ScriptedModel) -> dict[str, Any]:
    """The tool outputs the model was shown, by call id, as the SDK sent them (a str, or a list of parts)."""
    last = model.last_call
    assert last is not None and isinstance(last.input, list)
    return {
        str(i["call_id"]): i.get("output")
        for i in last.input
        if isinstance(i, dict) and i.get("type") == "function_call_output"
    }


def test_a_cells_image_reaches_the_model_as_an_image() -> None:
    """The scripted model sets a variable, uses it in a cell that shows a PNG: the model is sent the answer's
    JSON (the PNG a placeholder, the forged PNG left out) and the PNG as an input image (a data URL); a bad
    context is a failed call the model reads, and the loop goes on."""
    model = ScriptedModel(
        [
            [function_call("code_run", {"code": "total = 21"}, call_id="set")],
            [function_call("code_run", {"code": CELL}, call_id="plot")],
            [function_call("code_run", {"code": "1", "context": "nope"}, call_id="bad")],
            [assistant_message("done")],
        ]
    )
    agent = SandboxAgent(
        name="analyst", instructions="Analyse.", model=model, capabilities=[Shell(), ToolcageCodeInterpreter()]
    )

    async def main() -> None:
        client = ToolcageSandboxClient()
        session = await client.create(manifest=None)
        async with session:
            cap = ToolcageCodeInterpreter()
            cap.bind(session)
            assert [t.name for t in cap.tools()] == [
                "code_run", "code_context_create", "code_context_list", "code_context_restart", "code_context_remove",
            ]  # fmt: skip
            assert "code_run" in (await cap.instructions(session.state.manifest) or "")
            run = RunConfig(sandbox=SandboxRunConfig(session=session), tracing_disabled=True)
            result = await Runner.run(agent, "go", run_config=run, max_turns=8)
            assert result.final_output == "done"
        await client.delete(session)

    asyncio.run(main())
    out = _outputs(model)
    assert json.loads(out["set"])["status"] == "ok"
    parts = out["plot"]
    assert isinstance(parts, list) and [p["type"] for p in parts] == ["input_text", "input_image"], parts
    answer = json.loads(parts[0]["text"])
    assert answer["results"][0]["data"]["image/png"].startswith("<image/png, ")
    assert answer["results"][1]["data"]["image/png"].startswith("<image/png left out")
    assert answer["results"][2]["data"]["text/plain"] == "42"
    url = parts[1]["image_url"]
    assert url.startswith("data:image/png;base64,")
    assert base64.b64decode(url.partition(",")[2]).startswith(b"\x89PNG\r\n\x1a\n")
    assert url.partition(",")[2] not in parts[0]["text"]
    assert "tool failed" in out["bad"] and "nope" in out["bad"], out["bad"]
