"""toolcage: run tool handlers you did not write in a hardened, per-run sandbox.

    from toolcage import Sandbox
    with Sandbox(workspace=".") as sb:
        print(sb.call("run_python", {"code": "print(2+2)"}).result["stdout"])

This folder (``runner/``) is the ``toolcage`` package: the host side (Sandbox API, CLI,
Docker adapter, audit). ``toolcage.worker`` (``worker/``) runs inside the sandbox and
``toolcage.policies`` (``policies/``) is the policy model both sides share. The public
names below load on first use, so importing ``toolcage.worker`` or ``toolcage.policies``
(inside the image, or for ``--sandbox none``) never pulls in docker-py.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import sys
import types
import warnings
from typing import TYPE_CHECKING, Any, cast

__version__ = "0.1.0"

# public name -> module that defines it
_EXPORTS = {
    "Policy": "toolcage.policies",
    "PolicyError": "toolcage.policies",
    "load_policy": "toolcage.policies",
    "DockerUnavailable": "toolcage.errors",
    "ImageMissing": "toolcage.errors",
    "ProtocolError": "toolcage.errors",
    "SandboxError": "toolcage.errors",
    "SandboxInterrupted": "toolcage.errors",
    "SandboxOOM": "toolcage.errors",
    "SandboxTimeout": "toolcage.errors",
    "ToolcageError": "toolcage.errors",
    "UsageError": "toolcage.errors",
    "WorkerCrashed": "toolcage.errors",
    "WorkspaceError": "toolcage.errors",
    "AuditError": "toolcage.errors",
    "BadToolCall": "toolcage.errors",
    "BuildError": "toolcage.errors",
    "ChangesError": "toolcage.errors",
    "ProcessError": "toolcage.errors",
    "InterpreterError": "toolcage.errors",
    "Execution": "toolcage.interpreter",
    "ExecutionError": "toolcage.interpreter",
    "CodeContext": "toolcage.interpreter",
    "Process": "toolcage.processes",
    "AsyncProcess": "toolcage.processes",
    "ProcessOutput": "toolcage.processes",
    "ExposedPort": "toolcage.lifecycle.ports",
    "ChangesUsage": "toolcage.errors",
    "DiffFailed": "toolcage.errors",
    "DownloadError": "toolcage.errors",
    "DownloadLimit": "toolcage.errors",
    "DownloadUsage": "toolcage.errors",
    "EngineUnavailable": "toolcage.errors",
    "MissingExtra": "toolcage.errors",
    "NoCapacity": "toolcage.errors",
    "NodeLost": "toolcage.errors",
    "NotFound": "toolcage.errors",
    "RequirementsError": "toolcage.errors",
    "SnapshotError": "toolcage.errors",
    "SnapshotInvalid": "toolcage.errors",
    "UploadError": "toolcage.errors",
    "UploadUsage": "toolcage.errors",
    "STATUSES": "toolcage.results",
    "CallResult": "toolcage.results",
    "RunSummary": "toolcage.results",
    "Status": "toolcage.results",
    # what the session's file doors return (the files room loads only when one is asked for)
    "Changes": "toolcage.files.changes",
    "DownloadResult": "toolcage.files.safetar",
    "SnapshotInfo": "toolcage.files.snapshot",
    "UploadResult": "toolcage.files.upload",
    # the session surface every session is checked against (Sandbox, AsyncSandbox, the cluster's, the adapters)
    "SandboxLike": "toolcage.types",
    "AsyncSandboxLike": "toolcage.types",
    "DEFAULT_IMAGE": "toolcage.sandbox",
    "AsyncPool": "toolcage.aio",
    "AsyncSandbox": "toolcage.aio",
    "Sandbox": "toolcage.sandbox",
    "Pool": "toolcage.pool",
    "Cancel": "toolcage.rpc.session",
    "wait_removed": "toolcage.lifecycle.removal",
}

__all__ = [
    "DEFAULT_IMAGE",
    "STATUSES",
    "AsyncPool",
    "AsyncProcess",
    "AsyncSandbox",
    "AsyncSandboxLike",
    "AuditError",
    "BadToolCall",
    "BuildError",
    "CallResult",
    "Cancel",
    "Changes",
    "ChangesError",
    "ChangesUsage",
    "CodeContext",
    "DiffFailed",
    "DockerUnavailable",
    "DownloadError",
    "DownloadLimit",
    "DownloadResult",
    "DownloadUsage",
    "EngineUnavailable",
    "Execution",
    "ExecutionError",
    "ExposedPort",
    "ImageMissing",
    "InterpreterError",
    "MissingExtra",
    "NoCapacity",
    "NodeLost",
    "NotFound",
    "Policy",
    "PolicyError",
    "Pool",
    "Process",
    "ProcessError",
    "ProcessOutput",
    "ProtocolError",
    "RequirementsError",
    "RunSummary",
    "Sandbox",
    "SandboxError",
    "SandboxInterrupted",
    "SandboxLike",
    "SandboxOOM",
    "SandboxTimeout",
    "SnapshotError",
    "SnapshotInfo",
    "SnapshotInvalid",
    "Status",
    "ToolcageError",
    "UploadError",
    "UploadResult",
    "UploadUsage",
    "UsageError",
    "WorkerCrashed",
    "WorkspaceError",
    "__version__",
    "load_policy",
    "wait_removed",
]


# Modules that moved into rooms keep their old paths for one release (0.1.x), with a DeprecationWarning:
# ``import toolcage.transfer`` gives the module ``toolcage.files.download`` itself (one module, not a copy).
_MOVED = {
    "toolcage.upload": "toolcage.files.upload",
    "toolcage.transfer": "toolcage.files.download",
    "toolcage.safetar": "toolcage.files.safetar",
    "toolcage.batch": "toolcage.files.batch",
    "toolcage.changes": "toolcage.files.changes",
    "toolcage.gitdiff": "toolcage.files.gitdiff",
    "toolcage.snapshot": "toolcage.files.snapshot",
    "toolcage.kube": "toolcage.backends.kubernetes",
}


class _MovedFinder:
    """Finds a moved module's old name and hands out the module under its new one (a meta path finder and
    its loader by their methods: importlib.abc's base classes would load importlib.resources, pathlib and
    tempfile with every ``import toolcage``, about 10 ms)."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname not in _MOVED:
            return None
        return importlib.machinery.ModuleSpec(fullname, cast("importlib.abc.Loader", self))

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        new = _MOVED[spec.name]
        warnings.warn(
            f"{spec.name} moved to {new}; the old path goes in the next release", DeprecationWarning, stacklevel=2
        )
        return importlib.import_module(new)

    def exec_module(self, module: types.ModuleType) -> None:
        """Nothing to run: the module came back already executed under its new name."""


