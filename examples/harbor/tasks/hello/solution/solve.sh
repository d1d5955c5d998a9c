#!/bin/bash
set -eu
echo "hello from a toolcage sandbox" > /app/hello.txt
