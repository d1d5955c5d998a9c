"""`toolcage mcp serve`: a ``code_run`` cell's images reach the MCP client as ImageContent (issue 38, point 5)."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
from mcp import ClientSession

from tests.integration.test_mcp_serve import _session, _text

pytestmark = [
    pytest.mark.usefixtures("no_leaks"),
    pytest.mark.runc_only(
        "`mcp serve`'s mapping of code_run's answer to MCP content, host-side (the cell runs the same under gVisor)"
    ),
]

# a 4x4 red PNG made in the cell (the worker image has no matplotlib), a JPEG's signature, a forged "PNG"
CELL = r"""
import base64, struct, zlib
from IPython.display import Image, display

def png(w, h):
    raw = b"".join(b"\x00" + b"\xff\x00\x00" * w for _ in range(h))
    def chunk(t, d):
        return struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d) & 0xFFFFFFFF)
    ihdr = struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b"")

display(Image(data=png(4, 4)))
display({"image/jpeg": base64.b64encode(b"\xff\xd8\xff\xe0" + b"j" * 64).decode(), "text/plain": "a jpeg"}, raw=True)
display({"image/png": base64.b64encode(b"<svg onload=alert(1)>").decode(), "text/plain": "forged"}, raw=True)
x = 21
x * 2
"""


def test_code_run_images_are_image_content(engine: Any) -> None:
    """A cell's PNG and JPEG are ImageContent blocks after the text; the text and structuredContent carry a
    short placeholder instead of the base64; a forged PNG is left out, and says so; state persists."""

    async def body(s: ClientSession) -> None:
        await s.initialize()
        res = await s.call_tool("code_run", {"code": CELL})
        assert not res.is_error, _text(res)
        kinds = [c.type for c in res.content]
        assert kinds == ["text", "image", "image"], kinds
        png, jpeg = res.content[1], res.content[2]
        assert png.mime_type == "image/png" and base64.b64decode(png.data).startswith(b"\x89PNG\r\n\x1a\n")
        assert jpeg.mime_type == "image/jpeg" and base64.b64decode(jpeg.data).startswith(b"\xff\xd8\xff")
        text = _text(res)
        assert png.data not in text and jpeg.data not in text and len(text) < 2000, text
        answer = json.loads(text)
        assert answer == res.structured_content
        data = [r["data"] for r in answer["results"]]
        assert data[0]["image/png"].startswith("<image/png, ") and "image 1," in data[0]["image/png"]
        assert "image 2," in data[1]["image/jpeg"] and data[1]["text/plain"] == "a jpeg"
        assert data[2]["image/png"].startswith("<image/png left out"), data[2]
        assert answer["results"][3] == {"data": {"text/plain": "42"}, "is_main_result": True}

        res = await s.call_tool("code_run", {"code": "x + 1"})  # the default context kept x
        assert [c.type for c in res.content] == ["text"]
        assert res.structured_content["results"][0]["data"]["text/plain"] == "22"

    _session([], body)
