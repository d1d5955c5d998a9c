#!/bin/bash
# reward 1 when /app/hello.txt holds the line, else 0
if [ "$(cat /app/hello.txt 2>/dev/null)" = "hello from a toolcage sandbox" ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
