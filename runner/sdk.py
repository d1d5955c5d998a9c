"""The connector API: ``from toolcage.sdk import Context, tool``. See :mod:`toolcage.worker.connectors.sdk`.

The same module exists in the sandbox image (the handler's side), where the runner does not.
"""

from toolcage.worker.connectors.sdk import Context, EgressDenied, FetchFailed, Link, Logger, Response, ToolError, tool

__all__ = ["Context", "EgressDenied", "FetchFailed", "Link", "Logger", "Response", "ToolError", "tool"]
