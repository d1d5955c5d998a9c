#!/bin/sh
# A contributor's set-up, from a fresh clone:
#   sh examples/dev-setup.sh
# The user's quick start (examples/quickstart.sh: .venv, the core, the worker image, one sandboxed run),
# then the dev extra (pytest, ruff, mypy and every framework extra the tests use: .venv grows
# to about 1 GB, 1.5 minutes the first time) and the docs extra (MkDocs, Material, mkdocstrings, matplotlib for .ci/docs) into the same
# .venv. Run again, pip is skipped while pyproject.toml is the one it installed. Then run the tests:
#   .venv/bin/python -m pytest -n auto
set -eu
cd "$(dirname "$0")/.."
sh examples/quickstart.sh
step() { printf '==> %s\n' "$*" >&2; }
stamp=.venv/.toolcage-dev
want="dev,docs $(.venv/bin/python -c 'import hashlib; print(hashlib.sha256(open("pyproject.toml", "rb").read()).hexdigest())')"
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  step "installing the dev and docs extras into .venv (the test tools, the frameworks, the docs site)"
  .venv/bin/python -m pip install --quiet --disable-pip-version-check -e '.[dev,docs]' \
    --config-settings editable_mode=strict
  echo "$want" > "$stamp"
fi
step "ready: .venv/bin/python -m pytest -n auto (the Docker suites need the engine and the worker image, now built)"
