"""The public API is pinned: every name in ``toolcage.__all__`` and every CLI command (as httpx pins its own)."""

from __future__ import annotations

import subprocess
import sys

import click

import toolcage

PUBLIC = [
    "DEFAULT_IMAGE", "STATUSES", "AsyncPool", "AsyncSandbox", "CallResult", "Cancel", "DockerUnavailable",
    "ImageMissing", "Policy", "PolicyError", "Pool", "ProtocolError", "RunSummary", "Sandbox", "SandboxError",
    "SandboxInterrupted", "SandboxOOM", "SandboxTimeout", "ToolcageError", "UsageError", "WorkerCrashed",
    "WorkspaceError", "__version__", "load_policy", "wait_removed",
    # what a session's doors return, its surface and a result's status
    "Changes", "DownloadResult", "SnapshotInfo", "UploadResult", "SandboxLike", "AsyncSandboxLike", "Status",
    # background processes and exposed ports (issue 37)
    "Process", "AsyncProcess", "ProcessOutput", "ExposedPort", "Execution", "ExecutionError", "CodeContext",
    # every error of the tree a caller can meet (toolcage.errors draws them)
    "AuditError", "BadToolCall", "BuildError", "ChangesError", "ChangesUsage", "DiffFailed", "DownloadError",
    "DownloadLimit", "DownloadUsage", "EngineUnavailable", "MissingExtra", "NoCapacity", "NodeLost", "NotFound",
    "ProcessError", "InterpreterError", "RequirementsError", "SnapshotError", "SnapshotInvalid", "UploadError",
    "UploadUsage",
]  # fmt: skip
COMMANDS = [
    "audit", "daemon", "daemon start", "daemon status", "daemon stop", "doctor", "gc", "image", "image build",
    "mcp", "mcp serve", "mcp wrap", "policy", "policy test", "ps",
    "rm", "run", "serve", "tools",
]  # fmt: skip


def test_all_is_pinned() -> None:
    """toolcage.__all__ is exactly the pinned list: a name removed or added is a deliberate change here."""
    assert sorted(toolcage.__all__) == sorted(PUBLIC)
    assert dir(toolcage) == sorted(PUBLIC)


def test_every_public_name_imports() -> None:
    """Each public name loads (lazily, in a fresh interpreter) and is a toolcage object, not a stray import."""
    code = (
        "import toolcage\n"
        "for name in toolcage.__all__:\n"
        "    value = getattr(toolcage, name)\n"
        "    mod = getattr(value, '__module__', None)\n"
        "    assert mod is None or mod.startswith('toolcage'), (name, mod)\n"
        "from toolcage import *  # noqa\n"
        "print('ok')\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr


def test_importing_the_names_stays_light() -> None:
    """``import toolcage`` and its errors load neither docker-py nor the files room nor the front; a file
    door's type loads its room only when asked for, and still no docker-py."""
    code = (
        "import sys, toolcage\n"
        "from toolcage import DownloadError, EngineUnavailable, NodeLost, SnapshotInvalid, ToolcageError\n"
        "light = sorted(m for m in sys.modules if m == 'docker' or m.startswith(('docker.', 'toolcage.files',\n"
        "    'toolcage.sandbox', 'toolcage.engine')))\n"
        "toolcage.Changes, toolcage.SnapshotInfo\n"
        "print(light, 'toolcage.files.changes' in sys.modules, 'docker' in sys.modules)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.stdout.strip() == "[] True False", proc.stderr


def test_every_error_is_under_the_one_root() -> None:
    """Every public exception is a ToolcageError (policy errors included)."""
    errors = [getattr(toolcage, n) for n in PUBLIC if isinstance(getattr(toolcage, n), type)]
    errors = [e for e in errors if issubclass(e, BaseException)]
    assert errors and all(issubclass(e, toolcage.ToolcageError) for e in errors)


def test_every_cli_command_is_there() -> None:
    """The CLI's commands (the lazily registered ones included) are the pinned list."""
    from toolcage.cli.main import cli

    ctx = click.Context(cli)
    found: list[str] = []

    def walk(group: click.Group, prefix: str) -> None:
        for name in group.list_commands(ctx):
            command = group.get_command(ctx, name)
            assert command is not None, prefix + name
            found.append(prefix + name)
            if isinstance(command, click.Group):
                walk(command, f"{prefix}{name} ")

    walk(cli, "")
    assert found == COMMANDS
