"""The in-container worker: JSON-RPC 2.0 over stdin/stdout, dispatched to tool handlers.

Imports `policies` only; never `runner`.
"""

__all__: list[str] = []
