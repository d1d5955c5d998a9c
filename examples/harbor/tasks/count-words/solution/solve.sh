#!/bin/bash
set -eu
python3 - <<'PY'
import json
words = len(open("/app/poem.txt").read().split())
json.dump({"words": words}, open("/app/answer.json", "w"))
PY
