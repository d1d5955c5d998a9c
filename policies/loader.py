"""Find, parse and validate policies (a bundled name, a file, or data given in code); turn
every failure into one clear PolicyError."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeAlias

from toolcage.policies.errors import PolicyError
from toolcage.policies.model import Policy
from toolcage.policies.model import policy_from_json as policy_from_json  # its home is the model now
from toolcage.policies.typed import BuildError, build, to_dict

_ADAPTER: Any = None
_UNKNOWN = ("extra_forbidden", "unexpected_keyword_argument")

_BUNDLED = Path(__file__).resolve().parent
_MAX_EXTENDS = 8  # a chain of ``extends`` this deep is a loop, not a design

# What every door takes as a policy: a bundled name, a file path, data in code, or a Policy.
PolicySource: TypeAlias = "str | Path | Mapping[str, Any] | Policy"


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


def load_policy(source: PolicySource = "default") -> Policy:
    """A validated policy from a bundled name (``"default"``), a YAML/JSON file path, a mapping
    given in code, or a :class:`Policy` built in code.

    A mapping is read as a policy file is: the fields it leaves out take the model's safe
    defaults, and ``"extends": NAME_OR_PATH`` starts from another policy instead, the mapping's
    fields merged over it (nested mappings merge; anything else replaces). A Policy built in
    code is checked against the model's bounds and types, as a file would be.
    """
    if isinstance(source, Policy):
        return _checked(source)
    if isinstance(source, Mapping):
        return _from_mapping(source, "(given in code)", None, 0)
    if not isinstance(source, str | Path):
        raise PolicyError(
            f"a policy is a bundled name, a file path, a mapping or a Policy, not {type(source).__name__}"
        )
    return _load(source, 0)


def _load(name_or_path: str | Path, depth: int, relative_to: Path | None = None) -> Policy:
    text = str(name_or_path)
    path = Path(text).expanduser()
    if relative_to is not None and not path.is_absolute():
        path = relative_to / path
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
        raw_bytes = path.read_bytes()
    except FileNotFoundError:
        raise PolicyError(f"policy file not found: {path}") from None
    except OSError as exc:
        raise PolicyError(f"cannot read policy file {path}: {exc.strerror}") from None
    try:
        raw = raw_bytes.decode("utf-8")
    except UnicodeDecodeError as exc:
        line, column = _line_column(raw_bytes, exc.start)
        raise _at(path, line, column, f"policy file is not UTF-8 text (byte 0x{raw_bytes[exc.start]:02x})") from None
    try:
        data = yaml.safe_load(raw)
    except yaml.YAMLError as exc:
        raise _yaml_error(path, raw, exc) from None
    if isinstance(data, dict) and "extends" in data:
        return _from_mapping(data, repr(str(path)), path.parent, depth)
    return validate_policy(data, repr(str(path)))


def _line_column(text: str | bytes, pos: int) -> tuple[int, int]:
    """1-based line and column of offset ``pos`` (columns count characters, or bytes in bytes)."""
    nl = "\n" if isinstance(text, str) else b"\n"
    start = text.rfind(nl, 0, pos) + 1  # type: ignore[arg-type]
    return text.count(nl, 0, pos) + 1, pos - start + 1  # type: ignore[arg-type]


def _at(path: Path, line: int, column: int, what: str) -> PolicyError:
    """An error at a place in a policy file, said as compilers say it (``FILE:LINE:COLUMN: what``), on
    one line: the CLI prints one line per error and shows any control character in it as an escape."""
    return PolicyError(f"{path}:{line}:{column}: {_one_line(what)}", file=str(path), line=line, column=column)


def _one_line(text: str) -> str:
    return re.sub(r"\s*\n\s*", " ", text)


def _yaml_error(path: Path, text: str, exc: Any) -> PolicyError:
    """What PyYAML found wrong, where: its multi-line report (a snippet and a caret under
    ``in "<unicode string>"``) becomes the file, line and column, and its words."""
    problem = getattr(exc, "problem", None) or getattr(exc, "context", None)
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    if mark is not None:
        line, column = mark.line + 1, mark.column + 1
    elif isinstance(getattr(exc, "position", None), int):  # a ReaderError: a character YAML refuses
        line, column = _line_column(text, exc.position)
        problem = str(exc).split("\n")[0]
    else:
        return PolicyError(f"policy file {path} is not valid YAML: {_one_line(str(exc))}")
    what = f"policy file is not valid YAML: {problem or 'a syntax error'}"
    context, cmark = getattr(exc, "context", None), getattr(exc, "context_mark", None)
    if context and cmark is not None and context != problem:
        what += f" ({context} that starts at line {cmark.line + 1}, column {cmark.column + 1})"
    return _at(path, line, column, what)


def _from_mapping(data: Mapping[str, Any], source: str, relative_to: Path | None, depth: int) -> Policy:
    """A policy from a mapping: its ``extends`` (if any) loaded first, the rest merged over it."""
    fields = dict(data)
    base = fields.pop("extends", None)
    if base is None:
        return validate_policy(fields, source)
    if depth >= _MAX_EXTENDS:
        raise PolicyError(f"invalid policy {source}: extends: more than {_MAX_EXTENDS} deep (a loop?)")
    if isinstance(base, Policy):
        parent = _checked(base)
    elif isinstance(base, str | Path):
        parent = _load(base, depth + 1, relative_to)
    else:
        raise PolicyError(f"invalid policy {source}: extends: a bundled name or a file path")
    return validate_policy(_merge(to_dict(parent), fields), source)


def _merge(base: dict[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in over.items():
        old = merged.get(key)
        merged[key] = _merge(old, value) if isinstance(old, dict) and isinstance(value, Mapping) else value
    return merged


def _checked(policy: Policy) -> Policy:
    """A Policy built in code, held to the model: its dataclass constructor checks neither
    bounds nor types (``Timeouts(run_s=-1)`` builds), so it goes through the validator a
    file goes through. A policy that validated before comes back equal."""
    try:
        data = to_dict(policy)
    except TypeError as exc:  # not dataclasses all the way down
        raise PolicyError(f"invalid policy (given in code): {exc}") from None
    try:
        return build(Policy, json.loads(json.dumps(data, default=str)))  # type: ignore[no-any-return]
    except (BuildError, ValueError, TypeError):
        return validate_policy(data, "(given in code)")  # pydantic says what is wrong, in its words


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
