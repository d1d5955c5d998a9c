"""Check a tool call on the host before any container starts: the tool exists, its params fit.

Why: an unknown tool or bad params used to start a sandbox first (0.4-0.9 s) only to be told
-32601/-32602 by the worker, and the error did not list the valid tools. The built-in tools'
names and their params validation are importable here (``toolcage.worker.tools``), cheap
(no tool runs, no pydantic), and are the very code the worker runs, so the answers agree.

The check applies when the tool set is known: toolcage's own image. A derived image
(``--image`` or ``$TOOLCAGE_IMAGE`` not named ``toolcage-worker:*``) may add tools
(``TOOLCAGE_TOOL_MODULES``), so an unknown name is left to the worker there; built-in
tools' params are still checked.
"""

from __future__ import annotations

from typing import Any, NoReturn

from toolcage.errors import BadToolCall
from toolcage.policies import contract

OWN_IMAGE_REPO = "toolcage-worker"
PROTOCOL_METHODS = contract.PROTOCOL_METHODS  # answered by the worker's dispatcher itself, not by a tool


def _own_image(image: str | None) -> bool:
    from toolcage.options import worker_image

    ref = worker_image(image)
    repo = ref.rsplit("@", 1)[0]
    if ":" in repo.rsplit("/", 1)[-1]:
        repo = repo.rsplit(":", 1)[0]
    return repo.rsplit("/", 1)[-1] == OWN_IMAGE_REPO


def check_call(tool: str, params: dict[str, Any] | None, image: str | None = None, connectors: bool = False) -> None:
    """Raise BadToolCall when the worker would refuse this call with -32601 or -32602. With
    connectors (``--tools``) an unknown name may be one of theirs: the sandbox lists them."""
    from toolcage.rpc.session import check_request_size

    check_request_size(tool, params)  # over the worker's line limit: refused before a container starts
    if tool in PROTOCOL_METHODS:
        return
    from toolcage.worker.errors import BadParams
    from toolcage.worker.tools import BUILTIN, Catalog

    if tool not in BUILTIN:
        if not _own_image(image) or connectors:
            return
        unknown_tool(tool, sorted(BUILTIN))
    try:
        Catalog().get(tool).validate(params or {})
    except BadParams as exc:
        errors = exc.data if isinstance(exc.data, list) else [exc.data]
        fields = "; ".join(_describe(e) for e in errors)
        raise BadToolCall(f"invalid params for {tool}: {fields}", tool=tool, errors=errors) from None


def check_connector(tool: str, connectors: list[str]) -> None:
    """After the sandbox listed its connectors: the tool is one of them, or built in, or a protocol method."""
    from toolcage.worker.tools import BUILTIN

    if tool not in BUILTIN and tool not in connectors and tool not in PROTOCOL_METHODS:
        unknown_tool(tool, sorted([*BUILTIN, *connectors]))


def unknown_tool(tool: str, valid: list[str]) -> NoReturn:
    import difflib

    close = difflib.get_close_matches(tool, valid, n=3)  # a typo's likely meaning first, before the whole list
    hint = f"did you mean {' or '.join(map(repr, close))}? " if close else ""
    raise BadToolCall(
        f"unknown tool {tool!r}: {hint}the tools are {', '.join(valid)} (`toolcage tools` describes them)",
        tool=tool,
        valid_tools=valid,
        did_you_mean=close,
    )


def _describe(err: Any) -> str:
    """One bad field as ``field: what is wrong`` (the worker's -32602 data: field, error)."""
    if isinstance(err, dict) and err.get("field"):
        return f"{err['field']}: {err.get('error', 'invalid')}"
    if isinstance(err, dict) and "error" in err:  # about the params as a whole (a rule across fields)
        return str(err["error"])
    return str(err)


__all__ = ["check_call"]
