"""Make the built-in tools' ``tools.list`` entries once, at image build: ``python -m toolcage.worker.tools.schemas``.

Writes ``schemas.json`` next to the tools package (the image's Dockerfile runs it after the
code is copied in, so the file always matches the code beside it); ``Catalog.describe`` reads
it instead of importing pydantic and every tool module on a run's first ``tools.list``.
"""

from __future__ import annotations

import json
import sys

from toolcage.worker.tools import BAKED_SCHEMAS, BUILTIN, Catalog, describe_tool


def entries() -> list[dict[str, object]]:
    catalog = Catalog(modules=BUILTIN)
    return [describe_tool(catalog.get(name)) for name in BUILTIN]


def main() -> int:
    path = sys.argv[1] if len(sys.argv) > 1 else BAKED_SCHEMAS
    with open(path, "w", encoding="utf-8") as f:
        json.dump(entries(), f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
