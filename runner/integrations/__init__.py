"""Drop-in sandboxes for the agent frameworks: each module is one framework's interface over toolcage's
``Sandbox``/``AsyncSandbox`` (the same hardened container, policy, egress allowlist, secrets and audit log).

- ``openai_agents``: a ``BaseSandboxClient`` for the OpenAI Agents SDK's ``SandboxAgent`` (extra ``openai-agents``);
- ``deepagents``: a ``BaseSandbox`` backend for LangChain Deep Agents (extra ``deepagents``);
- ``langchain``: toolcage's tools as LangChain ``StructuredTool``s bound to an open sandbox (extra ``langchain``).

``split_images`` (``toolcage.interpreter``, no framework imported) takes a ``code_run`` answer's PNG and JPEG
results out of its JSON:
a model should not read a chart as base64 text (a 100 KB PNG is ~35,000 tokens of noise), so each adapter sends
the JSON with every image replaced by a short placeholder, and the images beside it in its framework's own way
(LangChain's ``ToolMessage.artifact``, the OpenAI Agents SDK's ``ToolOutputImage``). The images are the
sandbox's output (a cell may forge its display messages): only ``image/png`` and ``image/jpeg`` are taken, and
only when the value is base64 that decodes to that format's signature; anything else under those types is left
out with a placeholder saying so. Nothing here decodes the picture itself.

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


# the image rule is the interpreter's (toolcage.interpreter): servers and adapters share it
from toolcage.interpreter import IMAGE_MIMES, checked_image, split_images  # noqa: E402

__all__ = ["IMAGE_MIMES", "checked_image", "raise_missing_extra", "split_images"]
