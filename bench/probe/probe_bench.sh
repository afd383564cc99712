#!/usr/bin/env bash
# Runs the probe benchmark with the system's Python (Debian's CPU torch).
set -euo pipefail
export PYTHONPATH="client/python:tests/python${PYTHONPATH:+:$PYTHONPATH}"
exec /usr/bin/python3 bench/probe/probe_bench.py "$@"
