"""Runner-side error tree; each class carries its CLI exit code and, for sandbox failures,
the ``status`` that says how the run ended.

    ToolcageError (exit 3)                 the one root (defined in policies.errors, re-exported here)
    ├── PolicyError (exit 2)               a policy that cannot be found, parsed or validated
    ├── UsageError (exit 2)                bad CLI input, bad params JSON
    │   ├── WorkspaceError (exit 2)        workspace missing or too sensitive to mount
    │   ├── BadToolCall (exit 2)           unknown tool or bad params, found on the host (precheck)
    │   ├── MissingExtra (exit 2)          an optional module's extra is not installed (an ImportError too)
    │   └── RequirementsError (exit 2)     `image build --requirements`: a file or package it cannot use
    ├── NotFound (exit 1)                  what was asked for is not there (`audit --run ID`)
    ├── AuditError (exit 3)                the audit log cannot be written (disk full) or read back
    └── SandboxError (exit 3)              the sandbox, not the tool, failed
        ├── DockerUnavailable              the engine cannot be reached     status "crashed"
        ├── ImageMissing                   the worker image is not there    status "image_missing"
        ├── BuildError                     `image build` failed (engine, PyPI unreachable)
        ├── SandboxTimeout                 the run deadline killed it       status "timeout"
        ├── SandboxOOM                     the worker itself hit the limit  status "oom_killed"
        ├── WorkerCrashed                  the worker died (stderr tail)    status "crashed"
        ├── ProtocolError                  the container sent bad framing   status "crashed"
        ├── NodeLost                       a cluster node or its agent died status "node_lost"
        ├── EngineUnavailable              a node's engine stopped answering status "engine_unavailable"
        ├── NoCapacity                     no node admitted the run in time status "no_capacity"
        └── SandboxInterrupted (exit 130)  the runner was stopped mid-run   status "interrupted"

``except ToolcageError`` catches every error toolcage raises, policy errors included. Foreign errors (docker-py, OS) are
translated once, in the Docker adapter, with ``raise ... from exc``; the CLI prints every
error once, in ``toolcage.cli.output``.
"""

from __future__ import annotations

from toolcage.policies.errors import PolicyError, ToolcageError


class UsageError(ToolcageError):
    exit_code = 2
    status = "error"
    reason = "usage"


class WorkspaceError(UsageError):
    reason = "workspace"


class BadToolCall(UsageError):
    """The tool is unknown or its params do not fit its schema, found before any container starts."""

    reason = "bad_tool_call"


class RequirementsError(UsageError):
    """A requirements file `toolcage image build --requirements` cannot use: missing, unreadable,
    options instead of packages, or a package with neither a wheel for the image nor a pure-Python sdist."""

    reason = "requirements"


class MissingExtra(UsageError, ImportError):
    """An optional module (``toolcage.ray``, ``toolcage.integrations.*``) was imported without the extra it
    needs: ``extra`` names it (``pip install 'toolcage[ray]'``), ``name`` the missing module. An ImportError
    too, as tools that import optional modules expect (pkgutil, IDEs, docs generators)."""

    reason = "missing_extra"

    def __init__(self, message: str, *, extra: str, module: str) -> None:
        super().__init__(message, extra=extra, module=module)
        self.name = module  # ImportError's: the module that could not be imported


class NotFound(ToolcageError):
    exit_code = 1
    status = "error"
    reason = "not_found"


class AuditError(ToolcageError):
    """The audit log could not be written (disk full, read-only) or its end cannot be trusted."""

    reason = "audit"


class SandboxError(ToolcageError):
    exit_code = 3
    reason = "sandbox"


class DockerUnavailable(SandboxError):
    reason = "docker_unreachable"


class SandboxInterrupted(SandboxError):
    """The runner was stopped (SIGINT, SIGTERM) mid-run; the sandbox was killed without waiting."""

    status = "interrupted"
    reason = "interrupted"
    exit_code = 130


class ImageMissing(SandboxError):
    status = "image_missing"
    reason = "image_missing"


def image_missing(image: str | None) -> ImageMissing:
    """``image`` is not on this engine, with what makes that tag: a plain `toolcage image build` builds
    only this version's worker image (toolcage-worker:<version>), not a tag of your own."""
    from toolcage import __version__

    if image is None or image == f"toolcage-worker:{__version__}":
        how = "Build it with `toolcage image build`."
    else:
        how = (
            f"Build it here with `toolcage image build --tag {image}` (the worker image under that tag) or "
            f"`toolcage image build --pip PKG --tag {image}` (the worker image plus packages), or load it "
            "(`docker load`); a plain `toolcage image build` builds only the default worker image."
        )
    return ImageMissing(f"The image {image or '(unknown)'} is not present. {how}", image=image)


class BuildError(SandboxError):
    reason = "image_build"


class SandboxTimeout(SandboxError):
    status = "timeout"
    reason = "run_deadline"


class SandboxOOM(SandboxError):
    status = "oom_killed"
    reason = "memory_limit"


class WorkerCrashed(SandboxError):
    reason = "worker_crashed"


class ProtocolError(SandboxError):
    reason = "protocol"


class NodeLost(SandboxError):
    """A cluster run's node, or the engine agent that owned its sandbox, died (toolcage.ray). The run may
    have had effects: it is never retried; its sandbox is removed by that node's reaper."""

    status = "node_lost"
    reason = "node_lost"


class EngineUnavailable(DockerUnavailable):
    """A cluster node's container engine stopped answering while it held the run (toolcage.ray)."""

    status = "engine_unavailable"
    reason = "engine_unavailable"


class NoCapacity(SandboxError):
    """No node of the cluster admitted the run before the caller's wait ran out (toolcage.ray): every
    node was at its ``max_running``, or none had the image and a working engine."""

    status = "no_capacity"
    reason = "no_capacity"


__all__ = [
    "AuditError",
    "BadToolCall",
    "BuildError",
    "DockerUnavailable",
    "EngineUnavailable",
    "ImageMissing",
    "MissingExtra",
    "NoCapacity",
    "NodeLost",
    "NotFound",
    "PolicyError",
    "ProtocolError",
    "RequirementsError",
    "SandboxError",
    "SandboxInterrupted",
    "SandboxOOM",
    "SandboxTimeout",
    "ToolcageError",
    "UsageError",
    "WorkerCrashed",
    "WorkspaceError",
]
