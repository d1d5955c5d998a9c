#!/bin/bash
# reward 1 when /app/answer.json counts the poem's words (the verifier's env says how many)
python3 - <<'PY'
import json, os
try:
    ok = json.load(open("/app/answer.json")) == {"words": int(os.environ["EXPECTED_WORDS"])}
except Exception:
    ok = False
open("/logs/verifier/reward.txt", "w").write("1\n" if ok else "0\n")
PY
