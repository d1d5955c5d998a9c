"""The root of every error toolcage raises, and the policy errors under it.

The root lives here, in the package both sides may import, so that ``PolicyError`` (raised by
the policy loader, which imports neither side) and the runner's tree (``toolcage.errors``, which
re-exports the root and draws the whole tree) share it: ``except toolcage.ToolcageError`` catches
a policy that cannot be loaded too. The worker's wire errors (``worker.errors``) are a separate
tree: they never leave the sandbox as exceptions, only as JSON-RPC codes.
"""

from __future__ import annotations

from typing import Any


class ToolcageError(Exception):
    """Base of every error toolcage raises on the host; carries the CLI exit code and, for sandbox
    failures, the ``status`` that says how the run ended."""

    exit_code = 3
    status = "crashed"
    reason = "error"

    def __init__(self, message: str, **details: Any) -> None:
        super().__init__(message)
        self.message = message
        self.details = details

    def to_dict(self) -> dict[str, Any]:
        return {"status": self.status, "reason": self.reason, "message": self.message, **self.details}


class PolicyError(ToolcageError, ValueError):
    """A policy could not be found, parsed or validated (a ValueError too, as it always was).

    The CLI maps it to exit code 2 (usage or policy error).
    """

    exit_code = 2
    status = "error"
    reason = "policy"


__all__ = ["PolicyError", "ToolcageError"]
