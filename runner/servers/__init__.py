"""toolcage on stdio: the long-lived fronts a client talks to over stdin/stdout. ``serve`` (JSON-RPC
to one sandbox) and ``serve_pool`` (a fresh pooled sandbox per call), ``mcp_serve`` (toolcage's tools as
an MCP server, on the official SDK), ``mcp_wrap`` and ``mcp_relay`` (a third-party MCP server inside a
sandbox, its messages relayed and filtered). Each runs its sandboxes through ``toolcage.run.Run``."""
