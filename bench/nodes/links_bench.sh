#!/usr/bin/env bash
# Runs the links benchmark with the system's Python, from its runfiles.
set -euo pipefail
cd "${RUNFILES_DIR:-$0.runfiles}/shardsync"
export PYTHONPATH="client/python${PYTHONPATH:+:$PYTHONPATH}"
exec /usr/bin/python3 bench/nodes/links_bench.py "$@"
