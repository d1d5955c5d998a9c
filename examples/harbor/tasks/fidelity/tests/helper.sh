#!/bin/sh
# uploaded with its executable bit (the tar keeps it): test.sh runs it directly
echo helper-ran
