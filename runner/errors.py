"""The host side's one error tree, drawn below and defined in this file (the root and PolicyError come from the
shared kernel, policies.errors, and are re-exported). Each class carries its CLI exit code and, for sandbox
failures, the ``status`` that says how the run ended; tests/unit/test_error_tree.py holds the drawing to the classes.

    ToolcageError (exit 3)                 the one root (defined in policies.errors, re-exported here)
    ├── PolicyError (exit 2)               a policy that cannot be found, parsed or validated
    ├── UsageError (exit 2)                bad input: CLI flags, params JSON, a call's arguments
    │   ├── WorkspaceError (exit 2)        workspace missing or too sensitive to mount
    │   ├── BadToolCall (exit 2)           unknown tool or bad params, found on the host (precheck)
    │   ├── MissingExtra (exit 2)          an optional module's extra is not installed (an ImportError too)
    │   ├── RequirementsError (exit 2)     `image build --requirements`: a file or package it cannot use
    │   ├── UploadUsage (exit 2)           upload: a local path missing or special, a remote_dir in /workspace
    │   ├── DownloadUsage (exit 2)         download: a remote path not there or outside the roots, no local_dir
    │   ├── ChangesUsage (exit 2)          changes(): no workspace copy in the run, or no directory to compare
    │   └── SnapshotInvalid (exit 2)       resume=: tampered with, another key or version, not a snapshot
    ├── NotFound (exit 1)                  what was asked for is not there (`audit --run ID`)
    ├── AuditError (exit 3)                the audit log cannot be written (disk full) or read back
    └── SandboxError (exit 3)              the sandbox, not the tool, failed
        ├── DockerUnavailable              the engine cannot be reached           status "crashed"
        │   └── EngineUnavailable          a node's engine stopped answering      status "engine_unavailable"
        ├── ImageMissing                   the worker image is not there          status "image_missing"
        ├── BuildError                     `image build` failed (engine, PyPI unreachable)
        │   └── NoApt                      this host cannot fetch the image's Debian packages
        ├── SandboxTimeout                 the run deadline killed it             status "timeout"
        ├── SandboxOOM                     the worker itself hit the limit        status "oom_killed"
        ├── WorkerCrashed                  the worker died (stderr tail)          status "crashed"
        ├── ProtocolError                  the container sent bad framing         status "crashed"
        ├── NodeLost                       a cluster node or its agent died       status "node_lost"
        ├── NoCapacity                     no node admitted the run in time       status "no_capacity"
        ├── UploadError                    the worker could not take an upload    status "error"
        ├── DownloadError                  a download refused (a hostile tar)     status "error"
        │   └── DownloadLimit              past its byte or entry cap             status "error"
        ├── ChangesError                   changes() could not be gathered        status "error"
        ├── DiffFailed                     git could not make the diff            status "error"
        ├── SnapshotError                  a snapshot could not be made           status "error"
        ├── ProcessError                   a background process refused the call  status "error"
        ├── InterpreterError               a Python context refused the call      status "error"
        └── SandboxInterrupted (exit 130)  the runner was stopped mid-run         status "interrupted"

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
    """``image`` is not on this engine (nothing is pulled), with what makes that tag: any image of your own runs
    once the engine has it; a plain `toolcage image build` builds only this version's worker image
    (toolcage-worker:<version>), not a tag of your own."""
    from toolcage import __version__

    if image is None or image == f"toolcage-worker:{__version__}":
        how = "Build it with `toolcage image build`."
    else:
        how = (
            "Any image runs once the engine has it: build, pull or load it with docker; or make a worker image "
            f"under that tag (`toolcage image build --tag {image}`, with packages "
            f"`toolcage image build --pip PKG --tag {image}`)."
        )
    where = "is not on this engine (`docker images` lists them; nothing is pulled)"
    return ImageMissing(f"The image {image or '(unknown)'} {where}. {how}", image=image)


class BuildError(SandboxError):
    reason = "image_build"


class NoApt(BuildError):
    """This host cannot fetch Debian packages for the image (no apt-get, or another suite): raised by
    toolcage.image.debs, which re-exports it."""


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


# The files room's doors (toolcage.files: upload, download, changes, snapshot): defined here with the rest of
# the tree, and re-exported by the module that raises each (``from toolcage.files.upload import UploadError``).


class UploadError(SandboxError):
    """The worker could not take the upload (a refused entry, a full /scratch, a broken call)."""

    status = "error"
    reason = "upload_failed"


class UploadUsage(UsageError):
    """Bad input: a local path that is missing or holds a FIFO, socket or device; a remote_dir in /workspace."""

    reason = "upload_usage"


class DownloadError(SandboxError):
    """The sandbox sent something a download refuses (a hostile or malformed archive)."""

    status = "error"
    reason = "download_refused"


class DownloadLimit(DownloadError):
    """A download went over its byte or entry cap."""

    reason = "download_limit"


class DownloadUsage(UsageError):
    """Bad input: a remote path that is not there or outside the roots, a local_dir that is not a directory."""

    reason = "download_usage"


class ChangesError(SandboxError):
    """The changes could not be gathered (a refused stream, a cap, a worker that cannot tell)."""

    status = "error"
    reason = "changes_failed"


class ChangesUsage(UsageError):
    """Bad input: changes() in a run without a workspace copy, or without the host directory to compare."""

    reason = "changes_usage"


class SnapshotError(SandboxError):
    """A snapshot could not be made (a refused stream, a cap, a secret in a file)."""

    status = "error"
    reason = "snapshot_failed"


class SnapshotInvalid(UsageError):
    """A snapshot that cannot be resumed: tampered with, made with another key or by another format
    version, not a snapshot at all, or unreadable."""

    reason = "snapshot_invalid"


class ProcessError(SandboxError):
    """A background process (``Sandbox.spawn``) refused what was asked: no such id, its stdin closed, no
    terminal, at the limit of processes running. The message says which."""

    status = "error"
    reason = "process_failed"


class InterpreterError(SandboxError):
    """A Python context (``Sandbox.run_code``) refused what was asked: no such context, 16 exist already, a
    cell still running for the whole timeout, an image whose Python cannot import IPython (``details``: what
    is missing). A cell's own exception is not this: it is ``Execution.error``."""

    status = "error"
    reason = "interpreter_failed"


class DiffFailed(SandboxError):
    """git could not make the diff: not installed, past its deadline or its memory, or it failed."""

    status = "error"
    reason = "changes_failed"


__all__ = [
    "AuditError",
    "BadToolCall",
    "BuildError",
    "ChangesError",
    "ChangesUsage",
    "DiffFailed",
    "DockerUnavailable",
    "DownloadError",
    "DownloadLimit",
    "DownloadUsage",
    "EngineUnavailable",
    "ImageMissing",
    "InterpreterError",
    "MissingExtra",
    "NoApt",
    "NoCapacity",
    "NodeLost",
    "NotFound",
    "PolicyError",
    "ProcessError",
    "ProtocolError",
    "RequirementsError",
    "SandboxError",
    "SandboxInterrupted",
    "SandboxOOM",
    "SandboxTimeout",
    "SnapshotError",
    "SnapshotInvalid",
    "ToolcageError",
    "UploadError",
    "UploadUsage",
    "UsageError",
    "WorkerCrashed",
    "WorkspaceError",
]
