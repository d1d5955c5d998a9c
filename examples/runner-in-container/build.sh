#!/bin/sh
# Build the runner-in-a-container image (toolcage-runner-example:VERSION) with no registry:
#   PYTHON=.venv/bin/python sh examples/runner-in-container/build.sh
# PYTHON is a Python with toolcage installed (the quick start's .venv); the worker image must be
# built already (`toolcage image build`): it is this image's base. Prints the image's name.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
PY=${PYTHON:-python3}
ctx=$(mktemp -d)
trap 'rm -rf "$ctx"' EXIT
"$PY" - "$ctx" <<'PYEOF'
"""The build context: toolcage's package as installed, and wheels for its dependencies."""
import importlib, importlib.metadata as md, shutil, sys
from pathlib import Path
from toolcage.image.wheels import copy_wheels, download_wheels

ctx = Path(sys.argv[1])
reqs = [r for r in md.requires("toolcage") or [] if "extra ==" not in r]
(ctx / "requirements-runner.txt").write_text("\n".join(reqs) + "\n")
copy_wheels(download_wheels(lambda m: print(m, file=sys.stderr), ctx / "requirements-runner.txt"), ctx / "wheels")
shutil.copy(ctx / "requirements-runner.txt", ctx / "wheels")
ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
for name in ("toolcage", "toolcage.worker", "toolcage.policies", "toolcage.image"):  # an editable install too
    src = Path(importlib.import_module(name).__file__).parent
    shutil.copytree(src, ctx.joinpath(*name.split(".")), ignore=ignore, dirs_exist_ok=True)
PYEOF
version=$("$PY" -c 'import toolcage; print(toolcage.__version__)')
tag="toolcage-runner-example:$version"
docker build --quiet --build-arg "BASE=toolcage-worker:$version" -t "$tag" -f "$here/Dockerfile" "$ctx" >&2
echo "$tag"
