"""A worker tool called in-process the way the channel serves it: an upload's chunk handed over as the request's
data frame, a download's chunk taken from the answer's (toolcage.worker.protocol, the data path)."""

from __future__ import annotations

from typing import Any

from toolcage.worker import protocol


def call_tool(tool: Any, settings: Any, params: dict[str, Any]) -> dict[str, Any]:
    """``tool``'s result for ``params`` (``frame`` as bytes: sent as the request's frame), with the frame the
    answer carried in place of its size, as the runner's transport hands it on. A worker error propagates."""
    frame = params.get("frame")
    line: bytes = b"{}"
    if isinstance(frame, bytes):
        params = {**params, "frame": len(frame)}
        line = protocol.Framed(line)
        line.frame = frame
    got: dict[str, Any] = {}

    def handle() -> str:
        got["result"] = tool.handler(settings, tool.validate(params))
        return "{}"

    _, out = protocol.serve_framed(line, handle)
    result = got["result"]
    if out is not None:
        assert result.get("frame") == len(out), "the answer's frame size must be the frame's"
        result["frame"] = out
    return result
