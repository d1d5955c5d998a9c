#!/bin/bash
set -eu
python3 /solution/ask.py > /app/agent-phase.txt
