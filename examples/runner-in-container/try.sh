#!/bin/sh
# Build the runner image (build.sh), then run `toolcage run` in it against this machine's engine,
# as compose.yaml does: a host directory at /data/repo, a hostname that is not the container's id.
#   PYTHON=.venv/bin/python sh examples/runner-in-container/try.sh
set -eu
here=$(cd "$(dirname "$0")" && pwd)
tag=$(sh "$here/build.sh")
repo=$(mktemp -d)
trap 'rm -rf "$repo"' EXIT
chmod 755 "$repo"
echo "from the host" > "$repo/note.txt"
chmod 644 "$repo/note.txt"
out=$(docker run --rm --hostname agent --user 0 --read-only --tmpfs /tmp --network none \
  -e TOOLCAGE_AUDIT_LOG=/tmp/audit.jsonl -v /var/run/docker.sock:/var/run/docker.sock \
  -v "$repo:/data/repo:ro" "$tag" run read_file --workspace /data/repo --params '{"path": "/workspace/note.txt"}')
echo "$out"
case "$out" in *'"content": "from the host\n"'*) ;; *) echo "the sandbox did not read the host's file" >&2; exit 1 ;; esac