if not any(isinstance(f, _MovedFinder) for f in sys.meta_path):
    sys.meta_path.append(_MovedFinder())


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'toolcage' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(__all__)


if TYPE_CHECKING:  # the names, for type checkers and IDEs
    import importlib.abc

    from toolcage.aio import AsyncPool, AsyncSandbox
    from toolcage.errors import (
        AuditError,
        BadToolCall,
        BuildError,
        ChangesError,
        ChangesUsage,
        DiffFailed,
        DockerUnavailable,
        DownloadError,
        DownloadLimit,
        DownloadUsage,
        EngineUnavailable,
        ImageMissing,
        InterpreterError,
        MissingExtra,
        NoCapacity,
        NodeLost,
        NotFound,
        ProcessError,
        ProtocolError,
        RequirementsError,
        SandboxError,
        SandboxInterrupted,
        SandboxOOM,
        SandboxTimeout,
        SnapshotError,
        SnapshotInvalid,
        ToolcageError,
        UploadError,
        UploadUsage,
        UsageError,
        WorkerCrashed,
        WorkspaceError,
    )
    from toolcage.files.changes import Changes
    from toolcage.files.safetar import DownloadResult
    from toolcage.files.snapshot import SnapshotInfo
    from toolcage.files.upload import UploadResult
    from toolcage.interpreter import CodeContext, Execution, ExecutionError
    from toolcage.lifecycle.ports import ExposedPort
    from toolcage.lifecycle.removal import wait_removed
    from toolcage.policies import Policy, PolicyError, load_policy
    from toolcage.processes import AsyncProcess, Process, ProcessOutput
    from toolcage.results import STATUSES, CallResult, RunSummary, Status
    from toolcage.rpc.session import Cancel
    from toolcage.sandbox import DEFAULT_IMAGE, Sandbox
    from toolcage.types import AsyncSandboxLike, SandboxLike
