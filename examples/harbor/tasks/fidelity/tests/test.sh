#!/bin/bash
# reward 1 when the agent's files are right, the upload kept /tests' mode and symlink, and the egress proxy
# refused a host the allowlist does not name; leaves a tree in /logs/verifier for the download to bring back
out=/logs/verifier
fail() { echo "FAIL: $*" >> $out/checks.txt; echo 0 > $out/reward.txt; exit 0; }
[ "$(/app/latest)" = ok ] || fail "/app/latest does not run tool.sh"
[ -x /tests/helper.sh ] || fail "/tests/helper.sh lost its executable bit"
[ "$(readlink /tests/helper-link)" = helper.sh ] || fail "/tests/helper-link is not the symlink"
[ "$(/tests/helper-link)" = helper-ran ] || fail "the symlink does not run the helper"
python3 - <<'PY' >> $out/checks.txt || fail "the proxy let a request to a host outside the allowlist through"
import os, sys, urllib.error, urllib.request
assert os.environ.get("HTTP_PROXY"), "no egress proxy in the environment"
try:
    urllib.request.urlopen("http://pypi.org/simple/", timeout=10)
except urllib.error.HTTPError as exc:  # the egress proxy's refusal: nothing was sent to pypi.org
    print("proxy refused pypi.org:", exc.code, exc.read().decode(errors="replace")[:200].strip())
    sys.exit(0 if exc.code == 403 else 1)
sys.exit(1)
PY
mkdir -p $out/tree/empty-dir $out/tree/sub
printf '#!/bin/sh\necho x\n' > $out/tree/run.sh && chmod 750 $out/tree/run.sh
ln -s run.sh $out/tree/sub-link
echo "all checks passed" >> $out/checks.txt
echo 1 > $out/reward.txt
