"""Find, parse and validate policy files; turn every failure into one clear PolicyError."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from policies.errors import PolicyError
from policies.model import Policy

_BUNDLED = Path(__file__).resolve().parent


def bundled_policy_names() -> list[str]:
    """Names of the policies shipped inside the package (``default``, ...)."""
    return sorted(p.stem for p in _BUNDLED.glob("*.yaml"))


def _describe(exc: ValidationError, source: str) -> str:
    parts = []
    for err in exc.errors():
        loc = ".".join(str(x) for x in err["loc"]) or "(top level)"
        msg = err["msg"]
        if err["type"] == "extra_forbidden":
            msg = "unknown field (typo?)"
        parts.append(f"{loc}: {msg}")
    return f"invalid policy {source}: " + "; ".join(parts)


def _validate(data: Any, source: str) -> Policy:
    if not isinstance(data, dict):
        raise PolicyError(f"invalid policy {source}: the top level must be a mapping of fields")
    try:
        return Policy.model_validate(data)
    except ValidationError as exc:
        raise PolicyError(_describe(exc, source)) from None


def load_policy(name_or_path: str | Path = "default") -> Policy:
    """Load a bundled policy by name (``default``) or a YAML/JSON file by path."""
    import yaml  # only the host side loads YAML; the worker gets canonical JSON

    text = str(name_or_path)
    path = Path(text).expanduser()
    looks_like_path = "/" in text or text.endswith((".yaml", ".yml", ".json")) or path.exists()
    if not looks_like_path:
        path = _BUNDLED / f"{text}.yaml"
        if not path.is_file():
            known = ", ".join(bundled_policy_names())
            raise PolicyError(f"unknown policy {text!r}: bundled policies are {known}, or give a file path")
    try:
        raw = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise PolicyError(f"policy file not found: {path}") from None
    except OSError as exc:
        raise PolicyError(f"cannot read policy file {path}: {exc.strerror}") from None
    try:
        data = yaml.safe_load(raw)
    except yaml.YAMLError as exc:
        raise PolicyError(f"policy file {path} is not valid YAML: {exc}") from None
    policy = _validate(data, repr(str(path)))
    return policy


def policy_from_json(text: str) -> Policy:
    """Rebuild a policy from its canonical JSON (how the worker receives it)."""
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise PolicyError(f"policy JSON is malformed: {exc}") from None
    return _validate(data, "(from JSON)")
