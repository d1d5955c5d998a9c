#!/bin/bash
# reward 1 when the agent phase's allowlist named allowed.example (the proxy passed the name, then refused the port)
# and the verifier phase's policy, changed live, names nothing
out=/logs/verifier
agent=$(cat /app/agent-phase.txt 2>/dev/null)
verifier=$(python3 /tests/ask.py)
printf 'agent phase: %s\nverifier phase: %s\n' "$agent" "$verifier" > $out/checks.txt
case "$agent" in *"port 8080 is not allowed"*) ;; *) echo 0 > $out/reward.txt; exit 0 ;; esac
case "$verifier" in *"host allowed.example is not in the allowlist"*) echo 1 > $out/reward.txt ;; *) echo 0 > $out/reward.txt ;; esac
