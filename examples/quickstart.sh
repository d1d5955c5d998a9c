#!/bin/sh
# From a fresh clone to a sandboxed result in one command:
#   sh examples/quickstart.sh
# It makes .venv, installs toolcage's core (the library and the CLI: no test tools, no extras), builds the
# worker image (bootstrapping an offline Debian base, and installing debootstrap for it when run as root on
# a Debian-family host), then runs print(2+2) in a sandbox and prints the result. Running it again only
# repeats the last step: the install is skipped while pyproject.toml is the one it installed, and the image
# build finds the image up to date. A contributor's set-up is examples/dev-setup.sh.
set -eu
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if ! "$PY" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
  echo "toolcage needs Python 3.11 or newer: set PYTHON=/path/to/python3.11" >&2
  exit 2
fi
step() { printf '==> %s\n' "$*" >&2; }
if [ ! -x .venv/bin/python ]; then
  step "creating .venv"
  "$PY" -m venv .venv
fi
# Editable in setuptools' strict mode: a tree of links under build/, on sys.path, so the installed package is
# a regular one there. (The default editable finder comes after the path: a script run beside a folder named
# toolcage, such as this clone, got that folder as an empty namespace package instead.) An edit shows at once;
# a new module needs the install again (delete .venv/.toolcage-core, or see docs/contributing.md).
stamp=.venv/.toolcage-core
want="core $(.venv/bin/python -c 'import hashlib; print(hashlib.sha256(open("pyproject.toml", "rb").read()).hexdigest())')"
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ] || [ ! -x .venv/bin/toolcage ]; then
  step "installing toolcage's core into .venv"
  .venv/bin/python -m pip install --quiet --disable-pip-version-check -e . --config-settings editable_mode=strict
  echo "$want" > "$stamp"
fi
step "building the worker image (idempotent; the first build takes a minute or two)"
.venv/bin/toolcage image build >&2
step "running print(2+2) in a sandbox"
.venv/bin/toolcage run run_python --params '{"code": "print(2+2)"}'
