"""A code_run answer's images, taken out for MCP (ImageContent) and the framework adapters (issue 38, point 5):
only PNG and JPEG whose base64 decodes to their signature; the JSON left small; other answers untouched."""

from __future__ import annotations

import base64

import mcp_types as types

from toolcage.integrations import split_images
from toolcage.results import CallResult
from toolcage.servers.mcp_serve import call_content, code_images

PNG = base64.b64encode(b"\x89PNG\r\n\x1a\n" + b"\x00" * 3000).decode()
JPEG = base64.b64encode(b"\xff\xd8\xff\xe0" + b"\x00" * 100).decode()
FORGED = base64.b64encode(b"<svg onload=alert(1)>").decode()


def _answer(*bundles: dict) -> dict:
    return {
        "context": "default",
        "status": "ok",
        "results": [{"data": b, "is_main_result": False} for b in bundles],
        "logs": {"stdout": [], "stderr": []},
        "error": None,
        "execution_count": 1,
    }


def test_images_leave_the_json_for_their_own_place() -> None:
    """PNG and JPEG (base64 with line breaks too) come out in order; each is a short placeholder in the JSON;
    a forged PNG, a non-string and text beside them are kept apart as they should be."""
    wrapped = "\n".join(PNG[i : i + 76] for i in range(0, len(PNG), 76))
    answer = _answer(
        {"image/png": wrapped, "text/plain": "<Figure>"},
        {"image/jpeg": JPEG},
        {"image/png": FORGED},
        {"image/png": 7},
        {"text/html": "<b>x</b>"},
    )
    shown, images = split_images(answer, "in the artifact")
    assert images == [{"mime": "image/png", "data": PNG}, {"mime": "image/jpeg", "data": JPEG}]
    data = [r["data"] for r in shown["results"]]
    assert data[0] == {"image/png": "<image/png, 3008 bytes: image 1, in the artifact>", "text/plain": "<Figure>"}
    assert data[1]["image/jpeg"].endswith("image 2, in the artifact>")
    assert data[2]["image/png"] == data[3]["image/png"] == "<image/png left out: not base64 of a PNG image>"
    assert shown["results"][4] is answer["results"][4]
    assert answer["results"][0]["data"]["image/png"] == wrapped  # the answer itself is not changed
    assert split_images({"stdout": "x"}) == ({"stdout": "x"}, []) and split_images([1]) == ([1], [])


def test_mcp_shows_code_run_images_as_image_content() -> None:
    """call_content: the text and structuredContent carry placeholders, the images follow as ImageContent; the
    same rule as split_images; another tool's answer of the same shape is left as it is."""
    answer = _answer({"image/png": PNG}, {"image/jpeg": JPEG}, {"image/png": FORGED})
    out = call_content(CallResult("ok", "code_run", "r1", result=answer))
    assert [c["type"] for c in out["content"]] == ["text", "image", "image"]
    assert out["content"][1] == {"type": "image", "data": PNG, "mimeType": "image/png"}
    assert out["content"][2]["mimeType"] == "image/jpeg"
    assert PNG not in out["content"][0]["text"] and len(out["content"][0]["text"]) < 1000
    assert out["structuredContent"]["results"][0]["data"]["image/png"].startswith("<image/png, ")
    types.CallToolResult.model_validate(out)
    shown, _ = split_images(answer)
    assert [r["data"].keys() for r in shown["results"]] == [r["data"].keys() for r in code_images(answer)[0]["results"]]
    other = call_content(CallResult("ok", "my_connector", "r1", result=answer))
    assert [c["type"] for c in other["content"]] == ["text"] and PNG in other["content"][0]["text"]
