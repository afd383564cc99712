#!/usr/bin/env bash
# Runs the AdamW delta benchmark with the system's Python (Debian's CPU torch).
set -euo pipefail
export PYTHONPATH="client/python${PYTHONPATH:+:$PYTHONPATH}"
exec /usr/bin/python3 bench/delta/adamw_delta.py "$@"
