"""Find, parse and validate policy files; turn every failure into one clear PolicyError."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from toolcage.policies.errors import PolicyError
from toolcage.policies.model import Policy
from toolcage.policies.typed import BuildError, build

_ADAPTER: Any = None
_UNKNOWN = ("extra_forbidden", "unexpected_keyword_argument")

_BUNDLED = Path(__file__).resolve().parent


def bundled_policy_names() -> list[str]:
    """Names of the policies shipped inside the package (``default``, ...)."""
    return sorted(p.stem for p in _BUNDLED.glob("*.yaml"))


def _describe(errors: list[Any], source: str) -> str:
    parts = []
    for err in errors:
        loc = ".".join(str(x) for x in err["loc"]) or "(top level)"
        msg = str(err["msg"])
        if err["type"] in _UNKNOWN:
            msg = "unknown field (typo?)"
        elif err["type"] in ("value_error", "assertion_error"):
            # pydantic prefixes our validators' messages with its own wording; the user needs ours
            msg = msg.removeprefix("Value error, ").removeprefix("Assertion failed, ")
        parts.append(f"{loc}: {msg}")
    return f"invalid policy {source}: " + "; ".join(parts)


def validate_policy(data: Any, source: str = "(data)") -> Policy:
    """Validate policy data a person wrote (pydantic: the clearest errors)."""
    global _ADAPTER
    from pydantic import TypeAdapter, ValidationError

    if not isinstance(data, dict):
        raise PolicyError(f"invalid policy {source}: the top level must be a mapping of fields")
    if _ADAPTER is None:
        _ADAPTER = TypeAdapter(Policy)
    try:
        # JSON mode: strict about types ("64" is not 64) while accepting mappings for dataclasses
        return _ADAPTER.validate_json(json.dumps(data, default=str))  # type: ignore[no-any-return]
    except ValidationError as exc:
        raise PolicyError(_describe(exc.errors(), source)) from None


def load_policy(name_or_path: str | Path = "default") -> Policy:
    """Load a bundled policy by name (``default``) or a YAML/JSON file by path."""
    text = str(name_or_path)
    path = Path(text).expanduser()
    looks_like_path = "/" in text or text.endswith((".yaml", ".yml", ".json")) or path.exists()
    if not looks_like_path:
        path = _BUNDLED / f"{text}.yaml"
        if not path.is_file():
            known = ", ".join(bundled_policy_names())
            raise PolicyError(f"unknown policy {text!r}: bundled policies are {known}, or give a file path")
        cached = _from_cache(text, path)
        if cached is not None:
            return cached
    import yaml  # only the host side loads YAML; the worker gets canonical JSON

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
    return validate_policy(data, repr(str(path)))


def _from_cache(name: str, path: Path) -> Policy | None:
    """A bundled policy whose file is byte for byte the one parsed ahead of time (policies.bundled),
    built without YAML or pydantic; None sends it down the ordinary path."""
    from toolcage.policies import bundled

    try:
        data = bundled.cached_data(name, path.read_bytes())
    except OSError:
        return None  # the ordinary path says what is wrong
    if data is None:
        return None
    try:
        return build(Policy, data)  # type: ignore[no-any-return]
    except BuildError:
        return None  # pydantic says what is wrong, in its words


def policy_from_json(text: str) -> Policy:
    """Rebuild a policy from its canonical JSON (how the worker receives it), without pydantic."""
    try:
        return build(Policy, json.loads(text))  # type: ignore[no-any-return]
    except BuildError as exc:
        raise PolicyError(f"invalid policy (from JSON): {exc}") from None
    except ValueError as exc:
        raise PolicyError(f"policy JSON is malformed: {exc}") from None
