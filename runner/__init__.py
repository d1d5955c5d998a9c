"""toolcage's host side: start hardened per-run sandboxes and call tools in them.

from runner import Sandbox
with Sandbox(workspace=".") as sb:
    print(sb.call("run_python", {"code": "print(2+2)"}).result["stdout"])
"""

from policies import Policy, PolicyError, load_policy
from runner.errors import (
    DockerUnavailable,
    ImageMissing,
    ProtocolError,
    SandboxError,
    SandboxOOM,
    SandboxTimeout,
    ToolcageError,
    UsageError,
    WorkerCrashed,
    WorkspaceError,
)
from runner.results import STATUSES, CallResult, RunSummary
from runner.sandbox import DEFAULT_IMAGE, AsyncSandbox, Sandbox, __version__

__all__ = [
    "DEFAULT_IMAGE",
    "STATUSES",
    "AsyncSandbox",
    "CallResult",
    "DockerUnavailable",
    "ImageMissing",
    "Policy",
    "PolicyError",
    "ProtocolError",
    "RunSummary",
    "Sandbox",
    "SandboxError",
    "SandboxOOM",
    "SandboxTimeout",
    "ToolcageError",
    "UsageError",
    "WorkerCrashed",
    "WorkspaceError",
    "__version__",
    "load_policy",
]
