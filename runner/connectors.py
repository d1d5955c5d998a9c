"""The host side of connectors: tool sources to mount, secret values to hand over, checked before a run starts.

Tool sources (``--tools PATH``, ``tools=[...]``) are validated like a workspace and mounted
read-only; their code is never imported here (it is untrusted too: the worker lists its
tools from a child in the sandbox). Secrets (``--secret NAME=env:VAR|file:PATH``,
``secrets={...}``) must match the names the policy binds, exactly; their values travel to
the worker over the protocol after start, never through the container's settings, and the
runner redacts them from everything the worker sends back (worker.secrets.SecretStore,
the same rules on both sides).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from toolcage.errors import UsageError
from toolcage.policies import Policy, contract
from toolcage.workspace import validate_workspace

CONNECTORS_DIR = contract.CONNECTORS_DIR  # where sources are mounted in the sandbox


@dataclass(frozen=True)
class ToolSource:
    """One ``--tools`` path: a ``.py`` file, a folder of them, or a package folder (with ``__init__.py``)."""

    path: Path
    kind: Literal["file", "folder", "package"]
    index: int

    @property
    def target(self) -> str:
        """Where it is mounted in the sandbox (a package keeps its name: its modules import it by that name)."""
        base = f"{CONNECTORS_DIR}/{self.index}"
        return base if self.kind == "folder" else f"{base}/{self.path.name}"

    def wire(self, mounted: bool) -> dict[str, Any]:
        """What the worker is told: where to find it (its own path with --sandbox none)."""
        return {"path": self.target if mounted else str(self.path), "kind": self.kind, "label": str(self.path)}


def tool_sources(paths: Iterable[str | os.PathLike[str]]) -> tuple[ToolSource, ...]:
    out: list[ToolSource] = []
    for i, raw in enumerate(paths):
        path = validate_workspace(raw, what="tool source", file_ok=True)
        if path.is_file():
            if path.suffix != ".py":
                raise UsageError(f"tool source {str(path)!r} is not a .py file")
            kind: Literal["file", "folder", "package"] = "file"
        elif (path / "__init__.py").is_file():
            kind = "package"
        elif any(p.suffix == ".py" for p in path.iterdir()):
            kind = "folder"
        else:
            raise UsageError(f"tool source {str(path)!r} holds no .py file")
        if path in (s.path for s in out):
            raise UsageError(f"tool source {str(path)!r} is given twice")
        out.append(ToolSource(path, kind, i))
    return tuple(out)


def secret_from_ref(name: str, ref: str) -> str:
    """A secret's value from ``env:VAR`` or ``file:PATH`` (the CLI never takes a literal: it would
    show in ``ps`` and the shell's history)."""
    how, _, where = ref.partition(":")
    if how == "env" and where:
        value = os.environ.get(where)
        if value is None:
            raise UsageError(f"--secret {name}: the environment variable {where} is not set")
        return value
    if how == "file" and where:
        try:
            return Path(where).expanduser().read_text(encoding="utf-8").rstrip("\r\n")
        except (OSError, UnicodeDecodeError) as exc:
            raise UsageError(f"--secret {name}: cannot read {where}: {exc}") from None
    raise UsageError(
        f"--secret {name}: give NAME=env:VAR or NAME=file:PATH (a literal value would show in ps and shell history)"
    )


def parse_secret_options(options: Iterable[str]) -> dict[str, str]:
    """``--secret NAME=env:VAR`` / ``NAME=file:PATH``, repeatable, as name -> value."""
    out: dict[str, str] = {}
    for opt in options:
        name, eq, ref = opt.partition("=")
        if not eq or not name:
            raise UsageError(f"--secret {opt.split('=')[0]!r}: expected NAME=env:VAR or NAME=file:PATH")
        if name in out:
            raise UsageError(f"--secret {name} is given twice")
        out[name] = secret_from_ref(name, ref)
    return out


def secret_store(policy: Policy, values: Mapping[str, str] | None) -> Any:
    """The run's secrets checked against the policy (every bound name given, no other), as the
    store the runner redacts with; UsageError before anything starts otherwise."""
    from toolcage.worker.errors import BadParams
    from toolcage.worker.secrets import SecretStore

    store = SecretStore()
    try:
        store.load(dict(values or {}), dict(policy.secrets))
    except BadParams as exc:
        data = exc.data or {}
        parts = []
        if data.get("missing"):
            parts.append(f"the policy {policy.name!r} needs {', '.join(data['missing'])} (give --secret NAME=env:VAR)")
        if data.get("not_in_policy"):
            parts.append(
                f"the policy {policy.name!r} binds no secret named {', '.join(data['not_in_policy'])} "
                "(add it under secrets: with send_to)"
            )
        if data.get("secrets"):
            parts.append(f"{', '.join(data['secrets'])}: {exc.message}")
        raise UsageError("; ".join(parts) or exc.message) from None
    return store


def configure_params(sources: tuple[ToolSource, ...], mounted: bool, store: Any) -> dict[str, Any]:
    """The one ``sandbox.configure`` request: sources where the worker sees them, and the secret values."""
    return {"sources": [s.wire(mounted) for s in sources], "secrets": store.wire()}


def configured(answer: dict[str, Any]) -> dict[str, Any]:
    """The worker's answer to ``sandbox.configure``: the tools and secrets it took, or a UsageError
    (a connector that cannot load, a name clash, secrets that do not match) before any call."""
    error = answer.get("error")
    if isinstance(error, dict):
        data = error.get("data")
        problems = data.get("problems") if isinstance(data, dict) else None
        detail = "\n  ".join(str(p) for p in problems) if isinstance(problems, list) else ""
        message = str(error.get("message", "the sandbox refused its configuration"))
        if detail and not message.endswith(detail):
            message = f"{message.split(': ')[0]}:\n  {detail}"
        raise UsageError(message)
    result = answer.get("result")
    return result if isinstance(result, dict) else {}
