#!/bin/bash
# reward 1 when the agent phase's allowlist named localhost (the proxy passed the name and its floor refused the
# address) and the verifier phase's policy, changed live, names nothing
out=/logs/verifier
agent=$(cat /app/agent-phase.txt 2>/dev/null)
verifier=$(python3 /tests/ask.py)
printf 'agent phase: %s\nverifier phase: %s\n' "$agent" "$verifier" > $out/checks.txt
case "$agent" in *"not in the allowlist"*|"no proxy"*|"") echo 0 > $out/reward.txt; exit 0 ;; esac
case "$verifier" in *"host localhost is not in the allowlist"*) echo 1 > $out/reward.txt ;; *) echo 0 > $out/reward.txt ;; esac
