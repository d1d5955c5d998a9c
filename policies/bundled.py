"""The bundled policies, parsed ahead of time: every run loads one, and YAML plus pydantic cost
the ``toolcage`` command about 90 ms on each.

``bundled.json`` holds each bundled ``*.yaml`` file's parsed data, keyed by the sha256 of
the file's bytes. A file whose bytes match is rebuilt with ``typed.build`` (pydantic's
strict equal, without its import; tests/unit/test_policy.py checks both give the same
policy for every bundled file); any other bytes, such as an edited file, take the YAML and
pydantic path as before. The cache holds input, never a validated result, so it cannot
outlive a change of the model; a stale entry only costs speed, and the unit test names it.

    python -m toolcage.policies.bundled      # rewrite bundled.json after editing a *.yaml here
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
CACHE = HERE / "bundled.json"

_entries: dict[str, Any] | None = None


def digest(raw: bytes) -> str:
    return hashlib.sha256(raw).hexdigest()


def cached_data(name: str, raw: bytes) -> Any:
    """The parsed data of bundled policy ``name`` when ``raw`` (its file's bytes) is what was
    cached, else None."""
    global _entries
    if _entries is None:
        try:
            _entries = json.loads(CACHE.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            _entries = {}
    entry = _entries.get(name)
    if not isinstance(entry, dict) or entry.get("sha256") != digest(raw):
        return None
    return entry.get("data")


def as_validated(data: Any) -> Any:
    """Parsed YAML as the JSON document the validators see (``default=str``, as the loader does)."""
    return json.loads(json.dumps(data, default=str))


def compute() -> dict[str, Any]:
    """What bundled.json must hold: every bundled policy's data, keyed by its file's hash."""
    import yaml

    out: dict[str, Any] = {}
    for path in sorted(HERE.glob("*.yaml")):
        raw = path.read_bytes()
        out[path.stem] = {"sha256": digest(raw), "data": as_validated(yaml.safe_load(raw))}
    return out


def main() -> None:
    CACHE.write_text(json.dumps(compute(), indent=1, sort_keys=True) + "\n", encoding="utf-8")
    print(f"wrote {CACHE}")


if __name__ == "__main__":
    main()
