"""Drop-in sandboxes for the agent frameworks: each module is one framework's interface over toolcage's
``Sandbox``/``AsyncSandbox`` (the same hardened container, policy, egress allowlist, secrets and audit log).

- ``openai_agents``: a ``BaseSandboxClient`` for the OpenAI Agents SDK's ``SandboxAgent`` (extra ``openai-agents``);
- ``deepagents``: a ``BaseSandbox`` backend for LangChain Deep Agents (extra ``deepagents``);
- ``langchain``: toolcage's tools as LangChain ``StructuredTool``s bound to an open sandbox (extra ``langchain``).

``split_images`` (here, no framework imported) takes a ``code_run`` answer's PNG and JPEG results out of its JSON:
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

import base64
import binascii
from typing import Any


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


IMAGE_MIMES: tuple[str, ...] = ("image/png", "image/jpeg")
_MAGIC = {"image/png": b"\x89PNG\r\n\x1a\n", "image/jpeg": b"\xff\xd8\xff"}


def checked_image(mime: str, value: object) -> str | None:
    """``value`` as clean base64 (whitespace removed) when it is a ``mime`` image (PNG or JPEG), else None."""
    if mime not in _MAGIC or not isinstance(value, str):
        return None
    b64 = "".join(value.split())
    try:
        raw = base64.b64decode(b64, validate=True)
    except (binascii.Error, ValueError):
        return None
    return b64 if raw.startswith(_MAGIC[mime]) else None


def split_images(result: Any, where: str = "beside this text") -> tuple[Any, list[dict[str, str]]]:
    """``code_run``'s answer with each PNG/JPEG value replaced by a placeholder naming the image (``where`` says
    where the reader finds it), and the images, in order, as ``{"mime": ..., "data": base64}``. Any other value
    comes back as it is, with no images."""
    if not isinstance(result, dict) or not isinstance(result.get("results"), list):
        return result, []
    images: list[dict[str, str]] = []
    results: list[Any] = []
    for r in result["results"]:
        data = r.get("data") if isinstance(r, dict) else None
        if not isinstance(data, dict) or not any(m in data for m in IMAGE_MIMES):
            results.append(r)
            continue
        data = dict(data)
        for mime in IMAGE_MIMES:
            if mime not in data:
                continue
            b64 = checked_image(mime, data[mime])
            if b64 is None:
                data[mime] = f"<{mime} left out: not base64 of a {mime.partition('/')[2].upper()} image>"
                continue
            images.append({"mime": mime, "data": b64})
            size = len(b64) * 3 // 4 - (len(b64) - len(b64.rstrip("=")))
            data[mime] = f"<{mime}, {size} bytes: image {len(images)}, {where}>"
        results.append({**r, "data": data})
    return {**result, "results": results}, images


__all__ = ["IMAGE_MIMES", "checked_image", "raise_missing_extra", "split_images"]
