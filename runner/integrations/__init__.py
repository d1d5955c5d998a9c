"""Drop-in sandboxes for the agent frameworks: each module is one framework's interface over toolcage's
``Sandbox``/``AsyncSandbox`` (the same hardened container, policy, egress allowlist, secrets and audit log).

- ``openai_agents``: a ``BaseSandboxClient`` for the OpenAI Agents SDK's ``SandboxAgent`` (extra ``openai-agents``);
- ``deepagents``: a ``BaseSandbox`` backend for LangChain Deep Agents (extra ``deepagents``);
- ``langchain``: toolcage's tools as LangChain ``StructuredTool``s bound to an open sandbox (extra ``langchain``).

A module imports its framework when it is imported, never before: the core needs none of them. Without its
framework, importing a module raises :class:`~toolcage.errors.MissingExtra` (an ``ImportError``, as tools
that import optional modules expect) naming the extra to install.
"""

from __future__ import annotations


def raise_missing_extra(exc: ImportError, extra: str, needed_by: str) -> None:
    """Met ``exc`` importing a framework: raise ``MissingExtra`` naming ``extra`` when a module is not installed
    at all (the framework, or one it needs); return otherwise, for the caller to re-raise ``exc`` (a framework
    of another version says what it lacks)."""
    from toolcage.errors import MissingExtra

    missing = (exc.name or "").partition(".")[0]
    if isinstance(exc, ModuleNotFoundError) and missing:
        raise MissingExtra(
            f"{needed_by} needs {missing}: pip install 'toolcage[{extra}]'", extra=extra, module=missing
        ) from exc


__all__ = ["raise_missing_extra"]
