#!/usr/bin/env bash
# Runs the node test bed's scenarios with the system's Python (Debian's torch).
set -euo pipefail
export PYTHONPATH="client/python:tests/python${PYTHONPATH:+:$PYTHONPATH}"
exec /usr/bin/python3 tests/nodes/nodes_test.py "$@"
